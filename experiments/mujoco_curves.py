"""Learning curves on MuJoCo (MJX back end, true reward): TRPO and ACER on Hopper and HalfCheetah.

    python -m experiments.mujoco_curves [--quick] [--steps N] [--agents trpo acer]
                                       [--tasks hopper halfcheetah] [--num-envs N] [--points N]

For each agent and task, 3 seeds train vmapped in one program: ``jax.vmap`` over the
seeds' runners, each from ``init_runner`` with its own training key, of the agent's
``iteration`` (what ``make_train`` scans). The run goes in ``--points`` compiled chunks
of whole iterations, the runner carried (and donated) from one to the next: the same
training as ``train(key)``, but it can report and save as it goes, and the chunks after
the first time training without compiling. Per agent/task it records

* ``return_per_seed``: the mean true episode return of the episodes that finished in
  each chunk, per seed (``None`` where none finished: HalfCheetah's episodes all last
  1,000 steps, so with few env steps per chunk most chunks end none);
* ``reward_per_step_per_seed``: the mean true reward per env step in each chunk, a
  dense curve that needs no finished episode;
* ``steps_per_s``: env steps per second summed over the seeds, chunks after the
  first (no compiling); ``steps_per_s_with_compile`` over the whole run;
* ``diagnostics``: the agent's other metrics (KL, entropy, losses, ...) per chunk, mean
  over seeds and iterations.

Results go to ``experiments/results/mujoco_curves.json`` and ``mujoco_curves.png``
(``mujoco_curves_quick.*`` with ``--quick``), rewritten after every chunk (the JSON,
``"complete": false`` until the end) and every agent/task (the PNG), so an interrupted
run keeps what it measured.

**Budgets.** Default: 1,000,000 env steps per seed, 64 environments per seed on a GPU
(4 on a CPU, ``--num-envs`` to change), sized for a GPU. On 2 CPU cores MJX steps
Hopper at a few hundred env steps per second, and a batch of more than about 16 copies
in all (seeds x environments) is much slower per step than a smaller one (measured
with random actions: HalfCheetah ~800 env steps/s with 12 copies, ~220 with 24; Hopper
~400 with 16, ~130 with 48 and 64), hence 4 environments per seed there.
``--quick``: 2,560 env steps per seed in 4 chunks; compiling dominates (about 5 minutes
on CPU, some 50 s per agent and task). A CPU run that shows learning on Hopper:
``--steps 24000 --points 12``, 14 minutes on 2 shared CPU cores (measured: Hopper's
mean return from ~20-35 to ~300 (TRPO) and ~200 (ACER); HalfCheetah about flat, near
random play's -350 per 1,000 steps, at that budget).

**A CPU hang worked around.** With jax/jaxlib 0.10.2 on CPU, ``jax.jit(jax.vmap(f))`` where
``f`` makes several orthogonal initialisations (``nn.initializers.orthogonal``: QR of a random
matrix; ACER's init makes eight) can block forever in ``block_until_ready``, every thread
idle: batched QRs side by side deadlock XLA:CPU's thread pool (docs/notes.md, *A CPU
hang*). So the runners are initialised one seed at a time and stacked
(``benchmarks.common.stacked_runners``); the training chunks are vmapped.

**Hyper-parameters** (not tuned; none is the paper's unless said so):

* TRPO: Christiano et al.'s gamma 0.995, lambda 0.97 and mean KL 0.01 (appendix A.1),
  no entropy bonus on the true reward; a batch of at least 640 env steps, 80 steps per
  environment with 64 environments (5,120, near the usual 5,000 of TRPO on MuJoCo),
  160 steps each with the CPU's 4; rewards scaled by 0.1 for the value regression
  (advantages are normalised anyway). HalfCheetah's copies start together and all
  episodes last 1,000 steps, so a batch of 80 or 160 steps per copy holds one phase of
  the episode (configs/trpo_pendulum.yaml says why that can hurt); for a running gait
  the phases differ less than Pendulum's swing-up does.
* ACER (continuous: Gaussian policy, stochastic dueling network, n = 5): the paper's
  k = 20, replay ratio 4, c = 10, delta = 1, alpha = 0.99; gamma 0.99, RMSProp at 5e-4
  decaying linearly to 0 over the run, rewards scaled by 0.1, no entropy bonus, a memory
  of 200 iterations' trajectories (256,000 env steps with 64 environments, 16,000 with
  4), replay from 10 iterations' worth of env steps on.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import jax
import numpy as np

from benchmarks.common import Headline, enable_compilation_cache, machine, stacked_runners, with_headline
from experiments.common import RESULTS, write_result
from rlhf_jax.agents import acer, trpo
from rlhf_jax.agents.base import env_reward
from rlhf_jax.cli import whole_number
from rlhf_jax.envs import EnvConfig, make

SEEDS = 3
TASKS = {"hopper": "mjx/Hopper-v5", "halfcheetah": "mjx/HalfCheetah-v5"}
AGENTS = ("trpo", "acer")
TRPO_STEPS_PER_ENV = 80  # per iteration, or more where that makes a batch under TRPO_MIN_BATCH
TRPO_MIN_BATCH = 640
ACER_MEMORY_ITERATIONS = 200  # iterations' trajectories the memory holds
ACER_REPLAY_START_ITERATIONS = 10
# Metrics that are sums over episodes or counters, not diagnostics to average.
COUNTS = ("episodes", "episode_return_sum", "episode_length_sum", "env_steps", "reward_sum", "steps")


def agent_config(name: str, num_envs: int, env_steps: int):
    """(agent module, config) for MuJoCo; see the module docstring."""
    if name == "trpo":
        steps_per_env = max(TRPO_STEPS_PER_ENV, -(-TRPO_MIN_BATCH // num_envs))
        return trpo, trpo.TRPOConfig(total_env_steps=env_steps, batch_size=steps_per_env * num_envs,
                                     gamma=0.995, gae_lambda=0.97, max_kl=0.01, entropy_coef=0.0,
                                     reward_scale=0.1)
    per_iteration = acer.ACERConfig.num_steps * num_envs
    return acer, acer.ACERConfig(total_env_steps=env_steps, gamma=0.99, learning_rate=5e-4, reward_scale=0.1,
                                 entropy_coef=0.0, replay_capacity=ACER_MEMORY_ITERATIONS * per_iteration,
                                 replay_start=ACER_REPLAY_START_ITERATIONS * per_iteration)


def make_chunk(iteration, length: int):
    """``chunk(runner) -> (runner, metrics [length])``: ``length`` iterations, plus the true
    reward summed over the steps they took (from the transitions, which are dropped)."""

    def chunk(runner):
        def body(runner, _):
            runner, metrics, transitions = iteration(runner, None)
            reward = transitions.oracle_reward
            return runner, dict(metrics, reward_sum=reward.sum(), steps=reward.size)

        return jax.lax.scan(body, runner, None, length)

    return chunk


def _finite_or_none(x: float):
    return float(x) if math.isfinite(x) else None


def _mean_of_seeds(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def run_curve(agent_name: str, task: str, env_steps: int, num_envs: int, points: int, on_chunk) -> dict:
    env_id = TASKS[task]
    env = make(EnvConfig(id=env_id, num_envs=num_envs))
    agent, config = agent_config(agent_name, num_envs, env_steps)
    per_iteration = agent.env_steps_per_iteration(config, env)
    iterations = agent.num_iterations(config, env)
    chunk_length = max(1, iterations // points)
    chunks = iterations // chunk_length
    start = time.perf_counter()
    init = jax.jit(lambda key: agent.init_runner(key, config, env))
    runner = jax.block_until_ready(stacked_runners(init, SEEDS))
    init_s = time.perf_counter() - start
    chunk = jax.jit(jax.vmap(make_chunk(agent.make_iteration(config, env, env_reward), chunk_length)),
                    donate_argnums=0)

    result = {
        "agent": agent_name, "env": env_id, "seeds": SEEDS, "num_envs": num_envs,
        "env_steps_per_iteration": per_iteration, "iterations_per_chunk": chunk_length,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()},
        "env_steps": [], "return_per_seed": [[] for _ in range(SEEDS)], "episodes_per_seed": [[] for _ in range(SEEDS)],
        "reward_per_step_per_seed": [[] for _ in range(SEEDS)], "diagnostics": {}, "chunk_seconds": [],
        "init_seconds": round(init_s, 1), "complete": False,
    }
    for c in range(chunks):
        t0 = time.perf_counter()
        runner, metrics = chunk(runner)
        metrics = jax.device_get(metrics)  # waits for the chunk
        result["chunk_seconds"].append(round(time.perf_counter() - t0, 2))
        result["env_steps"].append(int(np.asarray(metrics["env_steps"])[0, -1]))
        episodes = np.asarray(metrics["episodes"]).sum(1)
        returns = np.asarray(metrics["episode_return_sum"]).sum(1)
        rewards = np.asarray(metrics["reward_sum"]).sum(1) / np.asarray(metrics["steps"]).sum(1)
        for s in range(SEEDS):
            result["episodes_per_seed"][s].append(int(episodes[s]))
            result["return_per_seed"][s].append(_finite_or_none(returns[s] / episodes[s]) if episodes[s] else None)
            result["reward_per_step_per_seed"][s].append(float(rewards[s]))
        for name, value in metrics.items():
            if name not in COUNTS:
                result["diagnostics"].setdefault(name, []).append(_finite_or_none(float(np.mean(value))))
        summarise(result)
        print(f"{agent_name}_{task} chunk {c + 1}/{chunks}: {result['env_steps'][-1]} env steps/seed, "
              f"return {_mean_of_seeds([r[-1] for r in result['return_per_seed']])}, "
              f"reward/step {float(np.mean(rewards)):.3f}, {result['chunk_seconds'][-1]} s",
              file=sys.stderr, flush=True)
        on_chunk(result)
    result["complete"] = True
    return result


def summarise(result: dict) -> None:
    """Throughput and the first and last points of the curves, from what has run so far."""
    seconds = result["chunk_seconds"]
    steps_per_chunk = SEEDS * result["iterations_per_chunk"] * result["env_steps_per_iteration"]
    total = steps_per_chunk * len(seconds)
    result["env_steps_total"] = total
    result["seconds_with_compile"] = round(result["init_seconds"] + sum(seconds), 1)
    result["steps_per_s_with_compile"] = round(total / result["seconds_with_compile"], 1)
    if len(seconds) > 1:  # the chunks after the first compile nothing
        steady = sum(seconds[1:]) / (len(seconds) - 1)
        result["steps_per_s"] = round(steps_per_chunk / steady, 1)
        result["compile_seconds_estimate"] = round(result["init_seconds"] + seconds[0] - steady, 1)
    by_chunk = list(zip(*result["return_per_seed"]))
    with_episodes = [i for i, row in enumerate(by_chunk) if any(r is not None for r in row)]
    result["first_return"] = _mean_of_seeds(by_chunk[with_episodes[0]]) if with_episodes else None
    result["last_return"] = _mean_of_seeds(by_chunk[with_episodes[-1]]) if with_episodes else None
    result["first_return_env_steps"] = result["env_steps"][with_episodes[0]] if with_episodes else None
    result["last_return_env_steps"] = result["env_steps"][with_episodes[-1]] if with_episodes else None
    per_step = np.array(result["reward_per_step_per_seed"])
    result["first_reward_per_step"] = float(per_step[:, 0].mean())
    result["last_reward_per_step"] = float(per_step[:, -1].mean())


def plot(curves: dict, tasks: list[str], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 7), squeeze=False)
    for column, task in enumerate(tasks):
        top, bottom = axes[0, column], axes[1, column]
        for name, result in curves.items():
            if result["env"] != TASKS[task]:
                continue
            label = f"{result['agent']} (mean of {SEEDS} seeds)"
            steps = np.array(result["env_steps"])
            returns = np.array([[np.nan if r is None else r for r in seed] for seed in result["return_per_seed"]])
            finite = np.isfinite(returns).any(0)
            if finite.any():
                mean = np.nanmean(returns[:, finite], 0)
                line, = top.plot(steps[finite], mean, marker="o", markersize=3, label=label)
                top.fill_between(steps[finite], np.nanmin(returns[:, finite], 0), np.nanmax(returns[:, finite], 0),
                                 alpha=0.2, color=line.get_color())
            per_step = np.array(result["reward_per_step_per_seed"])
            line, = bottom.plot(steps, per_step.mean(0), label=label)
            bottom.fill_between(steps, per_step.min(0), per_step.max(0), alpha=0.2, color=line.get_color())
        top.set_title(f"{TASKS[task]}, true reward")
        top.set_ylabel("true episode return")
        bottom.set_ylabel("true reward per env step")
        bottom.set_xlabel("env steps per seed")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget that just runs end to end")
    parser.add_argument("--steps", type=whole_number(0), default=0, help="env steps per seed (default 1M; quick 2,560)")
    parser.add_argument("--agents", nargs="+", choices=AGENTS, default=list(AGENTS))
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--num-envs", type=whole_number(0), default=0, help="environments per seed (default 64 on GPU, 4 on CPU)")
    parser.add_argument("--points", type=whole_number(0), default=0, help="chunks, i.e. points per curve (default 50; quick 4)")
    parser.add_argument("--name", default="", help="results file name (default mujoco_curves, or mujoco_curves_quick)")
    args = parser.parse_args()
    enable_compilation_cache()
    on_cpu = jax.default_backend() == "cpu"
    env_steps = args.steps or (2_560 if args.quick else 1_000_000)
    num_envs = args.num_envs or (4 if on_cpu else 64)
    points = args.points or (4 if args.quick else 50)
    name = args.name or ("mujoco_curves_quick" if args.quick else "mujoco_curves")
    settings = {"quick": args.quick, "seeds": SEEDS, "env_steps_per_seed": env_steps, "num_envs": num_envs,
                "points": points, "true_reward": True}
    curves: dict = {}

    def summary(runs):
        keys = ("steps_per_s", "steps_per_s_with_compile", "first_return", "last_return",
                "first_reward_per_step", "last_reward_per_step")
        return {key: {k: c.get(k) for k in keys} for key, c in runs.items()}

    def save_partial(runs):
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(with_headline(
            {"benchmark": name, "machine": machine(), **settings, "complete": False,
             "summary": summary(runs), "curves": runs}, headline), indent=2) + "\n")

    start = time.perf_counter()
    for task in args.tasks:
        for agent_name in args.agents:
            key = f"{agent_name}_{task}"
            result = run_curve(agent_name, task, env_steps, num_envs, points,
                               on_chunk=lambda partial, key=key: save_partial({**curves, key: partial}))
            curves[key] = result
            save_partial(curves)
            plot(curves, args.tasks, RESULTS / f"{name}.png")
    write_result(name, {**settings, "complete": True, "wall_seconds": round(time.perf_counter() - start, 1),
                        "summary": summary(curves), "curves": curves}, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: each agent and task's return at the end of its curve, beside its start."""
    rows = []
    for run, s in result["summary"].items():
        agent, task = run.split("_", 1)
        rows.append(Headline(f"{agent.upper()} {task} (MJX), last chunk's return (peer: first chunk's), "
                             f"{result['env_steps_per_seed']:,} env steps/seed", s["last_return"], s["first_return"]))
    return rows


if __name__ == "__main__":
    main()
