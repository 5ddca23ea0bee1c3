"""The experiments of Christiano et al. 2017 as figures: true return against env steps.

    python -m experiments.reproduce --figure {2,3,5,6} [--tasks hopper,ant] [--budgets 350,1400]
        [--ablations "target,no ensemble"] [--baselines a2c,dqn] [--seeds N] [--steps N]
        [--points N] [--quick] [--dry-run] [--runs-dir runs/reproduce] [--backend {mjx,cpu}]

What each figure runs (configs in ``configs/paper/``, one panel per task, one line per
label budget or ablation, the agent on the true reward beside them, as in the paper):

* **2**: the eight MuJoCo tasks on MJX, TRPO from 350, 700 and 1,400 synthetic labels
  (``mujoco/<task>.yaml``) and TRPO on the true reward (``mujoco/<task>_trpo.yaml``); 5 seeds.
* **3**: the seven Atari games on EnvPool, A2C from 350, 700, 1,400 and 5,500 synthetic
  labels (``atari/<game>.yaml``) and A2C on the true reward (``atari/<game>_a2c.yaml``;
  ``--baselines a2c,dqn`` adds DQN, ``atari/<game>_dqn.yaml``); 3 seeds.
* **5**: the MuJoCo tasks at 700 labels with each ablation of section 3.3
  (``configs/paper/ablations.yaml``), beside the full method and RL; 5 seeds.
* **6**: the Atari games at 5,500 labels with the ablations except "no segments" (which
  the paper ran "on the robotics tasks only"); "no online queries" has 5,000 labels (A.2:
  "In the ablation studies ... pretraining has 5,000 labels rather than 5,500"); 3 seeds.

Every run is one :func:`rlhf_jax.trainer.train` of its config with ``key=value`` overrides
(budget, ablation, ``seed`` and ``env.seed``, and ``--steps``/``--points``), in a run
directory of its own under ``--runs-dir`` named by a fingerprint of the resolved config.
When a run finishes, its curve (``metrics.csv``: the mean true return of the episodes that
ended in each chunk, labels, reward accuracy) goes into the ledger
``experiments/results/reproduce_fig<N>_runs.json`` and the figure is redrawn. Run again, the
same command skips every run the ledger holds with the same fingerprint, continues an
interrupted one from its newest checkpoint (Ctrl-C saves one), and starts the rest; change
a setting and the runs it changes start afresh; so does a code change that alters results
once it is registered in ``RESULT_CHANGES``. Seeds go in the outer loop, so a figure
is complete at one seed before the second seed of any line starts. ``--dry-run`` prints
the plan as ``rlhf-jax train`` commands (to spread over machines) and runs nothing.

**--backend cpu** (figure 2): the eight tasks on EnvPool's C MuJoCo (``env.id`` set to
``envpool/<Task>-v5``, every other setting the config's), 5 copies per seed (see
``CPU_NUM_ENVS``), 1M env steps per seed in every cell, 5 seeds (the paper's five runs per
curve). A *cell* is one line of one panel with all its seeds, run as one program: a sweep
(:mod:`rlhf_jax.sweep`) whose seeds share one EnvPool pool, checkpointed every chunk, in
``runs/reproduce/fig2_cpu/<task>/<line>-<fingerprint>/``. A cell finished at fewer seeds (the
figure's first cells had 3) keeps them and runs the rest as a sweep of their own beside it
(:func:`later_seeds_config`). ``--dry-run`` prints, as ``rlhf-jax sweep`` commands, what the
same command would run now: the cells the ledger lacks, or only the seeds they lack (with
none left, a comment saying so).
The cells run RL and 700 labels task by task, then 1,400 labels, then 350. When a cell
finishes it goes into the ledger ``reproduce_fig2_cpu_runs.json`` and the figure and
``reproduce_fig2_cpu.json`` (per cell: each seed's final return, the mean, the wall time, the
curve; per task the ratios to RL and the table; the command and commit) are written again.
Run again, the same command skips finished cells and resumes a begun one from its newest
checkpoint; cells whose config changed since they ran are left out of the outputs until they
run again (:func:`current_records`). ``--baselines trpo,oracle`` adds TRPO on the oracle's reward with the ends hidden
(not a line of the paper; :data:`ORACLE_LINE`) on the tasks that end early when unhealthy.
``--ablations "no entropy bonus"`` adds the 700-label cell without TRPO's entropy bonus (not a
line of the paper either; :data:`OUR_ABLATIONS`), after every other cell; ``"reward dropout 0.5"``
the 700-label cell with dropout in r̂'s hidden layers, as the reference implementation fits it;
``"fitting 0.1 pairs per step"`` the 700-label cell fitting r̂ at the library's default rate,
``"fitting 0.3 pairs per step"`` at three times it (the configs' rate but InvertedPendulum's),
``"fitting 1.0 pairs per step"`` at ten times it (InvertedPendulum's; every config's until
2026-12-01). A cell whose config is one a line has already run with (the same fingerprint)
takes that line's runs instead of running again (:func:`with_identical_runs`).
``--steps N`` (other than 1M) is another figure beside this one, ``reproduce_fig2_cpu_2m.*``
for 2M (:func:`result_name`), with its own ledger and runs: the 1M figure stands meanwhile.

Outputs: ``experiments/results/reproduce_fig<N>.png`` (the figure: mean over seeds, the band
their range), ``reproduce_fig<N>.json`` (``write_result``: per task and line the mean curve
and the final return, the mean of the last tenth of each seed's curve) and the ledger.
``--quick`` writes ``reproduce_fig<N>_quick.*`` instead.

**--quick** (figure 5: 7.4 min measured on 2 CPU cores shared with other work, 4.7 min of
CPU time; compiling each config takes a good part of it): CartPole from
gymnax with the default experiment's A2C (``rlhf_jax/configs/default.yaml``; RL is
``configs/a2c_cartpole.yaml``), 153,600 env steps, one seed; figures 2 and 3 with 50 and
200 labels, figures 5 and 6 with 200 labels and the three ablations that hurt most on
CartPole (no online queries, no segments, target: see the README's ``labels_vs_return``;
``--ablations all`` for six). It checks the machinery and shows the figures' shape, not
the paper's numbers.

**The full figures need an accelerator.** One Atari run is 50M env steps of A2C with the
reward CNN fitted at 1 label per 10 steps; one MuJoCo run is 5M steps of TRPO on MJX, which
on a CPU steps about 50 times slower than C MuJoCo. Figure 2 is 160 runs (8 tasks x 4
lines x 5 seeds: 800M env steps), figure 3 105 runs (7 x 5 x 3: 5.25G env steps), figure 5
320 runs (1.6G), figure 6 147 runs (7.35G). No accelerator was lent to measure them; at an
assumed 10k env steps/s per run they take about 1, 6, 2 and 9 days of one device.
Each point of a curve is one chunk (``run.chunk_env_steps``: 50k env steps in these
configs, i.e. 200k Atari frames, near figure 3's "about 150,000 consecutive frames").
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
import time
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from benchmarks.common import cpu_overrides, enable_compilation_cache
from experiments.common import RESULTS, write_result
from experiments.records import (ROOT, attempts_of, duration, final_return, hosts_of, load_ledger, provenance_of,
                                 run_timed, save_json)
from rlhf_jax.cli import whole_number
from rlhf_jax.config import DEFAULT_EXPERIMENT_FILE, ExperimentConfig, flat_keys, load_config, to_dict
from rlhf_jax.config_base import read_yaml
from rlhf_jax.envs import make
from rlhf_jax.reward.config import resolve
from rlhf_jax.errors import ConfigError, Interrupted
from rlhf_jax.metrics_log import judged_return

CONFIGS = ROOT / "configs"
PAPER = CONFIGS / "paper"
ABLATIONS_FILE = PAPER / "ablations.yaml"
MIN_POINTS = 10  # a run with fewer chunks gets smaller ones, so that every curve has a shape


def read_ablations(path: str | Path = ABLATIONS_FILE) -> dict[str, list[str]]:
    """Section 3.3's ablations from ``configs/paper/ablations.yaml``: name -> overrides, in order."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ConfigError(f"{path}: expected a mapping of ablation names to lists of key=value overrides")
    return {str(name): [str(item) for item in overrides] for name, overrides in data.items()}


