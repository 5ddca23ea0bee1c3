"""Saving and restoring a run's whole state with orbax-checkpoint, with messages a user can act on.

Orbax writes checkpoint ``N`` into ``checkpoints/N.orbax-checkpoint-tmp`` and renames it to
``checkpoints/N`` only once every file is written, so a process killed at any moment (SIGKILL
included) leaves the checkpoints before it whole: an unfinished one keeps its tmp name, is
never restored, and is removed when chunk ``N`` is saved again. Each checkpoint also keeps
the config it was written with, so that a resume that no longer fits can say what changed.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from rlhf_jax.config import flat_keys
from rlhf_jax.errors import ConfigError, RunError

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a checkpoint still being written


class Checkpoints:
    """The ``checkpoints/`` folder of a run: numbered by chunk, the newest few kept.

    ``config`` (the run's config as a plain dict) is saved with every checkpoint and, on
    restore, compared with the one a checkpoint was written with. ``resume_command`` is what
    messages tell the user to run to go on (default: ``rlhf-jax train --resume RUN_DIR``)."""

    def __init__(self, run_dir: Path, keep: int = 2, config: dict | None = None, resume_command: str | None = None):
        self.run_dir = Path(run_dir).resolve()
        self.directory = self.run_dir / "checkpoints"
        self.config = config
        self.resume_command = resume_command or f"rlhf-jax train --resume {self.run_dir}"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, chunk: int, state) -> None:
        """Write the state after ``chunk``; a write that fails (disk full, quota, permissions)
        stops the run with a :class:`RunError` that says which checkpoint is still intact."""
        metadata = {"config": self.config} if self.config is not None else None
        try:
            self._manager.save(chunk, args=ocp.args.StandardSave(state), custom_metadata=metadata)
            self._manager.wait_until_finished()
        except Exception as error:
            cause = os_error(error)
            if cause is None:
                raise
            for unfinished in self.directory.glob(f"{chunk}{TMP_SUFFIX}*"):
                shutil.rmtree(unfinished, ignore_errors=True)  # give back the space it took
            raise write_failed(cause, f"checkpoint {chunk} in {self.directory}", self) from None

    def latest(self) -> int | None:
        return self._manager.latest_step()

    def last_intact(self) -> int | None:
        """The newest complete checkpoint, read from the folder itself: after a failed save
        the manager's own list may name the one that failed. Orbax gives a checkpoint its
        bare number only once it is whole."""
        chunks = [int(p.name) for p in self.directory.iterdir() if p.name.isdigit()] if self.directory.is_dir() else []
        return max(chunks, default=None)

    def resume_hint(self, first: str = "") -> str:
        """Which checkpoint is intact and the command that resumes from it (after ``first``,
        what the user should do before)."""
        chunk, command = self.last_intact(), self.resume_command
        if chunk is None:
            return f"No checkpoint was saved yet: {first}{command} starts the run again from the beginning."
        return f"The last checkpoint, {chunk} ({self.directory / str(chunk)}), is intact: {first}resume from it with  {command}"

    def restore(self, like):
        """Restore the newest checkpoint into a pytree shaped like ``like`` (arrays or ShapeDtypeStructs)."""
        chunk = self.latest()
        if chunk is None:
            raise ConfigError(f"no checkpoint in {self.directory}: nothing to resume")
        # Each array is restored where ``like`` puts it (a sweep's are sharded over devices).
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
        try:
            state = self._manager.restore(chunk, args=ocp.args.StandardRestore(abstract))
            # Orbax checks jax arrays against the requested shapes, not NumPy ones.
            for (path, got), wanted in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(abstract)):
                if got.shape != wanted.shape:
                    raise ValueError(f"{jax.tree_util.keystr(path)} has shape {got.shape}, not {wanted.shape}")
            return chunk, state
        except Exception as error:  # orbax raises many kinds; all mean the same to the user
            # The first sentence only: orbax goes on to suggest padding the arrays.
            reason = f"{type(error).__name__}: {str(error).splitlines()[0].split('. ')[0][:300]}"
            raise ConfigError(
                f"checkpoint {self.directory / str(chunk)} cannot be restored ({reason}). {self._likely_cause(chunk)} "
                f"Nothing was overwritten: the run directory is as it was."
            ) from None

    def _likely_cause(self, chunk: int) -> str:
        """The config changes since checkpoint ``chunk`` was written: the usual reason its
        arrays no longer fit (another env.num_envs, network size or buffer capacity)."""
        try:
            saved = (self._manager.metadata(chunk).custom_metadata or {}).get("config")
        except Exception:
            saved = None
        if saved is None or self.config is None:
            return ("It is corrupt, or was written by a config with other shapes (another env.num_envs, "
                    "network size or buffer capacity).")
        changes = config_changes(saved, self.config)
        if not changes:
            return ("config.yaml is the config it was written with: the checkpoint is corrupt, or was "
                    "written by another version of rlhf_jax.")
        return (f"{self.run_dir / 'config.yaml'} was changed since it was written, the likely cause: "
                f"{'; '.join(changes)}. Put those values back to resume.")

    def close(self) -> None:
        try:
            self._manager.close()
        except Exception:  # a failed save has already been reported; don't hide that report
            pass


def config_changes(saved: dict, current: dict) -> list[str]:
    """``["env.num_envs: 8 when saved, 16 now", ...]`` for every key whose value differs."""
    # Through JSON, as orbax stores the config: tuples and lists compare alike.
    flat_saved, flat_current = (flat_keys(json.loads(json.dumps(c))) for c in (saved, current))
    changes = []
    for key in sorted(flat_saved.keys() | flat_current.keys()):
        before, now = flat_saved.get(key, "(absent)"), flat_current.get(key, "(absent)")
        if before != now:
            changes.append(f"{key}: {before} when saved, {now} now")
    return changes


def os_error(error: BaseException) -> OSError | None:
    """The operating system's error behind ``error``, if any. Orbax raises the ``OSError``
    of its own metadata files as it is, but TensorStore, which writes the arrays, raises a
    ``ValueError`` ending ``[os_error_code='28']``; either may be another exception's cause."""
    while error is not None:
        if isinstance(error, OSError):
            return error
        code = re.search(r"os_error_code='(\d+)'", str(error))
        if code:
            number = int(code.group(1))
            return OSError(number, os.strerror(number))
        error = error.__cause__ or error.__context__
    return None


def write_failed(error: OSError, what: str, checkpoints: Checkpoints) -> RunError:
    """The message for a run stopped because ``what`` could not be written."""
    full = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "your disk quota is used up"}.get(error.errno)
    if full:
        return RunError(f"cannot write {what}: {error}: {full}. {checkpoints.resume_hint('free some space, then ')}")
    return RunError(f"cannot write {what}: {error}. {checkpoints.resume_hint('fix that, then ')}")


@contextmanager
def stop_on_write_failure(checkpoints: Checkpoints, what: str):
    """Turn an ``OSError`` inside the block (metrics.csv, TensorBoard, the plot, labels.npz)
    into the :class:`RunError` that names the intact checkpoint; ``what``: where it wrote."""
    try:
        yield
    except OSError as error:
        raise write_failed(error, what, checkpoints) from None
