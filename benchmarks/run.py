"""Run every benchmark and write one report, ``benchmarks/REPORT.md``.

    python -m benchmarks.run --quick                     # every benchmark, small budgets
    python -m benchmarks.run --full                      # every benchmark, its default budget (hours on a CPU)
    python -m benchmarks.run --quick --only scaling,env_throughput
    python -m benchmarks.run --report-only               # rebuild the report from benchmarks/results/*.json
    python -m benchmarks.run --backfill-headlines        # store headline rows in JSON files written without them

Each benchmark runs as its own process (``python -m benchmarks.<name>``, with ``--quick``
where the script has it), one after the other, so that one that fails, hangs past
``--timeout`` or runs out of memory does not stop the rest: the failure, its exit status
and the tail of its stderr go into the report. While a benchmark runs, its own output is
echoed (prefixed ``|``) and a line every 30 s says which benchmark is running and for how
long.

The report has the machine and the library versions on top, then ONE table of the
headline figures of every benchmark: our figure, the peer's or the raw back end's figure
where there is one, their ratio, the target and whether it is met, and for each row the
JSON file it came from and whether that run was ``--quick``. Then the scaling plots of
``benchmarks/scaling.py``; what only an accelerator can show
(each benchmark's :class:`OnAccelerator`, with its command and the device its stored result
came from); the JSON files used; and what happened to each benchmark this invocation ran.

What a benchmark's headline figures are, and their targets, the benchmark says: its
``headline(result)`` gives its rows (``benchmarks.common.Headline``), which ``write_result``
stores in its JSON under ``"headline"``; this runner only renders them.
``--backfill-headlines`` stores them in JSON files written before benchmarks did so (run
on the stored results: nothing is measured again).

Which JSON a benchmark's rows come from: the file this invocation wrote, if it ran the
benchmark successfully; otherwise the full run's file if there is one (``cpu_devices.json``),
otherwise the quick run's (``cpu_devices_quick.json``). Several scripts write the same file in
both modes; their ``quick`` field tells which. A benchmark run where JAX's default device is an
accelerator writes to ``results/accelerator/`` instead (:func:`benchmarks.common.results_folder`):
those figures fill the report's accelerator section, never the CPU's table.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

from benchmarks.common import Headline, Target, command_line, cpu_model, with_headline

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ACCELERATOR_RESULTS = RESULTS / "accelerator"  # where a run on an accelerator writes (common.results_folder)
REPORT = ROOT / "benchmarks" / "REPORT.md"


@dataclasses.dataclass(frozen=True)
class OnAccelerator:
    """What a benchmark's run on an accelerator would show that its CPU figures cannot, and the
    arguments that measure it there."""

    shows: str
    args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One script of ``benchmarks/`` as this runner drives it."""

    name: str  # the module, benchmarks.<name>; its headline(result) gives the report's rows
    section: str  # the rows' section in the report's table
    about: str
    quick_args: tuple[str, ...]
    full_args: tuple[str, ...]
    full_result: str  # results/<stem>.json that the default run writes
    quick_result: str  # ... and that --quick writes (often the same file)
    quick_minutes: float  # rough wall time on 2 shared CPU cores, for the plan printed at the start
    full_minutes: float
    on_accelerator: OnAccelerator | None = None  # None: an accelerator would show nothing more


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("env_throughput", "Environments", "environment back ends against the raw ones", ("--quick",), (),
              "env_throughput", "env_throughput", 1, 5,
              OnAccelerator("MJX's Hopper stepped on the device (`mjx_hopper_steps_per_s`); on a CPU MJX steps about "
                            "50 times slower than C MuJoCo")),
    Benchmark("scaling", "Agents: seeds and environments", "agents' env steps/s against seeds and environments",
              ("--quick",), (), "scaling", "scaling", 4, 20,
              OnAccelerator("how far env steps/s keep rising with seeds and environments on a device wider than "
                            "two cores")),
    Benchmark("cpu_devices", "Agents: seeds and environments",
              "sweeps on a CPU made one device per core, against one device", ("--quick",), (),
              "cpu_devices", "cpu_devices_quick", 1, 15),
    Benchmark("agent_throughput", "Agents vs Stable-Baselines3 and raw EnvPool",
              "agents' env steps/s, against Stable-Baselines3 and raw EnvPool",
              ("--quick",), (), "agent_throughput", "agent_throughput", 2, 15,
              OnAccelerator("A2C on Pong against Stable-Baselines3 with both networks on the device (on the CPU "
                            "XLA's convolutions weigh on the ratio), and whether Atari batches should go "
                            "through the CNN in passes there as on the CPU (`rlhf_jax.networks.apply_time_major`)")),
    Benchmark("reward_fit", "Reward fitting vs imitation", "fitting the reward ensemble, against imitation",
              ("--quick",), (), "reward_fit", "reward_fit", 3, 16,
              OnAccelerator("the Atari reward CNN's fit as one scanned program (`cnn_scan_pairs_per_s`), left out "
                            "on a CPU, where convolution gradients inside loops run many times slower")),
    Benchmark("mujoco_throughput", "MuJoCo on the CPU (EnvPool)",
              "TRPO and the RLHF loop on EnvPool's C MuJoCo, against raw EnvPool stepping", ("--quick",), (),
              "mujoco_throughput", "mujoco_throughput_quick", 2, 5,
              OnAccelerator("the RLHF loop against TRPO (target 0.5) with r-hat's fitting at a device's rate: on "
                            "2 CPU cores the fitting (10.8 MFLOP per env step on Hopper) runs near their "
                            "arithmetic rate, on the cores the pool steps on; and TRPO against raw stepping "
                            "(target 0.8) on the tasks cheapest to simulate, where TRPO's update is one core's "
                            "arithmetic on the CPU",
                            ("--tasks", "all"))),
    Benchmark("rlhf_overhead", "RLHF overhead", "the RLHF loop against RL on the true reward", ("--quick",), (),
              "rlhf_overhead", "rlhf_overhead", 3, 8,
              OnAccelerator("the RLHF loop against the true reward (target 0.8) with the fitting's arithmetic, "
                            "which bounds it on a CPU (XLA's cost analysis in the JSON), at a device's rate")),
    Benchmark("rlhf_pong", "RLHF overhead", "the RLHF loop on Pong at the paper's settings against A2C on the score",
              ("--quick",), (), "rlhf_pong", "rlhf_pong_quick", 10, 25,
              OnAccelerator("the Pong RLHF loop against A2C with the reward CNN's fitting at a device's rate: on 2 "
                            "CPU cores the fitting, 4 times A2C's arithmetic per env step, sets the pace")),
    Benchmark("across_commits", "RLHF overhead",
              "the Pong RLHF loop at this commit against 499a760, before the refresh's validation was sampled, "
              "alternated in one run", (), (), "across_commits_rlhf_pong", "across_commits_rlhf_pong", 45, 45),
    Benchmark("replay_memory", "Replay memory",
              "memory of a 1M-transition Atari replay (computed, nothing allocated)", (), (),
              "replay_memory", "replay_memory", 0.2, 0.2),
    Benchmark("label_dataset_size", "Label datasets",
              "bytes on disk of 500 CartPole and 500 Pong labels exported as Parquet", (), (),
              "label_dataset_size", "label_dataset_size", 3, 3),
)
BY_NAME = {b.name: b for b in BENCHMARKS}
STDERR_TAIL = 40  # lines of a failed benchmark's stderr kept for the report
HEARTBEAT_S = 30.0