# Not the paper's: switches of the 700-label cell that the paper did not ablate, run like an
# ablation when named in ``--ablations``. A.1 adds TRPO's entropy bonus to every preference run
# without saying how it was weighed; the public reference implementation's TRPO has none. Section
# 2.2.3 applies dropout "in some domains" without naming them; the reference implementation's
# reward MLP for these tasks drops half of each hidden layer while it fits. The figure's configs
# fit r-hat on 0.3 pairs per env step (1 on InvertedPendulum), more than the library's default
# (the paper's Atari rate; it gives none for MuJoCo); the fitting is most of a loop's time
# (benchmarks/mujoco_throughput.py), so each rate tried is a line of its own: the default, 0.3
# and 1.0 (every config's until 2026-12-01, chosen on Hopper and Walker2d).
OUR_ABLATIONS = {"no entropy bonus": ["trpo.entropy_coef=0.0"],
                 "reward dropout 0.5": ["reward_model.mlp_dropout=0.5"],
                 "fitting 0.1 pairs per step": ["preferences.fit_pairs_per_env_step=0.1"],
                 "fitting 0.3 pairs per step": ["preferences.fit_pairs_per_env_step=0.3"],
                 "fitting 1.0 pairs per step": ["preferences.fit_pairs_per_env_step=1.0"]}


def known_ablations() -> dict[str, list[str]]:
    """Every ablation ``--ablations`` can name: the paper's (:func:`read_ablations`), then ours."""
    return {**read_ablations(), **OUR_ABLATIONS}


class Kind(StrEnum):
    """What a line of a panel is; the ledger stores it as its string. Declared in the order a
    panel lists its lines (:func:`_line_order`)."""

    LABELS = "labels"  # the preference method at one label budget: the paper's lines
    ABLATION = "ablation"  # a changed setting at the first budget
    BASELINE = "baseline"  # an agent on the environment's own reward (or the oracle's)


def budget_line(budget: int) -> str:
    """The line, and legend label, of a label budget: "700 labels" (:func:`budget_of` reads it back)."""
    return f"{budget} labels"


def budget_of(line: str) -> int:
    """The label budget of a :data:`Kind.LABELS` line (:func:`budget_line`)."""
    return int(line.removesuffix(" labels"))


class Baseline(NamedTuple):
    """An agent on the environment's own reward, drawn beside the label budgets."""

    name: str  # what ``--baselines`` calls it: "trpo", "a2c", "dqn", "oracle"
    config: Path
    overrides: tuple[str, ...] = ()
    legend: str = ""  # the line's label; "RL (<name>)" unless given

    @property
    def line(self) -> str:
        return self.legend or f"RL ({self.name})"


@dataclasses.dataclass(frozen=True)
class Task:
    """One panel: the preference config and the agents on the true reward to draw beside it."""

    title: str
    rlhf: Path
    baselines: tuple[Baseline, ...]  # the first is the paper's "RL"


def _atari(slug: str, title: str) -> Task:
    folder = PAPER / "atari"
    return Task(title, folder / f"{slug}.yaml",
                (Baseline("a2c", folder / f"{slug}_a2c.yaml"), Baseline("dqn", folder / f"{slug}_dqn.yaml")))


# Not a line of the paper's figure: TRPO on the oracle's own reward with the episode ends hidden,
# the task the preference runs face, so a panel shows how much of the gap to RL is the task
# change and how much is learning from labels (``--baselines trpo,oracle``). Only for the
# tasks that end early when unhealthy; on the others it would be RL again.
ORACLE_LINE = "TRPO on the oracle, ends hidden"


def _mujoco(slug: str, title: str, ends_when_unhealthy: bool) -> Task:
    folder = PAPER / "mujoco"
    rl, rlhf = folder / f"{slug}_trpo.yaml", folder / f"{slug}.yaml"
    oracle = (Baseline("oracle", rl, ("env.hide_episode_end=true", *preference_task(rlhf)), ORACLE_LINE),
              ) if ends_when_unhealthy else ()
    return Task(title, rlhf, (Baseline("trpo", rl), *oracle))


def preference_task(config_path: Path) -> tuple[str, ...]:
    """The overrides that give another run the preference config's task: its shortened episodes,
    where it has them (``env.max_episode_steps``), with their scoring on the task (its ``run``
    keys), and its oracle (``env.oracle``, ``env.termination_penalty``), where it sets them."""
    data = read_yaml(config_path)
    env = data.get("env", {})
    oracle = tuple(f"env.{key}={env[key]}" for key in ("oracle", "termination_penalty") if key in env)
    steps = env.get("max_episode_steps")
    if not steps:
        return oracle
    return (f"env.max_episode_steps={steps}", *oracle, *(f"run.{key}={value}" for key, value in data.get("run", {}).items()))


ATARI_TASKS = {slug: _atari(slug, title) for slug, title in [
    ("beamrider", "BeamRider"), ("breakout", "Breakout"), ("enduro", "Enduro"), ("pong", "Pong"),
    ("qbert", "Qbert"), ("seaquest", "SeaQuest"), ("spaceinvaders", "SpaceInvaders")]}
MUJOCO_TASKS = {slug: _mujoco(slug, title, unhealthy) for slug, title, unhealthy in [
    ("reacher", "Reacher", False), ("halfcheetah", "HalfCheetah", False), ("hopper", "Hopper", True),
    ("walker2d", "Walker2d", True), ("swimmer", "Swimmer", False), ("ant", "Ant", True),
    ("invertedpendulum", "InvertedPendulum", True), ("inverteddoublependulum", "InvertedDoublePendulum", True)]}


QUICK_TASKS = {"cartpole": Task("CartPole (gymnax)", Path(DEFAULT_EXPERIMENT_FILE),
                                (Baseline("a2c", CONFIGS / "a2c_cartpole.yaml"),))}


@dataclasses.dataclass(frozen=True)
class Figure:
    """What one of the paper's figures compares, and on which tasks."""

    number: int
    title: str
    tasks: dict
    budgets: tuple[int, ...]  # one line each; ablations run at the first
    seeds: int
    ablations: tuple[str, ...] = ()
    # More overrides for some ablations, applied when they run at the paper's budget (budgets[0]).
    ablation_extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


