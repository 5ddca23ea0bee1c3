"""What every benchmark shares: timing, the machine's description, the JSON result file, and
the typed rows (:class:`Headline`) each benchmark gives the report's table."""
from __future__ import annotations

import dataclasses
import datetime
import json
import operator
import os
import platform
import time
from pathlib import Path
from typing import Callable, Literal

import jax
import jax.numpy as jnp

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


@dataclasses.dataclass(frozen=True)
class Target:
    """A target a benchmark's docstring states, on one figure of its result: ``value comparison threshold``."""

    key: str  # the result's key it is checked on, e.g. "rlhf_over_true_reward"
    comparison: Literal[">=", "<="]
    threshold: float
    value: float | None  # the result's figure at ``key``; None where it was not measured

    @classmethod
    def on(cls, result: dict, key: str, comparison: Literal[">=", "<="], threshold: float) -> Target:
        return cls(key, comparison, threshold, result.get(key))

    @property
    def met(self) -> bool | None:
        """Whether the figure meets the target; None where there is no figure."""
        if not isinstance(self.value, (int, float)):
            return None
        return {">=": operator.ge, "<=": operator.le}[self.comparison](self.value, self.threshold)


@dataclasses.dataclass(frozen=True)
class Headline:
    """One row of the table in ``benchmarks/REPORT.md``: a headline figure of a benchmark, beside
    the peer's or the raw back end's where there is one. A figure is None where it was not measured.

    Each benchmark has ``headline(result) -> list[Headline]`` beside the code that measures the
    figures; :func:`write_result` stores its rows in the result, and ``benchmarks/run.py`` only
    renders them."""

    what: str  # the metric in words: what is measured, in which unit, set up how
    ours: float | None
    peer: float | None = None
    ratio: float | None = None  # ours over peer, as the benchmark measured or computed it
    target: Target | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> Headline:
        target = row.get("target")
        return cls(**{**row, "target": Target(**target) if target else None})


def ratio(ours, peer) -> float | None:
    """``ours / peer``, or None where either is missing or the peer is 0."""
    numbers = all(isinstance(x, (int, float)) for x in (ours, peer))
    return ours / peer if numbers and peer else None


def with_headline(result: dict, headline: Callable[[dict], list[Headline]]) -> dict:
    """``result`` with its headline rows, made from ``result`` itself, under the key ``"headline"``."""
    return {**result, "headline": [row.to_json() for row in headline(result)]}


def write_result(name: str, result: dict, headline: Callable[[dict], list[Headline]] | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` and print the same JSON object as the last line.

    ``headline``: the benchmark's function from its result to its rows of the report's table
    (:class:`Headline`); a result without one is not in the report."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "machine": machine(), **result}
    if headline is not None:
        result = with_headline(result, headline)
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
    # Imported here: benchmarks/run.py imports this module for Headline, and its report must
    # not depend on the library importing.
    from rlhf_jax.agents.base import env_reward

    iteration = agent.make_iteration(config, env, env_reward)
    step_seeds = jax.vmap(lambda runner: iteration(runner, None)[:2])

    def chunk(runners):
        return jax.lax.scan(lambda runners, _: step_seeds(runners), runners, None, iterations)

    return jax.jit(chunk, donate_argnums=0)
