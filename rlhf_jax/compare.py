"""``rlhf-jax stats DIR ...``: interquartile means with their stratified bootstrap intervals
(:mod:`rlhf_jax.statistics`) across runs made apart, not only within one sweep.

    rlhf-jax stats runs/labels100-* runs/labels500-* runs/sweep-rm-lr

Each ``DIR`` is a run directory (``config.yaml``, ``metrics.csv``) or a sweep directory
(``sweep.yaml``, ``members.csv``: each of its members is one run). A run's score is its final
true return, as a sweep's results judge it: the last row's
:func:`~rlhf_jax.metrics_log.judged_return` (on the task itself where the run scored one); a
run whose last chunk ended no episode has none and is left out, and said to be. Runs are
grouped by their resolved config, leaving aside what does not change the work (``seed``,
``name``, ``run.*``), or with ``--by KEY`` by those keys alone; a group is named by the keys in
which the groups differ. For each group it prints the number of runs, their final env steps (a
range where some have not finished), the mean and the IQM with its 95% interval, as a Markdown
table like a sweep's ``results.md``. rliable comes with the ``stats`` extra.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rlhf_jax.config_base import flat_keys
from rlhf_jax.errors import ConfigError
from rlhf_jax.statistics import CONFIDENCE, IntervalEstimate, interval_estimate, require_rliable, shown_iqm

# Config keys that never make two runs' work differ: left out of the grouping.
UNGROUPED = ("seed", "name", "run.")


class Scored(NamedTuple):
    """One run's final true return, with its resolved config (flat keys) and where it came from."""

    source: str  # the run directory, or "SWEEP_DIR member <i>"
    config: dict
    env_steps: float
    score: float  # NaN: its last chunk ended no episode


class Group(NamedTuple):
    label: str
    runs: list[Scored]  # the runs with a score
    unscored: int  # runs left out: no score
    estimate: IntervalEstimate | None  # None: no run with a score


def read_runs(directory: str | Path) -> list[Scored]:
    """The runs of a run directory (one) or a sweep directory (one per member)."""
    from rlhf_jax.config import ExperimentConfig, apply_overrides, build, to_dict
    from rlhf_jax.config_base import CONFIG_FILE
    from rlhf_jax.metrics_log import MetricsLog, judged_return
    from rlhf_jax.run_dir import load_run_config
    from rlhf_jax.sweep import SWEEP_FILE, Sweep, last_row

    directory = Path(directory)
    if (directory / SWEEP_FILE).is_file():
        sweep = Sweep.load(directory)
        members = {m.index: m for group in sweep.groups for m in group}
        rows: dict[int, list[dict]] = {}
        for row in sweep.rows():
            rows.setdefault(int(row["member"]), []).append(row)
        last = {member: last_row(member_rows) for member, member_rows in rows.items()}
        if not last:
            raise ConfigError(f"{directory} holds a sweep without rows in members.csv: none of its runs has "
                              f"finished a chunk")
        return [Scored(f"{directory} member {i}",
                       flat_keys(to_dict(build(ExperimentConfig, apply_overrides(sweep.base, members[i].overrides())))),
                       float(row["env_steps"]), float(judged_return(row)))
                for i, row in sorted(last.items())]
    if not directory.is_dir():
        raise ConfigError(f"{directory} does not exist")
    if not (directory / CONFIG_FILE).is_file():
        raise ConfigError(f"{directory} is neither a run directory ({CONFIG_FILE}) nor a sweep's (sweep.yaml)")
    config = flat_keys(to_dict(load_run_config(directory)))
    rows = MetricsLog(directory, tensorboard=False).rows()
    if not rows:
        raise ConfigError(f"{directory} has no rows in metrics.csv: the run has not finished a chunk")
    return [Scored(str(directory), config, rows[-1]["env_steps"], float(judged_return(rows[-1])))]


def group_runs(runs: list[Scored], by: list[str] = ()) -> dict[str, list[Scored]]:
    """The runs by their configs (``UNGROUPED`` keys aside) or, with ``by``, by those keys alone;
    each group named by the keys in which the groups differ ("all runs" if they are one)."""
    for key in by:
        if runs and key not in runs[0].config:
            raise ConfigError(f"--by {key}: no such config key; keys look like a2c.learning_rate or preferences.labels")

    def kept(key: str) -> bool:
        return key in by if by else not key.startswith(UNGROUPED)

    def identity(run: Scored) -> str:
        return json.dumps({k: v for k, v in run.config.items() if kept(k)}, sort_keys=True, default=str)

    grouped: dict[str, list[Scored]] = {}
    for run in runs:
        grouped.setdefault(identity(run), []).append(run)
    firsts = [members[0].config for members in grouped.values()]
    keys = [k for k in (by or firsts[0]) if kept(k) and len({json.dumps(c.get(k), default=str) for c in firsts}) > 1]
    return {(", ".join(f"{k}={members[0].config.get(k)}" for k in keys) or "all runs"): members
            for members in grouped.values()}


def compare(directories: list[str | Path], by: list[str] = ()) -> list[Group]:
    """Each group's runs (from ``directories``) and the IQM of their final true returns."""
    runs = [run for directory in directories for run in read_runs(directory)]
    require_rliable()  # before the work, in one line
    groups = []
    for label, members in group_runs(runs, list(by)).items():
        scored = [run for run in members if math.isfinite(run.score)]
        estimate = interval_estimate(np.array([[run.score] for run in scored])) if scored else None
        groups.append(Group(label, scored, len(members) - len(scored), estimate))
    return groups


def table(groups: list[Group]) -> str:
    lines = [f"| group | runs | env steps | final true return (mean) | IQM [{CONFIDENCE:.0%} interval] |",
             "|---|---|---|---|---|"]
    for group in groups:
        steps = sorted({int(run.env_steps) for run in group.runs})
        shown_steps = "" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
        e = group.estimate
        runs = f"{len(group.runs)}" + (f" (+{group.unscored} without a score)" if group.unscored else "")
        lines.append(f"| {group.label} | {runs} | {shown_steps} | {f'{e.mean:.1f}' if e else 'n/a'} | {shown_iqm(e)} |")
    return "\n".join(lines)
