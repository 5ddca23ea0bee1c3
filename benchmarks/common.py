"""What every benchmark shares: timing, the machine's description, and the JSON result file."""
from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from rlhf_jax.agents.base import env_reward

RESULTS = Path(__file__).resolve().parent / "results"


def enable_compilation_cache() -> None:
    """Reuse compiled programs across runs: compiling dominates short benchmarks on few cores."""
    cache = Path(__file__).resolve().parent.parent / ".cache" / "jax"
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def machine() -> dict:
    device = jax.devices()[0]
    return {
        "device": f"{device.platform}:{getattr(device, 'device_kind', '')}",
        "device_count": jax.device_count(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def steps_per_second(run, steps: int, repeats: int = 3) -> float:
    """Best of ``repeats`` timings of ``run()`` (which must block until done), in steps per second.

    The best, not the mean: on a shared machine other work only ever slows a run down.
    """
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return steps / best


def write_result(name: str, result: dict) -> Path:
    """Write ``benchmarks/results/<name>.json`` and print the same JSON object as the last line."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "machine": machine(), **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return path


def stacked_runners(init, seeds: int, seed: int = 0):
    """``seeds`` runners on a leading axis, each initialised by its own call from the keys of
    ``PRNGKey(seed)``: vmapped orthogonal initialisers are batched LAPACK QRs, which can
    deadlock XLA:CPU on few cores (see the README's *A CPU hang to know about*)."""
    runners = [init(key) for key in jax.random.split(jax.random.PRNGKey(seed), seeds)]
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *runners)


def compiled_chunk(agent, config, env, iterations: int):
    """``chunk(runners) -> (runners, metrics)``: ``iterations`` vmapped iterations, runners donated."""
    iteration = agent.make_iteration(config, env, env_reward)
    step_seeds = jax.vmap(lambda runner: iteration(runner, None)[:2])

    def chunk(runners):
        return jax.lax.scan(lambda runners, _: step_seeds(runners), runners, None, iterations)

    return jax.jit(chunk, donate_argnums=0)
