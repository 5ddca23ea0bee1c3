"""Figure 2, confirmatory: register its cells, run them, and report them by the registered rule.

    python -m experiments.confirm register figure2_1m      # writes experiments/registrations/figure2_1m.yaml
    python -m experiments.confirm run experiments/registrations/figure2_1m.yaml [--cells hopper/700 labels,...]
    python -m experiments.confirm report experiments/registrations/figure2_1m.yaml

``register`` writes a new registration (:mod:`experiments.protocol`) from today's configs: it
is committed before ``run`` runs its first cell. ``run`` runs the cells in the file's order,
each as one ``rlhf-jax sweep`` of its seeds on EnvPool's C MuJoCo (every seed one member of one
compiled program, checkpointed after every chunk, so the same command goes on from the last
chunk after a stop), and records each finished cell in ``experiments/results/<name>_runs.json``
with the command, the commit and the host (:func:`benchmarks.common.cpu_host`). A cell whose
config's fingerprint is not the registered one is refused before it runs and again before it
is recorded. ``report`` (also written after every cell) is ``experiments/results/<name>.json``
and ``.png``: per task the seeds' final returns, each label budget's gain ratio with its
intervals, the counts the decision rule reads, and how the RL line compares with a reference
TRPO (:func:`experiments.trpo_reference.figure_rl_line`).

The designs (:data:`DESIGNS`), fixed here and copied into each registration:

* ``figure2_1m``: 1M env steps per seed; RL and 700 labels at 10 seeds (100-109), 1,400 and
  350 labels at 5 (100-104), on all eight tasks;
* ``figure2_5m``: 5M env steps per seed, the paper's scale; RL and 700 labels at 5 seeds
  (200-204), on all eight tasks;
* ``figure2_own_episodes_1m``: as ``figure2_1m``'s RL and 700-label lines (10 seeds, 300-309),
  with each task's own episode length in the label runs in place of 200 steps on the five
  tasks with ends: ``figure2_1m``'s Hopper and Walker2d label policies fell on the true task
  after the 200 steps they were trained on (``experiments/log/figure2.md``).

* ``figure2_matched_1m`` and ``figure2_matched_5m``: ``figure2_1m``'s four lines (seeds 400-409,
  400-404) and ``figure2_5m``'s two (500-504) with the agent matched against the reference TRPO
  (:data:`MATCHED_TRPO`, in every cell) and each task's own episodes in the label runs (one value
  for all eight, as in ``figure2_own_episodes_1m``).

* ``figure2_reset_1m`` and ``figure2_reset_5m``: ``figure2_matched_1m``'s four lines (seeds 600-609,
  600-604) and ``figure2_matched_5m``'s two (700-704), with the matched agent, and three values in
  every label cell (:data:`RESET_LABEL_RUNS`): a copy that fails restarts at once, unseen by the
  agent, where before it ran on fallen to the end of its 1,000 steps; r̂ reads the action the
  environment takes, clipped into its bounds; and l2 adapts every 50 fitting steps
  (``reward_model.l2_adapt_every``, the library's rule since it no longer follows the chunk).
  On the matched figure's Hopper and Walker2d the label policies lay fallen 71-98% of their steps,
  and on probe seeds 900-902 TRPO on the exact oracle in that task ended far below RL; with the
  restart Hopper's 700-label line rose from about 40 to 714-1,140 there (``experiments/log/figure2.md``).

* ``figure2_bonus_per_dimension_5m``: ``figure2_reset_5m``'s two lines (seeds 800-804) with the paper's
  entropy bonus paid on the entropy's mean over the action's dimensions in every label cell
  (:data:`BONUS_PER_DIMENSION`), as the matched agent takes its KL: in ``figure2_reset_5m`` the bonus
  on the whole entropy widened the multi-joint label policies past the action box and they lost what
  they had learned; on probe seeds 990-992 the bonus per dimension kept Ant's at their starting width.

* ``figure2_batches_1m``: ``figure2_reset_1m``'s four lines and label runs (seeds 2100-2109,
  2100-2104) with the matched agent making its batches as the reference does (:data:`BATCHES_TRPO`,
  in every cell): with the matched agent InvertedDoublePendulum's RL line stayed under 0.9 of the
  reference on two registered blocks; with these three settings every compared task reached it.
* ``figure2_batches_5m``: ``figure2_bonus_per_dimension_5m``'s two lines and label runs (seeds
  2200-2204) with ``figure2_batches_1m``'s agent: the paper's scale with the agent at the reference's
  strength. Its label runs pay the bonus per action dimension, the rule of every 5M registration since
  the whole entropy's bonus widened the multi-joint label policies at 5M until they lost what they had
  learned; ``figure2_batches_1m`` keeps ``figure2_reset_1m``'s label runs, as it was registered.

Seeds from 100 up are fresh: every probe and every exploratory cell ran seeds 0-15; the
reference comparison's blocks and the later probes' seeds are listed in ``experiments/log/figure2.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from benchmarks.common import cpu_host, enable_compilation_cache
from experiments.protocol import (REGISTRATIONS, Registration, RegisteredCell, RegistrationError, cell_config,
                                  check_fingerprint, decide, fingerprint, gain_ratio_estimate, load, save, seed_keys)
from experiments.common import RESULTS
from experiments.records import ROOT, attempts_of, final_return, git_commit, load_ledger, provenance_of, run_timed, save_json
from experiments.reproduce import (FIGURES, MUJOCO_TASKS, Kind, budget_line, budget_of, cpu_overrides, curve_of,
                                   pinned_segment_length, plot, run_or_resume_sweep, shown, slug, summary)
from experiments.trpo_reference import figure_rl_line
from rlhf_jax.config import ExperimentConfig, build, to_dict
from rlhf_jax.errors import ConfigError, Interrupted

RUNS = ROOT / "runs" / "confirm"
NUM_ENVS = 5  # copies per seed: TRPO's batch of 5,000 env steps is 1,000 steps of each
CHUNK_ENV_STEPS = 40_000  # one point of a curve, at every budget
RL_LINE = "RL (trpo)"


class Line(NamedTuple):
    budget: int | None  # None: RL on the true reward
    seeds: int
    first_seed: int


THRESHOLD = 0.8
CLAIM_BUDGET = 700
CLAIM_TASKS = 6
DECISION_RULE = (
    "A task counts when its 700-label cell's gain ratio (the mean final true return's gain over the untrained "
    "policy, divided by RL's; the final return of a seed is the mean of the last tenth of its curve; the untrained "
    "policy's return is the mean first point of the task's RL and label cells) is at least 0.8 by the mean over "
    "seeds. The same count by the lower bound of its 95% stratified bootstrap interval is reported beside it. The "
    "claim holds at this budget of env steps when at least 6 of the 8 tasks count by the mean; the paper's is all 8.")
# The only settings that differ between tasks, each with the reason the paper or the task gives.
PER_TASK_SETTINGS = (
    {"task": "swimmer", "key": "trpo.entropy_coef", "value": 0.001,
     "reason": "appendix A.1: an entropy bonus of 0.01 on all tasks except Swimmer, 0.001"},
    {"task": "all", "key": "preferences.segment_length", "value": "1.5 s of the task's time",
     "reason": "the paper's clip length in seconds; in steps it follows each task's time step"},
    {"task": "hopper, walker2d, ant, invertedpendulum, inverteddoublependulum", "key": "env.max_episode_steps",
     "value": 200, "reason": "these tasks end early when unhealthy; with the ends hidden (appendix A) an episode "
     "needs a fixed length, one value for the five; the other three keep their own (1,000; Reacher 50)"},
    {"task": "hopper, walker2d, ant, invertedpendulum, inverteddoublependulum", "key": "env.termination_penalty",
     "value": 10.0, "reason": "the penalty that replaces the end (appendix A), one value for the five tasks that "
     "have an end to replace"},
)


@dataclasses.dataclass(frozen=True)
class Design:
    steps: int
    lines: tuple[Line, ...]  # in the order they run: the claim's two lines first, task by task
    label_overrides: tuple[str, ...] = ()  # one value for every task's label cells
    per_task_settings: tuple[dict, ...] = PER_TASK_SETTINGS
    agent: tuple[str, ...] = ()  # the agent's settings beyond its config files: every cell, RL's and the labels'


# The tasks' own episodes in the label runs: one value (0, the task's own limit) for all eight.
OWN_EPISODES = ({"task": "all", "key": "env.max_episode_steps", "value": "the task's own (0)",
                 "reason": "appendix A replaces the ends by a penalty and gives no length; each task keeps its "
                 "own (1,000; Reacher 50), so the label runs' episodes are the task's, as RL's are"},)
PER_TASK_OWN_EPISODES = tuple(s for s in PER_TASK_SETTINGS if s["key"] != "env.max_episode_steps") + OWN_EPISODES

# The figure's RL agent matched against sb3-contrib's TRPO on the standard tasks (seeds 110-112 and, on the
# figure's own Ant, 120-122; experiments/log/figure2.md): its trust region bounds the KL averaged over the
# action's dimensions with the damping and line search in those units, its batch of 2,048 steps in 5 copies,
# 25 CG steps on the whole batch, 20 x 16 critic minibatches, and the observations standardised with a clip of
# 10 and a floor of 1e-4 after each update. The paper's gamma and lambda, as every figure 2 config has them.
MATCHED_TRPO = ("trpo.kl_per_action_dimension=true", "trpo.max_kl=0.01", "trpo.cg_damping=0.1",
                "trpo.line_search_decay=0.8", "trpo.batch_size=2048", "trpo.cg_iterations=25",
                "trpo.fisher_subsample=1", "trpo.value_epochs=20", "trpo.value_minibatches=16",
                "trpo.observation_clip=10", "trpo.observation_min_std=0.0001", "trpo.observation_moments=after_update")

# The matched agent making its batches as the reference does (experiments/log/figure2.md): 2 copies of 1,024 steps,
# the observation moments taking in each step's observations before the policy acts on them (as VecNormalize does),
# and V fitted to raw returns. With it ours is at 0.9 or more of the reference on every compared task, where the
# matched agent was not on InvertedDoublePendulum. The order of the keys is the comparison's ``--ours-overrides``,
# so that the figure's JSON finds its rows; ``env.num_envs=2`` comes after the design's 5 copies and wins.
BATCHES_TRPO = (*(key for key in MATCHED_TRPO if not key.startswith("trpo.observation_moments=")),
                "trpo.observation_moments=every_step", "trpo.normalize_value_targets=false", "env.num_envs=2")

# The label runs of figure2_reset_*: one value each for all eight tasks (the restart acts on the five with ends).
RESET_LABEL_RUNS = ("env.max_episode_steps=0", "env.hidden_end=reset", "reward_model.clip_actions=true")
RESET_SETTINGS = PER_TASK_OWN_EPISODES + (
    {"task": "all", "key": "env.hidden_end", "value": "reset",
     "reason": "appendix A hides the ends and, for Atari, says the environment is still reset; a Hopper or Walker2d "
     "that has fallen cannot rise, so run on it spends the rest of its 1,000 steps lying, which is most of what its "
     "clips show; on the three tasks without an end it changes nothing"},
    {"task": "all", "key": "reward_model.clip_actions", "value": True,
     "reason": "r(o, a) of the action the environment takes: the policy's draws fall far outside the bounds, and "
     "read unclipped they collapsed three Walker2d reward models of the matched figure"},
)

# The label runs of figure2_bonus_per_dimension_5m: figure2_reset_5m's, with the paper's bonus paid on the
# entropy's mean over the action's dimensions, as the matched agent takes its KL (one rule for all eight; the
# two pendulums have one dimension, so theirs is unchanged, and Swimmer keeps its own tenth of the bonus).
BONUS_PER_DIMENSION = ("trpo.entropy_per_action_dimension=true",)
BONUS_PER_DIMENSION_SETTINGS = RESET_SETTINGS + (
    {"task": "all", "key": "trpo.entropy_per_action_dimension", "value": True,
     "reason": "appendix A.1 gives the bonus (0.01; Swimmer 0.001) and not the entropy's unit; the matched agent "
     "bounds the KL per action dimension (the reference's trust region), and with it the bonus on the whole entropy "
     "widened label policies past the action box (figure2_reset_5m: every Ant and three Walker2d seeds; "
     "figure2_matched_5m: three HalfCheetah seeds), each losing what it had learned, where every RL policy "
     "narrowed; on probe seeds 990-992 the bonus per dimension kept Ant's label policies at their starting width"},
)

DESIGNS = {
    "figure2_1m": Design(1_000_000, (Line(None, 10, 100), Line(700, 10, 100), Line(1400, 5, 100), Line(350, 5, 100))),
    "figure2_5m": Design(5_000_000, (Line(None, 5, 200), Line(700, 5, 200))),
    "figure2_own_episodes_1m": Design(1_000_000, (Line(None, 10, 300), Line(700, 10, 300)),
                                      ("env.max_episode_steps=0",), PER_TASK_OWN_EPISODES),
    "figure2_matched_1m": Design(1_000_000, (Line(None, 10, 400), Line(700, 10, 400), Line(1400, 5, 400),
                                             Line(350, 5, 400)),
                                 ("env.max_episode_steps=0",), PER_TASK_OWN_EPISODES, MATCHED_TRPO),
    "figure2_matched_5m": Design(5_000_000, (Line(None, 5, 500), Line(700, 5, 500)),
                                 ("env.max_episode_steps=0",), PER_TASK_OWN_EPISODES, MATCHED_TRPO),
    "figure2_reset_1m": Design(1_000_000, (Line(None, 10, 600), Line(700, 10, 600), Line(1400, 5, 600),
                                           Line(350, 5, 600)), RESET_LABEL_RUNS, RESET_SETTINGS, MATCHED_TRPO),
    "figure2_reset_5m": Design(5_000_000, (Line(None, 5, 700), Line(700, 5, 700)), RESET_LABEL_RUNS, RESET_SETTINGS,
                               MATCHED_TRPO),
    "figure2_bonus_per_dimension_5m": Design(5_000_000, (Line(None, 5, 800), Line(700, 5, 800)),
                                             RESET_LABEL_RUNS + BONUS_PER_DIMENSION, BONUS_PER_DIMENSION_SETTINGS,
                                             MATCHED_TRPO),
    "figure2_batches_1m": Design(1_000_000, (Line(None, 10, 2100), Line(700, 10, 2100), Line(1400, 5, 2100),
                                             Line(350, 5, 2100)), RESET_LABEL_RUNS, RESET_SETTINGS, BATCHES_TRPO),
    "figure2_batches_5m": Design(5_000_000, (Line(None, 5, 2200), Line(700, 5, 2200)),
                                 RESET_LABEL_RUNS + BONUS_PER_DIMENSION, BONUS_PER_DIMENSION_SETTINGS, BATCHES_TRPO),
}


def design_cells(design: Design, tasks: list[str]) -> list[RegisteredCell]:
    """Every cell of a design, in the order it runs: its first two lines task by task, then each
    other line across the tasks."""
    order = [(line, task) for task in tasks for line in design.lines[:2]]
    order += [(line, task) for line in design.lines[2:] for task in tasks]
    cells = []
    for line, task in order:
        panel = MUJOCO_TASKS[task]
        path = panel.baselines[0].config if line.budget is None else panel.rlhf
        overrides = [*cpu_overrides(path), f"env.num_envs={NUM_ENVS}", *design.agent]
        if line.budget is not None:
            overrides += [f"preferences.labels={line.budget}", *design.label_overrides]
        overrides += [*seed_keys(line.first_seed, NUM_ENVS), f"trpo.total_env_steps={design.steps}",
                      f"run.chunk_env_steps={CHUNK_ENV_STEPS}", "run.checkpoint_every_updates=1",
                      "run.tensorboard=false"]
        draft = RegisteredCell(task, RL_LINE if line.budget is None else budget_line(line.budget),
                               Kind.BASELINE.value if line.budget is None else Kind.LABELS.value, shown(path),
                               tuple(overrides), tuple(range(line.first_seed, line.first_seed + line.seeds)), "")
        overrides += pinned_segment_length(cell_config(draft))
        cell = dataclasses.replace(draft, overrides=tuple(overrides))
        cells.append(dataclasses.replace(cell, fingerprint=fingerprint(cell_config(cell))))
    return cells


def register(name: str, tasks: list[str] | None = None, directory: Path = REGISTRATIONS) -> Path:
    design = DESIGNS[name]
    cells = design_cells(design, tasks or list(MUJOCO_TASKS))
    registration = Registration(name, design.steps, design.steps // CHUNK_ENV_STEPS, THRESHOLD, CLAIM_BUDGET,
                                CLAIM_TASKS, DECISION_RULE, design.per_task_settings, tuple(cells), design.agent)
    commit = git_commit()
    header = (f"# Figure 2, confirmatory ({name}): registered before any of its cells ran, from the configs at\n"
              f"# commit {commit['commit']}{' (with uncommitted changes)' if commit['uncommitted_changes'] else ''}.\n"
              f"# Run it: python -m experiments.confirm run {shown(directory / f'{name}.yaml')}\n"
              f"# Never edited: a changed cell is a new registration with fresh seeds.\n")
    path = directory / f"{name}.yaml"
    save(registration, path, header)
    return path


# ---------------------------------------------------------------- running
def versions() -> dict[str, str]:
    """The libraries whose code makes a run's digits, beside the host (a new jax is a new host)."""
    from importlib.metadata import version

    return {name: version(name) for name in ("jax", "jaxlib", "flax", "optax", "envpool", "mujoco")}


