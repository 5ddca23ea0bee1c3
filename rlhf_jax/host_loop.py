"""The host loop every run has, ``rlhf-jax train``'s and each group of a sweep's alike: run a
chunk, hand its metrics to the caller (who logs them and checks them for divergence), save the
state when it is due or a stop is asked for, and stop.

What runs a chunk is a :class:`Chunked`: a :class:`~rlhf_jax.driver.Driver` (one run) or a
sweep's group (its runs vmapped as one program). A chunk's metrics come as two trees: one value
per iteration (``metrics``) and one per chunk (``learned``: the reward model's fitting and
scores); :func:`summarize` makes them one row.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, NamedTuple, Protocol

import jax
import numpy as np

from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.config import RunConfig
from rlhf_jax.run_control import SaveSchedule, StopRequests


class Chunked(Protocol):
    """What the host loop drives."""

    num_chunks: int
    people: Any  # a PeopleSeam (its answers are noted in each checkpoint), or None

    def run_chunk(self, state, chunk: int) -> tuple[Any, dict, dict]: ...


class ChunkDone(NamedTuple):
    """A chunk just run, as the host loop hands it to its caller."""

    chunk: int
    state: Any
    metrics: dict  # one value per iteration (a sweep: [members, iterations])
    learned: dict  # one value per chunk (a sweep: [members])
    seconds: float


def summarize(metrics: dict, learned: dict | None = None) -> dict:
    """One row from a chunk's metrics: sums of episodes and means of the rest of the
    per-iteration ``metrics``, and the per-chunk ``learned`` values as they are."""
    metrics = jax.tree.map(np.asarray, metrics)
    episodes = metrics.pop("episodes").sum()
    returns = metrics.pop("episode_return_sum").sum()
    lengths = metrics.pop("episode_length_sum").sum()
    row = {"env_steps": float(metrics.pop("env_steps")[-1]), "episodes": float(episodes)}
    row["episode_return"] = float(returns / episodes) if episodes else math.nan
    row["episode_length"] = float(lengths / episodes) if episodes else math.nan
    row.update({key: float(np.mean(value)) for key, value in metrics.items()})
    row.update({key: float(value) for key, value in jax.device_get(learned or {}).items()})
    return row


def one_process(*flags: bool) -> tuple[bool, ...]:
    """Flags as this process sees them (a sweep over several processes makes them agree)."""
    return flags


def run_chunks(run: Chunked, state, first_chunk: int, checkpoints: Checkpoints, stop: StopRequests,
               run_config: RunConfig, chunk_iterations: int, report: Callable[[ChunkDone], None],
               agree: Callable[..., tuple[bool, ...]] = one_process) -> tuple[Any, int, bool]:
    """Run chunks ``first_chunk`` ... of ``run`` from ``state``, handing each to ``report``
    (which may raise: a diverged run stops before its state is saved). The state is saved
    after a chunk when ``run.checkpoint_every_*`` says so (:class:`SaveSchedule`), after the
    last one, and when a stop is requested, which ends the loop there. ``agree`` makes every
    process of a sweep act alike on whether to save and to stop. Returns ``(state, the last
    chunk saved, whether a stop ended it)``."""
    schedule = SaveSchedule(run_config, chunk_iterations, run.num_chunks)
    saved = first_chunk - 1
    (stopping,) = agree(stop.requested())  # a stop asked for before the first chunk
    chunk = first_chunk
    while chunk < run.num_chunks and not stopping:
        start = time.perf_counter()
        state, metrics, learned = run.run_chunk(state, chunk)
        # A compiled call returns before it has run: the chunk's time ends when its metrics are there.
        metrics, learned = jax.block_until_ready((metrics, learned))
        report(ChunkDone(chunk, state, metrics, learned, time.perf_counter() - start))
        due, stopping = agree(schedule.due(chunk), stop.requested())
        if due or stopping:
            started = schedule.clock()
            checkpoints.save(chunk, state, run.people.checkpoint_notes() if run.people else {})
            if run.people:
                run.people.checkpoint_saved()
            schedule.saved(started)
            saved = chunk
        chunk += 1
    return state, saved, stopping
