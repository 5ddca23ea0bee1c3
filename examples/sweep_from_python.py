"""A sweep of seeds x learning rates as one compiled program, from Python rather than the CLI.

A2C keeps its learning rate in the optimiser state (``optax.inject_hyperparams``), so runs
that differ only in their seed and learning rate are one program on different states. Each
run is initialised on its own, with its seed and its learning rate (``a2c.init_runner``); the
states are stacked along a new leading axis, and ``jax.jit(jax.vmap(train))`` runs them all,
``train`` being ``jax.lax.scan`` of the agent's pure iteration (``a2c.make_iteration``).
The runs are initialised one at a time, not vmapped: on a CPU with few cores, vmapped
orthogonal initialisers can hang (see the docs' troubleshooting page).

The script prints each run's mean true return over its last tenth of training, and the
mean over seeds for each learning rate.

    python examples/sweep_from_python.py --seeds 3 --learning-rates 0.001,0.003
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.agents import a2c, env_reward
from rlhf_jax.envs import EnvConfig, make


def main(argv: list[str] | None = None) -> dict[float, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning-rates", default="0.0003,0.003", help="comma-separated")
    parser.add_argument("--env-steps", type=int, default=256_000, help="env steps per run")
    parser.add_argument("--envs", type=int, default=32)
    args = parser.parse_args(argv)
    learning_rates = [float(x) for x in args.learning_rates.split(",")]

    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=args.envs))
    base = a2c.A2CConfig(total_env_steps=args.env_steps, num_steps=8, entropy_coef=0.0,
                         learning_rate=learning_rates[0])
    iterations = a2c.num_iterations(base, env)
    # One iteration function for every run: the learning rate is read from each run's state.
    iteration = a2c.make_iteration(base, env, env_reward)

    def train(runner):
        return jax.lax.scan(lambda r, _: iteration(r)[:2], runner, None, iterations)

    runs = [(lr, seed) for lr in learning_rates for seed in range(args.seeds)]
    runners = [a2c.init_runner(jax.random.PRNGKey(seed), dataclasses.replace(base, learning_rate=lr), env)
               for lr, seed in runs]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *runners)

    start = time.perf_counter()
    final, metrics = jax.block_until_ready(jax.jit(jax.vmap(train))(stacked))
    seconds = time.perf_counter() - start

    # Mean true return of the episodes that ended in each run's last tenth of iterations.
    last = max(1, iterations // 10)
    episodes = np.asarray(metrics["episodes"][:, -last:].sum(1))
    returns = np.asarray(metrics["episode_return_sum"][:, -last:].sum(1)) / np.maximum(episodes, 1)
    held = np.asarray(final.opt_state[1].hyperparams["learning_rate"])  # each run's own rate

    print(f"{len(runs)} runs of {iterations * a2c.env_steps_per_iteration(base, env):,} env steps, "
          f"one program, {seconds:.1f} s with compilation")
    results: dict[float, list[float]] = {lr: [] for lr in learning_rates}
    for (lr, seed), ret, rate in zip(runs, returns, held):
        assert np.isclose(rate, lr), (rate, lr)
        results[lr].append(float(ret))
        print(f"learning rate {lr:<8g} seed {seed}  return {ret:6.1f}")
    for lr, rets in results.items():
        print(f"learning rate {lr:<8g} mean over {len(rets)} seeds: {np.mean(rets):6.1f} +- {np.std(rets):.1f}")
    return results


if __name__ == "__main__":
    main()
