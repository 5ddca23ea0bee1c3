"""Saving and restoring a run's whole state with orbax-checkpoint, with messages a user can act on.

Orbax writes checkpoint ``N`` into ``checkpoints/N.orbax-checkpoint-tmp`` and renames it to
``checkpoints/N`` only once every file is written, so a process killed at any moment (SIGKILL
included) leaves the checkpoints before it whole: an unfinished one keeps its tmp name, is
never restored, and is removed when chunk ``N`` is saved again. Each checkpoint also keeps
the config it was written with, so that a resume that no longer fits can say what changed,
and a checksum of every array, so that a restore can tell a damaged checkpoint (a byte
changed on disk) from a good one: it passes over the damaged ones to the newest that
verifies, and rotation never deletes the checkpoint a restore verified. A checkpoint whose
checksums are gone (its metadata file deleted or cut short) counts as damaged: nothing in it
can be verified.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from rlhf_jax.config import ExperimentConfig, flat_keys
from rlhf_jax.config_base import is_in_state
from rlhf_jax.errors import ConfigError, RunError

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a checkpoint still being written
DAMAGED_SUFFIX = ".damaged"  # a checkpoint that failed its checksums, moved aside (orbax ignores it)
# Config sections that say how a run is driven, saved and labeled, not what it computes; but
# the chunk length numbers the checkpoints.
_DRIVING_SECTIONS = ("run.", "people.")
_FIXED_DRIVING_KEYS = ("run.chunk_env_steps",)


def editable_on_resume(key: str) -> bool:
    """Whether a resume may continue with config key ``key`` changed since its checkpoint was
    written: a hyper-parameter its optimiser keeps in the state (``config_base.in_state``: the
    resume writes the new value into the restored state), or how the run is driven (``run.*``
    but its chunk length, ``people.*``, ``name``). Any other key is compiled into the program or
    shapes the state, so the checkpoint cannot continue under it."""
    if key == "name" or (key.startswith(_DRIVING_SECTIONS) and key not in _FIXED_DRIVING_KEYS):
        return True
    try:
        return is_in_state(ExperimentConfig, key)
    except ConfigError:  # a key this version does not know
        return False


def checksums(state) -> dict[str, str]:
    """The SHA-256 of every array of ``state`` (its dtype, shape and bytes), keyed by its path in
    the tree. A sharded array counts whole, gathered from every process."""
    sums = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        array = np.ascontiguousarray(jax.device_get(leaf))
        digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.reshape(-1).view(np.uint8))
        sums[jax.tree_util.keystr(path)] = digest.hexdigest()
    return sums


class Checkpoints:
    """The ``checkpoints/`` folder of a run: numbered by chunk, the newest ``keep`` kept, and
    the checkpoint a restore verified kept until a restore verifies a newer one.

    ``config`` (the run's config as a plain dict) is saved with every checkpoint and, on
    restore, compared with the one a checkpoint was written with. ``resume_command`` is what
    messages tell the user to run to go on (default: ``rlhf-jax train --resume RUN_DIR``);
    ``say`` prints what a restore had to pass over."""

    def __init__(self, run_dir: Path, keep: int = 2, config: dict | None = None, resume_command: str | None = None,
                 say=print):
        self.run_dir = Path(run_dir).resolve()
        self.directory = self.run_dir / "checkpoints"
        self.config, self.keep, self.say = config, keep, say
        self.resume_command = resume_command or f"rlhf-jax train --resume {self.run_dir}"
        self.verified: int | None = None  # the checkpoint a restore read back and found intact
        self._damaged: list[int] = []  # found damaged by a restore: moved aside before the next save
        # Rotation is ours (see _rotate): orbax's max_to_keep would delete the verified checkpoint.
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True)
        try:
            with _metadata_warnings_dropped():  # the manager reads each checkpoint's metadata
                self._manager = ocp.CheckpointManager(self.directory, options=options)
        except OSError as error:  # it makes the folder: a read-only run directory, say
            raise RunError(f"cannot write checkpoints in {self.directory}: {error}") from None

    def save(self, chunk: int, state, notes: dict | None = None) -> None:
        """Write the state after ``chunk``, with ``notes`` (plain JSON: what the run must know
        on a restore besides the state, read back by :meth:`notes`); a write that fails (disk full, quota, permissions)
        stops the run with a :class:`RunError` that says which checkpoint is still intact."""
        try:
            self._set_aside_damaged()
            # The checksums go into the checkpoint's own metadata, which orbax writes before
            # it renames the checkpoint whole: no checkpoint exists without them.
            metadata = {"checksums": checksums(state)}
            if self.config is not None:
                metadata["config"] = self.config
            if notes:
                metadata["notes"] = notes
            with _save_failure_noise_held():
                self._manager.save(chunk, args=ocp.args.StandardSave(state), custom_metadata=metadata)
                self._manager.wait_until_finished()
            self._rotate()
        except Exception as error:
            cause = os_error(error)
            if cause is None:
                raise
            self._remove_unfinished(chunk)
            raise write_failed(cause, f"checkpoint {chunk} in {self.directory}", self) from None

    def _remove_unfinished(self, chunk: int, settle_s: float = 0.2, patience_s: float = 10.0) -> None:
        """Give back the space a failed save of ``chunk`` took. Orbax's writer threads can outlive
        the error (they log it late, :func:`_drop_late_reports_of_failed_writes`) and recreate
        the unfinished directory after a first removal: wait for the manager's own threads, then
        remove until nothing has reappeared for ``settle_s`` (at most ``patience_s``)."""
        try:
            self._manager.wait_until_finished()
        except Exception:  # the same failed write, reported by the caller
            pass
        deadline = time.monotonic() + patience_s
        while True:
            for unfinished in self.directory.glob(f"{chunk}{TMP_SUFFIX}*"):
                shutil.rmtree(unfinished, ignore_errors=True)
            time.sleep(settle_s)
            if not any(self.directory.glob(f"{chunk}{TMP_SUFFIX}*")) or time.monotonic() > deadline:
                return

    def _rotate(self) -> None:
        """Delete all but the newest ``keep`` checkpoints and the verified one."""
        steps = sorted(self._manager.all_steps())
        kept = set(steps[-self.keep:]) | {self.verified}
        for step in steps:
            if step not in kept:
                self._manager.delete(step)

    def _set_aside_damaged(self) -> None:
        """Rename the checkpoints a restore found damaged to ``N.damaged`` (kept for a look,
        never restored), so that chunk ``N`` can be saved again."""
        if not self._damaged:
            return
        if jax.process_index() == 0:
            for chunk in self._damaged:
                aside = self.directory / f"{chunk}{DAMAGED_SUFFIX}"
                if aside.exists():  # damaged twice: the older copy says nothing new
                    shutil.rmtree(aside)
                os.rename(self.directory / str(chunk), aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("rlhf_jax: damaged checkpoints set aside")
        self._damaged = []
        self._manager.reload()

    def latest(self) -> int | None:
        return self._manager.latest_step()

    def last_intact(self) -> int | None:
        """The newest complete checkpoint, read from the folder itself: after a failed save
        the manager's own list may name the one that failed. Orbax gives a checkpoint its
        bare number only once it is whole; one a restore found damaged does not count."""
        names = [p.name for p in self.directory.iterdir()] if self.directory.is_dir() else []
        return max((int(n) for n in names if n.isdigit() and int(n) not in self._damaged), default=None)

    def resume_hint(self, first: str = "") -> str:
        """Which checkpoint is intact and the command that resumes from it (after ``first``,
        what the user should do before)."""
        chunk, command = self.last_intact(), self.resume_command
        if chunk is None:
            return f"No checkpoint was saved yet: {first}{command} starts the run again from the beginning."
        return f"The last checkpoint, {chunk} ({self.directory / str(chunk)}), is intact: {first}resume from it with  {command}"

    def saved_config(self, chunk: int) -> dict | None:
        """The config checkpoint ``chunk`` was written with (``None``: not recorded, or unreadable)."""
        return self._custom_metadata(chunk).get("config")

    def notes(self, chunk: int) -> dict:
        """The ``notes`` checkpoint ``chunk`` was saved with (``{}``: none)."""
        return self._custom_metadata(chunk).get("notes", {})

    def _custom_metadata(self, chunk: int) -> dict:
        """What checkpoint ``chunk`` was saved with: its checksums, config and notes (``{}``: its
        metadata file is gone or cut short)."""
        try:
            with _metadata_warnings_dropped():
                return self._manager.metadata(chunk).custom_metadata or {}
        except Exception:  # a damaged checkpoint's metadata may not parse
            return {}

    def restore(self, like):
        """``(chunk, state)`` from the newest checkpoint that reads back whole and matches its
        checksums, into a pytree shaped like ``like`` (arrays or ShapeDtypeStructs). Damaged
        ones are passed over, with one line saying so; a checkpoint that fails because the
        config changed stops the restore with a :class:`ConfigError` naming the changes."""
        chunks = sorted(self._manager.all_steps(), reverse=True)
        if not chunks:
            raise ConfigError(f"no checkpoint in {self.directory}: nothing to resume")
        # Each array is restored where ``like`` puts it (a sweep's are sharded over devices).
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
        damaged = []  # (chunk, what is wrong with it), newest first
        for chunk in chunks:
            saved = self._custom_metadata(chunk).get("checksums")
            if saved is None:  # nothing to tell a changed byte by: never trusted
                damaged.append((chunk, "its checksums are missing (its _CHECKPOINT_METADATA is gone or cut short)"))
                continue
            try:
                with _read_failure_noise_held():
                    state = self._read(chunk, abstract)
            except Exception as error:  # orbax raises many kinds; all mean the same to the user
                # The first sentence only: orbax goes on to suggest padding the arrays.
                reason = f"{type(error).__name__}: {str(error).splitlines()[0].split('. ')[0][:300]}"
                if self._changed_shapes(chunk) or len(chunks) == 1:
                    raise ConfigError(
                        f"checkpoint {self.directory / str(chunk)} cannot be restored ({reason}). "
                        f"{self._likely_cause(chunk)} Nothing was overwritten: the run directory is as it was."
                    ) from None
                damaged.append((chunk, f"it cannot be read ({reason})"))
                continue
            wrong = differing_arrays(saved, state)
            if wrong:
                damaged.append((chunk, f"its arrays differ from the checksums written with them ({wrong})"))
                continue
            self.verified = chunk
            if damaged:
                self._damaged = [c for c, _ in damaged]
                self.say(f"checkpoint {damaged[0][0]} ({self.directory / str(damaged[0][0])}) is damaged: "
                         f"{damaged[0][1]}" + "".join(f"; so is {c}: {why}" for c, why in damaged[1:]) +
                         f". Restored checkpoint {chunk}, the newest intact one; the next save moves the damaged "
                         f"one{'s' if len(damaged) > 1 else ''} aside to <chunk>{DAMAGED_SUFFIX}.", flush=True)
            return chunk, state
        # None reads back, though their bytes were not found changed: most likely they hold a
        # state of another shape, the state of another version of rlhf_jax.
        unreadable = all(why.startswith("it cannot be read") for _, why in damaged)
        raise ConfigError(
            f"no checkpoint in {self.directory} is intact: "
            + "; ".join(f"{c} is damaged: {why}" for c, why in damaged)
            + (". If config.yaml is unchanged they were likely written by another version of rlhf_jax, whose "
               "state has another structure: resume with that version" if unreadable else "")
            + ". Nothing was overwritten; start the run again in a new directory.")

    def _read(self, chunk: int, abstract):
        state = self._manager.restore(chunk, args=ocp.args.StandardRestore(abstract))
        # Orbax checks jax arrays against the requested shapes, not NumPy ones.
        for (path, got), wanted in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(abstract)):
            if got.shape != wanted.shape:
                raise ValueError(f"{jax.tree_util.keystr(path)} has shape {got.shape}, not {wanted.shape}")
        return state

    def _changed_shapes(self, chunk: int) -> bool:
        """Whether the config changed since ``chunk`` was written in a key that may change
        shapes: then a failed restore is the config's doing, not the checkpoint's."""
        saved = self.saved_config(chunk)
        if saved is None or self.config is None:
            return False
        return any(not editable_on_resume(key) for key in config_diff(saved, self.config))

    def _likely_cause(self, chunk: int) -> str:
        """The config changes since checkpoint ``chunk`` was written: the usual reason its
        arrays no longer fit (another env.num_envs, network size or buffer capacity)."""
        saved = self.saved_config(chunk)
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


def differing_arrays(saved: dict[str, str], state) -> str:
    """The arrays of ``state`` that differ from the checksums ``saved`` with it, as a short list
    ("" when all match)."""
    restored = checksums(state)
    wrong = [path for path in restored if saved.get(path) != restored[path]]
    wrong += [path for path in saved if path not in restored]
    return ", ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")


@contextmanager
def _metadata_warnings_dropped():
    """Orbax logs a warning for each checkpoint whose metadata file is gone or cut short, as the
    manager lists the checkpoints and as one's metadata is read: :meth:`Checkpoints.restore`
    reports such a checkpoint as damaged, in one line, so those warnings are dropped."""
    absl = logging.getLogger("absl")
    absl.addFilter(_drop_everything)
    try:
        yield
    finally:
        absl.removeFilter(_drop_everything)


def _drop_everything(record: logging.LogRecord) -> bool:
    return False


def config_diff(saved: dict, current: dict) -> dict[str, tuple]:
    """``{key: (value when saved, value now)}`` for every key whose value differs ("(absent)"
    where a config lacks it)."""
    # Through JSON, as orbax stores the config: tuples and lists compare alike.
    flat_saved, flat_current = (flat_keys(json.loads(json.dumps(c))) for c in (saved, current))
    diff = {}
    for key in sorted(flat_saved.keys() | flat_current.keys()):
        before, now = flat_saved.get(key, "(absent)"), flat_current.get(key, "(absent)")
        if before != now:
            diff[key] = (before, now)
    return diff


def config_changes(saved: dict, current: dict) -> list[str]:
    """``["env.num_envs: 8 when saved, 16 now", ...]`` for every key whose value differs."""
    return [f"{key}: {before} when saved, {now} now" for key, (before, now) in config_diff(saved, current).items()]


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


@contextmanager
def _save_failure_noise_held():
    """Orbax's threads log each failure inside a save with its traceback, asyncio logs the
    futures it left unread, and TensorStore's callbacks find orbax's event loop closed: a
    full disk made 26 tracebacks before the one line that matters. Hold those reports back
    during the save; drop them if it failed for a write error (the caller says that in one
    line, and :func:`_drop_late_reports_of_failed_writes` drops what comes later), show them
    otherwise."""
    held, unraisable = [], []

    class Hold(logging.Filter):
        def filter(self, record):
            held.append(record)
            return False

    hold, loggers = Hold(), [logging.getLogger(name) for name in ("absl", "asyncio")]
    previous_hook = sys.unraisablehook
    for logger in loggers:
        logger.addFilter(hold)
    sys.unraisablehook = unraisable.append
    failed_writing = False
    try:
        yield
    except BaseException as error:
        failed_writing = os_error(error) is not None
        raise
    finally:
        for logger in loggers:
            logger.removeFilter(hold)
        sys.unraisablehook = previous_hook
        if failed_writing:
            _drop_late_reports_of_failed_writes()
        else:
            for record in held:
                logging.getLogger(record.name).handle(record)
            for report in unraisable:
                previous_hook(report)


@contextmanager
def _read_failure_noise_held():
    """A read that fails (a damaged checkpoint, passed over in one line) is followed by
    :func:`_is_noise_of_failed_io`'s reports, during the read and after it: hold them back
    during the read, and drop them then and from then on if it failed."""
    held = []
    previous = sys.unraisablehook
    sys.unraisablehook = held.append
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        sys.unraisablehook = previous
        if failed:
            _drop_unraisable_reports_of_failed_io()
        for report in held:
            if not (failed and _is_noise_of_failed_io(report)):
                previous(report)


class _LateWriteFailure(logging.Filter):
    """A log record whose exception (or, failing that, message) is a failed write: asyncio's
    report of a future orbax left unread, or orbax's thread logging the error it raised."""

    def filter(self, record):
        error = record.exc_info[1] if record.exc_info else Exception(record.getMessage())
        return os_error(error) is None


_LATE_WRITE_FAILURE = _LateWriteFailure()


def _drop_late_reports_of_failed_writes() -> None:
    """After a failed write: asyncio reports the futures orbax left unread when it collects
    them, as late as the interpreter's exit, orbax's threads may log the write error they raised
    after the save has returned, TensorStore's last callbacks find the event loop closed, and
    sometimes a write coroutine of orbax's that never ran is collected with a warning. The run
    has reported the failure in one line: drop those four reports from now on (nothing else)."""
    warnings.filterwarnings("ignore", message=r"coroutine '.*write_fragment' was never awaited",
                            category=RuntimeWarning)
    for name in ("asyncio", "absl"):
        logger = logging.getLogger(name)
        if _LATE_WRITE_FAILURE not in logger.filters:
            logger.addFilter(_LATE_WRITE_FAILURE)
    _drop_unraisable_reports_of_failed_io()


def _is_noise_of_failed_io(report) -> bool:
    """An unraisable report that follows a failed read or write of orbax's: TensorStore's
    callback finding orbax's event loop closed, or a coroutine of orbax's that never ran (one
    per array not yet read or written, each with its traceback)."""
    if isinstance(report.exc_value, RuntimeError) and str(report.exc_value) == "Event loop is closed":
        return True
    code = getattr(report.object, "cr_code", None)
    return code is not None and "orbax" in code.co_filename


def _drop_unraisable_reports_of_failed_io() -> None:
    """From now on, drop the unraisable reports :func:`_is_noise_of_failed_io` names (nothing
    else): a checkpoint cut short, passed over in one line, was followed by 27 tracebacks of
    arrays orbax never read and more of its closed event loop."""
    if getattr(sys.unraisablehook, "drops_noise_of_failed_io", False):
        return
    previous = sys.unraisablehook

    def hook(report):
        if not _is_noise_of_failed_io(report):
            previous(report)

    hook.drops_noise_of_failed_io = True
    sys.unraisablehook = hook


def out_of_space(error: OSError) -> str | None:
    """What a write error says about space, in words ("the disk is full"), if anything."""
    return {errno.ENOSPC: "the disk is full", errno.EDQUOT: "your disk quota is used up"}.get(error.errno)


def write_failed(error: OSError, what: str, checkpoints: Checkpoints) -> RunError:
    """The message for a run stopped because ``what`` could not be written."""
    full = out_of_space(error)
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
