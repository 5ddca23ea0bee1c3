"""How the agents' training throughput scales: env steps/s against seeds vmapped and environments per seed.

    python -m benchmarks.scaling [--quick] [--agents a2c,dqn] [--seeds 1,4,16] [--envs 1,16,256]
    python -m benchmarks.scaling --plot-only     # redraw the plots from results/scaling.json

Two sweeps on gymnax CartPole-v1, for A2C and DQN with the settings of
``configs/*_cartpole.yaml`` (:func:`benchmarks.agent_throughput.agent_setups`):

* **seeds**: 1, 4, 16, 64, 256 and 1024 seeds vmapped in one program, each seed with
  ``--seed-envs`` (32, as in ``agent_throughput.py``) environments (``--quick``: up to 64);
* **environments**: one seed with 1, 4, 16, 32, 64, 256 and 1024 environments
  (``--quick``: 1, 8, 32, 128, 512). The point of one seed with 32 environments belongs
  to both sweeps and is measured once.

Every point is env steps per second summed over the seeds, of the agent's own pure
``iteration`` (``make_iteration``, what ``make_train`` scans) run as one compiled chunk:
``jax.lax.scan`` over ``jax.vmap(iteration)`` for as many iterations as make about 32,768
env steps (``--quick``: 4,096; at least one iteration), its metrics kept as ``make_train``
keeps them, the runners donated from one call to the next. One seed is vmapped too (a
leading axis of 1), so both sweeps time the same program. A timing calls the chunk until
1.5 s (``--quick``: 0.5 s) have passed; the figure is the best of 3 timings, because on a
shared machine other work only ever slows a run down. Compiling, and the first call, are
timed apart (``compile_s``). ``--quick`` (16 points) took 5 minutes on 2 CPU cores shared
with other work, most of it compiling, and under 2 minutes with a warm compilation cache.

**Seeds are initialised one at a time.** On CPU (jax/jaxlib 0.10.2), vmapping the agents'
initialisation (orthogonal initialisers: batched LAPACK QR) can block forever on few
cores, so each seed's runner comes from a jitted ``init_runner`` called per seed, and the
runners are stacked on a leading axis (``init_s``); only the iterations are vmapped.

**DQN's memory and learning phase.** DQN keeps ``REPLAY_ROWS`` (512) vector steps of
replay per seed (``replay_capacity = 512 x num_envs``; 200,000 in the config would take
GBs at 1,024 seeds) and starts learning after ``max(batch_size, 2 vector steps)`` env
steps: the chunks are run past that point before timing, so every timed iteration makes
its updates. An iteration always makes one update per 4 env steps (the paper's ratio,
whatever the number of environments), so DQN's throughput grows with environments only as
far as batching the acting helps, unlike A2C's, whose one update covers all its
environments' 8 steps.

Writes ``benchmarks/results/scaling.json`` (``quick`` says which mode), and
``scaling_seeds.png`` and ``scaling_envs.png``. Keys ``<agent>_<n>seeds_steps_per_s``,
``<agent>_<n>envs_steps_per_s``, and the speed-ups ``<agent>_<max>seeds_over_1seed`` and
``<agent>_<max>envs_over_1env``.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

import jax

from benchmarks.agent_throughput import CARTPOLE_ENVS, agent_setups
from benchmarks.common import (RESULTS, Headline, compiled_chunk, enable_compilation_cache, ratio, stacked_runners,
                               steps_per_second, write_result)
from rlhf_jax.cli import whole_number
from rlhf_jax.envs import EnvConfig, make

ENV_ID = "gymnax/CartPole-v1"
SEEDS = (1, 4, 16, 64, 256, 1024)
QUICK_SEEDS = (1, 4, 16, 64)
# 32 is the seed sweep's environments per seed: that point is measured once for both sweeps.
ENVS = (1, 4, 16, 32, 64, 256, 1024)
QUICK_ENVS = (1, 8, 32, 128, 512)
REPLAY_ROWS = 512  # DQN: vector steps of replay per seed (module docstring)


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long each point is timed."""

    chunk_steps: int  # env steps (summed over seeds) that one compiled call aims at
    min_seconds: float  # a timing calls the chunk until at least this long has passed
    repeats: int  # timings per point; the best counts


QUICK = Budget(chunk_steps=4_096, min_seconds=0.5, repeats=3)
FULL = Budget(chunk_steps=32_768, min_seconds=1.5, repeats=3)


