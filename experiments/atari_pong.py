"""Pong learned on a CPU: A2C, DQN and ACER on the score, and A2C from 3,300 synthetic preferences.

    python -m experiments.atari_pong [--dry-run] [--lines a2c,preferences,acer,dqn] [--runs-dir runs/atari_pong]
    python -m experiments.atari_pong --report
    python -m experiments.atari_pong --pack [--runs-dir runs/atari_pong]
    python -m experiments.atari_pong --lines a2c --hours 2.5   # a stretch, then --pack

The design below (:data:`LINES`, :data:`ENV_STEPS`, the seeds and the targets) was fixed and
committed before any of its runs. Each line is the paper's config, every setting the paper's:

* **A2C on the score** (``configs/paper/atari/pong_a2c.yaml``: Christiano et al.'s A2C, Mnih et
  al. 2016's synchronous form with the Nature CNN), 3 seeds;
* **A2C from 3,300 synthetic labels** (``configs/paper/atari/pong.yaml`` with
  ``preferences.labels=3300``: the score hidden, no episode ends, the reward CNN ensemble fitted
  to the oracle's choices, 500 labels from the untrained policy and 200 epochs of pretraining,
  the label rate proportional to 5e6 / (T + 5e6), the newest 3,000 labels), 2 seeds;
* **ACER on the score** (``pong_acer.yaml``, Wang et al. 2016), 1 seed;
* **DQN on the score** (``pong_dqn.yaml``, every setting Mnih et al. 2015's), 1 seed.

**The budget**: 10M env steps (agent steps of 4 frames, summed over the 16 environments) for
every line, the same for A2C on the score and from preferences. What the published curves lead
one to expect at 10M on Pong (NoFrameskip-v4; read from the curves, so approximate):
OpenAI Baselines' A2C, mean of 6 runs, +18 at 7.8M and 18.5 at 10M; its ACER +18 at 5.8M and
19.5 at 10M (``benchmarks_atari10M`` of openai/baselines); a reproduction of the preference
method with A2C and synthetic labels (mrahtz/learning-from-human-preferences) near +18 at
about 10M. DQN at Mnih et al. 2015's settings is slower: Dopamine's DQN with Nature-like
settings (and sticky actions, which make Pong harder) averages 10.0 at 10M and 16.6 at 50M
over 5 runs, and none of the Nature paper's curves is Pong's; so DQN is not expected to reach
+18 in this budget, and is run at it so that the four lines share one axis.

**Seeds** 100 and up: no Atari run of this length has been made before.

**Targets** (:func:`report`): A2C on the score at least +18 on every seed; DQN and ACER at least
+18; A2C from preferences at least 0.8 of A2C's gain on the score at the same env steps, from
the untrained policy's score (its mean over the A2C runs' first chunks), with a 95% bootstrap
interval over the seeds of both lines. A final score is the mean return of the last 100
episodes: the smallest tail of whole chunks that holds 100 ended episodes, each chunk's mean
weighted by its episodes.

Runs go one at a time in :data:`LINES`' order, seed by seed (``--lines`` picks lines), each
``rlhf-jax train`` of its config in ``<runs-dir>/pong/<line>/seed<k>-<fingerprint>/``,
checkpointed every chunk of 50,000 env steps: the same command goes on from the newest
checkpoint after a stop, and skips runs the ledger holds
(:func:`experiments.reproduce.execute`). On another machine it goes on from
``experiments/results/atari_pong_unfinished.tar.gz``, which ``--pack`` writes with each unfinished
run's newest checkpoint (:mod:`experiments.carry`); ``--hours H`` stops after H hours, where
the run's state is whole, and packs, for a machine lent for a while. Each finished run goes into
``experiments/results/atari_pong_runs.json`` with its command, commit and host, and each
attempt's host (a run carried to another machine has several), and the report is written
again: ``atari_pong.json`` (per line each seed's final score, env steps and hours, the hosts,
the targets) and ``atari_pong.png`` (per line the true score against env steps and
against the hours of training, each seed thin, the mean bold). ``--dry-run`` prints each
remaining run's ``rlhf-jax train`` command, how far a begun one has come, and the training
time it has left at the rate measured nearest to it: its own so far, else its line's finished
seeds', else the design's (:func:`expected_rate`).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks.common import enable_compilation_cache
from experiments.carry import pack_unfinished, unpack_unfinished
from experiments.common import RESULTS, write_result
from experiments.protocol import gain_ratio_estimate
from experiments.records import duration, hosts_of, load_ledger, provenance_of
from experiments.reproduce import PAPER, Kind, Run, execute, run_command, runs_to_do, shown
from rlhf_jax.errors import ConfigError, Interrupted
from rlhf_jax.metrics_log import MetricsLog

ENV_STEPS = 10_000_000
TASK = "pong"
LEDGER = RESULTS / "atari_pong_runs.json"
UNFINISHED = RESULTS / "atari_pong_unfinished.tar.gz"  # runs begun, carried to another machine
LAST_EPISODES = 100
SCORE_TARGET = 18.0
GAIN_TARGET = 0.8


class Line(NamedTuple):
    """One line of the design: a config, its seeds, and what it is expected to reach."""

    name: str  # what --lines calls it
    title: str  # the ledger's line and the figure's label
    kind: Kind
    config: Path
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    steps_per_second: float  # the design's estimate for this 2-core CPU (see ``expected_rate``)


ATARI = PAPER / "atari"
# Env steps/s on the 2-core AMD EPYC this design was written on, for the expected wall times:
# A2C as measured on the idle CPU (benchmarks/results/agent_throughput.json); the preference
# loop as measured at the paper's settings beside other runs, load 4-6 (the median of
# across_commits_rlhf_pong.json's runs at this code); DQN and ACER from their measured gradient
# steps (agent_throughput.json: DQN's 16.4 ms every 4 env steps; ACER's 171 ms, 5 of them, 1
# on-policy and 4 replayed, per 16 x 20 env steps), acting and the environments left out.
# Those two were far off: measured whole on the AVX2 EPYC (``benchmarks.agent_throughput --only
# pong_training``, beside a niced Pong run), DQN trains at 61 env steps/s (12 before its updates
# left the conditional XLA:CPU runs its CNN gradients slowly in) and ACER at 360 (69 while its
# replayed updates ran in a loop, before the host dispatched them written out); and the
# preference loop (``benchmarks.rlhf_pong --quick``) at 75. These rates replace the three
# estimates, for the hours only.
LINES = (
    Line("a2c", "A2C on the score", Kind.BASELINE, ATARI / "pong_a2c.yaml", (), (100, 101, 102), 1_200.0),
    Line("preferences", "A2C from 3,300 synthetic labels", Kind.LABELS, ATARI / "pong.yaml",
         ("preferences.labels=3300",), (100, 101), 75.0),
    Line("acer", "ACER on the score", Kind.BASELINE, ATARI / "pong_acer.yaml", (), (100,), 360.0),
    Line("dqn", "DQN on the score", Kind.BASELINE, ATARI / "pong_dqn.yaml", (), (100,), 61.0),
)
LINE_NAMES = {line.name: line for line in LINES}


def plan(lines: list[Line]) -> list[Run]:
    """Every run, seed by seed in the order of :data:`LINES` (the first seed of each line before any second)."""
    most = max(len(line.seeds) for line in lines)
    return [Run(TASK, line.title, line.kind, line.seeds[index], line.config, line.overrides)
            for index in range(most) for line in lines if index < len(line.seeds)]


def training_rate(env_steps: list[float], steps_per_second: list) -> float | None:
    """Env steps per second of training over a run's chunks whose rate was measured (compiling and
    saving aside), from its metrics' or record's per-chunk env steps and rates; None for none."""
    steps, rates = chunk_steps_and_rates(env_steps, steps_per_second)
    measured = np.isfinite(rates)
    return float(steps[measured].sum() / (steps[measured] / rates[measured]).sum()) if measured.any() else None


def expected_rate(line: Line, ledger: dict, begun: list[dict]) -> tuple[float, str]:
    """The env steps/s a run of ``line`` is expected to go on at, and whence: its own rate so far
    (``begun``: its metrics' rows), else its line's finished seeds' (the ledger), else the
    design's (:data:`LINES`, written before any run)."""
    own = training_rate([r["env_steps"] for r in begun], [r.get("steps_per_second") for r in begun]) if begun else None
    if own:
        return own, "its own rate so far"
    finished = [rate for r in ledger["runs"].values() if r["line"] == line.title
                for rate in [training_rate(r["env_steps"], r["steps_per_second"])] if rate]
    if finished:
        return float(np.mean(finished)), "its line's finished seeds' rate"
    return line.steps_per_second, "the design's rate"


# ------------------------------------------------------------------------ the report
def final_score(episodes: list[float], returns: list[float | None], last: int = LAST_EPISODES) -> float | None:
    """The mean return of the last ``last`` episodes, from chunks' episode counts and mean returns:
    the smallest tail of whole chunks holding ``last`` episodes (all of them where fewer ended),
    each chunk's mean weighted by its episodes."""
    total, weighted = 0.0, 0.0
    for count, value in zip(reversed(episodes), reversed(returns)):
        if count and value is not None:
            total, weighted = total + count, weighted + count * value
        if total >= last:
            break
    return weighted / total if total else None


def hours_of(record: dict) -> list[float]:
    """The training hours at the end of each chunk: its env steps over the chunk's steps/s, summed
    (compiling and saving aside)."""
    steps, rates = chunk_steps_and_rates(record["env_steps"], record["steps_per_second"])
    return list(np.cumsum(np.where(np.isfinite(rates), steps / rates, 0.0)) / 3600)


def chunk_steps_and_rates(env_steps: list[float], steps_per_second: list) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk's env steps (from the running totals) and its env steps/s, NaN where unmeasured."""
    rates = np.asarray([math.nan if r is None else r for r in steps_per_second], float)
    return np.diff([0.0, *env_steps]), np.where(rates > 0, rates, math.nan)


def report(ledger: dict) -> dict:
    """Per line each seed's final score, env steps, hours, commit (the stretch that finished it)
    and hosts (every attempt's), each list in the order of ``seeds``; the targets, as the
    docstring states them."""
    lines = {}
    for line in LINES:
        records = sorted((r for r in ledger["runs"].values() if r["line"] == line.title), key=lambda r: r["seed"])
        lines[line.name] = {
            "title": line.title, "seeds_planned": list(line.seeds), "seeds": [r["seed"] for r in records],
            "final_score": [final_score(r["episodes"], r["episode_return"]) for r in records],
            "env_steps": [r["env_steps"][-1] for r in records], "hours": [round(hours_of(r)[-1], 2) for r in records],
            "commits": [r.get("commit", "") for r in records], "hosts": [hosts_of([r]) for r in records]}
        scores = [s for s in lines[line.name]["final_score"] if s is not None]
        lines[line.name]["mean_final_score"] = float(np.mean(scores)) if scores else None
    firsts = [r["episode_return"][0] for r in ledger["runs"].values()
              if r["line"] == LINE_NAMES["a2c"].title and r["episode_return"][0] is not None]
    start = float(np.mean(firsts)) if firsts else None
    targets = {}
    for name in ("a2c", "acer", "dqn"):
        scores = lines[name]["final_score"]
        finished = len(scores) == len(LINE_NAMES[name].seeds) and all(s is not None for s in scores)
        targets[name] = {"rule": f"final score >= {SCORE_TARGET:g} on every seed", "finished": finished,
                         "met": finished and min(scores) >= SCORE_TARGET}
    preferences = [s for s in lines["preferences"]["final_score"] if s is not None]
    rl = [s for s in lines["a2c"]["final_score"] if s is not None]
    ratio = gain_ratio_estimate(preferences, rl, start) if preferences and rl and start is not None else None
    finished = targets["a2c"]["finished"] and len(preferences) == len(LINE_NAMES["preferences"].seeds)
    targets["preferences"] = {
        "rule": f"gain over the untrained score >= {GAIN_TARGET:g} of A2C's on the score, by the mean",
        "untrained_score": start, "gain_ratio": None if ratio is None else ratio.mean,
        "gain_ratio_interval": None if ratio is None else [ratio.mean_low, ratio.mean_high],
        "gain_ratio_per_seed": None if ratio is None else list(ratio.per_seed),
        "finished": finished, "met": finished and ratio is not None and ratio.mean >= GAIN_TARGET}
    return {"env_steps_budget": ENV_STEPS, "last_episodes": LAST_EPISODES, "lines": lines, "targets": targets}


def plot(ledger: dict, path: Path) -> None:
    """Per line (a column) the true score against env steps (top) and against training hours (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(LINES), figsize=(4 * len(LINES), 6.5), squeeze=False, sharey=True)
    for column, line in enumerate(LINES):
        records = sorted((r for r in ledger["runs"].values() if r["line"] == line.title), key=lambda r: r["seed"])
        for row, axis_of in enumerate((lambda r: np.asarray(r["env_steps"], float) / 1e6, lambda r: np.asarray(hours_of(r)))):
            ax = axes[row, column]
            curves = []
            for record in records:
                score = np.asarray([np.nan if v is None else v for v in record["episode_return"]], float)
                ax.plot(axis_of(record), score, linewidth=0.7, alpha=0.6, label=f"seed {record['seed']}")
                curves.append((axis_of(record), score))
            if len(curves) > 1:
                length = min(len(x) for x, _ in curves)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean = np.nanmean([s[:length] for _, s in curves], 0)
                ax.plot(np.mean([x[:length] for x, _ in curves], 0), mean, color="black", linewidth=2, label="mean")
            ax.axhline(SCORE_TARGET, color="gray", linestyle=":", linewidth=0.8)
            ax.set_xlabel("env steps (millions)" if row == 0 else "hours of training on this CPU")
            if row == 0:
                ax.set_title(line.title, fontsize=10)
            if column == 0:
                ax.set_ylabel("true score (episode return)")
            if records:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "no run finished yet", transform=ax.transAxes, ha="center", color="gray")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def publish(ledger: dict) -> dict:
    result = report(ledger)
    plot(ledger, RESULTS / "atari_pong.png")
    write_result("atari_pong", result)
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", help=f"comma-separated, in the design's order (default all): {', '.join(LINE_NAMES)}")
    parser.add_argument("--runs-dir", default="runs/atari_pong")
    parser.add_argument("--dry-run", action="store_true", help="print the remaining runs' commands and times; run nothing")
    parser.add_argument("--report", action="store_true", help="write the report from the ledger; run nothing")
    parser.add_argument("--pack", action="store_true",
                        help=f"write the runs begun but not finished (of every line), each with its newest "
                             f"checkpoint, into {shown(UNFINISHED)} for another machine to go on from; run nothing")
    parser.add_argument("--hours", type=float, default=0.0,
                        help="stop after this many hours where the run's state is whole (as SIGTERM does; "
                             "between runs, the command stops), then --pack: a stretch on a machine lent for a "
                             "while; 0: run to the end")
    args = parser.parse_args(argv)
    if args.hours < 0:
        raise SystemExit(f"--hours: {args.hours:g} is negative; give the hours to run, or 0 for no limit")
    names = args.lines.split(",") if args.lines else list(LINE_NAMES)
    unknown = [name for name in names if name not in LINE_NAMES]
    if unknown:
        raise SystemExit(f"--lines: no line {unknown[0]!r}; the lines are {', '.join(LINE_NAMES)}")
    if args.report:
        publish(load_ledger(LEDGER))
        return
    lines = [line for line in LINES if line.name in names]
    runs, runs_dir = plan(lines), Path(args.runs_dir)
    # First, so that --pack rewrites the archive with the runs it carried that this machine lacked.
    for run_dir in unpack_unfinished(UNFINISHED, runs_dir):
        print(f"{run_dir}: carried over from {shown(UNFINISHED)}; goes on from its checkpoint", flush=True)
    if args.pack:
        pack(runs_dir)
        return
    if args.dry_run:
        ledger = load_ledger(LEDGER)
        for run, config in runs_to_do(runs, ledger, runs_dir, ENV_STEPS):
            line = next(line for line in lines if line.title == run.line)
            rows = MetricsLog(Path(config.run.dir), tensorboard=False).rows()
            done = rows[-1]["env_steps"] if rows else 0.0
            begun = f"begun, {done / 1e6:.2f}M of {ENV_STEPS / 1e6:g}M env steps; " if done else ""
            rate, whence = expected_rate(line, ledger, rows)
            print(f"# {run.line}, seed {run.seed}: {begun}about {duration((ENV_STEPS - done) / rate)} left "
                  f"at {rate:,.0f} env steps/s ({whence})")
            print(run_command(run, config))
        return
    enable_compilation_cache()
    provenance = provenance_of("experiments.atari_pong", argv)
    with stopped_after(args.hours):
        try:
            execute(runs, LEDGER, runs_dir, ENV_STEPS, after_run=publish, provenance=provenance)
        except (Interrupted, KeyboardInterrupt):
            print("stopped: the same command goes on from the newest checkpoint", flush=True)
        except ConfigError as error:
            raise SystemExit(f"error: {error}") from None
    if args.hours:
        pack(runs_dir)


def pack(runs_dir: Path) -> None:
    """Every line's runs begun but not finished into :data:`UNFINISHED`, rewritten whole."""
    begun = [Path(config.run.dir) for _, config in runs_to_do(plan(list(LINES)), load_ledger(LEDGER), runs_dir,
                                                              ENV_STEPS)]
    packed = pack_unfinished(begun, runs_dir, UNFINISHED)  # those without a checkpoint are passed over
    print(f"{shown(UNFINISHED)}: {len(packed)} unfinished runs" + "".join(f"\n  {p}" for p in packed), flush=True)


@contextlib.contextmanager
def stopped_after(hours: float):
    """SIGTERM to this process once ``hours`` have passed (0: never). A run in training stops
    after its chunk in flight and saves it (:class:`rlhf_jax.run_control.StopRequests`); between
    runs the signal raises :class:`Interrupted` here, where nothing is in flight."""
    if not hours:
        yield
        return

    def between_runs(number, frame):
        raise Interrupted(number, "stopped between runs")

    previous = signal.signal(signal.SIGTERM, between_runs)
    timer = threading.Timer(hours * 3600, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
