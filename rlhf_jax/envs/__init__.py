"""One environment protocol over three back ends; ``make(EnvConfig(id=...))`` builds any of them.

Ids are ``<backend>/<name>``:

* ``gymnax/...``  classic control and MinAtar, pure JAX (vmap over seeds works);
* ``envpool/...`` Atari through EnvPool's XLA interface, and EnvPool's C MuJoCo
  (the CPU back end for MuJoCo);
* ``mjx/...``     MuJoCo tasks in pure JAX over ``mujoco.mjx`` (the accelerator back end);
* ``<yours>/...`` an environment of your own, registered with :func:`register` and wrapped in
  an adapter: :class:`GymnaxEnv` (any gymnax environment), :class:`BraxEnv` (a Brax / MuJoCo
  Playground ``Env``), :class:`GymnasiumEnv` (a Gymnasium environment stepped on the host),
  :class:`JumanjiEnv` (a Jumanji environment; the ``jumanji`` extra), or a subclass of
  :class:`Environment` of your own (docs: "Your own task").

The adapters are loaded on first use, as the back ends are: each pulls in its library. So is
the protocol itself (:mod:`rlhf_jax.envs.core`, which imports JAX): an :class:`EnvConfig` is
read and checked without JAX.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlhf_jax.envs.options import ATARI_NAMES, ENV_IDS, GYMNAX_NAMES, MUJOCO_NAMES, EnvConfig
from rlhf_jax.envs.registry import factory_of, register, registered_ids, unregister
from rlhf_jax.errors import ConfigError

if TYPE_CHECKING:
    from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, EnvState, TimeStep, check_action

# Adapters of your own environments, by the module that holds each (loaded on first use).
ADAPTERS = {"GymnaxEnv": "gymnax_envs", "BraxEnv": "brax_envs", "GymnasiumEnv": "gymnasium_envs",
            "JumanjiEnv": "jumanji_envs"}
# The protocol (rlhf_jax.envs.core), loaded on first use too: it imports JAX.
CORE = ("Box", "Discrete", "Environment", "EnvSpec", "EnvState", "TimeStep", "check_action")


def _made_by_factory(config: EnvConfig, members: int) -> Environment:
    """A registered id's environment, checked against what its config asked for."""
    from rlhf_jax.envs.core import Environment

    factory = factory_of(config.id)
    if factory is None:
        raise ConfigError(f"{config.id!r} is no longer registered (rlhf_jax.envs.unregister)")
    env = factory(config, members)
    if not isinstance(env, Environment):
        raise TypeError(f"the factory of {config.id!r} returned {type(env).__name__}, not an "
                        f"rlhf_jax.envs.Environment (wrap your environment in an adapter: docs/your-own-task.md)")
    if env.spec.id != config.id or env.spec.num_envs != config.num_envs:
        raise ValueError(f"the factory of {config.id!r} built {env.spec.id!r} with {env.spec.num_envs} copies; "
                         f"its config asked for {config.id!r} with env.num_envs={config.num_envs}")
    return env


def make(config: EnvConfig | str, members: int = 1) -> Environment:
    """Build the environment named by ``config.id`` (a bare id string takes default options).

    ``members``: how many runs of a sweep share it. JAX environments are vmapped over the
    runs as they are; EnvPool (Atari and MuJoCo) builds one pool for all of them
    (:func:`rlhf_jax.envs.shared_pool.shared_by_members`); so does a Gymnasium environment on the host."""
    if isinstance(config, str):
        config = EnvConfig(id=config)  # an unknown id fails here, listing the known ones
    backend, name = config.backend, config.name
    if config.id not in ENV_IDS:  # an environment of your own (EnvConfig found its factory)
        return _made_by_factory(config, members)
    # Back ends are imported on demand: each pulls in a heavy library.
    if backend == "gymnax":
        from rlhf_jax.envs.gymnax_envs import make_gymnax

        return make_gymnax(name, config)
    if backend == "envpool":
        from rlhf_jax.envs.envpool_envs import AtariEnv, MujocoPoolEnv

        return AtariEnv(name, config, members) if name in ATARI_NAMES else MujocoPoolEnv(name, config, members)
    from rlhf_jax.envs.mjx_tasks import make_mjx

    return make_mjx(name, config)


__all__ = [
    "BraxEnv", "Box", "Discrete", "ENV_IDS", "EnvConfig", "EnvSpec", "EnvState", "Environment", "GymnasiumEnv",
    "GymnaxEnv", "JumanjiEnv", "TimeStep", "check_action", "make", "register", "registered_ids", "unregister",
]


def __getattr__(name: str) -> Any:
    if name in ADAPTERS or name in CORE:
        value = getattr(importlib.import_module(f"rlhf_jax.envs.{ADAPTERS.get(name, 'core')}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
