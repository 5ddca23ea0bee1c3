"""What learning the reward costs: env steps/s of the RLHF loop over the same agent on the true reward.

    python -m benchmarks.rlhf_overhead [--quick]

Both sides run as ``rlhf-jax train`` runs them (the same chunks, the same compiled
iterations); the RLHF side adds the learned reward inside every step, the recording and
cutting of segments, the queries, the oracle, and the ensemble's fitting
(``fit_pairs_per_env_step`` pairs per env step, the paper's 0.1 by default). The set-up
before RL (the untrained policy's labels, pretraining) is left out of both.

Key ``rlhf_over_true_reward`` (CartPole A2C; target >= 0.8) and ``pong_rlhf_over_true_reward``
(A2C on Pong through EnvPool with the paper's Atari reward CNN).
"""
from __future__ import annotations

import argparse
import time

import jax

from benchmarks.common import enable_compilation_cache, write_result
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build
from rlhf_jax.trainer import make_training


def chunk_steps_per_second(config: ExperimentConfig, chunks: int) -> float:
    """Env steps/s over ``chunks`` chunks after a first, compiling one."""
    training = make_training(config)
    state = jax.block_until_ready(training.init_runner(jax.random.PRNGKey(0)))
    state, _ = training.run_chunk(state, 0)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for chunk in range(1, chunks + 1):
        state, metrics = training.run_chunk(state, chunk)
    jax.block_until_ready(state)
    return chunks * training.chunk_iterations * training.steps_per_iteration / (time.perf_counter() - start)


def ratio(rlhf: dict, overrides: list[str], chunks: int) -> tuple[float, float]:
    learned = build(ExperimentConfig, apply_overrides(rlhf, overrides))
    true = build(ExperimentConfig, apply_overrides(rlhf, [*overrides, "reward=env"]))
    return chunk_steps_per_second(learned, chunks), chunk_steps_per_second(true, chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: about a minute on 2 CPU cores")
    parser.add_argument("--no-atari", action="store_true", help="leave out Pong")
    args = parser.parse_args()
    enable_compilation_cache()
    results: dict = {}

    chunks = 3 if args.quick else 10
    cartpole = ["run.chunk_env_steps=51200", f"a2c.total_env_steps={51200 * (chunks + 2)}"]
    learned, true = ratio(DEFAULT_EXPERIMENT, cartpole, chunks)
    results.update(cartpole_rlhf_steps_per_s=learned, cartpole_true_reward_steps_per_s=true,
                   rlhf_over_true_reward=learned / true)

    if not args.no_atari:
        # Small buffers and budgets so that the CPU run fits in memory and minutes; the
        # per-step work (reward CNN on every frame, fitting 0.1 pairs per env step) is the paper's.
        pong_chunks = 2 if args.quick else 5
        steps = 1_600 if args.quick else 8_000
        pong = {**DEFAULT_EXPERIMENT, "name": "rlhf-pong", "env": {"id": "envpool/Pong-v5", "num_envs": 16,
                                                                    "hide_episode_end": True, "hide_score": True},
                "a2c": {"total_env_steps": steps * (pong_chunks + 2)},
                "preferences": {"labels": 200, "initial_labels": 20, "segment_capacity": 64, "pretrain_epochs": 1},
                "run": {"chunk_env_steps": steps}}
        learned, true = ratio(pong, [], pong_chunks)
        results.update(pong_rlhf_steps_per_s=learned, pong_true_reward_steps_per_s=true,
                       pong_rlhf_over_true_reward=learned / true)

    write_result("rlhf_overhead", {"quick": args.quick,
                                   **{k: round(v, 4) if "over" in k else round(v, 1) for k, v in results.items()}})


if __name__ == "__main__":
    main()
