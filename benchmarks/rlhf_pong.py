"""The RLHF loop on Pong at the paper's settings against A2C on the score: env steps/s of whole chunks.

    python -m benchmarks.rlhf_pong [--quick] [--rounds N]

Both sides are ``configs/paper/atari/pong.yaml`` as ``rlhf-jax train`` runs it (A2C, 16
environments, the Nature CNN, python dispatch on a CPU): the preference side with 3,300 labels,
the reward CNN ensemble of 3 and its fitting at 1 pair per 10 env steps; the other with
``reward=env``, so that only the reward differs. A chunk is ``run.chunk_env_steps`` env steps,
the configs' 50,000 (``--quick``: 10,000, where the chunk's fixed costs, the refresh and the
queries, weigh five times as much). The preference side is timed with its label ring full
(3,000 labels, as in the last 1.7M env steps of a 10M-step run with 3,300 labels): the refresh
scores up to 1,024 held labels, so a fuller ring is a slower chunk. The set-up before RL (the untrained policy's
labels, pretraining) is left out; pretraining runs 1 epoch here.

Each side compiles everything it calls first, then whole chunks are timed, the sides taking
turns (true reward, RLHF, true reward, ...; ``--rounds`` RLHF chunks), so that load from
elsewhere falls on both alike. Beside the ratio, the seconds of each part of an RLHF chunk:
acting (A2C's iteration, r̂ on every frame, the clips), asking, fitting and the refresh, each
timed alone, and the arithmetic per env step of A2C and of the fitting as XLA's cost analysis
counts it, which bounds the ratio where arithmetic sets the pace.

Key ``pong_rlhf_over_true_reward``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax

from benchmarks.common import Headline, enable_compilation_cache, on_cpu, write_result
from benchmarks.rlhf_overhead import xla_flops
from rlhf_jax.cli import whole_number
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.driver import Driver

PONG = Path(__file__).resolve().parent.parent / "configs" / "paper" / "atari" / "pong.yaml"
LABELS = 3_300
FULL_RING = 3_000


def pong_driver(chunk_env_steps: int, *overrides: str) -> Driver:
    return Driver(load_config(ExperimentConfig, PONG, [
        f"preferences.labels={LABELS}", "preferences.pretrain_epochs=1", f"run.chunk_env_steps={chunk_env_steps}",
        "run.tensorboard=false", *overrides]))


def timed(work) -> tuple[object, float]:
    start = time.perf_counter()
    out = jax.block_until_ready(work())
    return out, time.perf_counter() - start


def rlhf_ready(driver: Driver):
    """The preference run after its set-up, its label ring filled, every part compiled."""
    compiled, loop = driver.compiled, driver.loop
    state = driver.init(jax.random.PRNGKey(0))
    while int(state.learner.labels.ring.size) < FULL_RING:
        state = compiled.ask(state, 500, 500)
    state, _ = compiled.collect(state, 1)
    state = compiled.ask(state, int(loop.wanted[0]), loop.max_queries)
    state, _ = compiled.fit_and_refresh(state, 1)
    return jax.block_until_ready(state)


def parts_of_a_chunk(driver: Driver, state) -> tuple[object, dict[str, float]]:
    """Seconds of each part of one chunk, each timed alone (acting over the whole chunk)."""
    compiled, loop = driver.compiled, driver.loop
    (state, _), acting = timed(lambda: compiled.collect(state, loop.chunk_iterations))
    state, asking = timed(lambda: compiled.ask(state, int(loop.wanted[0]), loop.max_queries))
    (state, _), refresh = timed(lambda: compiled.fit_and_refresh(state, 0))
    (state, _), fit_and_refresh = timed(lambda: compiled.fit_and_refresh(state, loop.fit_steps))
    return state, {"acting": acting, "asking": asking, "fitting": fit_and_refresh - refresh, "refresh": refresh}


def fitting_flops_per_env_step(driver: Driver) -> float:
    loop = driver.loop
    state = jax.eval_shape(loop.init, jax.random.PRNGKey(0))
    return xla_flops(loop.fit_one, state) * loop.fit_steps / (loop.chunk_iterations * loop.steps_per_iteration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="chunks of 10,000 env steps: about 10 minutes on 2 cores")
    parser.add_argument("--rounds", type=whole_number(1), default=1, help="RLHF chunks timed, each between two on the score")
    args = parser.parse_args()
    enable_compilation_cache()
    chunk = 10_000 if args.quick else 50_000

    true, learned = pong_driver(chunk, "reward=env"), pong_driver(chunk)
    true_state = true.init(jax.random.PRNGKey(0))
    true_state, _, _ = true.run_chunk(true_state, 0)  # compiles
    state = rlhf_ready(learned)
    # Each part, then the whole chunk, once untimed: under "scan" dispatch (an accelerator's
    # default) each is one program compiled at the chunk's length on its first call.
    state, _ = parts_of_a_chunk(learned, state)
    state, parts = parts_of_a_chunk(learned, state)
    state, _, _ = learned.run_chunk(state, 0)
    steps = learned.loop.chunk_iterations * learned.loop.steps_per_iteration
    true_seconds, rlhf_seconds, loads = [], [], []
    for index in range(args.rounds):
        (true_state, _, _), seconds = timed(lambda: true.run_chunk(true_state, index + 1))
        true_seconds.append(seconds)
        (state, _, _), seconds = timed(lambda: learned.run_chunk(state, index + 1))
        rlhf_seconds.append(seconds)
        loads.append(round(os.getloadavg()[0], 1))
        print(f"round {index + 1}/{args.rounds}: true reward {true_seconds[-1]:.1f} s, RLHF {seconds:.1f} s "
              f"per {steps} env steps, load {loads[-1]}", flush=True)
    (true_state, _, _), seconds = timed(lambda: true.run_chunk(true_state, args.rounds + 1))
    true_seconds.append(seconds)

    true_rate = steps / (sum(true_seconds) / len(true_seconds))
    rlhf_rate = steps / (sum(rlhf_seconds) / len(rlhf_seconds))
    a2c_flops = xla_flops(lambda r: true.loop.iteration(r)[0], true.abstract_state()) / true.loop.steps_per_iteration
    result = {"quick": args.quick, "chunk_env_steps": steps, "labels_held": FULL_RING, "rounds": args.rounds,
              "load_1min": loads,
              "pong_rlhf_steps_per_s": round(rlhf_rate, 1), "pong_true_reward_steps_per_s": round(true_rate, 1),
              "pong_rlhf_over_true_reward": round(rlhf_rate / true_rate, 4),
              "rlhf_chunk_seconds": [round(s, 1) for s in rlhf_seconds],
              "true_reward_chunk_seconds": [round(s, 1) for s in true_seconds],
              "rlhf_chunk_parts_seconds": {k: round(v, 1) for k, v in parts.items()},
              "flops_per_env_step_a2c": round(a2c_flops), "flops_per_env_step_fitting": round(
                  fitting_flops_per_env_step(learned))}
    write_result("rlhf_pong_quick" if args.quick else "rlhf_pong", result, headline=headline)


def headline(result: dict) -> list[Headline]:
    r = result
    rows = [
        Headline(f"RLHF loop env steps/s vs A2C on the score (Pong, the paper's settings, {r['labels_held']:,} labels "
                 f"held, chunks of {r['chunk_env_steps']:,} env steps; alternated)",
                 r["pong_rlhf_steps_per_s"], r["pong_true_reward_steps_per_s"], r["pong_rlhf_over_true_reward"]),
    ]
    # On a GPU, XLA's cost analysis leaves out the convolutions cuDNN computes (it counts about
    # the dense layers' share of A2C's arithmetic there): the count is arithmetic on a CPU only.
    if on_cpu(r):
        rows.append(Headline(
            "Arithmetic per env step (XLA cost analysis, flops): the reward CNN's fitting vs A2C's iteration (Pong)",
            r["flops_per_env_step_fitting"], r["flops_per_env_step_a2c"],
            r["flops_per_env_step_fitting"] / r["flops_per_env_step_a2c"]))
    return rows


if __name__ == "__main__":
    main()