_ALL_ABLATIONS = tuple(read_ablations())
FIGURES = {
    2: Figure(2, "MuJoCo: synthetic labels against RL on the true reward", MUJOCO_TASKS, (350, 700, 1400), 5),
    3: Figure(3, "Atari: synthetic labels against RL on the true reward", ATARI_TASKS, (350, 700, 1400, 5500), 3),
    5: Figure(5, "MuJoCo ablations (700 labels)", MUJOCO_TASKS, (700,), 5, _ALL_ABLATIONS),
    6: Figure(6, "Atari ablations (5,500 labels)", ATARI_TASKS, (5500,), 3,
              tuple(a for a in _ALL_ABLATIONS if a != "no segments"),
              (("no online queries", ("preferences.labels=5000",)),)),
}
QUICK_STEPS = 153_600
QUICK_POINTS = 12
QUICK_BUDGETS = {2: (50, 200), 3: (50, 200), 5: (200,), 6: (200,)}
QUICK_ABLATIONS = ("no online queries", "no segments", "target")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the plan: a line of a panel, at one seed."""

    task: str
    line: str  # the legend's label: "700 labels", "RL (trpo)", "no ensemble"
    kind: Kind
    seed: int
    config_path: Path
    overrides: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.task}/{self.line}/seed{self.seed}"


def plan(figure: Figure, tasks: list[str], budgets: list[int], ablations: list[str],
         baselines: list[str], seeds: int, task_table: dict | None = None) -> list[Run]:
    """Every run of the figure, seed by seed (a figure is whole at one seed before the next)."""
    task_table = task_table or figure.tasks
    known = known_ablations()
    extra = dict(figure.ablation_extra) if budgets and budgets[0] == figure.budgets[0] else {}
    offered = {b.name for t in tasks for b in task_table[t].baselines}
    unknown = [b for b in baselines if b not in offered]
    if unknown:  # a baseline only some tasks have (TRPO on the oracle) is drawn where it exists
        raise ConfigError(f"no task has the baseline {unknown[0]!r}; they have {', '.join(sorted(offered))}")
    lines = []  # (task, line, kind, config, overrides) for one seed
    for name in tasks:
        task = task_table[name]
        lines += [(name, b.line, Kind.BASELINE, b.config, b.overrides)
                  for wanted in baselines for b in task.baselines if b.name == wanted]
        for budget in budgets:
            lines.append((name, budget_line(budget), Kind.LABELS, task.rlhf, (f"preferences.labels={budget}",)))
        for ablation in ablations:
            overrides = (f"preferences.labels={budgets[0]}", *known[ablation], *extra.get(ablation, ()))
            lines.append((name, ablation, Kind.ABLATION, task.rlhf, overrides))
    return [Run(task, line, kind, seed, config, tuple(overrides))
            for seed in range(seeds) for task, line, kind, config, overrides in lines]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# Fields added to the config after the first figure-2 cells had run, with the value that
# leaves a run as it was before them: at that value they stay out of the fingerprint, so a
# finished cell stays finished; set to anything else they make a new cell.
ADDED_AFTER_FIRST_CELLS = {("reward_model", "init_from"): "", ("preferences", "labels_from"): "",
                           ("preferences", "score_pairs"): 256, ("ibt", "marks_from"): "",
                           ("trpo", "normalize_value_targets"): False, ("run", "score_on_task"): False,
                           ("env", "oracle"): "penalty", ("trpo", "fisher_subsample"): 1,
                           ("reward_model", "clip_actions"): True, ("trpo", "normalize_observations"): False,
                           ("trpo", "observation_clip"): 5.0, ("trpo", "observation_min_std"): 0.1,
                           ("trpo", "observation_moments"): "before_update",
                           ("trpo", "kl_per_action_dimension"): False, ("env", "penalty_step"): "failing",
                           ("trpo", "entropy_per_action_dimension"): False, ("reward_model", "reads_action"): True}


@dataclasses.dataclass(frozen=True)
class ResultChange:
    """A change to the library after which a run of the same config computes something else:
    another draw of the same distribution (dropout's masks), another order of a sum (whose
    last bit a run of a million steps amplifies), a corrected rule. ``touches`` says which
    configs it reaches."""

    name: str  # short and never edited: it enters the fingerprint of every config it touches
    touches: Callable[[ExperimentConfig], bool]


# One entry per such change, appended in the commit that makes it: the cells it touches get
# another fingerprint, so the figure leaves their records out ("cells_made_by_an_earlier_config")
# and the same command runs them again on the new code. A change that only makes runs faster,
# bit for bit the same, needs none. (The changes before this list existed had their cells moved
# out of the ledger by hand: docs/reproducing.md.)
RESULT_CHANGES: tuple[ResultChange, ...] = (
    # rlhf_jax.reward.preference_learner.VALIDATION_PAIRS: past 1,024 labels held, the adaptive
    # l2 reads its losses on a sample of 1,024 of them, not on all.
    ResultChange("l2 losses on at most 1,024 labels", lambda config: config.reward == "preferences" and (
        config.preferences.label_capacity or config.preferences.labels) > 1_024),
    # rlhf_jax.ops.gaussian_kl through the variances' ratio (its curvature no longer overflows):
    # the same KL, rounded otherwise in float32. Only Gaussian policies use it, but the config
    # does not say whether the task's actions are continuous, so every TRPO config is touched.
    ResultChange("Gaussian KL through the variances' ratio", lambda config: config.agent == "trpo"),
)


def fingerprinted_fields(config: ExperimentConfig) -> dict:
    """The resolved config less the Weights & Biases settings (where metrics are also sent
    changes no result) and less the fields of ``ADDED_AFTER_FIRST_CELLS`` at their neutral
    value (an option added later must not make finished cells look new), with the names of
    the ``RESULT_CHANGES`` that touch it (a code change that alters results must)."""
    fields = to_dict(config)
    fields["run"] = {key: value for key, value in fields["run"].items() if not key.startswith("wandb")}
    for (section, key), neutral in ADDED_AFTER_FIRST_CELLS.items():
        if key in fields[section] and fields[section][key] == neutral:
            del fields[section][key]
    changes = [change.name for change in RESULT_CHANGES if change.touches(config)]
    if changes:  # absent while none touches it: the fingerprints of the cells made before the list
        fields["result_changes"] = changes
    return fields


def digest(fields: dict, length: int) -> str:
    """A config's fingerprint: the first ``length`` hex digits of the SHA-1 of its fields as
    sorted JSON (the run directories here take 10, the registrations' cells 12)."""
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:length]