def run_directory(registration: Registration, cell: RegisteredCell) -> Path:
    return RUNS / registration.name / cell.task / f"{slug(cell.line)}-{cell.fingerprint}"


def finished_sweep(directory: Path) -> tuple[ExperimentConfig, list[dict]]:
    """A finished sweep's own config (what it ran on, from its ``sweep.yaml``) and its rows."""
    from rlhf_jax.sweep import Sweep

    sweep = Sweep.load(directory)
    return build(ExperimentConfig, sweep.base), sweep.rows()


def cell_records(cell: RegisteredCell, rows: list[dict], directory: Path, seconds: float) -> dict[str, dict]:
    """The finished cell's seeds as ledger records, keyed ``<task>/<line>/seed<k>``."""
    records = {}
    for seed in cell.seeds:
        mine = sorted((r for r in rows if int(r["seed"]) == seed), key=lambda r: r["chunk"])
        records[f"{cell.key}/seed{seed}"] = {
            "task": cell.task, "line": cell.line, "kind": cell.kind, "seed": seed, "config": cell.config,
            "overrides": list(cell.overrides), "fingerprint": cell.fingerprint, "run_dir": shown(directory),
            "seconds": round(seconds, 1), **curve_of(mine)}
    return records


def record_cell(ledger: dict, cell: RegisteredCell, directory: Path, seconds: float, provenance: dict) -> dict:
    """The ledger with the finished cell in it, after checking the sweep ran the registered config."""
    config, rows = finished_sweep(directory)
    check_fingerprint(cell, config, f"the finished sweep in {shown(directory)}")
    missing = [s for s in cell.seeds if not any(int(r["seed"]) == s for r in rows)]
    if missing:
        raise RegistrationError(f"{cell.key}: the sweep in {shown(directory)} has no rows for seeds {missing}")
    records = cell_records(cell, rows, directory, seconds)
    return {**ledger, "runs": {**ledger["runs"], **{k: {**r, **provenance} for k, r in records.items()}}}


