"""Weights & Biases beside ``metrics.csv`` and TensorBoard: ``run.wandb: true``.

A run, or each member of a sweep, is one W&B run. It gets the run's resolved config, every
row of its metrics as it is written (plotted against ``env_steps``), and at the end its
learning curve and, for a people run, how many of its queries people answered. The members of
a sweep share a W&B group, named after the sweep's directory.

``run.wandb_mode``: ``offline`` (the default) writes the W&B run into the run's own directory
(``wandb/``), for ``wandb sync`` to upload later; ``online`` streams it to the server, which
needs ``wandb login``. A resumed run goes on in the same W&B run: the directory keeps its id
(``wandb_id``). The rows a resume repeats (those logged after the checkpoint it starts from)
are logged again, at the same env steps.

wandb is optional (``pip install 'rlhf_jax[wandb]'``): :func:`require_wandb` stops a run that
asks for it without it, before anything is written.
"""
from __future__ import annotations

import contextlib
import importlib.util
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_jax.config_base import to_dict
from rlhf_jax.errors import ConfigError, RunError

if TYPE_CHECKING:
    from rlhf_jax.config import ExperimentConfig, RunConfig
    from rlhf_jax.feedback.store import Counts

ID_FILE = "wandb_id"  # in a run's (a sweep's) directory: the id its W&B run(s) resume


def require_wandb(run: RunConfig) -> None:
    """A one-line error naming ``run.wandb`` when it is on and wandb is not installed."""
    if run.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("run.wandb is true, but wandb is not installed: pip install 'rlhf_jax[wandb]' "
                          "(or set run.wandb=false)")


def directory_id(directory: Path) -> str:
    """The W&B run id kept in ``directory``, made on first use (8 hex digits)."""
    path = Path(directory) / ID_FILE
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    made = secrets.token_hex(4)
    path.write_text(made + "\n")
    return made


class WandbRun:
    """One W&B run, as a run (or a sweep member) logs to it."""

    def __init__(self, run):
        self._run = run  # a wandb.Run

    @classmethod
    def start(cls, config: ExperimentConfig, directory: Path, name: str, run_id: str,
              group: str | None = None) -> "WandbRun":
        """The W&B run ``run_id`` of ``config`` (started, or resumed), its files under ``directory``."""
        import wandb

        settings = config.run
        try:
            run = wandb.init(
                project=settings.wandb_project, entity=settings.wandb_entity or None, mode=settings.wandb_mode,
                tags=list(settings.wandb_tags), name=name, group=group, config=to_dict(config), dir=str(directory),
                id=run_id, resume="allow",
                reinit="create_new",  # a sweep logs to one W&B run per member at once
                settings=wandb.Settings(console="off"))  # the terminal stays the command's own
        except Exception as error:  # noqa: BLE001 - a login, network or server problem, in wandb's own words
            reason = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
            raise RunError(f"cannot start the W&B run (run.wandb_mode={settings.wandb_mode}): {reason}. "
                           f"Log in with `wandb login`, or use run.wandb_mode=offline") from None
        run.define_metric("*", step_metric="env_steps")  # the x axis of every metric, as in metrics.csv
        return cls(run)

    def log_row(self, row: dict) -> None:
        """One row of metrics (its numbers: a sweep's rows also name their member)."""
        self._run.log({key: value for key, value in row.items() if isinstance(value, (int, float))})

    def log_image(self, key: str, path: Path) -> None:
        import wandb

        self._run.log({key: wandb.Image(str(path))})

    def log_label_counts(self, counts: Counts) -> None:
        """A people run's queries at its end, from its label store."""
        self._run.summary.update({"people/answered": counts.answered, "people/waiting": counts.waiting})

    def finish(self, failed: bool = False) -> None:
        self._run.finish(exit_code=1 if failed else 0)


@contextlib.contextmanager
def logging_to_wandb(config: ExperimentConfig, directory: Path, name: str, member: int | None = None,
                     group: str | None = None):
    """While the block runs: the W&B run of ``config`` (``None`` unless ``run.wandb``), its
    files under ``directory``; with ``member``, that sweep member's, one of the sweep's in
    ``directory``. Finished on leaving the block, as failed if the block raises."""
    if not config.run.wandb:
        yield None
        return
    run_id = directory_id(directory) + ("" if member is None else f"-{member}")
    run = WandbRun.start(config, directory, name, run_id, group)
    try:
        yield run
    except BaseException:
        run.finish(failed=True)
        raise
    run.finish()
