"""What every benchmark shares: timing, the machine's description, the JSON result file, and
the typed rows (:class:`Headline`) each benchmark gives the report's table."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import operator
import os
import platform
import shlex
import statistics
import time
from pathlib import Path
from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp

RESULTS = Path(__file__).resolve().parent / "results"


def enable_compilation_cache() -> None:
    """Reuse compiled programs across runs: compiling dominates short benchmarks on few cores."""
    cache = Path(__file__).resolve().parent.parent / ".cache" / "jax"
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def cpu_model() -> str:
    """The processor's name: XLA's CPU code, and so its timings and even its rounding, differ by it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The vector extensions that decide which code XLA:CPU emits (and so the rounding of a run).
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                     "amx_tile")


def command_line(module: str, argv: list[str]) -> str:
    """The command that ran ``python -m module`` with ``argv``, as a record keeps it: quoted
    where a word needs it, so that pasting it runs the same (``--cells 'hopper/700 labels'``)."""
    return shlex.join(["python", "-m", module, *argv])


def cpu_host() -> dict:
    """What makes a run's digits this host's: the processor, its vector extensions and the XLA
    flags. The same code and seed give the same digits on one such host; on another, results
    agree only statistically."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {"cpu": cpu_model(), "vector_extensions": [f for f in VECTOR_EXTENSIONS if f in flags],
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def machine() -> dict:
    """Where a result was measured: the device, and the host as :func:`cpu_host` names it."""
    device = jax.devices()[0]
    return {
        "device": f"{device.platform}:{getattr(device, 'device_kind', '')}",
        "device_count": jax.device_count(),
        **cpu_host(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


class PartsRun(NamedTuple):
    """How a benchmark made of named parts runs (:func:`parse_parts`)."""

    quick: bool  # small budgets
    parts: tuple[str, ...]  # the parts to measure
    merge: bool  # only some parts: keep the stored result's other figures
    repeats: int  # timings of which the best is kept
    rounds: int  # rounds of a side-by-side timing


def parse_parts(description: str, parts: tuple[str, ...], argv: list[str] | None = None) -> PartsRun:
    """``--quick`` and ``--only PART`` (repeatable), read the same way by every benchmark of parts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small budgets: under a minute on 2 CPU cores")
    parser.add_argument("--only", action="append", choices=parts,
                        help="measure only these parts (repeatable) and keep the stored result's other figures")
    args = parser.parse_args(argv)
    return PartsRun(args.quick, tuple(args.only or parts), args.only is not None,
                    repeats=1 if args.quick else 3, rounds=3 if args.quick else 5)


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


class Side(NamedTuple):
    """One side of a side-by-side timing: ``run()`` does ``units`` of work (env steps, pairs)
    and returns once it is done (it blocks on its device's results itself)."""

    run: Callable[[], object]
    units: float


class Spread(NamedTuple):
    """A figure over alternating rounds: the median and the [min, max] of the rounds."""

    median: float
    low: float
    high: float
    rounds: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Spread:
        values = tuple(float(v) for v in values)
        return cls(statistics.median(values), min(values), max(values), values)


class SideBySide(NamedTuple):
    """Ours beside a peer, timed alternately in one run (:func:`side_by_side`)."""

    ours: Spread  # units per second
    peer: Spread
    ratio: Spread  # ours over peer within each round
    load_1min: tuple[float, ...]  # the 1-minute load average before the rounds and after each side

    def fields(self, ours: str, peer: str, ratio: str) -> dict:
        """The result's keys: each figure's median under its name, its ``_min_max`` and
        ``_rounds`` beside it, and the rounds' load under ``<ratio>_load_1min``."""
        out = {}
        for name, spread in ((ours, self.ours), (peer, self.peer), (ratio, self.ratio)):
            digits = 4 if spread.median < 100 else 1
            out[name] = round(spread.median, digits)
            out[f"{name}_min_max"] = [round(spread.low, digits), round(spread.high, digits)]
            out[f"{name}_rounds"] = [round(v, digits) for v in spread.rounds]
        out[f"{ratio}_load_1min"] = list(self.load_1min)
        return out