def is_recorded(ledger: dict, cell: RegisteredCell) -> bool:
    return all(ledger["runs"].get(f"{cell.key}/seed{s}", {}).get("fingerprint") == cell.fingerprint
               for s in cell.seeds)


def run(registration: Registration, ledger_path: Path, cells: list[str] | None = None,
        run_sweep: Callable = run_or_resume_sweep, after_cell: Callable | None = None, provenance: dict | None = None) -> dict:
    """Run every registered cell (or those ``cells`` names) the ledger lacks, and record each."""
    chosen = [c for c in registration.cells if cells is None or c.key in cells]
    unknown = sorted(set(cells or ()) - {c.key for c in registration.cells})
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not a cell of {registration.name}; cells are '<task>/<line>', "
                          f"e.g. {registration.cells[0].key!r}")
    ledger = load_ledger(ledger_path)
    todo = [c for c in chosen if not is_recorded(ledger, c)]
    print(f"{registration.name}: {len(chosen)} cells, {len(chosen) - len(todo)} recorded before, {len(todo)} to run",
          flush=True)
    for index, cell in enumerate(todo):
        config = cell_config(cell)
        check_fingerprint(cell, config, "today's config")
        directory = run_directory(registration, cell)
        print(f"[{index + 1}/{len(todo)}] {cell.key}, seeds {cell.seeds[0]}-{cell.seeds[-1]}", flush=True)
        base = to_dict(dataclasses.replace(config, run=dataclasses.replace(config.run, dir=str(directory))))
        seconds = run_timed(directory, lambda: run_sweep(directory, base, len(cell.seeds)))
        ledger = record_cell(ledger, cell, directory, seconds,
                             {**(provenance or {}), **cpu_host(), "attempts": attempts_of(directory)})
        save_json(ledger_path, ledger)
        finals = [final_return(ledger["runs"][f"{cell.key}/seed{s}"]["episode_return"]) for s in cell.seeds]
        print(f"    finished in {seconds / 60:.1f} min: final true returns "
              f"{', '.join('-' if f is None else f'{f:.0f}' for f in finals)}", flush=True)
        if after_cell is not None:
            after_cell(ledger)
    return ledger


