"""A run's directory: making it (``config.yaml`` first, written whole), taking back one that
could not start, reading its config back, and a resume's edits to that config
(:func:`apply_config_edits`)."""
from __future__ import annotations

import contextlib
import shutil
from datetime import datetime
from pathlib import Path

import jax
import jax.numpy as jnp

from rlhf_jax.checkpoints import Checkpoints, config_diff, editable_on_resume, out_of_space
from rlhf_jax.config import ExperimentConfig, build, to_dict
from rlhf_jax.config_base import CONFIG_FILE, dump_yaml, is_in_state, read_run_config
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.files import write_atomically
from rlhf_jax.wandb_log import ID_FILE


def new_run_dir(config: ExperimentConfig) -> Path:
    """The directory of a new run, holding its ``config.yaml`` (written whole or not at all:
    a run that cannot write it stops at once, leaving nothing behind)."""
    if config.run.dir:
        path = Path(config.run.dir)
        if (path / CONFIG_FILE).exists():
            raise ConfigError(f"{path} already holds a run; resume it with --resume {path} or choose another run.dir")
    else:
        path = Path("runs") / f"{config.name}-{datetime.now():%Y%m%d-%H%M%S}"
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        text = dump_yaml(to_dict(config))
        write_atomically(path / CONFIG_FILE, lambda temporary: temporary.write_text(text))
    except OSError as error:
        if created and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        full = out_of_space(error)
        raise RunError(f"cannot start a run in {path}: {error}{': ' + full if full else ''}. Nothing was "
                       f"written: {'make room or ' if full else ''}choose another run.dir, and start it again") from None
    return path


def remove_unstarted_run(run_dir: Path, checkpoints: Checkpoints) -> None:
    """Take back what a new run wrote before it could start (its W&B run refused it): its
    config.yaml, W&B id and files, its empty checkpoints folder, and its directory once empty (a
    run.dir that held other files keeps them). The same command, mended as the message says,
    then starts it, where it met "already holds a run"."""
    checkpoints.close()
    for name in (CONFIG_FILE, ID_FILE):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "wandb", ignore_errors=True)
    for folder in (checkpoints.directory, run_dir):
        with contextlib.suppress(OSError):  # not empty
            folder.rmdir()


def load_run_config(run_dir: str | Path) -> ExperimentConfig:
    """The config a run was started with, from its ``config.yaml``; one that cannot be read, or
    that sets nothing, is an error naming the file (never the defaults)."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        data = read_run_config(run_dir)
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    if not data:
        raise ConfigError(f"{path} is empty: it was never written whole, so {run_dir} cannot be resumed")
    return build(ExperimentConfig, data)


def apply_config_edits(driver, checkpoints: Checkpoints, chunk: int, state):
    """``state`` (restored from checkpoint ``chunk`` of ``driver``'s run) under the run's config.yaml, which may have
    been edited since the checkpoint was written: a hyper-parameter its optimiser keeps in the
    state (``config_base.in_state``, the learning rates) takes its new value there; a change a
    resume cannot apply (one compiled into the program or shaping the state) is refused, naming
    every such key, before anything is written. Keys of how the run is driven (``run.*``,
    ``people.*``) are free (:func:`rlhf_jax.checkpoints.editable_on_resume`)."""
    saved = checkpoints.saved_config(chunk)
    if saved is None:  # a checkpoint from before configs were saved with them
        return state
    diff = config_diff(saved, to_dict(driver.config))
    refused = [f"{key}: {before} when saved, {now} now" for key, (before, now) in diff.items()
               if not editable_on_resume(key)]
    if refused:
        raise ConfigError(
            f"{checkpoints.run_dir / CONFIG_FILE} was changed since checkpoint {chunk} was written, in keys a resume "
            f"cannot apply (they are compiled into the run or shape its state): {'; '.join(refused)}. Put those "
            f"values back to resume, or start a new run with them. Nothing was overwritten: the run directory is "
            f"as it was.")
    where = driver.optimizer_states()
    for key, (before, now) in diff.items():
        section = key.split(".")[0]
        if is_in_state(ExperimentConfig, key) and section in where:
            state = set_hyperparameter(state, where[section], before, now, key)
            print(f"{key}: {before} when saved, {now} now: the resumed run uses {now}", flush=True)
    return state


def set_hyperparameter(state, prefix: str, before: float, now: float, key: str):
    """``state`` with the in-state hyper-parameter ``key`` changed from ``before`` to ``now``:
    in the optimiser states under path ``prefix``, every ``hyperparams`` value equal to ``before``
    (one per ensemble member, say). Each optimiser holds one marked hyper-parameter, so the
    value names it."""
    found = 0

    def replace(path, leaf):
        nonlocal found
        name = jax.tree_util.keystr(path)
        if not name.startswith(prefix) or ".hyperparams" not in name:
            return leaf
        match = leaf == jnp.asarray(before, leaf.dtype)
        found += int(match.sum())
        return jnp.where(match, jnp.asarray(now, leaf.dtype), leaf)

    state = jax.tree_util.tree_map_with_path(replace, state)
    if not found:
        raise ConfigError(f"{key} was changed, but the checkpoint holds no optimiser state with its old value "
                          f"{before}: put it back to resume")
    return state
