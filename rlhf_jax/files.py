"""The one rule for what a command writes where a user named: never over something that is
there. A mistyped path, or one given twice, then costs an error message, never a user's file
or folder (``labels export``, ``labels import`` and ``fit-reward`` alike)."""
from __future__ import annotations

from pathlib import Path

from rlhf_jax.errors import ConfigError


def refuse_to_overwrite(path: Path, fix: str) -> None:
    """A one-line error ending in ``fix`` if ``path`` exists, unless it is an empty directory
    (nothing in it to lose: a command may fill it)."""
    if path.is_dir() and not path.is_symlink():
        if any(path.iterdir()):
            raise ConfigError(f"{path} already exists and is not empty: {fix}")
    elif path.exists() or path.is_symlink():
        raise ConfigError(f"{path} already exists: {fix}")