# ---------------------------------------------------------------- the report
def report(registration: Registration, ledger: dict) -> dict:
    """Per task the cells' final returns and each budget's gain ratio; the decision rule's counts."""
    registered = {c.key: c for c in registration.cells}
    ours = {**ledger, "runs": {k: r for k, r in ledger["runs"].items()
                               if f"{r['task']}/{r['line']}" in registered
                               and r["fingerprint"] == registered[f"{r['task']}/{r['line']}"].fingerprint}}
    tasks = list(dict.fromkeys(c.task for c in registration.cells))
    result = summary(ours, tasks)
    budgets = sorted({c.line for c in registration.cells if c.kind == Kind.LABELS.value}, key=budget_of)
    ratios: dict[str, dict] = {line: {} for line in budgets}
    for task, lines in result.items():
        rl = lines.get(RL_LINE)
        starts = [cell["mean_return"][0] for cell in lines.values() if cell["mean_return"][0] is not None]
        for line in budgets:
            cell = lines.get(line)
            if rl is None or cell is None or not starts:
                continue
            finals = [f for f in cell["final_return_per_seed"] if f is not None]
            rl_finals = [f for f in rl["final_return_per_seed"] if f is not None]
            estimate = gain_ratio_estimate(finals, rl_finals, float(np.mean(starts)))
            cell["gain_ratio"] = None if estimate is None else dataclasses.asdict(estimate)
            ratios[line][task] = estimate
    counts = {line: decide(ratios[line], registration.threshold) for line in budgets}
    claim = counts.get(budget_line(registration.claim_budget))
    finished = sum(1 for c in registration.cells if is_recorded(ledger, c))
    return {"registration": registration.name, "steps": registration.steps, "decision_rule": registration.decision_rule,
            "cells_registered": len(registration.cells), "cells_finished": finished,
            "claim_holds": None if finished < len(registration.cells) or claim is None
            else len(claim["at_threshold_by_mean"]) >= registration.claim_tasks,
            "counts": counts, "tasks": result}


