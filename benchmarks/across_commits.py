"""One benchmark figure at two commits, measured alternately on the same machine in one run.

    python -m benchmarks.across_commits --before 499a760 [--after HEAD] \\
        [--benchmark rlhf_pong] [--args=] [--key pong_rlhf_steps_per_s] [--rounds 1] [--target 3] \\
        [--name across_commits_rlhf_pong]

A speed-up claimed against an older commit is only fair when both were timed on the same
machine within minutes of each other: a shared machine's speed drifts by 2-3x between days.
Each commit is checked out in a git worktree of its own (so uncommitted changes are in
neither), and the benchmark runs there as its own process, ``after, before, after, ...``
(``rounds`` times each, ``after`` once more at the end so that ``before`` sits between two
``after`` runs). The key is read from the JSON that each run writes in its worktree; the
ratio is the median of ``after`` over the median of ``before``.

Writes ``benchmarks/results/across_commits_<benchmark>.json`` (or ``<name>.json``). The default measures the Pong
RLHF loop at the paper's settings (``rlhf_pong``, chunks of 50,000 env steps) against 499a760, the
commit before the refresh's validation was sampled (target: 3 times). An earlier pair,
``across_commits_rlhf_overhead.json``, measured the loop of ``rlhf_overhead --quick`` at 9ea8816
against cb7886c, the start of the work on the loop's speed (15.1 times).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Headline, Spread, Target, write_result
from rlhf_jax.cli import whole_number

ROOT = Path(__file__).resolve().parent.parent


def commit_of(ref: str) -> str | None:
    """``ref``'s short commit, or None where the repository has no such commit."""
    found = subprocess.run(["git", "rev-parse", "--short", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def run_benchmark(tree: Path, benchmark: str, args: list[str], key: str) -> float:
    """Run ``python -m benchmarks.<benchmark> <args>`` inside ``tree`` and return ``key`` of its JSON."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", f"benchmarks.{benchmark}", *args], cwd=tree, env=environment,
                   check=True, stdout=subprocess.DEVNULL)
    result = json.loads((tree / "benchmarks" / "results" / f"{benchmark}.json").read_text())
    if key not in result:
        raise KeyError(f"benchmarks.{benchmark} at {tree.name} wrote no key {key!r}")
    return float(result[key])


def headline(result: dict) -> list[Headline]:
    what = (f"{result['key']} of benchmarks.{result['benchmark_measured']} at {result['after']} "
            f"over {result['before']}, alternated in one run")
    target = (Target.on(result, "after_over_before", ">=", result["target"])
              if result.get("target") is not None else None)
    return [Headline(what, result["after_median"], result["before_median"], result["after_over_before"], target)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="499a760", help="the older commit")
    parser.add_argument("--after", default="HEAD", help="the newer commit")
    parser.add_argument("--benchmark", default="rlhf_pong", help="a module of benchmarks/")
    parser.add_argument("--args", default="", help="the benchmark's arguments, one string")
    parser.add_argument("--key", default="pong_rlhf_steps_per_s", help="the JSON key compared")
    parser.add_argument("--rounds", type=whole_number(1), default=1, help="runs of `before` (after runs one more)")
    parser.add_argument("--target", type=float, default=3.0, help="the ratio aimed at; 0 for none")
    parser.add_argument("--name", help="the result's name, so that another pair of commits does not replace "
                                       "the default's (default: across_commits_<benchmark>)")
    args = parser.parse_args(argv)
    commits = {"after": commit_of(args.after), "before": commit_of(args.before)}
    for side, commit in commits.items():
        if commit is None:
            parser.error(f"--{side}: no commit {getattr(args, side)!r} in this repository")
    if not (ROOT / "benchmarks" / f"{args.benchmark}.py").is_file():
        parser.error(f"--benchmark: no module benchmarks/{args.benchmark}.py")
    values: dict[str, list[float]] = {"after": [], "before": []}
    loads = [round(os.getloadavg()[0], 2)]
    with tempfile.TemporaryDirectory() as scratch:
        trees = {}
        for side, commit in commits.items():
            trees[side] = Path(scratch) / side
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[side]), commit],
                           cwd=ROOT, check=True)
        try:
            order = ["after", "before"] * args.rounds + ["after"]
            for index, side in enumerate(order):
                start = time.perf_counter()
                values[side].append(run_benchmark(trees[side], args.benchmark, shlex.split(args.args), args.key))
                loads.append(round(os.getloadavg()[0], 2))
                print(f"[{index + 1}/{len(order)}] {side} ({commits[side]}): {args.key} = {values[side][-1]:.4g} "
                      f"in {time.perf_counter() - start:.0f} s, load {loads[-1]}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    after, before = Spread.of(values["after"]), Spread.of(values["before"])
    result = {"benchmark_measured": args.benchmark, "args": args.args, "key": args.key, **commits,
              "order": order, "after_rounds": list(after.rounds), "before_rounds": list(before.rounds),
              "after_median": after.median, "before_median": before.median,
              "after_over_before": round(after.median / before.median, 2),
              "load_1min": loads, "target": args.target or None}
    write_result(args.name or f"across_commits_{args.benchmark}", result, headline)


if __name__ == "__main__":
    main()