def run_config(run: Run, steps: int, points: int, runs_dir: Path) -> ExperimentConfig:
    """The run's config: its file, its overrides, the seed, and ``--steps``/``--points``;
    ``run.dir`` is ``runs_dir/<task>/<line>/seed<k>-<fingerprint of everything else>``."""
    overrides = [*run.overrides, f"seed={run.seed}", f"env.seed={run.seed}", "run.tensorboard=false"]
    config = load_config(ExperimentConfig, run.config_path, overrides)
    total = steps or getattr(config, config.agent).total_env_steps
    if steps:
        overrides.append(f"{config.agent}.total_env_steps={steps}")
    chunk = config.run.chunk_env_steps
    if points:
        chunk = max(1, total // points)
    elif total // chunk < MIN_POINTS:
        chunk = max(1, total // MIN_POINTS)
    overrides.append(f"run.chunk_env_steps={chunk}")
    overrides += pinned_segment_length(config)
    config = load_config(ExperimentConfig, run.config_path, overrides)
    run_dir = runs_dir / run.task / slug(run.line) / f"seed{run.seed}-{digest(fingerprinted_fields(config), 10)}"
    return dataclasses.replace(config, run=dataclasses.replace(config.run, dir=str(run_dir)))


def pinned_segment_length(config: ExperimentConfig) -> list[str]:
    """The clip length a preference run resolves to, as an override: so that a run's command
    says it and its fingerprint covers it. The default rule changed once (MuJoCo clips were
    1.5 s of simulated time, 188 steps on Hopper, before they were the paper's 15 to 60
    steps), and a cell finished under the old rule was then taken for a finished one."""
    if config.reward != "preferences" or config.preferences.segment_length:
        return []
    spec = make(dataclasses.replace(config.env, num_envs=1)).spec
    return [f"preferences.segment_length={resolve(config.preferences, spec).segment_length}"]


def fingerprint_of(config: ExperimentConfig) -> str:
    return Path(config.run.dir).name.rsplit("-", 1)[-1]


def curve_of(rows: list[dict]) -> dict:
    """A run's rows (one per chunk) as the lists a ledger record keeps (NaN, a chunk where no
    episode ended, as None), with each chunk's ended episodes and env steps/s where the rows
    have them. ``episode_return`` is the return on the task itself: the run's ``task_return``
    where it scored one (``run.score_on_task``: its training episodes are not the task's), its
    training episodes' true return otherwise, kept then as ``training_return``."""
    column = lambda values: [None if math.isnan(v) else v for v in values]
    curve = {key: column(r[key] for r in rows)
             for key in ("env_steps", "labels", "reward_accuracy", "episodes", "steps_per_second")
             if rows and key in rows[0]}
    if rows:
        curve["episode_return"] = column(judged_return(r) for r in rows)
        if "task_return" in rows[0]:
            curve["training_return"] = column(r["episode_return"] for r in rows)
    return curve


def read_curve(run_dir: Path) -> dict:
    """A finished run's ``metrics.csv`` as :func:`curve_of` lists."""
    with (run_dir / "metrics.csv").open() as f:
        return curve_of([{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)])


def shown(path: Path) -> str:
    """A config's path as the ledger and the printed commands name it: from the repository root."""
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def run_command(run: Run, config: ExperimentConfig) -> str:
    """The ``rlhf-jax train`` command line that makes this run."""
    base = flat_keys(to_dict(load_config(ExperimentConfig, run.config_path, [])))
    changed = [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
               for key, value in flat_keys(to_dict(config)).items() if base[key] != value]
    return " ".join(["rlhf-jax train", shown(run.config_path), *(f"'{c}'" if " " in c else c for c in changed)])


def runs_to_do(runs: list[Run], ledger: dict, runs_dir: Path, steps: int = 0,
               points: int = 0) -> list[tuple[Run, ExperimentConfig]]:
    """The runs of ``runs`` that the ledger lacks at their config's fingerprint, with their configs."""
    todo = []
    for run in runs:
        config = run_config(run, steps, points, runs_dir)
        record = ledger["runs"].get(run.key)
        if record is None or record.get("fingerprint") != fingerprint_of(config):
            todo.append((run, config))
    return todo


def execute(runs: list[Run], ledger_path: Path, runs_dir: Path, steps: int = 0, points: int = 0,
            train_fn: Callable | None = None, progress: bool = True, after_run: Callable | None = None,
            provenance: dict | None = None) -> dict:
    """Train every run of ``runs`` that the ledger lacks, recording each as it finishes.

    ``train_fn(config, resume=None, progress=True)`` is :func:`rlhf_jax.trainer.train`
    unless given (the tests give a stand-in). ``after_run(ledger)`` is called after each
    run is recorded (the figure is redrawn there); ``provenance`` (:func:`experiments.records.provenance_of`)
    goes into each record, as :func:`execute_cells` puts it. Returns the ledger."""
    if train_fn is None:
        from rlhf_jax.trainer import train as train_fn
    ledger = load_ledger(ledger_path)
    todo = runs_to_do(runs, ledger, runs_dir, steps, points)
    print(f"{len(runs)} runs planned: {len(runs) - len(todo)} finished before (skipped), {len(todo)} to run",
          flush=True)
    spent = []
    for index, (run, config) in enumerate(todo):
        eta = f", about {duration(np.mean(spent) * (len(todo) - index))} left" if spent else ""
        print(f"[{index + 1}/{len(todo)}] {run.task}, {run.line}, seed {run.seed}{eta}", flush=True)
        run_dir = Path(config.run.dir)
        if (run_dir / "config.yaml").exists():  # begun before: go on from its newest checkpoint
            spent.append(run_timed(run_dir, lambda: train_fn(resume=run_dir, progress=progress)))
        else:
            spent.append(run_timed(run_dir, lambda: train_fn(config, progress=progress)))
        record = {"task": run.task, "line": run.line, "kind": run.kind, "seed": run.seed,
                  "config": shown(run.config_path),
                  "overrides": list(run.overrides), "fingerprint": fingerprint_of(config),
                  "run_dir": str(run_dir), "seconds": round(spent[-1], 1), **read_curve(run_dir),
                  **(provenance or {}), "attempts": attempts_of(run_dir)}
        ledger["runs"][run.key] = record
        save_json(ledger_path, ledger)
        final = final_return(record["episode_return"])
        print(f"    finished in {duration(spent[-1])}: final true return {final:.1f}" if final is not None
              else f"    finished in {duration(spent[-1])}: no episode ended", flush=True)
        if after_run is not None:
            after_run(ledger)
    return ledger


def _line_order(record: dict, ablation_names: list[str]) -> tuple:
    """Budgets from the smallest, then ablations in the order they are known, then baselines."""
    kind, line = Kind(record["kind"]), record["line"]
    rank = list(Kind).index(kind)
    if kind is Kind.LABELS:
        return rank, budget_of(line), ""
    if kind is Kind.ABLATION:
        names = ablation_names + [line]
        return rank, names.index(line), ""
    return rank, 0, line


def lines_by_task(ledger: dict, task_order: list[str]) -> dict:
    """{task: {line: [records of its seeds]}}, tasks and lines in the figure's order."""
    ablation_names = list(known_ablations())
    grouped: dict = {}
    records = sorted(ledger["runs"].values(), key=lambda r: _line_order(r, ablation_names))
    for record in records:
        grouped.setdefault(record["task"], {}).setdefault(record["line"], []).append(record)
    order = [t for t in task_order if t in grouped] + sorted(t for t in grouped if t not in task_order)
    return {task: grouped[task] for task in order}


def mean_curve(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Env steps and the mean, min and max over seeds of the true return (NaN where none)."""
    length = min(len(r["env_steps"]) for r in records)
    steps = np.asarray(records[0]["env_steps"][:length], dtype=float)
    returns = np.array([[np.nan if v is None else v for v in r["episode_return"][:length]] for r in records])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a point where no seed's episode ended
        return steps, np.nanmean(returns, 0), np.nanmin(returns, 0), np.nanmax(returns, 0)


def _colors(lines: list[str], kinds: dict) -> dict:
    import matplotlib

    blues = matplotlib.colormaps["Blues"]
    budgets = [line for line in lines if kinds[line] == Kind.LABELS]
    others = iter(["tab:green", "tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"])
    baselines = iter(["tab:orange", "tab:brown", "goldenrod"])
    colors = {}
    for line in lines:
        if kinds[line] == Kind.LABELS:
            shade = 0.45 + 0.5 * budgets.index(line) / (len(budgets) - 1) if len(budgets) > 1 else 0.85
            colors[line] = blues(shade)
        elif kinds[line] == Kind.BASELINE:
            colors[line] = next(baselines, "black")
        else:
            colors[line] = next(others, "black")
    return colors


def legend_label(line: str, record: dict, figure: Figure) -> str:
    """The line's name, and an ablation's budget where the figure draws several budgets."""
    budgets = [o.split("=", 1)[1] for o in record.get("overrides", ()) if o.startswith("preferences.labels=")]
    if record["kind"] != Kind.ABLATION or len(figure.budgets) == 1 or not budgets:
        return line
    return f"{line} ({budget_line(int(budgets[-1]))})"  # the last override wins, as the config reads them


def distinct_lines(lines: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """A panel's lines less each whose runs (fingerprint and seed) are those of a line before it:
    a cell that took another line's runs (:func:`with_identical_runs`), drawn over it, would hide
    it. Records without a fingerprint (ledgers older than fingerprints) are never taken for another's."""
    seen, kept = set(), {}
    for line, records in lines.items():
        runs = frozenset((record.get("fingerprint"), record["seed"]) for record in records)
        if runs in seen and all(record.get("fingerprint") for record in records):
            continue
        seen.add(runs)
        kept[line] = records
    return kept


def plot(ledger: dict, figure: Figure, task_order: list[str], path: Path, quick: bool) -> None:
    """One panel per task: each line's mean true return over seeds against env steps, the band their
    range; a line that is the same runs as one before it is drawn once (:func:`distinct_lines`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = lines_by_task(ledger, task_order)
    if not grouped:
        return
    columns = min(4, len(grouped))
    rows = math.ceil(len(grouped) / columns)
    width = max(6.0, 4.2 * columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width, 3.3 * rows + 1.0), squeeze=False)
    first_records = {}
    for lines in grouped.values():
        for line, records in lines.items():
            first_records.setdefault(line, records[0])
    # every panel's lines in one order (budgets, ablations, baselines): the colours' and the legend's
    ablation_names = list(known_ablations())
    order = sorted(first_records, key=lambda line: _line_order(first_records[line], ablation_names))
    kinds = {line: record["kind"] for line, record in first_records.items()}
    colors = _colors(order, kinds)
    handles = {}  # line -> the handle of its first drawing
    for ax, (task, lines) in zip(axes.flat, grouped.items()):
        for line, records in distinct_lines(lines).items():
            steps, mean, low, high = mean_curve(records)
            finite = np.isfinite(mean)
            style = "--" if kinds[line] == Kind.BASELINE else "-"
            (handle,) = ax.plot(steps[finite], mean[finite], style, color=colors[line], lw=1.6)
            if len(records) > 1:
                ax.fill_between(steps[finite], low[finite], high[finite], color=colors[line], alpha=0.15, lw=0)
            handles.setdefault(line, handle)
        seeds = sorted({len(r) for r in lines.values()})
        title = (QUICK_TASKS.get(task) or figure.tasks.get(task) or Task(task, Path(), ())).title
        ax.set_title(f"{title} ({'/'.join(map(str, seeds))} seed{'s' if seeds != [1] else ''})", fontsize=10)
        ax.set_xlabel("env steps")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(grouped):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("true episode return")
    name = f"Figure {figure.number}: {figure.title}"
    if quick:
        name = f"Figure {figure.number} (--quick: CartPole, a short run)"
    fig.suptitle(name)
    drawn = [line for line in order if line in handles]
    labels = [legend_label(line, first_records[line], figure) for line in drawn]
    # as many columns as the longest label leaves room for (about 0.07 inch a character at size 9)
    entry_width = 0.6 + 0.07 * max(map(len, labels))
    legend_columns = max(1, min(len(labels), int(width / entry_width)))
    fig.legend([handles[line] for line in drawn], labels, loc="lower center", ncol=legend_columns, fontsize=9,
               frameon=False)
    height = fig.get_size_inches()[1]
    legend_rows = math.ceil(len(labels) / legend_columns)
    fig.tight_layout(rect=(0, (0.3 * legend_rows + 0.15) / height, 1, 1 - 0.1 / height))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(ledger: dict, task_order: list[str], max_points: int = 200) -> dict:
    """Per task and line: the seeds' final returns, the mean curve (at most ``max_points``), the
    command and commit that made it, and the hosts it ran on (CPU, vector extensions, XLA flags)."""
    result = {}
    for task, lines in lines_by_task(ledger, task_order).items():
        result[task] = {}
        for line, records in lines.items():
            steps, mean, _, _ = mean_curve(records)
            every = max(1, math.ceil(len(steps) / max_points))
            finals = [final_return(r["episode_return"]) for r in records]
            known = [f for f in finals if f is not None]
            result[task][line] = {
                "kind": records[0]["kind"],
                "seeds": len(records),
                "final_return": float(np.mean(known)) if known else None,
                "final_return_per_seed": finals,
                "seconds_per_seed": [r["seconds"] for r in records],
                # What made the cell (one sweep: the same for every seed); absent from old ledgers.
                "made_by": sorted({(r.get("command"), r.get("commit")) for r in records if "commit" in r}),
                "hosts": hosts_of(records),
                "env_steps": steps[::every].tolist(),
                "mean_return": [None if not np.isfinite(v) else round(float(v), 3) for v in mean[::every]],
            }
    return result


def table(result: dict) -> str:
    lines = ["| task | line | seeds | final true return (per seed) |", "| --- | --- | --- | --- |"]
    for task, cells in result.items():
        for line, cell in cells.items():
            per_seed = ", ".join("-" if f is None else f"{f:.1f}" for f in cell["final_return_per_seed"])
            mean = "-" if cell["final_return"] is None else f"{cell['final_return']:.1f}"
            lines.append(f"| {task} | {line} | {cell['seeds']} | {mean} ({per_seed}) |")
    return "\n".join(lines)


def _csv(text: str | None) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()] if text else []


# ------------------------------------------------------------------ the CPU back end
# --backend cpu: figure 2 on EnvPool's C MuJoCo, each cell (a task's line) its seeds as one
# program: a sweep (rlhf_jax.sweep) whose members share one pool of seeds x copies.
CPU_SEEDS = 5  # "All curves are the average of 5 runs" (figure 2's caption)
# Copies per seed. TRPO's batch of 5,000 env steps is then 1,000 steps of each copy: whole
# episodes. With 64 copies started together (ends hidden: every episode 1,000 steps) each batch
# would hold one 79-step phase of all of them, and the trust region would bound the policy's
# change on that phase alone (configs/trpo_pendulum.yaml shows what that does).
CPU_NUM_ENVS = 5
CPU_STEPS = 1_000_000  # per seed, every cell (the README's figure-2 section says why)
CPU_POINTS = 25
CPU_BUDGETS = (700, 1400, 350)  # the 700-label column first, beside RL; then 1,400, then 350


@dataclasses.dataclass(frozen=True)
class Cell:
    """One line of one panel, all its seeds: one compiled program on the CPU back end."""

    task: str
    line: str
    kind: Kind
    config_path: Path
    overrides: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.task}/{self.line}"


def cpu_cells(figure: Figure, tasks: list[str], budgets: list[int], baselines: list[str],
              ablations: list[str] = ()) -> list[Cell]:
    """The cells in the order they run: RL and the first budget task by task, then the second
    budget across the tasks, then TRPO on the oracle (if asked for), then the other budgets,
    then the ablations (at the first budget), one column each."""
    runs = plan(figure, tasks, budgets, list(ablations), baselines, 1)

    def column(run: Run) -> float:
        if run.kind == Kind.BASELINE:
            return 1.5 if run.line == ORACLE_LINE else 0
        if run.kind == Kind.ABLATION:
            return len(budgets) + list(ablations).index(run.line)
        return budgets.index(budget_of(run.line))

    ordered = sorted(runs, key=lambda run: (column(run), tasks.index(run.task)))
    return [Cell(run.task, run.line, run.kind, run.config_path,
                 (*run.overrides, *cpu_overrides(run.config_path), f"env.num_envs={CPU_NUM_ENVS}"))
            for run in ordered]


def cell_config(cell: Cell, steps: int, points: int, runs_dir: Path) -> ExperimentConfig:
    """The cell's config at its first seed (the sweep adds the others), checkpointed every chunk;
    its directory ``runs_dir/<task>/<line>-<fingerprint>``."""
    run = Run(cell.task, cell.line, cell.kind, 0, cell.config_path, (*cell.overrides, "run.checkpoint_every_updates=1"))
    config = run_config(run, steps, points, runs_dir)
    directory = runs_dir / cell.task / f"{slug(cell.line)}-{fingerprint_of(config)}"
    return dataclasses.replace(config, run=dataclasses.replace(config.run, dir=str(directory)))


def sweep_records(cell: Cell, config: ExperimentConfig, directory: Path, seconds: float) -> list[dict]:
    """The finished sweep's rows (``members.csv``) as one ledger record per seed."""
    from rlhf_jax.sweep import Sweep

    rows = Sweep.load(directory).rows()
    records = []
    for seed in sorted({int(r["seed"]) for r in rows}):
        curve = curve_of(sorted((r for r in rows if int(r["seed"]) == seed), key=lambda r: r["chunk"]))
        records.append({"task": cell.task, "line": cell.line, "kind": cell.kind, "seed": seed, "backend": "cpu",
                        "config": shown(cell.config_path), "overrides": list(cell.overrides),
                        "fingerprint": fingerprint_of(config), "run_dir": str(directory),
                        "seconds": round(seconds, 1), **curve})
    return records


def run_or_resume_sweep(directory: Path, base: dict, seeds: int) -> None:
    """The sweep of ``seeds`` seeds on ``base`` in ``directory``, or, begun before there, the same
    sweep from its newest checkpoint. A cell's directory is named by its config's fingerprint, so
    what is there is this config's sweep."""
    from rlhf_jax.sweep import SWEEP_FILE, Sweep

    if (directory / SWEEP_FILE).exists():
        sweep = Sweep.load(directory)
        if sweep.seeds != seeds:  # a start with another count must not pass for this one
            raise ValueError(f"{directory} holds a sweep of {sweep.seeds} seeds, not {seeds}: "
                             f"remove it or ask for {sweep.seeds}")
        sweep.run()
    else:
        Sweep.create(directory, base, {}, seeds).run()


def execute_cells(cells: list[tuple[Cell, ExperimentConfig]], ledger_path: Path, seeds: int,
                  after_cell: Callable | None = None, run_sweep: Callable | None = None,
                  provenance: dict | None = None) -> dict:
    """Run every cell the ledger lacks, one sweep of ``seeds`` seeds each on its config (its
    :func:`cell_config`), and record it when it finishes. A cell begun before goes on from its
    newest checkpoint (every chunk has one); a finished one never runs again.
    ``run_sweep(directory, base, seeds)`` is the sweep unless given (the tests give a stand-in);
    ``after_cell(ledger)`` runs after each cell is recorded; ``provenance`` (the command, the
    commit this process runs and the processor, :func:`experiments.records.provenance_of`) goes into each record."""
    run_sweep = run_sweep or run_or_resume_sweep
    ledger, shared = with_identical_runs(load_ledger(ledger_path), cells, seeds)
    if shared:
        print(f"already run under another line, with the same config: {', '.join(shared)}", flush=True)
        save_json(ledger_path, ledger)
    todo = cells_to_run(cells, ledger, seeds)
    print(f"{len(cells)} cells planned ({seeds} seeds each, one program per cell): "
          f"{len(cells) - len(todo)} finished before (skipped), {len(todo)} to run", flush=True)
    for index, (cell, config, first) in enumerate(todo):
        which = f", seeds {first}-{seeds - 1} beside the {first} finished" if first else ""
        print(f"[{index + 1}/{len(todo)}] {cell.task}, {cell.line}{which} (load {os.getloadavg()[0]:.1f})", flush=True)
        directory = Path(config.run.dir)
        seconds = run_timed(directory, lambda: run_sweep(directory, to_dict(config), seeds - first))
        records = sweep_records(cell, config, directory, seconds)
        for record in records:
            ledger["runs"][f"{cell.key}/seed{record['seed']}"] = {**record, **(provenance or {}),
                                                                 "attempts": attempts_of(directory)}
        save_json(ledger_path, ledger)
        finals = [final_return(r["episode_return"]) for r in records]
        print(f"    finished in {duration(seconds)}: final true returns "
              f"{', '.join('-' if f is None else f'{f:.1f}' for f in finals)}", flush=True)
        if after_cell is not None:
            after_cell(ledger)
    return ledger


def with_identical_runs(ledger: dict, cells: list[tuple[Cell, ExperimentConfig]],
                        seeds: int) -> tuple[dict, list[str]]:
    """The ledger with each seed a cell lacks taken from a run of the same task, seed and
    fingerprint recorded under another line, and the keys of the cells so filled. The
    fingerprint covers the whole resolved config but not the line's name, so such a run is the
    cell's own: when a config comes to say what an ablation of it said (the 700-label cell fitting
    at 0.3 is the run "fitting 0.3 pairs per step" made), the run is not made twice. Each copy
    keeps the command and commit that made it and names the line it was first recorded under.
    The runs are looked up in the ledger as it came, so that a record about to be replaced (the
    700-label cell of the config before) still gives its run to the line that has its config now
    ("fitting 1.0 pairs per step")."""
    finished = {(r["task"], r.get("fingerprint"), r["seed"]): r for r in ledger["runs"].values()}
    runs, filled = dict(ledger["runs"]), set()
    for cell, config in cells:
        fingerprint = fingerprint_of(config)
        for seed in range(seeds):
            key, same = f"{cell.key}/seed{seed}", finished.get((cell.task, fingerprint, seed))
            if same is None or ledger["runs"].get(key, {}).get("fingerprint") == fingerprint:
                continue
            runs[key] = {**same, "line": cell.line, "kind": cell.kind, "overrides": list(cell.overrides),
                         "first_recorded_as": same.get("first_recorded_as", same["line"])}
            filled.add(cell.key)
    return {**ledger, "runs": runs}, sorted(filled)


def cells_to_run(cells: list[tuple[Cell, ExperimentConfig]], ledger: dict,
                 seeds: int) -> list[tuple[Cell, ExperimentConfig, int]]:
    """The cells the ledger lacks a seed of, each with the config its missing seeds run on (the
    cell's own, or :func:`later_seeds_config` beside the seeds it kept) and the first of them."""
    todo = []
    for cell, config in cells:
        first = first_unfinished_seed(ledger, cell, fingerprint_of(config), seeds)
        if first < seeds:
            todo.append((cell, config if first == 0 else later_seeds_config(config, first), first))
    return todo


def sweep_command(cell: Cell, config: ExperimentConfig, seeds: int) -> str:
    """The ``rlhf-jax sweep`` command line that runs ``seeds`` seeds of the cell on ``config``
    (its base seed, pool seed and directory among the keys), as ``--dry-run`` prints it."""
    keys = run_command(Run(cell.task, cell.line, cell.kind, 0, cell.config_path, ()), config).removeprefix("rlhf-jax train ")
    return f"rlhf-jax sweep {keys} --seeds {seeds} --dir {config.run.dir}   # {cell.key}"


def first_unfinished_seed(ledger: dict, cell: Cell, fingerprint: str, seeds: int) -> int:
    """The first of the cell's ``seeds`` seeds the ledger lacks on the cell's config today, from
    which on it runs; ``seeds`` when every one is there. A cell finished at fewer seeds than
    asked for now keeps them and runs only the rest (seeds 3 and 4 of a cell that ran at 3)."""
    for seed in range(seeds):
        record = ledger["runs"].get(f"{cell.key}/seed{seed}")
        if not (record and record.get("fingerprint") == fingerprint):
            return seed
    return seeds


def later_seeds_config(config: ExperimentConfig, first: int) -> ExperimentConfig:
    """The cell's config for its seeds from ``first`` on, run as a sweep of their own beside the
    cell's finished one (``<line>-from-seed<first>-<fingerprint>``, the cell's fingerprint). The
    pool seeds its copy i with ``env.seed + i``, so the later seeds' copies start from the env
    seeds one sweep of every seed would have given them: none is shared with an earlier seed."""
    directory, fingerprint = Path(config.run.dir), fingerprint_of(config)
    line = directory.name.removesuffix(f"-{fingerprint}")
    return dataclasses.replace(
        config, seed=first, env=dataclasses.replace(config.env, seed=first * config.env.num_envs),
        run=dataclasses.replace(config.run, dir=str(directory.parent / f"{line}-from-seed{first}-{fingerprint}")))


def current_records(ledger: dict, fingerprints: dict[str, str]) -> tuple[dict, list[str]]:
    """The ledger less the records an earlier config made of a cell planned now (their
    fingerprint is not the one ``fingerprints``, cell key to fingerprint, gives the cell today: a
    config file changed since they ran), and the keys of those cells. Such records stay in the
    ledger file until their cell runs again; the figure, the table and the headline leave them
    out, so that no panel sets cells of two configs side by side unsaid."""
    kept, stale = {}, set()
    for key, record in ledger["runs"].items():
        cell = f"{record['task']}/{record['line']}"
        if cell in fingerprints and record.get("fingerprint") != fingerprints[cell]:
            stale.add(cell)
        else:
            kept[key] = record
    return {**ledger, "runs": kept}, sorted(stale)


def rl_cell(cells: dict) -> dict | None:
    """A panel's paper's "RL" cell (an agent on the true reward, ``RL (<agent>)``), or None
    before it has run; TRPO on the oracle (:data:`ORACLE_LINE`) is not it."""
    return next((cell for line, cell in cells.items() if line.startswith("RL (")), None)


def with_ratios(result: dict) -> dict:
    """Each line's final return beside RL's (the task's baseline) at the same steps: the plain
    ratio where RL's return is positive, and the ratio of the gains over the untrained policy,
    which also reads right for negative returns. The untrained policy's return is the mean first
    point of the paper's lines of the panel (RL and the label budgets), so that a line of ours
    added to a panel moves no other line's ratio."""
    for task, lines in result.items():
        rl = rl_cell(lines)
        papers = [cell for cell in lines.values() if cell is rl or cell["kind"] == Kind.LABELS]
        starts = [cell["mean_return"][0] for cell in papers if cell["mean_return"][0] is not None]
        start = float(np.mean(starts)) if starts else None
        for line, cell in lines.items():
            final, base = cell["final_return"], rl and rl["final_return"]
            known = final is not None and base is not None
            cell["ratio_to_rl"] = round(final / base, 4) if known and base > 0 else None
            gain = known and start is not None and base - start
            cell["gain_ratio_to_rl"] = round((final - start) / gain, 4) if gain and gain > 0 else None
    return result


def gain_ratios(result: dict, line: str) -> dict[str, float | None]:
    """Each task's gain ratio to RL (:func:`with_ratios`) for ``line``, a label budget's or an
    ablation's, on the tasks where both have run."""
    return {task: lines[line]["gain_ratio_to_rl"] for task, lines in result.items()
            if line in lines and rl_cell(lines) is not None}


def tasks_at(gains: dict[str, float | None], threshold: float = 0.8) -> int:
    """How many tasks reach ``threshold`` of RL's gain: the paper's claim counts them at 700 labels."""
    return sum(1 for gain in gains.values() if gain is not None and gain >= threshold)


def claim_counts(result: dict, budgets: list[int], ablations: list[str]) -> dict:
    """How many tasks reach 0.8 of RL's gain: the paper's claim at 700 labels, then every label
    budget and every line of ours at 700 labels beside it."""
    return {"tasks_at_0.8_from_700_labels": tasks_at(gain_ratios(result, budget_line(700))),
            "tasks_at_0.8_by_budget": {budget_line(b): tasks_at(gain_ratios(result, budget_line(b))) for b in budgets},
            "tasks_at_0.8_by_ablation": {line: tasks_at(gain_ratios(result, line)) for line in ablations}}


def ratio_table(result: dict, budgets: list[int], seeds: int | None = None) -> str:
    """Markdown: per task, RL's final return and each budget's, with its ratios to RL; then TRPO
    on the oracle with the ends hidden and each ablation, where any task has that line. A cell
    that has run fewer than the planned ``seeds`` so far says how many, ``[3]``, so that a mean
    of three is not read beside the others' five unsaid."""
    columns = [budget_line(b) for b in budgets]
    columns += [line for line in (ORACLE_LINE, *known_ablations()) if any(line in cells for cells in result.values())]
    head = ["| task | RL (TRPO, true reward) |"] + [f" {c} |" for c in columns]
    lines = ["".join(head), "| --- | ---: |" + " ---: |" * len(columns)]

    def short(cell: dict) -> str:
        return f" [{cell['seeds']}]" if seeds is not None and cell["seeds"] < seeds else ""

    for task, cells in result.items():
        rl = rl_cell(cells)
        row = [f"| {task} | {_number(rl and rl['final_return'])}{short(rl) if rl else ''} |"]
        for column in columns:
            cell = cells.get(column)
            row.append(" |" if cell is None else f" {_number(cell['final_return'])} "
                       f"({_number(cell['ratio_to_rl'], 2)}; {_number(cell['gain_ratio_to_rl'], 2)}){short(cell)} |")
        lines.append("".join(row))
    return "\n".join(lines)


def _number(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cpu_headline(result: dict) -> list:
    """The report's rows: each task's 700-label cell against RL (target 0.8 of RL's gain over the
    untrained policy), and how many tasks meet it (the paper's claim: at least 6 of 8)."""
    from benchmarks.common import Headline, Target

    rows = []
    for task, cells in result["tasks"].items():
        rl = rl_cell(cells)
        cell = cells.get(budget_line(700))
        if cell is None or rl is None:
            continue
        rows.append(Headline(f"Figure 2 on the CPU, {task}: final true return from 700 labels vs TRPO on the true "
                             f"reward (ratio of gains over the untrained policy)", cell["final_return"],
                             rl["final_return"], cell["gain_ratio_to_rl"],
                             Target.on(result, f"{task}_700_labels_gain_ratio", ">=", 0.8)))
    rows.append(Headline("Figure 2 on the CPU: tasks whose 700-label cell reaches 0.8 of RL (of those finished)",
                         result["tasks_at_0.8_from_700_labels"], len(rows), None,
                         Target.on(result, "tasks_at_0.8_from_700_labels", ">=", 6)))
    return rows


def result_name(figure: int, quick: bool, cpu: bool, steps: int) -> str:
    """The stem of a figure's JSON, PNG, ledger and runs directory. On the CPU another budget
    than :data:`CPU_STEPS` is another figure (``reproduce_fig2_cpu_2m``): its cells would
    otherwise replace the standing figure's, which then lacks them until they all run again."""
    name = f"reproduce_fig{figure}" + ("_quick" if quick else "") + ("_cpu" if cpu else "")
    if cpu and steps != CPU_STEPS:
        name += f"_{steps // 1_000_000}m" if steps % 1_000_000 == 0 else f"_{steps // 1000}k"
    return name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figure", type=int, choices=sorted(FIGURES), required=True)
    parser.add_argument("--tasks", help="comma-separated (default: the figure's); Atari: "
                        f"{', '.join(ATARI_TASKS)}; MuJoCo: {', '.join(MUJOCO_TASKS)}")
    parser.add_argument("--budgets", help="label budgets, comma-separated (figures 5 and 6: the first is the ablations')")
    parser.add_argument("--ablations", help="figures 5 and 6 (and 2 with --backend cpu): comma-separated names from "
                        f"configs/paper/ablations.yaml or ours ({', '.join(map(repr, OUR_ABLATIONS))}), "
                        "'all' (the paper's) or 'none'")
    parser.add_argument("--baselines", help="agents on the true reward: a2c, dqn (Atari), trpo (MuJoCo), or 'none'")
    parser.add_argument("--seeds", type=whole_number(1), help="runs per line (default: the paper's, 5 MuJoCo, 3 Atari; --quick 1)")
    parser.add_argument("--steps", type=whole_number(0), default=0, help="env steps per run (default: each config's)")
    parser.add_argument("--points", type=whole_number(0), default=0, help="chunks per run, i.e. points per curve "
                        f"(default: each config's chunk size, at least {MIN_POINTS} points)")
    parser.add_argument("--quick", action="store_true", help="CartPole, short runs, one seed: a few minutes on a CPU")
    parser.add_argument("--dry-run", action="store_true", help="print the runs as rlhf-jax train commands; run nothing")
    parser.add_argument("--runs-dir", default="runs/reproduce", help="where the runs' directories go")
    parser.add_argument("--backend", choices=("mjx", "cpu"), default="mjx",
                        help="figure 2's MuJoCo: mjx (the configs' own, for an accelerator) or cpu (EnvPool's C "
                        f"MuJoCo, {CPU_SEEDS} seeds per cell vmapped in one program, {CPU_STEPS:,} env steps each)")
    args = parser.parse_args(argv)

    figure = FIGURES[args.figure]
    cpu = args.backend == "cpu"
    if cpu and (args.figure != 2 or args.quick):
        parser.error("--backend cpu runs figure 2 (without --quick)")
    task_table = QUICK_TASKS if args.quick else figure.tasks
    tasks = _csv(args.tasks) or list(task_table)
    unknown = [t for t in tasks if t not in task_table]
    if unknown:
        parser.error(f"unknown tasks {unknown} for figure {figure.number}{' --quick' if args.quick else ''}; "
                     f"known: {', '.join(task_table)}")
    budgets = [int(b) for b in _csv(args.budgets)] or list(
        QUICK_BUDGETS[figure.number] if args.quick else CPU_BUDGETS if cpu else figure.budgets)
    if args.ablations in ("all", "none"):
        ablations = list(read_ablations()) if args.ablations == "all" else []
    elif args.ablations:
        ablations = _csv(args.ablations)
    else:
        ablations = [a for a in QUICK_ABLATIONS if a in figure.ablations] if args.quick else list(figure.ablations)
    missing = [a for a in ablations if a not in known_ablations()]
    if missing:
        parser.error(f"unknown ablations {missing}; known: {', '.join(known_ablations())}")
    if args.baselines == "none":
        baselines = []
    elif args.baselines:
        baselines = _csv(args.baselines)
    else:  # the paper's "RL": the task's first baseline
        baselines = [task_table[tasks[0]].baselines[0].name]
    seeds = args.seeds or (1 if args.quick else CPU_SEEDS if cpu else figure.seeds)
    steps = args.steps or (QUICK_STEPS if args.quick else CPU_STEPS if cpu else 0)
    points = args.points or (QUICK_POINTS if args.quick else CPU_POINTS if cpu else 0)
    try:
        runs = plan(figure, tasks, budgets, ablations, baselines, seeds, task_table)
    except ConfigError as error:
        parser.error(str(error))

    name = result_name(figure.number, args.quick, cpu, steps)
    runs_dir = Path(args.runs_dir) / name.removeprefix("reproduce_")
    # each CPU cell with its config, made once: the fingerprints, the dry run and the runs read it
    cells = [(cell, cell_config(cell, steps, points, runs_dir))
             for cell in (cpu_cells(figure, tasks, budgets, baselines, ablations) if cpu else [])]
    ledger_path = RESULTS / f"{name}_runs.json"
    if args.dry_run:
        if cpu:  # what the same command would run now: the cells, or their seeds, the ledger lacks
            to_run = cells_to_run(cells, with_identical_runs(load_ledger(ledger_path), cells, seeds)[0], seeds)
            for cell, config, first in to_run:
                print(sweep_command(cell, config, seeds - first))
            if not to_run:  # a comment, so that the output stays a script
                print(f"# nothing to run: the {len(cells)} cells have {seeds} seeds each in {ledger_path.name}")
            return
        for run in runs:
            config = run_config(run, steps, points, runs_dir)
            print(f"{run_command(run, config)}   # {run.key}")
        return
    enable_compilation_cache()
    provenance = provenance_of("experiments.reproduce", argv)
    png = RESULTS / f"{name}.png"
    task_order = list(task_table)
    start = time.perf_counter()
    title = f"{figure.title}; --quick: CartPole, short runs" if args.quick else figure.title
    if cpu:
        title = f"{figure.title} (EnvPool C MuJoCo on the CPU, {seeds} seeds per cell, {steps:,} env steps each)"

    fingerprints = {cell.key: fingerprint_of(config) for cell, config in cells}

    def publish(ledger: dict) -> dict:
        """The figure, and the JSON of every finished cell: after each one, and at the end."""
        ledger, stale = current_records(ledger, fingerprints)
        plot(ledger, figure, task_order, png, args.quick)
        result = summary(ledger, task_order)
        extra = {}
        if cpu:
            result = with_ratios(result)
            gains = gain_ratios(result, budget_line(700))
            extra = {**provenance, "cells_finished": sorted({f"{r['task']}/{r['line']}" for r in ledger["runs"].values()}),
                     # finished under an earlier config; left out of every figure below until they run again
                     "cells_made_by_an_earlier_config": stale,
                     "table": ratio_table(result, budgets, seeds),
                     **{f"{task}_700_labels_gain_ratio": gain for task, gain in gains.items()},
                     **claim_counts(result, budgets, ablations)}
        write_result(name, {
            "figure": figure.number, "quick": args.quick, "backend": args.backend, "title": title,
            "planned": {"tasks": tasks, "budgets": budgets, "ablations": ablations, "baselines": baselines,
                        "seeds": seeds, "steps": steps or "each config's", "points": points or "each config's"},
            "seconds_this_invocation": round(time.perf_counter() - start, 1),
            "figure_png": str(png.relative_to(ROOT)), "ledger": str(ledger_path.relative_to(ROOT)),
            **extra, "tasks": result,
        }, headline=cpu_headline if cpu else None)
        return result

    try:
        if cpu:
            ledger = execute_cells(cells, ledger_path, seeds, after_cell=publish,
                                   provenance=provenance)
        else:
            ledger = execute(runs, ledger_path, runs_dir, steps, points, provenance=provenance,
                             after_run=lambda ledger: plot(ledger, figure, task_order, png, args.quick))
    except (KeyboardInterrupt, Interrupted) as stop:
        # Ctrl-C inside a cell reaches here as the run's Interrupted, its checkpoint whole.
        print(f"\ninterrupted: finished runs are in {ledger_path}; the same command goes on from there",
              file=sys.stderr)
        sys.exit(stop.exit_code if isinstance(stop, Interrupted) else 130)
    result = publish(ledger)
    print(ratio_table(result, budgets, seeds) if cpu else table(result))


if __name__ == "__main__":
    main()
