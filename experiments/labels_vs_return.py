"""True return reached from 125, 250, 500 and 1000 synthetic labels, beside RL on the true reward.

    python -m experiments.labels_vs_return [--quick] [--tasks cartpole,acrobot] [--labels 125,500]

Every cell is 3 seeds of the RLHF loop run as one compiled program (``jax.vmap`` over
``Loop.make_train().from_state``), scored by the mean true return of 32 whole, unmodified
episodes per seed, with its curves kept beside (``chunk_curves``). Two references run the same
way with the same agent and budget: RL on the true reward with visible episode ends, and, where
the task hides its ends from the agent, RL on the oracle's own reward with the ends hidden
(unnormalised, unlike r̂). Then the six ablations of section 3.3 on CartPole with 500 labels.

Beside each cell's mean, the statistics Agarwal et al. (2021) recommend for few seeds
(:mod:`rlhf_jax.statistics`, with rliable): per task and budget, the interquartile mean (IQM)
over seeds with its 95% stratified bootstrap interval; per budget, across tasks, the IQM of
normalised returns (0: a uniformly random policy, 1: RL on the true reward, each a mean over
its seeds) with its interval, and the performance profile of those normalised returns.
Results are written after every cell (``experiments/results/labels_vs_return.json``, and a
PNG beside it), so an interrupted run keeps what it finished; cells from earlier runs that
this run does not repeat are kept, so tasks can be run one at a time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Headline, enable_compilation_cache, stacked_runners, with_headline
from experiments.common import RESULTS, write_result
from experiments.reproduce import read_ablations
from rlhf_jax.agents.base import env_reward
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build
from rlhf_jax.envs import Discrete, make
from rlhf_jax.envs.options import without_run_changes
from rlhf_jax.evaluation import evaluate
from rlhf_jax.statistics import (CONFIDENCE, REPLICATIONS, IntervalEstimate, PerformanceProfile, draw_intervals,
                                 draw_profiles, interval_estimate, normalize, performance_profile, require_rliable)
from rlhf_jax.driver import Driver

# Each task: overrides of the built-in default (A2C on CartPole from preferences).
TASKS = {
    "cartpole": [],
    # Reaching the goal ends Acrobot's episode: a success, so no penalty. The physics
    # treatment (`continue`): a swung-up arm runs on, and every step it stays above the line
    # pays the oracle 0 instead of -1. Under `reset` a success was one such step, almost every
    # pair tied, and A2C learned in 1 run of 12.
    "acrobot": ["env.id=gymnax/Acrobot-v1", "env.termination_penalty=0.0", "env.hidden_end=continue"],
    # Continuous actions: TRPO, the paper's agent for them, with configs/trpo_pendulum.yaml's
    # settings. Fixed-length episodes: nothing to hide. (A2C with tests/test_a2c.py's settings
    # learned from preferences in 0 of 3 seeds: its policy's std stayed near 1.)
    "pendulum": ["agent=trpo", "env.id=gymnax/Pendulum-v1", "env.hide_episode_end=false",
                 "trpo.total_env_steps=1024000", "trpo.batch_size=6400", "trpo.reward_scale=0.1",
                 "reward_model.normalized_std=1.0", "run.chunk_env_steps=64000"],
    # A2C's rate decays to zero over its own 5M steps, and r̂ has the paper's Atari std of 0.05
    # (the default's decay horizon and scale are set for CartPole's 1M steps).
    "breakout": ["env.id=gymnax/Breakout-MinAtar", "a2c.total_env_steps=5017600", "run.chunk_env_steps=250880",
                 "a2c.lr_decay_env_steps=0", "reward_model.normalized_std=0.05"],
}
# Settings only for learning from the predictor. TRPO's entropy bonus, "the only hyperparameter
# which we adjusted" (section 2.2.1; 0.01, appendix A.1): without it one Pendulum seed of three
# settled on flailing at the torque limit at every budget, though its r̂ ranked the other
# seeds' balancing policies far above its own (with it: 10 runs of 12 balance).
FROM_PREDICTOR = {"pendulum": ["trpo.entropy_coef=0.01"]}
LABELS = (125, 250, 500, 1000)
# Section 3.3, each one switch (configs/paper/ablations.yaml), on CartPole with 500 labels.
ABLATIONS = read_ablations()
SEEDS = 3
EVAL_EPISODES = 32


def experiment(overrides: list[str]) -> ExperimentConfig:
    return build(ExperimentConfig, apply_overrides(DEFAULT_EXPERIMENT, overrides))


def evaluation_env(env_config):
    """``EVAL_EPISODES`` copies of the unmodified task (episode ends visible), seeded apart from training's."""
    return make(without_run_changes(dataclasses.replace(env_config, num_envs=EVAL_EPISODES,
                                                        seed=env_config.seed + 10_000)))


