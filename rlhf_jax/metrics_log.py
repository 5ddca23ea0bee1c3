"""A run's metrics: one CSV row per compiled chunk, the same scalars to TensorBoard (and to
Weights & Biases, :mod:`rlhf_jax.wandb_log`), and a PNG curve."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from rlhf_jax.files import write_atomically

if TYPE_CHECKING:
    from rlhf_jax.wandb_log import WandbRun


class MetricsLog:
    """Appends rows to ``metrics.csv``, TensorBoard and a W&B run (``wandb``, if given); on
    resume, drops rows past the checkpoint from the CSV file."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, wandb: WandbRun | None = None):
        self.path = Path(run_dir) / "metrics.csv"
        self._wandb = wandb
        self._writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def truncate_after(self, env_steps: int) -> None:
        """Forget rows logged after the checkpoint a resumed run starts from (every row, for
        a run that starts again from the beginning), and a row cut short by a kill."""
        if not self.path.exists():
            return
        kept = [r for r in self.rows() if r["env_steps"] <= env_steps]
        if kept:
            self._write_all(kept)
        else:
            self.path.unlink()  # the header goes too: the next row writes it again

    def rows(self) -> list[dict]:
        """Every complete row. A row cut short (the process was killed while appending it: its
        line has no end, or too few fields) is dropped: it was written after the last
        checkpoint, so a resume drops it anyway."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]  # cut anywhere, even at a comma or inside a number
        rows = [row for row in csv.DictReader(lines) if None not in row.values() and None not in row]
        return [{k: float(v) for k, v in row.items()} for row in rows]

    def append(self, row: dict) -> None:
        rows = self.rows()
        if rows and set(rows[0]) != set(row):
            rows = [{k: r.get(k, math.nan) for k in row} for r in rows]
            self._write_all(rows + [row])
        else:
            new = not self.path.exists()
            with self.path.open("a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(row))
                if new:
                    writer.writeheader()
                writer.writerow(row)
        if self._writer is not None:
            for key, value in row.items():
                if key != "env_steps" and not math.isnan(value):
                    self._writer.add_scalar(key, value, int(row["env_steps"]))
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log_row(row)

    def _write_all(self, rows: list[dict]) -> None:
        """Rewrite the file whole, so a kill meanwhile leaves the old one."""

        def write(temporary: Path) -> None:
            with temporary.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
                writer.writeheader()
                writer.writerows(rows)

        write_atomically(self.path, write)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


_LABEL_MARK = "label-arrival"  # the marks' matplotlib id, by which the figure is read back


class LearningCurve(NamedTuple):
    """What :func:`plot_learning_curve` drew, read back from the figure."""

    label_marks: tuple[float, ...]  # env steps of the marks: the chunks in which labels arrived


class LabelArrival(NamedTuple):
    env_steps: float  # the end of the chunk in which they arrived
    labels: float  # the labels held from then on


def label_arrivals(rows: list[dict]) -> list[LabelArrival]:
    """The chunks whose ``labels`` count rose: people's answers arrived during them (in the
    first chunk, also those answered before it)."""
    arrivals, held = [], 0.0
    for row in rows:
        labels = row.get("labels", math.nan)
        if labels > held:  # False for NaN: a row without the count
            arrivals.append(LabelArrival(row["env_steps"], labels))
            held = labels
    return arrivals


def judged_return(row: dict) -> float:
    """The true return a chunk's metrics row is judged by: the return on the task itself where the
    run scored one (``task_return``, ``run.score_on_task``: its training episodes are not the
    task's), its training episodes' otherwise (``episode_return``)."""
    return row["task_return"] if "task_return" in row else row.get("episode_return", math.nan)


def plot_learning_curve(rows: list[dict], path: Path, title: str, mark_labels: bool = False) -> LearningCurve:
    """True episode return against env steps (:func:`judged_return`), as a PNG; with ``mark_labels`` (a people run),
    a faint vertical line at the end of each chunk in which labels arrived."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r["env_steps"], judged_return(r)) for r in rows if not math.isnan(judged_return(r))]
    fig, ax = plt.subplots(figsize=(6, 4))
    if points:
        steps, returns = zip(*points)
        ax.plot(steps, returns, label="true episode return")
    arrivals = label_arrivals(rows) if mark_labels else []
    for i, arrival in enumerate(arrivals):
        ax.axvline(arrival.env_steps, color="tab:orange", alpha=0.4, linewidth=0.8, gid=_LABEL_MARK,
                   label=f"labels arrived ({int(arrivals[-1].labels)} in all)" if i == 0 else None)
    if arrivals:
        ax.legend(fontsize=8)
    ax.set_xlabel("env steps")
    ax.set_ylabel("true episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    drawn = LearningCurve(tuple(float(line.get_xdata()[0]) for line in ax.lines if line.get_gid() == _LABEL_MARK))
    plt.close(fig)
    return drawn