def side_by_side(ours: Side, peer: Side, rounds: int, label: str = "") -> SideBySide:
    """Time ``ours`` and ``peer`` alternately (ours, peer, ours, peer, ...) over ``rounds``.

    Each side runs once untimed first (compiling, allocating, warming caches). The ratio is
    the median of each round's ours over peer, not a ratio of medians or bests: a shared
    machine's speed drifts by up to 2x between rounds, and alternating lets both sides of a
    round see the same drift. The load average is recorded so a reader can judge the rounds.
    """
    ours.run()
    peer.run()
    loads = [round(os.getloadavg()[0], 2)]
    rates: dict[str, list[float]] = {"ours": [], "peer": []}
    for index in range(rounds):
        for name, side in (("ours", ours), ("peer", peer)):
            start = time.perf_counter()
            side.run()
            rates[name].append(side.units / (time.perf_counter() - start))
            loads.append(round(os.getloadavg()[0], 2))
        if label:
            print(f"{label}: round {index + 1}/{rounds}: ours {rates['ours'][-1]:.4g}/s, "
                  f"peer {rates['peer'][-1]:.4g}/s, load {loads[-1]}", flush=True)
    ratios = [a / b for a, b in zip(rates["ours"], rates["peer"])]
    return SideBySide(Spread.of(rates["ours"]), Spread.of(rates["peer"]), Spread.of(ratios), tuple(loads))


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


def results_folder() -> Path:
    """Where a benchmark writes its result: ``results/``, or ``results/accelerator/`` where JAX's
    default device is not a CPU, so that an accelerator's figures sit beside the CPU's, never
    in their place (the report shows them under their own heading)."""
    return RESULTS if jax.default_backend() == "cpu" else RESULTS / "accelerator"


def on_cpu(result: dict) -> bool:
    """Whether ``result`` was measured with JAX on a CPU (results written before ``machine`` was
    stored were)."""
    return result.get("machine", {}).get("device", "cpu").startswith("cpu")


def with_headline(result: dict, headline: Callable[[dict], list[Headline]]) -> dict:
    """``result`` with its headline rows, made from ``result`` itself, under the key ``"headline"``."""
    return {**result, "headline": [row.to_json() for row in headline(result)]}


def write_result(name: str, result: dict, headline: Callable[[dict], list[Headline]] | None = None,
                 merge: bool = False, results: Path | None = None) -> Path:
    """Write ``<results>/<name>.json`` (:func:`results_folder` unless given: the experiments
    write theirs to ``experiments/results/``) and print the same JSON object as the last line.

    ``headline``: the benchmark's function from its result to its rows of the report's table
    (:class:`Headline`); a result without one is not in the report. ``merge``: a run of some
    of a benchmark's parts (each part short enough to time on a quiet machine) keeps the
    stored result's other keys and replaces those it measured."""
    results = results_folder() if results is None else results
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    earlier = json.loads(path.read_text()) if merge and path.exists() else {}
    earlier.pop("headline", None)
    if "parts" in earlier and "parts" in result:  # the parts measured so far, by any run
        result = {**result, "parts": sorted(set(earlier["parts"]) | set(result["parts"]))}
    result = {**earlier, "benchmark": name, "machine": machine(), **result}
    if headline is not None:
        result = with_headline(result, headline)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return path


def stacked_runners(init, seeds: int, seed: int = 0):
    """``seeds`` runners on a leading axis, each initialised by its own call from the keys of
    ``PRNGKey(seed)``: vmapped orthogonal initialisers are batched LAPACK QRs, which can
    deadlock XLA:CPU on few cores (docs/notes.md, *A CPU hang*)."""
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


def cpu_overrides(config_path: Path) -> list[str]:
    """A MuJoCo config's MJX task on EnvPool's C MuJoCo instead: the CPU back end (``--backend cpu``)."""
    from rlhf_jax.config import ExperimentConfig, load_config  # here: see compiled_chunk

    env_id = load_config(ExperimentConfig, config_path, []).env.id
    return [f"env.id=envpool/{env_id.split('/', 1)[1]}"]