def evaluate_seeds(driver, params, seed: int) -> list[float]:
    """Each seed's mean true return over ``EVAL_EPISODES`` whole episodes of the unmodified task."""
    env = evaluation_env(driver.config.env)
    return score_seeds(env, driver.agent.make_policy(driver.agent_config, env.spec), params, seed)


def score_seeds(env, act, params, seed: int) -> list[float]:
    """:func:`evaluate_seeds` for a policy ``act`` and its parameters stacked over ``SEEDS``."""
    score = jax.jit(jax.vmap(lambda p, k: evaluate(act, p, env, k, env.spec.max_episode_steps + 1)))
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), SEEDS)
    result = jax.device_get(score(params, keys))
    return [float(s / max(n, 1)) for s, n in zip(result.return_sum, result.episodes)]


def chunk_curves(loop, metrics, learned) -> dict:
    """Per chunk, for each seed: the true return of the episodes that ended in the chunk
    (NaN where none did), the labels so far, and the predictor's accuracy and correlation."""
    def per_chunk(x):  # [seeds, iterations] -> [seeds, chunks], summed within each chunk
        edges = np.arange(0, x.shape[1], loop.chunk_iterations)
        return np.add.reduceat(np.asarray(x, np.float64), edges, axis=1)
    episodes = per_chunk(metrics["episodes"])
    returns = np.where(episodes > 0, per_chunk(metrics["episode_return_sum"]) / np.maximum(episodes, 1), np.nan)
    def rounded(x):  # NaN as null, which strict JSON readers accept
        return [[None if np.isnan(v) else v for v in row] for row in np.round(np.asarray(x, np.float64), 3).tolist()]
    ends = np.minimum(np.arange(1, returns.shape[1] + 1) * loop.chunk_iterations, loop.total_iterations)
    return {"env_steps": (ends * loop.steps_per_iteration).tolist(),
            "true_return": rounded(returns), "labels": np.asarray(learned["labels"]).tolist(),
            "reward_accuracy": rounded(learned["reward_accuracy"]),
            "reward_correlation": rounded(learned["reward_correlation"])}


def rlhf_cell(overrides: list[str], seed: int = 0) -> dict:
    driver = Driver(experiment(overrides))
    start = time.perf_counter()
    state, metrics, learned = jax.device_get(jax.jit(jax.vmap(driver.loop.make_train().from_state))(
        stacked_runners(driver.init, SEEDS, seed)))
    returns = evaluate_seeds(driver, state.runner.params, seed)
    return {"returns": returns, "mean": float(np.mean(returns)), "labels": int(learned["labels"][0, -1]),
            # None when every fresh pair tied at the end (a policy that never fails).
            "reward_accuracy": None if np.isnan(learned["reward_accuracy"][:, -1]).all()
            else float(np.nanmean(learned["reward_accuracy"][:, -1])),
            "seconds": round(time.perf_counter() - start, 1), "curves": chunk_curves(driver.loop, metrics, learned)}


def without_curves(cell: dict) -> dict:
    return {key: value for key, value in cell.items() if key != "curves"}


def true_reward_cell(overrides: list[str], seed: int = 0, visible_ends: bool = True) -> dict:
    """The same agent and budget on the environment's reward, with visible episode ends; or,
    with ``visible_ends=False``, on the oracle's reward under the task's own treatment (ends
    hidden, a penalty per failure), as it is: not normalised as r̂ is."""
    config = experiment([*overrides, "reward=env", *(["env.hide_episode_end=false"] if visible_ends else [])])
    driver = Driver(config)
    train = driver.agent.make_train(driver.agent_config, driver.env, env_reward)
    start = time.perf_counter()
    runner, _ = jax.jit(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(seed), SEEDS))
    returns = evaluate_seeds(driver, runner.params, seed)
    return {"returns": returns, "mean": float(np.mean(returns)), "seconds": round(time.perf_counter() - start, 1)}


