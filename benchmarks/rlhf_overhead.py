"""What learning the reward costs: env steps/s of the RLHF loop over the same agent on the true reward.

    python -m benchmarks.rlhf_overhead [--quick]

Both sides run as ``rlhf-jax train`` runs them (the same chunks, the same compiled
iterations); the RLHF side adds the learned reward inside every step, the recording and
cutting of segments, the queries, the oracle, and the ensemble's fitting
(``fit_pairs_per_env_step`` pairs per env step, the paper's 0.1 by default). The set-up
before RL (the untrained policy's labels, pretraining) is left out of both.

Key ``rlhf_over_true_reward`` (CartPole A2C; target >= 0.8; Pong, at the paper's settings, is
``benchmarks/rlhf_pong.py``). Beside the ratio: the same loop with no fitting (``fit_pairs_per_env_step=0``), and the arithmetic each side
does per env step as XLA's cost analysis counts it, which bounds the ratio on any machine
where arithmetic, not the sequence of small steps, sets the pace.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from benchmarks.common import Headline, Target, enable_compilation_cache, write_result
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build
from rlhf_jax.driver import Driver


def chunk_rates(configs: dict[str, ExperimentConfig], chunks: int) -> tuple[dict[str, float], dict]:
    """Env steps/s of each config's chunks: best of ``chunks`` chunks after a first, compiling
    one, the configs taking turns chunk by chunk so that load from elsewhere falls on all alike.
    Returns the rates and the drivers that ran them, by the configs' names."""
    runs = {}
    for name, config in configs.items():
        driver = Driver(config)
        state = driver.init(jax.random.PRNGKey(0))
        state, _, _ = driver.run_chunk(state, 0)
        runs[name] = [driver, jax.block_until_ready(state), float("inf")]
    for chunk in range(1, chunks + 1):
        for run in runs.values():
            driver, state, best = run
            start = time.perf_counter()
            state, _, _ = driver.run_chunk(state, chunk)
            jax.block_until_ready(state)
            run[1:] = [state, min(best, time.perf_counter() - start)]
    rates = {name: d.loop.chunk_iterations * d.loop.steps_per_iteration / best for name, (d, _, best) in runs.items()}
    return rates, {name: driver for name, (driver, _, _) in runs.items()}


def xla_flops(function, *args) -> float:
    """Floating-point operations of one call, as XLA's cost analysis of the compiled program counts them."""
    cost = jax.jit(function).lower(*args).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def flops_per_env_step(learned, true) -> dict[str, float]:
    """Arithmetic per env step: the agent's iteration on the true reward (``true``, a
    :class:`~rlhf_jax.driver.Driver` on it); the loop's (``learned``'s) iteration on r̂ with its recording,
    its share of the fitting steps, and of the per-chunk queries, l2 adaptation and scoring.
    Loop bodies are counted once, so each piece is one iteration or step. Only shapes are
    needed: nothing is run."""
    runner = true.abstract_state()
    loop = learned.loop
    state = jax.eval_shape(loop.init, jax.random.PRNGKey(0))
    chunk_steps = loop.chunk_iterations * loop.steps_per_iteration
    fitting = xla_flops(loop.fit_one, state) * loop.fit_steps / chunk_steps
    # The metrics are returned too: XLA drops what a program does not return, and the
    # scoring would then count for nothing.
    rest = xla_flops(lambda s: loop.refresh(loop.ask(s, jnp.int32(1), loop.max_queries)), state) / chunk_steps
    playing = xla_flops(lambda s: loop.collect(s)[0], state) / loop.steps_per_iteration
    return {"agent_on_true_reward": xla_flops(lambda r: true.loop.iteration(r)[0], runner) / true.loop.steps_per_iteration,
            "rlhf_loop": playing + fitting + rest, "rlhf_fitting": fitting}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: about a minute on 2 CPU cores")
    args = parser.parse_args()
    enable_compilation_cache()
    results: dict = {}

    chunks = 3 if args.quick else 10
    cartpole = ["run.chunk_env_steps=51200", f"a2c.total_env_steps={51200 * (chunks + 2)}"]
    config = lambda *extra: build(ExperimentConfig, apply_overrides(DEFAULT_EXPERIMENT, [*cartpole, *extra]))
    rates, trainings = chunk_rates({"learned": config(), "no_fitting": config("preferences.fit_pairs_per_env_step=0"),
                                    "true": config("reward=env")}, chunks)
    flops = flops_per_env_step(trainings["learned"], trainings["true"])
    results.update(cartpole_rlhf_steps_per_s=rates["learned"], cartpole_true_reward_steps_per_s=rates["true"],
                   cartpole_no_fitting_steps_per_s=rates["no_fitting"],
                   rlhf_over_true_reward=rates["learned"] / rates["true"],
                   no_fitting_over_true_reward=rates["no_fitting"] / rates["true"],
                   **{f"flops_per_env_step_{name}": value for name, value in flops.items()},
                   flops_rlhf_over_true_reward=flops["rlhf_loop"] / flops["agent_on_true_reward"])

    write_result("rlhf_overhead", {"quick": args.quick,
                                   **{k: round(v, 4) if "over" in k else round(v, 1) for k, v in results.items()}},
                 headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: CartPole's ratio (the module docstring's target) and what bounds it."""
    r = result
    return [
        Headline("RLHF loop env steps/s vs the same agent on the true reward (CartPole A2C)",
                 r["cartpole_rlhf_steps_per_s"], r["cartpole_true_reward_steps_per_s"], r["rlhf_over_true_reward"],
                 Target.on(r, "rlhf_over_true_reward", ">=", 0.8)),
        Headline("The same loop with no fitting (fit_pairs_per_env_step=0), env steps/s vs true reward",
                 r["cartpole_no_fitting_steps_per_s"], r["cartpole_true_reward_steps_per_s"],
                 r["no_fitting_over_true_reward"]),
        Headline("Arithmetic per env step (XLA cost analysis, flops): RLHF loop vs the agent on the true reward",
                 r["flops_per_env_step_rlhf_loop"], r["flops_per_env_step_agent_on_true_reward"],
                 r["flops_rlhf_over_true_reward"]),
    ]


if __name__ == "__main__":
    main()