# ---------------------------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Outcome:
    """What happened to one benchmark in this invocation."""

    name: str
    command: str
    status: str  # "ok", "failed (exit N)", "timed out", "interrupted"
    seconds: float
    stderr_tail: list[str]

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _pump(stream, sink: collections.deque, echo: bool, prefix: str) -> None:
    """Copy a child's output line by line into ``sink`` (and to our stderr when ``echo``)."""
    for line in iter(stream.readline, ""):
        line = line.rstrip("\n")
        sink.append(line)
        if echo:
            shown = line if len(line) <= 200 else line[:200] + " ..."
            print(f"{prefix}| {shown}", file=sys.stderr, flush=True)
    stream.close()


def run_benchmark(bench: Benchmark, quick: bool, index: int, total: int, timeout: float, echo: bool) -> Outcome:
    """Run one benchmark as a subprocess, showing progress; never raises for the child's failure."""
    args = bench.quick_args if quick else bench.full_args
    argv = [sys.executable, "-m", f"benchmarks.{bench.name}", *args]
    command = " ".join(["python", "-m", f"benchmarks.{bench.name}", *args])
    label = f"[run {index}/{total}] {bench.name}"
    print(f"{label}: {command}", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    # A session of its own, so that a timeout can stop the benchmark and whatever it started.
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, bufsize=1, start_new_session=True)
    stdout: collections.deque = collections.deque(maxlen=200)
    stderr: collections.deque = collections.deque(maxlen=STDERR_TAIL)
    pumps = [threading.Thread(target=_pump, args=(child.stdout, stdout, echo, "  "), daemon=True),
             threading.Thread(target=_pump, args=(child.stderr, stderr, echo, "  "), daemon=True)]
    for pump in pumps:
        pump.start()
    status = None
    next_beat = start + HEARTBEAT_S
    try:
        while child.poll() is None:
            time.sleep(0.5)
            now = time.perf_counter()
            if timeout and now - start > timeout:
                _stop(child)
                status = "timed out"
                break
            if now >= next_beat:
                print(f"{label}: running, {now - start:.0f} s", file=sys.stderr, flush=True)
                next_beat += HEARTBEAT_S
    except KeyboardInterrupt:
        _stop(child)
        status = "interrupted"
    child.wait()
    for pump in pumps:
        pump.join(timeout=5)
    seconds = time.perf_counter() - start
    if status is None:
        status = "ok" if child.returncode == 0 else f"failed (exit {child.returncode})"
    print(f"{label}: {status} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return Outcome(bench.name, command, status, seconds, list(stderr))


def _stop(child: subprocess.Popen) -> None:
    """Stop the benchmark we started (its process group: the ones it started too)."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass
class Source:
    """One benchmark's JSON, as the report uses it."""

    bench: Benchmark
    path: Path
    data: dict
    this_run: bool

    @property
    def quick(self) -> bool | None:
        """Whether the run was ``--quick`` (None where the script has no such mode)."""
        if "quick" in self.data:
            return bool(self.data["quick"])
        if self.bench.quick_result == self.bench.full_result:
            return None
        return self.path.stem == self.bench.quick_result

    @property
    def headline(self) -> list[Headline] | None:
        """The benchmark's rows for the table; None for a JSON written before benchmarks stored them."""
        rows = self.data.get("headline")
        return None if rows is None else [Headline.from_json(row) for row in rows]

    @property
    def mode(self) -> str:
        return {True: "quick", False: "full", None: "n/a"}[self.quick]

    @property
    def label(self) -> str:
        return f"`{self.path.name}` ({self.mode})"

    @property
    def written(self) -> str:
        """When the benchmark wrote it, as the JSON says. Older files do not say: for them the
        time of the commit that last changed the result, if it is committed as it stands (a
        checkout resets file times), else the file time."""
        if "written" in self.data.get("machine", {}):
            return self.data["machine"]["written"]
        committed = last_commit_time(self.path)
        if committed is not None:
            return committed.strftime("%Y-%m-%d %H:%M UTC (committed)")
        stamp = datetime.datetime.fromtimestamp(self.path.stat().st_mtime, datetime.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M UTC (file time)")


def last_commit_time(path: Path) -> datetime.datetime | None:
    """When the last commit that changed the result in ``path`` was made, or None if the file
    is not committed as it stands (untracked, changed since, or no git). A commit that only
    stored the result's headline rows (``--backfill-headlines``) did not change the result."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True,
                              check=True).stdout.strip()

    def result_at(commit: str) -> dict | None:
        try:
            data = json.loads(git("show", f"{commit}:./{path.name}"))
        except (subprocess.CalledProcessError, json.JSONDecodeError):  # absent, or not a result
            return None
        return {key: value for key, value in data.items() if key != "headline"} if isinstance(data, dict) else data

    try:
        if git("status", "--porcelain", "--", path.name):  # untracked or changed
            return None
        current = result_at("HEAD")
        for line in git("log", "--format=%H %ct", "--", path.name).splitlines():
            commit, stamp = line.split()
            if result_at(f"{commit}^") != current:  # this commit made the result as it stands
                return datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc)
    except (OSError, subprocess.CalledProcessError):
        return None
    return None


def load_source(bench: Benchmark, written_now: set[str], folder: Path = RESULTS) -> Source | None:
    """The JSON in ``folder`` the report takes for ``bench`` (module docstring), or None if there is none."""
    stems = list(dict.fromkeys([bench.full_result, bench.quick_result]))
    fresh = [s for s in stems if s in written_now]
    for stem in fresh + stems:
        path = folder / f"{stem}.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            return Source(bench, path, data, stem in written_now)
    return None


# ---------------------------------------------------------------------------------------------
# The table: each benchmark's own headline rows (its ``headline`` function, stored in its JSON
# by ``write_result``), rendered as they are.


def fmt(value) -> str:
    """A number for the table: thousands separated when large, three significant digits otherwise."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def target_cells(target: Target | None) -> tuple[str, str]:
    """(target, met?) of one row."""
    if target is None:
        return "", ""
    met = {True: "yes", False: "**no**", None: "not measured"}[target.met]
    return f"{target.comparison} {target.threshold:g}", met


TABLE_HEAD = ["| section | metric | ours | peer or raw | ratio | target | met? | from |",
              "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]


def headline_lines(bench: Benchmark, source: Source, label: str = "") -> list[str]:
    """``source``'s headline rows as lines of the table; ``label`` names the file (its own label unless given)."""
    if source.headline is None:
        return [f"| {bench.section} | `{source.path.name}` has no headline rows: "
                "`python -m benchmarks.run --backfill-headlines` | | | | | | |"]
    lines = []
    for row in source.headline:
        target, met = target_cells(row.target)
        lines.append(f"| {bench.section} | {row.what} | {fmt(row.ours)} | {fmt(row.peer)} | {fmt(row.ratio)} "
                     f"| {target} | {met} | {label or source.label} |")
    return lines


def table(sources: dict[str, Source]) -> list[str]:
    """The table of every benchmark's headline rows, then how many targets are met."""
    lines = list(TABLE_HEAD)
    for bench in BENCHMARKS:
        source = sources.get(bench.name)
        if source is None:
            lines.append(f"| {bench.section} | no results yet: `python -m benchmarks.{bench.name}` | | | | | | |")
        else:
            lines += headline_lines(bench, source)
    targets = [row.target for s in sources.values() for row in s.headline or () if row.target is not None]
    if targets:
        measured = [t for t in targets if t.met is not None]
        lines += ["", f"Targets met: {sum(t.met for t in measured)} of {len(measured)} measured ({len(targets)} "
                  "targets in the rows above, each stated by its benchmark)."]
    return lines


def backfill_headlines() -> list[Path]:
    """Store its headline rows in every JSON the report reads that was written before the
    benchmarks stored them, by the benchmark's own ``headline`` function run on the stored
    result: nothing is measured, and every other key stays as it was. Returns the files written."""
    written = []
    for bench in BENCHMARKS:
        headline = importlib.import_module(f"benchmarks.{bench.name}").headline
        for stem in dict.fromkeys([bench.full_result, bench.quick_result]):
            path = RESULTS / f"{stem}.json"
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            if "headline" not in data:
                path.write_text(json.dumps(with_headline(data, headline), indent=2) + "\n")
                written.append(path)
    return written


# ---------------------------------------------------------------------------------------------
# The machine


VERSIONED = ("jax", "jaxlib", "flax", "optax", "gymnax", "envpool", "mujoco", "mujoco-mjx", "brax",
             "numpy", "torch", "stable-baselines3", "imitation", "gymnasium")


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def jax_devices() -> str:
    """JAX's devices, asked in a child process: this one must not take an accelerator's
    memory from the benchmarks it runs."""
    probe = ("import jax; d = jax.devices(); "
             "print(f'{len(d)} x {d[0].platform} ({getattr(d[0], \"device_kind\", \"?\")})')")
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return "unknown (probe timed out)"
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "unknown"


def header() -> list[str]:
    v = versions()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    optional = ", ".join(f"{n} {v[n]}" for n in ("torch", "stable-baselines3", "imitation", "gymnasium"))
    return [
        f"- **Date**: {now} (report written)",
        f"- **Device**: {jax_devices()}",
        f"- **CPU**: {cpu_model()}, {os.cpu_count()} cores; load average {load} (1, 5, 15 min) when written",
        f"- **Python** {platform.python_version()} on {platform.system()} {platform.release()}",
        "- **JAX stack**: " + ", ".join(f"{n} {v[n]}" for n in ("jax", "jaxlib", "flax", "optax", "numpy")),
        "- **Environments**: " + ", ".join(f"{n} {v[n]}" for n in ("gymnax", "envpool", "mujoco", "mujoco-mjx", "brax")),
        f"- **Peers (optional)**: {optional}",
        f"- **XLA_FLAGS** here: `{os.environ.get('XLA_FLAGS', '') or '(none)'}` (each JSON records the flags its run used, where it sets any)",
    ]


# ---------------------------------------------------------------------------------------------
# The report


FIGURES = (("scaling_seeds.png", "Env steps/s against seeds vmapped (A2C, DQN; CartPole)"),
           ("scaling_envs.png", "Env steps/s against environments, one seed (A2C, DQN; CartPole)"))


def accelerator_section(on_device: dict[str, Source]) -> list[str]:
    """What only an accelerator can show: each benchmark's ``on_accelerator``, the command that
    measures it, and the device of its result in ``results/accelerator/`` (``on_device``), whose
    headline rows follow in a table of their own."""
    lines = ["## What only an accelerator can show", "",
             "The figures above come from the machine each JSON records. These are the ones a CPU cannot give:",
             "run the command where JAX's default device is an accelerator (its result goes to",
             "`results/accelerator/`, beside the CPU's), then rebuild this report. The",
             "papers' full figures, which need one too, are sized in",
             "[Reproducing the papers](../docs/reproducing.md#what-needs-a-gpu).", "",
             "| benchmark | what a run on an accelerator would show | command | measured on an accelerator |",
             "| --- | --- | --- | --- |"]
    for bench in BENCHMARKS:
        if bench.on_accelerator:
            source = on_device.get(bench.name)
            device = source.data.get("machine", {}).get("device", "not recorded") if source else "not yet"
            command = " ".join(("python -m", f"benchmarks.{bench.name}", *bench.on_accelerator.args))
            lines.append(f"| {bench.name} | {bench.on_accelerator.shows} | `{command}` | {device} |")
    figures = accelerator_figures(on_device)
    if figures:
        lines += ["", "Figures measured on an accelerator (each JSON's `machine` names the device, its host CPU and",
                  "cores):", "", *figures]
    return lines + [""]


def accelerator_figures(on_device: dict[str, Source]) -> list[str]:
    """The headline rows of the results in ``results/accelerator/`` as a table (none: no lines)."""
    measured = [(bench, on_device[bench.name]) for bench in BENCHMARKS if bench.name in on_device]
    lines = list(TABLE_HEAD) if measured else []
    for bench, source in measured:
        lines += headline_lines(bench, source, f"`accelerator/{source.path.name}` ({source.mode})")
    return lines


def accelerator_sources(written_now: set[str] = frozenset(), since: float = 0.0) -> dict[str, Source]:
    """Each benchmark's result in ``results/accelerator/``, where it has one."""
    return {b.name: s for b in BENCHMARKS if b.on_accelerator and (s := load_source(
        b, written_since(ACCELERATOR_RESULTS, written_now, since), ACCELERATOR_RESULTS)) is not None}


def written_since(folder: Path, stems: set[str], since: float) -> set[str]:
    """Those of ``stems`` whose JSON in ``folder`` was written at or after ``since`` (a time):
    which folder a benchmark wrote to depends on the device it ran on."""
    return {s for s in stems if (folder / f"{s}.json").exists() and (folder / f"{s}.json").stat().st_mtime >= since}


def write_report(outcomes: list[Outcome], written_now: set[str], invocation: str, since: float = 0.0) -> Path:
    """``since``: when this invocation began, so that a result counts as its own only in the
    folder it was written to."""
    sources = {b.name: s for b in BENCHMARKS
               if (s := load_source(b, written_since(RESULTS, written_now, since))) is not None}
    on_device = accelerator_sources(written_now, since)
    lines = ["# Benchmark report", "",
             f"Written by `{invocation}` (see `benchmarks/run.py`). Figures are from the JSON files in",
             "`benchmarks/results/` named in the last column; each says whether its run was `--quick`",
             "(small budgets: lower, noisier figures). Throughputs are env steps (or pairs, frames) per second,",
             "summed over seeds. The machine below is the one the report was written on; each JSON's own",
             "machine is listed under *Sources*. On a shared machine absolute figures move with other work",
             "(see the load average); the ratios measured side by side within one run move less.", "",
             "## Machine", "", *header(), "",
             "## Results", "", *table(sources), ""]
    lines += ["## Scaling", ""]
    scaling = sources.get("scaling")
    if scaling is not None:
        d = scaling.data
        lines += [f"From {scaling.label}: `{d.get('env')}`, seeds initialised one at a time and the agents' "
                  f"iterations vmapped; dotted lines are linear scaling from the first point. "
                  f"The seed sweep runs {d.get('seed_sweep_envs_per_seed')} environments per seed.", ""]
    for name, caption in FIGURES:
        if (RESULTS / name).exists():
            lines += [f"![{caption}](results/{name})", "", f"*{caption}.*", ""]
        else:
            lines += [f"`results/{name}` is missing: run `python -m benchmarks.scaling --quick`.", ""]

    lines += accelerator_section(on_device)
    lines += ["## Sources", "", "| benchmark | JSON | mode | file written | machine recorded | this invocation |",
              "| --- | --- | --- | --- | --- | --- |"]
    for bench in BENCHMARKS:
        s = sources.get(bench.name)
        if s is None:
            lines.append(f"| {bench.name} | none | | | | |")
            continue
        m = s.data.get("machine", {})
        machine = f"{m.get('device', '?')}, {m.get('cpu_cores', '?')} cores, jax {m.get('jax', '?')}" if m else "?"
        lines.append(f"| {bench.name} | `{s.path.name}` | {s.mode} | {s.written} | {machine} | "
                     f"{'yes' if s.this_run else 'no'} |")
    lines.append("")

    lines += ["## This invocation", ""]
    if not outcomes:
        lines += ["No benchmark was run (`--report-only`): the report was rebuilt from the existing JSON files.", ""]
    else:
        lines += ["| benchmark | command | status | seconds |", "| --- | --- | --- | ---: |"]
        lines += [f"| {o.name} | `{o.command}` | {o.status} | {o.seconds:.0f} |" for o in outcomes]
        lines.append("")
        for o in outcomes:
            if not o.ok:
                lines += [f"### {o.name}: {o.status}", ""]
                if o.stderr_tail:
                    lines += [f"Last {len(o.stderr_tail)} lines of its stderr:", "", "```", *o.stderr_tail, "```", ""]
                else:
                    lines += ["It wrote nothing to stderr.", ""]
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    return REPORT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="each benchmark with --quick (where it has one)")
    mode.add_argument("--full", action="store_true", help="each benchmark with its default budget")
    mode.add_argument("--report-only", action="store_true", help="run nothing; rebuild REPORT.md from the JSON files")
    mode.add_argument("--backfill-headlines", action="store_true",
                      help="store the headline rows in JSON files written before benchmarks stored them, then stop")
    parser.add_argument("--only", default="", help=f"comma-separated, of {', '.join(BY_NAME)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per benchmark before it is stopped (0: none)")
    parser.add_argument("--quiet", action="store_true", help="do not echo the benchmarks' own output")
    args = parser.parse_args()
    if args.backfill_headlines:
        for path in backfill_headlines():
            print(f"[run] stored headline rows in {path.relative_to(ROOT)}", file=sys.stderr)
        return

    chosen = [n for n in args.only.split(",") if n] or list(BY_NAME)
    skipped = {n for n in args.skip.split(",") if n}
    unknown = sorted((set(chosen) | skipped) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {', '.join(BY_NAME)}")
    plan = [BY_NAME[n] for n in chosen if n not in skipped]
    invocation = command_line("benchmarks.run", sys.argv[1:])

    outcomes: list[Outcome] = []
    written_now: set[str] = set()
    began = time.time()
    if not args.report_only:
        quick = args.quick
        minutes = sum(b.quick_minutes if quick else b.full_minutes for b in plan)
        print(f"[run] {len(plan)} benchmarks, {'quick' if quick else 'full'}: roughly {minutes:.0f} min on 2 CPU cores",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        for index, bench in enumerate(plan, 1):
            outcome = run_benchmark(bench, quick, index, len(plan), args.timeout, echo=not args.quiet)
            outcomes.append(outcome)
            if outcome.ok:
                written_now.add(bench.quick_result if quick else bench.full_result)
            print(f"[run] {index}/{len(plan)} done, {(time.perf_counter() - start) / 60:.1f} min in all",
                  file=sys.stderr, flush=True)
            if outcome.status == "interrupted":
                break
    path = write_report(outcomes, written_now, invocation, began)
    failed = [o.name for o in outcomes if not o.ok]
    print(f"[run] wrote {path.relative_to(ROOT)}" + (f"; failed: {', '.join(failed)}" if failed else ""),
          file=sys.stderr, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