def uniform_random_policy(spec):
    """``act(params, obs, key)`` drawing every action uniformly from the action space (no parameters)."""
    space = spec.action_space

    def act(params, obs, key):
        shape = (obs.shape[0], *space.shape)
        if isinstance(space, Discrete):
            return jax.random.randint(key, shape, 0, space.n)
        return jax.random.uniform(key, shape, minval=space.low, maxval=space.high)

    return act


def random_policy_cell(overrides: list[str], seed: int = 0) -> dict:
    """The task's floor for normalised returns: uniformly random actions, scored as every cell is."""
    env = evaluation_env(experiment(overrides).env)
    returns = score_seeds(env, uniform_random_policy(env.spec), jnp.zeros(SEEDS), seed)
    return {"returns": returns, "mean": float(np.mean(returns))}


def hides_episode_ends(task: str) -> bool:
    return experiment(TASKS[task]).env.hide_episode_end


class LabelStatistics(NamedTuple):
    """A result's statistics (module docstring), by label budget."""

    per_task: dict[str, dict[int, IntervalEstimate]]  # task -> budget -> the IQM over its seeds
    normalized_tasks: tuple[str, ...]  # the tasks with both references, which the aggregate spans
    normalized: dict[int, IntervalEstimate]  # budget -> the IQM of normalised returns, seeds and tasks pooled
    profiles: dict[int, PerformanceProfile]  # budget -> the performance profile of normalised returns


# Normalised returns: 0 is a uniformly random policy's, 1 is RL on the true reward's.
PROFILE_THRESHOLDS = np.linspace(-0.25, 1.25, 61)


def label_statistics(result: dict, replications: int = REPLICATIONS) -> LabelStatistics:
    """The IQMs, intervals and profiles of ``result``'s label cells (rliable; module docstring)."""
    tasks = result["tasks"]
    per_task = {task: {int(b): interval_estimate(np.array(cell["returns"])[:, None], replications)
                       for b, cell in cells["labels"].items()} for task, cells in tasks.items()}
    normalized_tasks = tuple(task for task, cells in tasks.items() if {"random_policy", "true_reward"} <= set(cells))
    budgets = sorted(set.intersection(*(set(map(int, tasks[t]["labels"])) for t in normalized_tasks))
                     if normalized_tasks else set())
    low = [tasks[t]["random_policy"]["mean"] for t in normalized_tasks]
    high = [tasks[t]["true_reward"]["mean"] for t in normalized_tasks]
    normalized, profiles = {}, {}
    for budget in budgets:
        returns = np.array([tasks[t]["labels"][str(budget)]["returns"] for t in normalized_tasks]).T  # [seeds, tasks]
        scores = normalize(returns, low, high)
        normalized[budget] = interval_estimate(scores, replications)
        profiles[budget] = performance_profile(scores, PROFILE_THRESHOLDS, replications)
    return LabelStatistics(per_task, normalized_tasks, normalized, profiles)


def statistics_json(stats: LabelStatistics) -> dict:
    """``stats`` as the result file keeps them."""
    as_lists = lambda profile: {k: np.asarray(v).tolist() for k, v in profile._asdict().items() if k != "thresholds"}
    return {"per_task": {task: {str(b): e._asdict() for b, e in cells.items()} for task, cells in stats.per_task.items()},
            "normalized": {"tasks": list(stats.normalized_tasks), "zero": "random_policy", "one": "true_reward",
                           "budgets": {str(b): e._asdict() for b, e in stats.normalized.items()},
                           "profile_thresholds": PROFILE_THRESHOLDS.tolist(),
                           "profiles": {str(b): as_lists(p) for b, p in stats.profiles.items()}}}


