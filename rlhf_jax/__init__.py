"""rlhf_jax: agents trained from human (or synthetic) feedback, as pure JAX functions."""
from __future__ import annotations

from typing import Any


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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
