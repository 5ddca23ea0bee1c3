"""The host loop that train and sweep share: a chunk's time covers its computation, saves come
when due, and a stop asked for ends the loop with the state saved."""
import time

import jax
import jax.numpy as jnp

from rlhf_jax.config import RunConfig
from rlhf_jax.host_loop import run_chunks


class SlowChunks:
    """Chunks whose compiled call returns at once (dispatched asynchronously) while the device
    works on their metrics for ``rounds`` matrix products; ``rounds=0``: no work at all."""

    people = None

    def __init__(self, num_chunks: int, rounds: int = 0):
        self.num_chunks = num_chunks
        work = lambda x: jax.lax.fori_loop(0, rounds, lambda i, y: jnp.tanh(y @ y), x)
        self._chunk = jax.jit(lambda state, x: (state + 1, {"loss": work(x).sum()}, {}))
        self._x = jnp.ones((256, 256)) / 256

    def run_chunk(self, state, chunk):
        return self._chunk(state, self._x)

    def work_seconds(self) -> float:
        """How long the metrics of one chunk take once compiled (no dispatch in it to speak of)."""
        jax.block_until_ready(self._chunk(jnp.int32(0), self._x))
        start = time.perf_counter()
        jax.block_until_ready(self._chunk(jnp.int32(0), self._x))
        return time.perf_counter() - start


class Saves:
    def __init__(self):
        self.chunks = []

    def save(self, chunk, state, notes):
        self.chunks.append((chunk, int(state)))


class NoStop:
    def __init__(self, after: int | None = None):
        self.after, self.seen = after, 0

    def requested(self) -> bool:
        return self.after is not None and self.seen > self.after


def test_a_chunks_time_ends_when_its_metrics_are_there():
    """Not when its compiled call returns, which is before the device has run it (async dispatch)."""
    run, done = SlowChunks(3, rounds=300), []
    least = 0.1 * run.work_seconds()  # a tenth of the work alone: a dispatch takes about a thousandth
    state, saved, stopped = run_chunks(run, jnp.int32(0), 0, Saves(), NoStop(), RunConfig(checkpoint_every_minutes=0),
                                       1, done.append)
    assert [d.chunk for d in done] == [0, 1, 2] and int(state) == 3 and not stopped
    assert all(d.seconds >= least for d in done), ([d.seconds for d in done], least)


def test_saves_when_due_and_at_the_end_and_a_stop_saves_where_it_ends():
    saves = Saves()
    config = RunConfig(checkpoint_every_updates=2, checkpoint_every_minutes=0)
    run_chunks(SlowChunks(5), jnp.int32(0), 0, saves, NoStop(), config, 1, lambda d: None)
    assert saves.chunks == [(1, 2), (3, 4), (4, 5)]  # every 2 updates of 1 iteration, and the last
    saves, stop = Saves(), NoStop(after=2)

    def count(done):
        stop.seen += 1

    state, saved, stopped = run_chunks(SlowChunks(5), jnp.int32(0), 0, saves, stop, config, 1, count)
    assert stopped and saved == 2 and saves.chunks == [(1, 2), (2, 3)] and int(state) == 3