def throughput_config(name: str, config, num_envs: int):
    """The agent's CartPole config, adapted to timing: a schedule long enough never to end
    and, for DQN, a small replay memory that starts learning almost at once."""
    config = dataclasses.replace(config, total_env_steps=10**9)
    if name == "dqn":
        config = dataclasses.replace(config, replay_capacity=REPLAY_ROWS * num_envs,
                                     replay_start=max(config.batch_size, 2 * num_envs))
    return config


@functools.lru_cache(maxsize=None)
def prepared(name: str, num_envs: int):
    """``(agent, config, env, init)`` for ``num_envs`` CartPoles, ``init(key) -> runner`` jitted
    for one seed; kept, so that the points of the seed sweep compile it once."""
    agent, config = agent_setups()[name]
    env = make(EnvConfig(id=ENV_ID, num_envs=num_envs))
    config = throughput_config(name, config, num_envs)
    return agent, config, env, jax.jit(lambda key: agent.init_runner(key, config, env))


@functools.lru_cache(maxsize=None)
def measure(name: str, seeds: int, num_envs: int, budget: Budget) -> dict:
    """Env steps per second (summed over seeds) of agent ``name`` with ``seeds`` x ``num_envs``
    CartPoles (kept: a point both sweeps share is measured once)."""
    agent, config, env, init = prepared(name, num_envs)
    per_seed = agent.env_steps_per_iteration(config, env)
    iterations = max(1, budget.chunk_steps // (per_seed * seeds))
    steps_per_call = iterations * per_seed * seeds

    start = time.perf_counter()
    runners = jax.block_until_ready(stacked_runners(init, seeds))
    init_s = time.perf_counter() - start

    chunk = compiled_chunk(agent, config, env, iterations)
    start = time.perf_counter()
    runners, _ = jax.block_until_ready(chunk(runners))
    compile_s = time.perf_counter() - start
    # Into the learning phase before timing (DQN; A2C learns from its first iteration).
    for _ in range(math.ceil(getattr(config, "replay_start", 0) / (iterations * per_seed)) - 1):
        runners, _ = chunk(runners)
    runners = jax.block_until_ready(runners)

    start = time.perf_counter()
    runners, _ = jax.block_until_ready(chunk(runners))
    calls = max(1, math.ceil(budget.min_seconds / (time.perf_counter() - start)))
    holder = {"runners": runners}

    def run():
        for _ in range(calls):
            holder["runners"], metrics = chunk(holder["runners"])
        jax.block_until_ready(metrics)

    rate = steps_per_second(run, calls * steps_per_call, budget.repeats)
    return {"seeds": seeds, "num_envs": num_envs, "steps_per_s": round(rate, 1),
            "iterations_per_call": iterations, "env_steps_per_call": steps_per_call, "calls_per_timing": calls,
            "init_s": round(init_s, 2), "compile_s": round(compile_s, 2)}


def sweep(name: str, points: list[tuple[int, int]], budget: Budget, label: str) -> list[dict]:
    """Measure every (seeds, num_envs) point, printing each as it is done."""
    rows = []
    for seeds, num_envs in points:
        start = time.perf_counter()
        row = measure(name, seeds, num_envs, budget)
        rows.append(row)
        print(f"[scaling] {name} {label}: {seeds} seeds x {num_envs} envs: {row['steps_per_s']:,.0f} env steps/s "
              f"(compile {row['compile_s']:.1f} s, point {time.perf_counter() - start:.1f} s)",
              file=sys.stderr, flush=True)
    return rows


def plot(curves: dict, axis: str, xlabel: str, title: str, path) -> None:
    """Env steps/s against ``axis`` (``seeds`` or ``num_envs``), log-log, one line per agent,
    with dotted lines of perfect (linear) scaling from each agent's first point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in curves.items():
        xs = [row[axis] for row in rows]
        ys = [row["steps_per_s"] for row in rows]
        (line,) = ax.plot(xs, ys, marker="o", label=name.upper())
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], linestyle=":", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({row[axis] for rows in curves.values() for row in rows})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("env steps per second (all seeds)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title="dotted: linear scaling", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_counts(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="seeds up to 64, short timings: about 3-5 minutes on 2 shared CPU cores")
    parser.add_argument("--agents", default="a2c,dqn", help="comma-separated, of a2c, dqn")
    parser.add_argument("--seeds", default="", help="seed counts (default 1,4,...,1024; quick up to 64)")
    parser.add_argument("--envs", default="", help="environments per seed in the environment sweep (default 1,...,1024)")
    parser.add_argument("--seed-envs", type=whole_number(1), default=CARTPOLE_ENVS, help="environments per seed in the seed sweep")
    parser.add_argument("--plot-only", action="store_true", help="redraw the two plots from results/scaling.json")
    args = parser.parse_args()
    if args.plot_only:
        plot_result(json.loads((RESULTS / "scaling.json").read_text()))
        return
    enable_compilation_cache()
    budget = QUICK if args.quick else FULL
    seed_counts = parse_counts(args.seeds) or list(QUICK_SEEDS if args.quick else SEEDS)
    env_counts = parse_counts(args.envs) or list(QUICK_ENVS if args.quick else ENVS)
    names = [n for n in args.agents.split(",") if n]
    unknown = [n for n in names if n not in agent_setups()]
    if unknown:
        parser.error(f"unknown agents {unknown}; known: {sorted(agent_setups())}")

    start = time.perf_counter()
    by_seeds, by_envs = {}, {}
    for name in names:
        by_seeds[name] = sweep(name, [(s, args.seed_envs) for s in seed_counts], budget, "seeds")
        by_envs[name] = sweep(name, [(1, e) for e in env_counts], budget, "envs")

    summary = {}
    for name in names:
        for row in by_seeds[name]:
            summary[f"{name}_{row['seeds']}seeds_steps_per_s"] = row["steps_per_s"]
        for row in by_envs[name]:
            summary[f"{name}_{row['num_envs']}envs_steps_per_s"] = row["steps_per_s"]
        first, last = by_seeds[name][0], by_seeds[name][-1]
        summary[f"{name}_{last['seeds']}seeds_over_{first['seeds']}seed"] = round(
            last["steps_per_s"] / first["steps_per_s"], 2)
        first, last = by_envs[name][0], by_envs[name][-1]
        summary[f"{name}_{last['num_envs']}envs_over_{first['num_envs']}env"] = round(
            last["steps_per_s"] / first["steps_per_s"], 2)

    result = {
        "quick": args.quick, "env": ENV_ID, "agents": names, "seed_sweep_envs_per_seed": args.seed_envs,
        "dqn_replay_rows": REPLAY_ROWS, "budget": dataclasses.asdict(budget),
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "seconds": round(time.perf_counter() - start, 1),
        **summary, "seeds_sweep": by_seeds, "envs_sweep": by_envs,
    }
    path = write_result("scaling", result, headline=headline)
    plot_result(json.loads(path.read_text()))


def headline(result: dict) -> list[Headline]:
    """The report's rows: every point of both sweeps, beside each agent's first point of the sweep."""
    rows = []
    for sweep, axis, unit in (("seeds_sweep", "seeds", "seed"), ("envs_sweep", "num_envs", "env")):
        for agent, points in result[sweep].items():
            base = points[0]
            for point in points:
                if sweep == "seeds_sweep":
                    what = f"{point['seeds']} seed{'' if point['seeds'] == 1 else 's'} x {point['num_envs']} envs"
                else:
                    what = f"1 seed x {point['num_envs']} env{'' if point['num_envs'] == 1 else 's'}"
                what = f"{agent.upper()} CartPole env steps/s, {what}"
                if point is base:
                    rows.append(Headline(what, point["steps_per_s"]))
                    continue
                plural = "" if base[axis] == 1 else "s"
                rows.append(Headline(f"{what} (peer: {base[axis]} {unit}{plural}; ratio = speed-up)",
                                     point["steps_per_s"], base["steps_per_s"],
                                     ratio(point["steps_per_s"], base["steps_per_s"])))
    return rows


def plot_result(result: dict) -> None:
    """Draw ``scaling_seeds.png`` and ``scaling_envs.png`` from a ``scaling.json`` result."""
    machine = result.get("machine", {})
    where = machine.get("device", "?")
    if where.startswith("cpu"):
        where = f"cpu ({machine.get('cpu_cores', '?')} cores)"
    mode = ", --quick" if result.get("quick") else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(result["seeds_sweep"], "seeds", f"seeds vmapped ({result['seed_sweep_envs_per_seed']} CartPoles each)",
         f"Agents' throughput against seeds, {where}{mode}", RESULTS / "scaling_seeds.png")
    plot(result["envs_sweep"], "num_envs", "environments (one seed)",
         f"Agents' throughput against environments, {where}{mode}", RESULTS / "scaling_envs.png")


if __name__ == "__main__":
    main()
