"""A run's record, shared by the experiments that keep ledgers (the figures, the registered
comparisons, Pong): the ledger of finished runs, written whole or not at all; the wall time and
the host of every attempt at a run, kept in its directory while it runs; the commit that made
it; a curve's final return; and the claims by which several processes share a block of runs."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from benchmarks.common import command_line, cpu_host
from rlhf_jax.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent


def load_ledger(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": {}}


def save_json(path: Path, data: dict | list) -> None:
    """Write ``path`` whole or not at all (a kill mid-write keeps the previous version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda partial: partial.write_text(json.dumps(data, indent=1) + "\n"))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock of ``path``'s folder (``flock`` on the folder itself, which a file written whole
    by renaming keeps) against other processes on this machine doing the same: for a ledger's
    read, change and write, or a claim's check and take."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # and with it the lock


def record_run(path: Path, key: str, record: dict) -> None:
    """Add ``record`` to the ledger at ``path`` as ``key``, keeping what other processes added meanwhile."""
    with locked(path):
        ledger = load_ledger(path)
        ledger["runs"][key] = record
        save_json(path, ledger)


def _boot() -> str:
    boot = Path("/proc/sys/kernel/random/boot_id")
    return boot.read_text().strip() if boot.exists() else ""


def _alive(holder: str) -> bool:
    """Whether the process a claim names (``"<pid> <boot id>"``) still runs on this machine since its boot."""
    pid, _, boot = holder.strip().partition(" ")
    if not pid.isdigit() or boot != _boot():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Claim the run that ``path`` names for this process while the block runs: yields True, and
    gives the claim up after, or False, claiming nothing, where a living process on this machine
    holds it. A claim left by a process that died (or by an earlier boot) is taken over. So several
    processes given the same block of seeds share it, each run made once."""
    with locked(path):
        held = path.exists() and _alive(path.read_text())
        if not held:
            path.write_text(f"{os.getpid()} {_boot()}\n")
    if held:
        yield False
        return
    try:
        yield True
    finally:
        path.unlink(missing_ok=True)


WALL_SECONDS_FILE = "wall_seconds.txt"
ATTEMPTS_FILE = "attempts.json"  # each attempt's host, start and seconds: a run resumed elsewhere has several


def run_timed(directory: Path, work: Callable[[], None], every: float = 30.0) -> float:
    """Do ``work`` (a run or a sweep that checkpoints into ``directory``) and return the wall
    seconds it has taken over every attempt. Each attempt adds its time to ``directory``'s
    :data:`WALL_SECONDS_FILE`, stopped or not, so a cell resumed after a stop is recorded with
    its whole time, not the last stretch's; and its host (processor, vector extensions, XLA
    flags), start and seconds to :data:`ATTEMPTS_FILE` (:func:`attempts_of`), since a run
    resumed on another machine was computed by both. The files are rewritten every ``every``
    seconds as well as at the end: a process that is killed outright (the machine going away)
    runs no ``finally``, and would otherwise leave its attempt out."""
    path, attempts_path = directory / WALL_SECONDS_FILE, directory / ATTEMPTS_FILE
    before = float(path.read_text()) if path.exists() else 0.0
    earlier = attempts_of(directory)
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    host = cpu_host()
    start = time.perf_counter()
    spent = lambda: before + time.perf_counter() - start  # noqa: E731

    def write():
        if directory.exists():  # an attempt that failed before making it has nothing to resume
            # Whole or not at all, as the attempts: the next attempt reads it back as its start.
            write_atomically(path, lambda partial: partial.write_text(f"{spent():.1f}\n"))
            this = {"began": began, "seconds": round(time.perf_counter() - start, 1), **host}
            save_json(attempts_path, [*earlier, this])

    def keep_writing():
        while not stopped.wait(every):
            write()

    stopped = threading.Event()
    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        work()
    finally:
        stopped.set()
        writer.join()
        write()
    return spent()


def hosts_of(records: list[dict]) -> list[tuple[str, str, str]]:
    """Where ``records`` ran (:func:`benchmarks.common.cpu_host`: processor, vector extensions, XLA
    flags), every attempt's host: the same digits come from one such host only."""
    return sorted({(h["cpu"], " ".join(h["vector_extensions"]), h["xla_flags"])
                   for r in records for h in (r, *r.get("attempts", ())) if "cpu" in h})


def attempts_of(directory: Path) -> list[dict]:
    """The attempts :func:`run_timed` recorded in ``directory``, oldest first (none for a run
    made before it kept them)."""
    path = directory / ATTEMPTS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 90 s, 25 min, 6.7 h."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def final_return(returns: list) -> float | None:
    """The mean of the last tenth of a curve's points (at least one) that have a value."""
    tail = returns[-max(1, len(returns) // 10):]
    values = [r for r in tail if r is not None]
    return float(np.mean(values)) if values else None


def git_commit() -> dict:
    """The commit whose code this process runs, and whether the library, the figures' code or the
    papers' configs differ from it in the work tree."""
    import subprocess

    def git(*words):
        return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--", "rlhf_jax", "experiments/reproduce.py",
                                            "configs/paper"))}


def provenance_of(module: str, argv: list[str] | None) -> dict:
    """What made a record: the command (``python -m module`` with ``argv``, the process's own
    arguments where None), the commit whose code this process imported (taken at its start:
    commits made while it runs do not change its code), and the host (processor, vector
    extensions, XLA flags), whose XLA code can turn a chaotic run another way."""
    import sys

    return {"command": command_line(module, sys.argv[1:] if argv is None else argv), **git_commit(), **cpu_host()}
