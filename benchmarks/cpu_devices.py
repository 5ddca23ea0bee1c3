"""Sweeps on a CPU made one XLA device per core, against the one device JAX makes of it.

    python -m benchmarks.cpu_devices [--quick] [--configs trpo_pendulum,a2c_cartpole] [--seeds 4] [--rounds 2]

JAX makes one device of a CPU, and XLA:CPU runs the small matrix products of these agents on
one thread at a time (experiments/log/mujoco_throughput.md, "Why the five cheapest tasks stay
under 0.8"), so a
sweep's members, vmapped on that device, share about one core. ``rlhf-jax sweep`` spreads its
members over every device (:mod:`rlhf_jax.sweep`), and
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` makes a CPU N devices.

For each config, every round runs ``rlhf-jax sweep configs/<config>.yaml --seeds S`` (for
``rlhf_cartpole``, ``rlhf-jax sweep --seeds S``: the built-in default experiment) as a
process of its own twice, in turn: on one device, then on one device per core this process
may use (``os.sched_getaffinity``). The figure of a run is the median, over its chunks after
each group's first (which compiles), of ``steps_per_second`` in its ``members.csv``: the whole
sweep's env steps over the chunk's wall time, which :mod:`rlhf_jax.sweep` writes on every
member's row. The ratio is taken within each round; the result is its median, with the range. The members
are padded to a multiple of the device count, so ``--seeds`` should be a multiple of the cores. EnvPool sweeps
run on one device whatever the count (one pool feeds one device), so they are not measured.
No target: the result says what the flag is worth on this machine.

Writes ``benchmarks/results/cpu_devices.json`` (``cpu_devices_quick.json`` with ``--quick``:
TRPO on Pendulum alone, one round, 256k env steps a seed).
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Headline, Spread, write_result
from rlhf_jax.cli import whole_number

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("trpo_pendulum", "a2c_cartpole", "rlhf_cartpole")
DEFAULT = "rlhf_cartpole"  # the built-in default experiment: a sweep given no config file runs it


def config_words(config: str) -> list[str]:
    """How ``rlhf-jax sweep`` is told ``config``: ``configs/<config>.yaml``, or nothing for the
    built-in default (its one copy is package data, ``rlhf_jax/configs/default.yaml``)."""
    return [] if config == DEFAULT else [f"configs/{config}.yaml"]


def sweep_steps_per_s(config: str, seeds: int, devices: int, overrides: list[str], directory: Path) -> float:
    """Env steps per second of ``rlhf-jax sweep`` on ``devices`` CPU devices, its first chunk left out."""
    flags = os.environ.get("XLA_FLAGS", "")
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip()}
    command = [sys.executable, "-m", "rlhf_jax.cli", "sweep", *(str(ROOT / word) for word in config_words(config)),
               "--seeds", str(seeds), "--dir", str(directory), *overrides]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed (rc {done.returncode}): {done.stderr[-2000:]}")
    return sweep_rate(directory / "members.csv")


def sweep_rate(members_csv: Path) -> float:
    """A sweep's env steps per second from its ``members.csv``: the median over its chunks, each
    group's first (which compiles) left out, of the sweep's rate that every member's row of the
    chunk carries (:mod:`rlhf_jax.sweep`)."""
    by_chunk: dict[tuple[int, int], float] = {}
    with open(members_csv) as rows:
        for row in csv.DictReader(rows):
            by_chunk[int(row["group"]), int(row["chunk"])] = float(row["steps_per_second"])
    timed = [rate for (_, chunk), rate in by_chunk.items() if chunk > 0]
    if not timed:
        raise RuntimeError(f"{members_csv}: the sweep ran one chunk a group, all of it compiling; give it more env steps")
    return statistics.median(timed)


def measure(config: str, seeds: int, rounds: int, overrides: list[str]) -> dict:
    cores = len(os.sched_getaffinity(0))
    rates: dict[int, list[float]] = {1: [], cores: []}
    loads = []
    with tempfile.TemporaryDirectory(prefix="cpu_devices_") as scratch:
        for round_ in range(rounds):
            for devices in rates:
                loads.append(round(os.getloadavg()[0], 2))
                directory = Path(scratch) / f"{config}-{devices}-{round_}"
                rates[devices].append(sweep_steps_per_s(config, seeds, devices, overrides, directory))
                print(f"{config}, round {round_ + 1}, {devices} device(s): {rates[devices][-1]:,.0f} env steps/s",
                      flush=True)
    one, many = Spread.of(rates[1]), Spread.of(rates[cores])
    ratios = Spread.of(m / o for m, o in zip(many.rounds, one.rounds))
    return {
        "seeds": seeds, "cores": cores, "rounds": rounds, "overrides": overrides,
        "one_device_steps_per_s": round(one.median, 1),
        "device_per_core_steps_per_s": round(many.median, 1),
        "device_per_core_over_one": round(ratios.median, 3),
        "device_per_core_over_one_range": [round(ratios.low, 3), round(ratios.high, 3)],
        "load_during": {"min": min(loads), "max": max(loads)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="TRPO on Pendulum alone, one round, 256k env steps a seed")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated: {', '.join(CONFIGS)}")
    parser.add_argument("--seeds", type=whole_number(1), default=4)
    parser.add_argument("--rounds", type=whole_number(1), default=2)
    args = parser.parse_args()
    configs = ["trpo_pendulum"] if args.quick else args.configs.split(",")
    overrides = ["trpo.total_env_steps=256000"] if args.quick else []
    start = time.time()
    results = {config: measure(config, args.seeds, 1 if args.quick else args.rounds, overrides) for config in configs}
    write_result("cpu_devices_quick" if args.quick else "cpu_devices",
                 {"quick": args.quick, "minutes": round((time.time() - start) / 60, 1), "configs": results},
                 headline=headline)


def headline(result: dict) -> list[Headline]:
    """One row per config: the sweep's env steps/s on one device per core over one device."""
    return [Headline(f"{' '.join(['rlhf-jax sweep', *config_words(config)])} --seeds {r['seeds']}"
                     f"{' (the built-in default)' if config == DEFAULT else ''}: env steps/s on one CPU device "
                     f"per core ({r['cores']}) over one device, alternated", r["device_per_core_steps_per_s"],
                     r["one_device_steps_per_s"], r["device_per_core_over_one"])
            for config, r in result["configs"].items()]


if __name__ == "__main__":
    main()
