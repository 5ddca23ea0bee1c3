"""rlhf_jax: agents trained from human (or synthetic) feedback, as pure JAX functions.

``rlhf_jax.train(config)`` trains a run and returns its directory; ``rlhf_jax.load_run(run_dir)``
reads one back (its config, policy, learned reward and metrics: :mod:`rlhf_jax.api`). They are
loaded on first use: importing ``rlhf_jax`` imports no JAX.
"""
from __future__ import annotations

import importlib
from typing import Any

# The Python API (rlhf_jax.api), by name; loaded on first use.
_API = ("train", "load_run", "resolve_config", "Run", "Policy")

__all__ = [*_API, "__version__"]


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, its one source); from a source
    tree on ``sys.path`` that was never installed, pyproject.toml's read directly."""
    from importlib import metadata

    try:
        return metadata.version("rlhf_jax")
    except metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as file:
                return tomllib.load(file)["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


def __getattr__(name: str) -> Any:
    # Loaded on first use: importing rlhf_jax stays light (no JAX).
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    if name in _API:
        # By its name, not an import statement: the package's modules import rlhf_jax, not it them.
        globals()[name] = value = getattr(importlib.import_module("rlhf_jax.api"), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
