"""Run every benchmark and write one report, ``benchmarks/REPORT.md``.

    python -m benchmarks.run --quick                     # every benchmark, small budgets
    python -m benchmarks.run --full                      # every benchmark, its default budget (hours on a CPU)
    python -m benchmarks.run --quick --only scaling,env_throughput
    python -m benchmarks.run --report-only               # rebuild the report from benchmarks/results/*.json

Each benchmark runs as its own process (``python -m benchmarks.<name>``, with ``--quick``
where the script has it), one after the other, so that one that fails, hangs past
``--timeout`` or runs out of memory does not stop the rest: the failure, its exit status
and the tail of its stderr go into the report. While a benchmark runs, its own output is
echoed (prefixed ``|``) and a line every 30 s says which benchmark is running and for how
long.

The report has the machine and the library versions on top, then ONE table of the
headline figures of every benchmark: our figure, the peer's or the raw back end's figure
where there is one, their ratio, the target (:data:`TARGETS`) and whether it is met, and
for each row the JSON file it came from and whether that run was ``--quick``. Then the
scaling plots of ``benchmarks/scaling.py`` and links to the other figures, the JSON
files used, and what happened to each benchmark this invocation ran.

Which JSON a benchmark's rows come from: the file this invocation wrote, if it ran the
benchmark successfully; otherwise the full run's file if there is one (``ibt.json``),
otherwise the quick run's (``ibt_quick.json``). Several scripts write the same file in
both modes; their ``quick`` field tells which.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REPORT = ROOT / "benchmarks" / "REPORT.md"

# Every target the benchmarks' docstrings state, by the JSON key it is checked on:
# key -> (comparison, threshold). One place, so the report and its readers agree.
TARGETS: dict[str, tuple[str, float]] = {
    # env_throughput.py: Pong through our EnvPool XLA wrapper in a jitted scan, over
    # EnvPool's own Python loop at the same number of environments.
    "envpool_xla_over_python": (">=", 0.95),
    # env_throughput.py: the papers' Atari modifications (score hidden, no episode ends) over plain.
    "atari_modified_over_plain": (">=", 0.95),
    # agent_throughput.py: our A2C with 64 seeds vmapped over Stable-Baselines3's A2C, CartPole.
    "a2c_cartpole_64seeds_over_sb3": (">=", 50.0),
    # agent_throughput.py: A2C training on Pong over raw EnvPool stepping (the target is for CPU).
    "a2c_pong_over_raw_env": (">=", 0.8),
    # reward_fit.py: our 3-member MLP ensemble's fitting over imitation's EnsembleTrainer.
    "ensemble_fit_over_imitation": (">=", 10.0),
    # rlhf_overhead.py: the RLHF loop over the same agent on the true reward (CartPole A2C).
    "rlhf_over_true_reward": (">=", 0.8),
    # replay_memory.py: device memory of a 1M-transition Atari replay, GiB.
    "atari_replay_1m_gib": ("<=", 8.0),
}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One script of ``benchmarks/`` as this runner drives it."""

    name: str  # the module, benchmarks.<name>
    about: str
    quick_args: tuple[str, ...]
    full_args: tuple[str, ...]
    full_result: str  # results/<stem>.json that the default run writes
    quick_result: str  # ... and that --quick writes (often the same file)
    quick_minutes: float  # rough wall time on 2 shared CPU cores, for the plan printed at the start
    full_minutes: float


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("env_throughput", "environment back ends against the raw ones", ("--quick",), (),
              "env_throughput", "env_throughput", 1, 5),
    Benchmark("scaling", "agents' env steps/s against seeds and environments", ("--quick",), (),
              "scaling", "scaling", 4, 20),
    Benchmark("agent_throughput", "agents' env steps/s, against Stable-Baselines3 and raw EnvPool",
              ("--quick",), (), "agent_throughput", "agent_throughput", 2, 15),
    Benchmark("reward_fit", "fitting the reward ensemble, against imitation", ("--quick",), (),
              "reward_fit", "reward_fit", 1, 5),
    Benchmark("rlhf_overhead", "the RLHF loop against RL on the true reward", ("--quick",), (),
              "rlhf_overhead", "rlhf_overhead", 30, 60),
    Benchmark("replay_memory", "memory of a 1M-transition Atari replay (computed, nothing allocated)", (), (),
              "replay_memory", "replay_memory", 0.2, 0.2),
    Benchmark("ibt", "IBT loss throughput and reward quality against AR and preferences", ("--quick",), (),
              "ibt", "ibt_quick", 3, 10),
    Benchmark("labels_vs_return", "true return from synthetic labels, beside the true reward", ("--quick",), (),
              "labels_vs_return", "labels_vs_return_quick", 8, 120),
    Benchmark("minatar_curves", "DQN and A2C learning curves on MinAtar Breakout", ("--quick",), (),
              "minatar_curves", "minatar_curves", 2, 90),
    Benchmark("mujoco_curves", "TRPO and ACER learning curves on MJX Hopper and HalfCheetah", ("--quick",), (),
              "mujoco_curves", "mujoco_curves_quick", 5, 600),
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
    def mode(self) -> str:
        return {True: "quick", False: "full", None: "n/a"}[self.quick]

    @property
    def label(self) -> str:
        return f"`{self.path.name}` ({self.mode})"

    @property
    def written(self) -> str:
        """When the benchmark wrote it, as the JSON says. Older files do not say: for them the
        time of the commit that last changed the file, if it is committed as it stands (a
        checkout resets file times), else the file time."""
        if "written" in self.data.get("machine", {}):
            return self.data["machine"]["written"]
        committed = last_commit_time(self.path)
        if committed is not None:
            return committed.strftime("%Y-%m-%d %H:%M UTC (committed)")
        stamp = datetime.datetime.fromtimestamp(self.path.stat().st_mtime, datetime.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M UTC (file time)")


def last_commit_time(path: Path) -> datetime.datetime | None:
    """When the last commit that changed ``path`` was made, or None if the file is not
    committed as it stands (untracked, changed since, or no git)."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        if git("status", "--porcelain", "--", path.name):  # untracked or changed
            return None
        stamp = git("log", "-1", "--format=%ct", "--", path.name)
    except (OSError, subprocess.CalledProcessError):
        return None
    return datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc) if stamp else None


def load_source(bench: Benchmark, written_now: set[str]) -> Source | None:
    """The JSON the report takes for ``bench`` (module docstring), or None if there is none."""
    stems = list(dict.fromkeys([bench.full_result, bench.quick_result]))
    fresh = [s for s in stems if s in written_now]
    for stem in fresh + stems:
        path = RESULTS / f"{stem}.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            return Source(bench, path, data, stem in written_now)
    return None


def lookup(data: dict, key: str):
    """``data[key]``, where a dotted key walks into nested objects; None if absent."""
    value = data
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


# ---------------------------------------------------------------------------------------------
# The table: one function per section, each giving rows of (metric, ours, peer or raw,
# ratio, key the target is checked on). Values are numbers or None (not measured).

Row = tuple  # (metric, ours, peer, ratio, target_key)


def _ratio(ours, peer):
    return ours / peer if isinstance(ours, (int, float)) and isinstance(peer, (int, float)) and peer else None


def env_throughput_rows(d: dict) -> list[Row]:
    atari, gymnax, hopper = d.get("atari_envs", 8), d.get("gymnax_envs", 1024), d.get("envpool_hopper_envs", 16)
    rows = [
        (f"Pong env steps/s, our EnvPool XLA wrapper in a jitted scan vs EnvPool's Python loop ({atari} envs)",
         d.get("envpool_pong_xla_steps_per_s"), d.get("envpool_pong_python_steps_per_s"),
         d.get("envpool_xla_over_python"), "envpool_xla_over_python"),
        ("Pong env steps/s, papers' modifications (score hidden, no episode ends) vs plain",
         d.get("envpool_pong_modified_steps_per_s"), d.get("envpool_pong_xla_steps_per_s"),
         d.get("atari_modified_over_plain"), "atari_modified_over_plain"),
        (f"CartPole env steps/s, our protocol vs gymnax's own vmapped step ({gymnax} envs)",
         d.get("gymnax_cartpole_steps_per_s"), d.get("gymnax_cartpole_raw_steps_per_s"),
         d.get("gymnax_ours_over_raw"), None),
        (f"Hopper env steps/s, EnvPool through a host callback ({hopper} envs)",
         d.get("envpool_hopper_steps_per_s"), None, None, None),
    ]
    if "mjx_hopper_steps_per_s" in d:
        rows.append((f"Hopper env steps/s, MJX ({d.get('mjx_hopper_envs')} envs)",
                     d["mjx_hopper_steps_per_s"], None, None, None))
    return rows


def scaling_rows(d: dict) -> list[Row]:
    rows = []
    for sweep, axis, unit in (("seeds_sweep", "seeds", "seed"), ("envs_sweep", "num_envs", "env")):
        for agent, points in d.get(sweep, {}).items():
            base = points[0] if points else None
            for point in points:
                if sweep == "seeds_sweep":
                    what = f"{point['seeds']} seed{'' if point['seeds'] == 1 else 's'} x {point['num_envs']} envs"
                else:
                    what = f"1 seed x {point['num_envs']} env{'' if point['num_envs'] == 1 else 's'}"
                if point is base:
                    rows.append((f"{agent.upper()} CartPole env steps/s, {what}", point["steps_per_s"], None, None, None))
                    continue
                plural = "" if base[axis] == 1 else "s"
                rows.append((f"{agent.upper()} CartPole env steps/s, {what} (peer: {base[axis]} {unit}{plural}; "
                             "ratio = speed-up)",
                             point["steps_per_s"], base["steps_per_s"], _ratio(point["steps_per_s"], base["steps_per_s"]),
                             None))
    return rows


def agent_throughput_rows(d: dict) -> list[Row]:
    envs = d.get("cartpole_envs", 32)
    rows = [
        (f"A2C CartPole env steps/s, 64 seeds vmapped vs Stable-Baselines3 A2C ({envs} envs)",
         d.get("a2c_cartpole_64seeds_steps_per_s"), d.get("sb3_a2c_cartpole_steps_per_s"),
         d.get("a2c_cartpole_64seeds_over_sb3"), "a2c_cartpole_64seeds_over_sb3"),
        (f"A2C Pong training env steps/s vs raw EnvPool stepping ({d.get('pong_envs', 16)} envs)",
         d.get("a2c_pong_steps_per_s"), d.get("envpool_pong_raw_steps_per_s"),
         d.get("a2c_pong_over_raw_env"), "a2c_pong_over_raw_env"),
    ]
    for agent, task in (("a2c", "CartPole"), ("dqn", "CartPole"), ("acer", "CartPole"), ("trpo", "Pendulum")):
        prefix = f"{agent}_{task.lower()}"
        one, many = d.get(f"{prefix}_1seeds_steps_per_s"), d.get(f"{prefix}_64seeds_steps_per_s")
        if many is not None:
            rows.append((f"{agent.upper()} {task} env steps/s, 64 seeds vs 1 seed ({envs} envs each)",
                         many, one, _ratio(many, one), None))
    return rows


def reward_fit_rows(d: dict) -> list[Row]:
    return [
        (f"Reward ensemble fit, pairs/s (3 MLPs, {d.get('segment_length', 25)}-step segments) vs imitation "
         f"({d.get('imitation', 'imitation')})",
         d.get("mlp_pairs_per_s"), d.get("imitation_mlp_pairs_per_s"), d.get("ensemble_fit_over_imitation"),
         "ensemble_fit_over_imitation"),
        (f"Reward ensemble fit, pairs/s, Atari CNN (minibatch {d.get('cnn_batch_size', 64)} pairs)",
         d.get("cnn_pairs_per_s"), None, None, None),
    ]


def ibt_rows(d: dict) -> list[Row]:
    rows = []
    cases = lookup(d, "throughput.cases") or {}
    ar = cases.get("ar_teacher_forced", {})
    names = {"mlp_all_pairs": "MLP, every pair", "mlp_sampled_pairs": "MLP, 256 sampled pairs/episode",
             "lstm_all_pairs": "LSTM, every pair"}
    for case, title in names.items():
        measured = [t for t, cell in cases.get(case, {}).items() if "frames_per_s" in cell]
        if not measured:
            continue
        t = max(measured, key=int)  # the longest episodes measured
        ours = cases[case][t]["frames_per_s"]
        peer = ar.get(t, {}).get("frames_per_s")
        rows.append((f"IBT loss+grad, frames/s, {title}, T = {t} (peer: AR baseline, teacher-forced)",
                     ours, peer, _ratio(ours, peer), None))
    for task, cell in (lookup(d, "quality.tasks") or {}).items():
        budgets = cell.get("budgets", {})
        if not budgets:
            continue
        b = max(budgets, key=int)
        models = budgets[b].get("models", {})
        ibt, ar_mark, pref = (models.get(m, {}).get("mean") for m in ("ibt", "ar_sampled", "preferences"))
        rows.append((f"IBT reward, Pearson r with true progress, {task}, {b} clips (peer: AR sampled mark)",
                     ibt, ar_mark, None, None))
        rows.append((f"Preference ensemble reward, Pearson r, {task}, same decisions (peer: IBT)",
                     pref, ibt, None, None))
    return rows


def rlhf_overhead_rows(d: dict) -> list[Row]:
    rows = [("RLHF loop env steps/s vs the same agent on the true reward (CartPole A2C)",
             d.get("cartpole_rlhf_steps_per_s"), d.get("cartpole_true_reward_steps_per_s"),
             d.get("rlhf_over_true_reward"), "rlhf_over_true_reward")]
    if "no_fitting_over_true_reward" in d:
        rows.append(("The same loop with no fitting (fit_pairs_per_env_step=0), env steps/s vs true reward",
                     d.get("cartpole_no_fitting_steps_per_s"), d.get("cartpole_true_reward_steps_per_s"),
                     d.get("no_fitting_over_true_reward"), None))
        rows.append(("Arithmetic per env step (XLA cost analysis, flops): RLHF loop vs the agent on the true reward",
                     d.get("flops_per_env_step_rlhf_loop"), d.get("flops_per_env_step_agent_on_true_reward"),
                     d.get("flops_rlhf_over_true_reward"), None))
    if "pong_rlhf_over_true_reward" in d:
        rows.append(("RLHF loop env steps/s vs true reward (Pong A2C, Atari reward CNN)",
                     d.get("pong_rlhf_steps_per_s"), d.get("pong_true_reward_steps_per_s"),
                     d.get("pong_rlhf_over_true_reward"), None))
    return rows


def replay_memory_rows(d: dict) -> list[Row]:
    ours, naive = d.get("atari_replay_1m_gib"), d.get("stacked_obs_and_next_gib")
    return [("Atari replay of 1M transitions, GiB (peer: s and s' stored as whole 4-frame stacks)",
             ours, naive, _ratio(ours, naive), "atari_replay_1m_gib")]


def labels_vs_return_rows(d: dict) -> list[Row]:
    rows = []
    for task, cell in d.get("tasks", {}).items():
        true = lookup(cell, "true_reward.mean")
        for labels, result in sorted(cell.get("labels", {}).items(), key=lambda kv: int(kv[0])):
            rows.append((f"True return, {task}, RLHF from {labels} labels (peer: RL on the true reward)",
                         result.get("mean"), true, None, None))
    return rows


def minatar_rows(d: dict) -> list[Row]:
    steps = fmt(d.get("env_steps"))
    return [(f"MinAtar Breakout final return, {agent.upper()}, {steps} env steps x {d.get('seeds')} seeds",
             value, None, None, None) for agent, value in d.get("final_mean_return", {}).items()]


def mujoco_rows(d: dict) -> list[Row]:
    rows = []
    for run, s in d.get("summary", {}).items():
        agent, task = run.split("_", 1)
        rows.append((f"{agent.upper()} {task} (MJX), last chunk's return (peer: first chunk's), "
                     f"{fmt(d.get('env_steps_per_seed'))} env steps/seed", s.get("last_return"), s.get("first_return"),
                     None, None))
    return rows


# (section title, benchmark, rows)
SECTIONS = (
    ("Environments", "env_throughput", env_throughput_rows),
    ("Agents: seeds and environments", "scaling", scaling_rows),
    ("Agents vs Stable-Baselines3 and raw EnvPool", "agent_throughput", agent_throughput_rows),
    ("Reward fitting vs imitation", "reward_fit", reward_fit_rows),
    ("IBT", "ibt", ibt_rows),
    ("RLHF overhead", "rlhf_overhead", rlhf_overhead_rows),
    ("Replay memory", "replay_memory", replay_memory_rows),
    ("Learning: labels vs return", "labels_vs_return", labels_vs_return_rows),
    ("Learning: MinAtar", "minatar_curves", minatar_rows),
    ("Learning: MuJoCo", "mujoco_curves", mujoco_rows),
)


def fmt(value) -> str:
    """A number for the table: thousands separated when large, three significant digits otherwise."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def target_cells(key: str | None, data: dict) -> tuple[str, str]:
    """(target, met?) for a row checked on ``key`` of ``data``."""
    if key is None or key not in TARGETS:
        return "", ""
    op, threshold = TARGETS[key]
    value = data.get(key)
    if not isinstance(value, (int, float)):
        return f"{op} {threshold:g}", "not measured"
    met = value >= threshold if op == ">=" else value <= threshold
    return f"{op} {threshold:g}", "yes" if met else "**no**"


def table(sources: dict[str, Source]) -> list[str]:
    lines = ["| section | metric | ours | peer or raw | ratio | target | met? | from |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for title, name, make_rows in SECTIONS:
        source = sources.get(name)
        if source is None:
            lines.append(f"| {title} | no results yet: `python -m benchmarks.{name}` | | | | | | |")
            continue
        try:
            rows = make_rows(source.data)
        except Exception as error:  # a JSON of an older layout must not stop the report
            rows = [(f"could not read: {type(error).__name__}: {error}", None, None, None, None)]
        for metric, ours, peer, ratio, key in rows:
            target, met = target_cells(key, source.data)
            lines.append(f"| {title} | {metric} | {fmt(ours)} | {fmt(peer)} | {fmt(ratio)} | {target} | {met} "
                         f"| {source.label} |")
    return lines


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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
OTHER_FIGURES = ("ibt.png", "ibt_quick.png", "labels_vs_return.png", "labels_vs_return_quick.png",
                 "minatar_curves.png", "mujoco_curves.png", "mujoco_curves_quick.png")


def write_report(outcomes: list[Outcome], written_now: set[str], invocation: str) -> Path:
    sources = {b.name: s for b in BENCHMARKS if (s := load_source(b, written_now)) is not None}
    lines = ["# Benchmark report", "",
             f"Written by `{invocation}` (see `benchmarks/run.py`). Figures are from the JSON files in",
             "`benchmarks/results/` named in the last column; each says whether its run was `--quick`",
             "(small budgets: lower, noisier figures). Throughputs are env steps (or pairs, frames) per second,",
             "summed over seeds. The machine below is the one the report was written on; each JSON's own",
             "machine is listed under *Sources*. On a shared machine absolute figures move with other work",
             "(see the load average); the ratios measured side by side within one run move less.", "",
             "## Machine", "", *header(), "",
             "## Results", "", *table(sources), ""]
    targets = [(k, op, t, s) for s in sources.values() for k, (op, t) in TARGETS.items() if k in s.data]
    if targets:
        met = sum((s.data[k] >= t) if op == ">=" else (s.data[k] <= t) for k, op, t, s in targets
                  if isinstance(s.data[k], (int, float)))
        lines += [f"Targets met: {met} of {len(targets)} measured ({len(TARGETS)} targets in `benchmarks/run.py`).", ""]

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
    others = [f"[{n}](results/{n})" for n in OTHER_FIGURES if (RESULTS / n).exists()]
    if others:
        lines += ["Other figures: " + ", ".join(others) + ".", ""]

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
    parser.add_argument("--only", default="", help=f"comma-separated, of {', '.join(BY_NAME)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per benchmark before it is stopped (0: none)")
    parser.add_argument("--quiet", action="store_true", help="do not echo the benchmarks' own output")
    args = parser.parse_args()

    chosen = [n for n in args.only.split(",") if n] or list(BY_NAME)
    skipped = {n for n in args.skip.split(",") if n}
    unknown = sorted((set(chosen) | skipped) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {', '.join(BY_NAME)}")
    plan = [BY_NAME[n] for n in chosen if n not in skipped]
    invocation = "python -m benchmarks.run " + " ".join(sys.argv[1:])

    outcomes: list[Outcome] = []
    written_now: set[str] = set()
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
    path = write_report(outcomes, written_now, invocation)
    failed = [o.name for o in outcomes if not o.ok]
    print(f"[run] wrote {path.relative_to(ROOT)}" + (f"; failed: {', '.join(failed)}" if failed else ""),
          file=sys.stderr, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