def plot(result: dict, stats: LabelStatistics | None, path) -> None:
    """Each task's return against labels (the IQM over seeds with its interval, and the mean),
    the ablations; below, across tasks, the normalised IQM per budget and the profiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks, names = list(result["tasks"]), list(result["ablations"])
    columns = max(len(tasks) + bool(names), 2)
    rows = 2 if stats and stats.normalized else 1
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.4 * rows), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        cells = result["tasks"][task]
        budgets = sorted(int(b) for b in cells["labels"])
        if not budgets:
            continue
        means = [cells["labels"][str(b)]["mean"] for b in budgets]
        if stats:
            estimates = [stats.per_task[task][b] for b in budgets]
            iqm = np.array([e.iqm for e in estimates])
            spread = [iqm - [e.iqm_low for e in estimates], [e.iqm_high for e in estimates] - iqm]
            ax.errorbar(budgets, iqm, yerr=spread, marker="o", capsize=3,
                        label=f"preferences: IQM, {CONFIDENCE:.0%} interval")
            ax.plot(budgets, means, "x", color="tab:blue", label="mean")
        else:
            ax.plot(budgets, means, marker="o", label="preferences: mean")
        if "true_reward" in cells:
            ax.axhline(cells["true_reward"]["mean"], color="k", linestyle="--", label="true reward")
        if "oracle_reward" in cells:
            ax.axhline(cells["oracle_reward"]["mean"], color="k", linestyle=":", label="oracle's reward, ends hidden")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_title(task)
        ax.set_xlabel("labels")
    axes[0][0].set_ylabel(f"true return ({SEEDS} seeds)")
    axes[0][0].legend(fontsize=8)
    for ax in axes[0][len(tasks) + bool(names):]:
        ax.axis("off")
    if names:
        ax = axes[0][len(tasks)]
        ax.barh(names, [result["ablations"][n]["mean"] for n in names])
        ax.set_title("cartpole, 500 labels: ablations")
        ax.set_xlabel("true return")
    if rows == 2:
        budgets = list(stats.normalized)
        score = "normalised return (0: random policy, 1: RL on the true reward)"
        draw_intervals(axes[1][0], [f"{b} labels" for b in budgets], list(stats.normalized.values()), score)
        axes[1][0].set_title(f"all tasks ({', '.join(stats.normalized_tasks)}): IQM of seeds x tasks", fontsize=9)
        draw_profiles(axes[1][1], [f"{b} labels" for b in budgets], list(stats.profiles.values()), "normalised return")
        axes[1][1].set_title("performance profiles", fontsize=9)
        for ax in axes[1][2:]:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(result: dict) -> str:
    budgets = sorted({int(b) for cells in result["tasks"].values() for b in cells["labels"]})
    references = ("oracle_reward", "true_reward")
    lines = ["| task | " + " | ".join(f"{b} labels" for b in budgets) + " | oracle's reward, ends hidden | true reward |",
             "| --- |" + " --- |" * (len(budgets) + 2)]
    for task, cells in result["tasks"].items():
        row = [f"{cells['labels'][str(b)]['mean']:.1f}" if str(b) in cells["labels"] else "" for b in budgets]
        row += [f"{cells[key]['mean']:.1f}" if key in cells else "" for key in references]
        lines.append(f"| {task} | " + " | ".join(row) + " |")
    for name, cell in result["ablations"].items():
        lines.append(f"| cartpole 500, {name} | {cell['mean']:.1f} |")
    return "\n".join(lines)


def statistics_table(stats: LabelStatistics) -> str:
    """Per task, then across tasks (normalised), the IQM over seeds with its interval, by budget."""
    budgets = sorted({b for cells in stats.per_task.values() for b in cells})
    shown = lambda e: f"{e.iqm:.2f} [{e.iqm_low:.2f}, {e.iqm_high:.2f}]" if e else ""
    lines = [f"| IQM [{CONFIDENCE:.0%} interval] | " + " | ".join(f"{b} labels" for b in budgets) + " |",
             "| --- |" + " --- |" * len(budgets)]
    for task, cells in stats.per_task.items():
        lines.append(f"| {task} | " + " | ".join(shown(cells.get(b)) for b in budgets) + " |")
    if stats.normalized:
        lines.append(f"| all tasks, normalised ({', '.join(stats.normalized_tasks)}) | "
                     + " | ".join(shown(stats.normalized.get(b)) for b in budgets) + " |")
    return "\n".join(lines)


def merge_cells(latest: dict, mine: dict) -> dict:
    """The results file's latest contents with this run's cells written over them. Cells this
    run did not make (other tasks or budgets, or another process's, written meanwhile) stay."""
    # Made from the cells at each save: never carried over.
    derived = ("benchmark", "machine", "headline", "statistics")
    merged = {key: value for key, value in latest.items() if key not in derived}
    merged.update(seeds=mine["seeds"], eval_episodes=mine["eval_episodes"],
                  ablations={**latest.get("ablations", {}), **mine["ablations"]},
                  tasks=dict(latest.get("tasks", {})))
    for task, cells in mine["tasks"].items():
        old = merged["tasks"].get(task, {})
        merged["tasks"][task] = {**old, **cells, "labels": {**old.get("labels", {}), **cells["labels"]}}
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="CartPole only, 125 and 500 labels, no ablations: about 10 minutes on 2 CPU cores")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--labels", default=",".join(map(str, LABELS)),
                        help="comma-separated budgets; empty (--labels=) runs only the reference cells")
    parser.add_argument("--no-ablations", action="store_true")
    args = parser.parse_args()
    enable_compilation_cache()
    tasks = ["cartpole"] if args.quick else args.tasks.split(",")
    budgets = [125, 500] if args.quick else [int(b) for b in args.labels.split(",") if b]
    unknown = set(tasks) - set(TASKS)
    if unknown:
        parser.error(f"unknown tasks {sorted(unknown)}; known: {', '.join(TASKS)}")

    result = {"seeds": SEEDS, "eval_episodes": EVAL_EPISODES, "tasks": {}, "ablations": {}}
    name = "labels_vs_return_quick" if args.quick else "labels_vs_return"

    path = RESULTS / f"{name}.json"
    try:
        require_rliable()
        with_statistics = True
    except ImportError as error:
        print(f"note: {error}; the results will have means only", flush=True)
        with_statistics = False

    def save() -> dict:
        merged = merge_cells(json.loads(path.read_text()) if path.exists() else {}, result)
        stats = label_statistics(merged) if with_statistics else None
        if stats:
            merged["statistics"] = statistics_json(stats)
        path.write_text(json.dumps(with_headline({"benchmark": name, **merged}, headline), indent=2) + "\n")
        plot(merged, stats, RESULTS / f"{name}.png")
        if stats:
            print(statistics_table(stats), flush=True)
        return merged

    RESULTS.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        cells = result["tasks"].setdefault(task, {"labels": {}})
        cells["true_reward"] = true_reward_cell(TASKS[task])
        print(f"{task}, true reward: {cells['true_reward']}", flush=True)
        cells["random_policy"] = random_policy_cell(TASKS[task])
        print(f"{task}, a uniformly random policy: {cells['random_policy']}", flush=True)
        if hides_episode_ends(task):
            cells["oracle_reward"] = true_reward_cell(TASKS[task], visible_ends=False)
            print(f"{task}, the oracle's reward with the ends hidden: {cells['oracle_reward']}", flush=True)
        save()
        for labels in budgets:
            cells["labels"][str(labels)] = rlhf_cell([*TASKS[task], *FROM_PREDICTOR.get(task, []),
                                                        f"preferences.labels={labels}"])
            print(f"{task}, {labels} labels: {without_curves(cells['labels'][str(labels)])}", flush=True)
            save()
    if not (args.quick or args.no_ablations):
        for ablation, overrides in ABLATIONS.items():
            result["ablations"][ablation] = rlhf_cell(["preferences.labels=500", *overrides])
            print(f"cartpole 500 labels, {ablation}: {without_curves(result['ablations'][ablation])}", flush=True)
            save()
    merged = save()
    print(table(merged))
    write_result(name, merged, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: each task's true return from each label budget, beside RL on the true reward."""
    rows = []
    for task, cells in result["tasks"].items():
        true = cells.get("true_reward", {}).get("mean")
        for labels, cell in sorted(cells["labels"].items(), key=lambda kv: int(kv[0])):
            rows.append(Headline(f"True return, {task}, RLHF from {labels} labels (peer: RL on the true reward)",
                                 cell["mean"], true))
    return rows


if __name__ == "__main__":
    main()