def table(result: dict) -> str:
    """Markdown: per task RL's final return and each budget's gain ratio with its interval."""
    budgets = list(result["counts"])
    lines = ["| task | RL (seeds) | " + " | ".join(f"{b}: gain ratio [95% interval] (seeds)" for b in budgets) + " |",
             "| --- | ---: |" + " ---: |" * len(budgets)]
    for task, cells in result["tasks"].items():
        rl = cells.get(RL_LINE)
        shown_rl = "-" if rl is None else f"{rl['final_return']:.1f} ({rl['seeds']})"
        row = [f"| {task} | {shown_rl} |"]
        for line in budgets:
            ratio = (cells.get(line) or {}).get("gain_ratio")
            row.append(" - |" if ratio is None else
                       f" {ratio['mean']:.2f} [{ratio['mean_low']:.2f}, {ratio['mean_high']:.2f}] ({ratio['seeds']}) |")
        lines.append("".join(row))
    return "\n".join(lines)


def publish(registration: Registration, ledger: dict) -> dict:
    result = report(registration, ledger)
    result["table"] = table(result)
    result["rl_line_against_reference"] = figure_rl_line(list(registration.agent))
    png = RESULTS / f"{registration.name}.png"
    title = f"labels against RL, confirmatory, {registration.steps / 1e6:g}M env steps"
    plot(ledger, dataclasses.replace(FIGURES[2], title=title), list(MUJOCO_TASKS), png, quick=False)
    save_json(RESULTS / f"{registration.name}.json", result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("register", help="write a new registration from today's configs")
    new.add_argument("design", choices=sorted(DESIGNS))
    go = commands.add_parser("run", help="run a registration's cells the ledger lacks")
    go.add_argument("registration", type=Path)
    go.add_argument("--cells", help="comma-separated '<task>/<line>' keys (default: every cell)")
    show = commands.add_parser("report", help="write the figure and the JSON from the ledger")
    show.add_argument("registration", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "register":
            print(f"registered: {shown(register(args.design))}")
            return
        registration = load(args.registration)
        ledger_path = RESULTS / f"{registration.name}_runs.json"
        if args.command == "report":
            print(table(publish(registration, load_ledger(ledger_path))))
            return
        enable_compilation_cache()
        provenance = {**provenance_of("experiments.confirm", argv), "versions": versions()}
        cells = [c.strip() for c in args.cells.split(",")] if args.cells else None
        ledger = run(registration, ledger_path, cells, after_cell=lambda ledger: publish(registration, ledger),
                     provenance=provenance)
        print(table(publish(registration, ledger)))
    except (KeyboardInterrupt, Interrupted) as stop:
        print("\ninterrupted: finished cells are in the ledger; the same command goes on from the last chunk",
              file=sys.stderr)
        sys.exit(stop.exit_code if isinstance(stop, Interrupted) else 130)
    except ConfigError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
