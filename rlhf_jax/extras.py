"""The parts of rlhf_jax that need an extra of the install, and the one-line error a missing one
gives, naming the extra.

The core install (``pip install rlhf_jax``) runs everything on gymnax: CartPole from
preferences, the default experiment. The rest is pyproject.toml's optional dependencies:

* ``mujoco``: EnvPool's C MuJoCo (``envpool/Hopper-v5``) and MJX (``mjx/Hopper-v5``);
* ``atari``: EnvPool's Atari (``envpool/Pong-v5``);
* ``video``: ``rlhf-jax eval --video`` (ffmpeg, and pygame for classic control);
* ``people``: people in the loop: clips and the labeling web page (``rlhf-jax label``);
* ``jumanji``: :class:`~rlhf_jax.envs.JumanjiEnv`, a Jumanji environment as a task of your own;
* ``wandb``, ``stats``, ``labels``: Weights & Biases, rliable's statistics, Parquet datasets.
"""
from __future__ import annotations

import importlib.util

from rlhf_jax.errors import ConfigError

# What the labeling web page (rlhf-jax label) is served with: the people extra.
WEB_APP_MODULES = ("starlette", "uvicorn", "h11")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):  # a submodule of a missing package; one without a spec
        return False


class MissingExtra(ConfigError):
    """What a missing extra of the install stops: its one-line message, and the extra it names."""

    def __init__(self, message: str, extra: str):
        super().__init__(message)
        self.extra = extra


def require(what: str, extra: str, *modules: str) -> None:
    """A :class:`MissingExtra` if any of ``modules`` is not installed: ``what`` needs them, and the
    ``extra`` of rlhf_jax installs them."""
    absent = [module for module in modules if not installed(module)]
    if absent:
        named = " and ".join([", ".join(absent[:-1]), absent[-1]] if len(absent) > 1 else absent)
        raise MissingExtra(f"{what} needs {named}, not installed here: pip install 'rlhf_jax[{extra}]'", extra)
