"""Learning curves on MinAtar Breakout: each agent, 3 seeds vmapped in one program, true return vs env steps.

    python -m experiments.minatar_curves [--quick] [--env-steps N]

Writes ``experiments/results/minatar_curves.json`` and ``minatar_curves.png``. The full
run (default 5M env steps per seed) belongs here, not in the tests.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from benchmarks.agent_throughput import agent_setups
from benchmarks.common import Headline, enable_compilation_cache
from experiments.common import RESULTS, write_result
from rlhf_jax.cli import whole_number
from rlhf_jax.envs import EnvConfig, make

ENV_ID = "gymnax/Breakout-MinAtar"
SEEDS = 3
NUM_ENVS = 32
POINTS = 50  # points on each curve


def curve(agent, config, env_steps: int) -> dict:
    env = make(EnvConfig(id=ENV_ID, num_envs=NUM_ENVS))
    config = dataclasses.replace(config, total_env_steps=env_steps)
    train = jax.jit(jax.vmap(agent.make_train(config, env)))
    start = time.perf_counter()
    _, metrics = jax.block_until_ready(train(jax.random.split(jax.random.PRNGKey(0), SEEDS)))
    seconds = time.perf_counter() - start
    # Per seed: mean true return of the episodes finished in each of POINTS windows.
    episodes = np.asarray(metrics["episodes"])
    returns = np.asarray(metrics["episode_return_sum"])
    steps = np.asarray(metrics["env_steps"])[0]
    windows = np.array_split(np.arange(episodes.shape[1]), min(POINTS, episodes.shape[1]))
    per_seed = [[float(returns[s, w].sum() / max(episodes[s, w].sum(), 1)) for w in windows] for s in range(SEEDS)]
    return {"env_steps": [int(steps[w[-1]]) for w in windows], "return_per_seed": per_seed,
            "seconds_with_compile": round(seconds, 1), "steps_per_s_with_compile": round(SEEDS * env_steps / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run, under a minute on 2 CPU cores")
    parser.add_argument("--env-steps", type=whole_number(0), default=0, help="env steps per seed (default 5M, quick 100k)")
    args = parser.parse_args()
    enable_compilation_cache()
    env_steps = args.env_steps or (100_000 if args.quick else 5_000_000)
    curves = {name: curve(agent, config, env_steps) for name, (agent, config) in agent_setups().items()}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, result in curves.items():
        returns = np.array(result["return_per_seed"])
        mean, low, high = returns.mean(0), returns.min(0), returns.max(0)
        ax.plot(result["env_steps"], mean, label=f"{name} (mean of {SEEDS} seeds)")
        ax.fill_between(result["env_steps"], low, high, alpha=0.2)
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("true episode return")
    ax.set_title(ENV_ID)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "minatar_curves.png", dpi=100)
    write_result("minatar_curves", {"quick": args.quick, "env": ENV_ID, "seeds": SEEDS, "env_steps": env_steps,
                                    "final_mean_return": {n: float(np.mean([r[-1] for r in c["return_per_seed"]]))
                                                          for n, c in curves.items()},
                                    "curves": curves}, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: each agent's final return (no peer)."""
    return [Headline(f"MinAtar Breakout final return, {agent.upper()}, {result['env_steps']:,} env steps x "
                     f"{result['seeds']} seeds", value) for agent, value in result["final_mean_return"].items()]


if __name__ == "__main__":
    main()
