"""The two rules for the files the library writes. Where a user named: never over something
that is there, so a mistyped path, or one given twice, costs an error message, never a user's
file or folder (``labels export``, ``labels import`` and ``fit-reward`` alike). Everywhere:
whole or not at all, so a reader, or a resume after a kill or a full disk, never finds half a file."""
from __future__ import annotations

import os
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


def write_atomically(path: Path, write) -> None:
    """``write(temporary_path)``, then rename it to ``path``: a reader (or a resume after a
    kill or a full disk) finds the old file or the new one whole, never half of one."""
    # Hidden, and with the same suffix: np.savez and savefig go by it.
    temporary = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
