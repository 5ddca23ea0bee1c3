"""Chunk-by-chunk control of a run: when it saves (:class:`SaveSchedule`), how a signal stops
it where its state is whole (:class:`StopRequests`), and when it has diverged (:func:`check_finite`)."""
from __future__ import annotations

import math
import os
import signal
import threading
import time

from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.config import RunConfig
from rlhf_jax.errors import Interrupted, RunError


class SaveSchedule:
    """When a run saves its state: after every ``run.checkpoint_every_updates`` updates (whole
    chunks, at least one), after its last chunk, and once ``run.checkpoint_every_minutes`` of
    wall-clock time have passed since the last save (or the start), but never sooner than 19
    times the last save's duration after it, so that saving takes at most about 5% of a run."""

    def __init__(self, run: RunConfig, chunk_iterations: int, num_chunks: int, clock=time.monotonic):
        self.every = max(1, run.checkpoint_every_updates // chunk_iterations)
        self.seconds, self.num_chunks, self.clock = run.checkpoint_every_minutes * 60, num_chunks, clock
        self._last, self._took = clock(), 0.0  # when the last save ended, how long it took

    def due(self, chunk: int) -> bool:
        """Whether the state after ``chunk`` is to be saved."""
        timed = self.seconds > 0 and self.clock() - self._last >= max(self.seconds, 19 * self._took)
        return (chunk + 1) % self.every == 0 or chunk + 1 == self.num_chunks or timed

    def saved(self, started: float) -> None:
        """A save that began at ``started`` (on ``clock``) has ended."""
        self._last = self.clock()
        self._took = self._last - started


class StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM, while the block runs, ask the run to stop where its state is
    whole: after the chunk in flight, whose state it then saves (:attr:`requested`). Nothing is
    raised inside a compiled call: an interrupt there lost the state it had donated to it, and
    could end in a segfault. A second signal stops at once, as a kill would, saying which
    checkpoint is the newest (``hint()``). Handlers are set in the main thread only, before
    anything renders a clip: SDL (pygame's, which draws them) takes a SIGTERM nobody handles
    for itself, and a people run then ignored SIGTERM. A signal the process was started
    ignoring (a background job's Ctrl-C) stays ignored; the previous handlers come back after
    the block."""

    NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}

    def __init__(self):
        self.signal: int | None = None
        self.hint = lambda: ""  # which checkpoint is intact, for a stop at once
        self._previous = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.NAMES
                              if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, number: int, frame) -> None:
        # os.write, not print: a handler may run in the middle of a print to the same stream.
        if self.signal is not None:
            os.write(2, f"\n{self.NAMES[number]} again: stopped at once. {self.hint()}\n".encode())
            os._exit(128 + number)
        self.signal = number
        os.write(2, f"\n{self.NAMES[number]}: stopping where the run's state is whole, after the chunk in "
                    f"flight, and saving it (again to stop at once)\n".encode())

    def interrupted(self, what: str) -> Interrupted:
        """The error a run stopped by the signal raises; ``what``: how far it got, what is saved."""
        return Interrupted(self.signal, f"interrupted by {self.NAMES[self.signal]} {what}")


def check_finite(row: dict, chunk: int, unmeasured: set[str] = frozenset()) -> None:
    """Raise a :class:`RunError` when a loss in ``row`` (a chunk's metrics, as from
    :func:`summarize`) is NaN or infinite: the state after that chunk is worth nothing, and
    saving it would push a good checkpoint out. A row holds means over the chunk, so one
    bad iteration is enough to show. A NaN in ``unmeasured`` (the learner says which:
    nothing to measure yet) is no divergence."""
    for name, value in row.items():
        if "loss" not in name or math.isfinite(value):
            continue
        if math.isnan(value) and name in unmeasured:
            continue
        raise RunError(f"training diverged: {name} is {value} in chunk {chunk} (env steps up to {row['env_steps']:.0f})")


def stopped_diverging(checkpoints: Checkpoints) -> str:
    """What is left of a diverged run. Not a resume: the checkpoint holds the state, keys and
    learning rate that led to the divergence, so it would happen again, bit for bit."""
    last = checkpoints.last_intact()
    if last is None:
        return "No checkpoint was saved yet: start the run again with a smaller learning rate, say."
    return (f"The last good checkpoint, {last} ({checkpoints.directory / str(last)}), is intact, but resumed it "
            f"would diverge again the same way: start a new run with a smaller learning rate, say "
            f"(rlhf-jax eval {checkpoints.run_dir} scores the checkpoint's policy).")
