"""The host loop that train and sweep share: a chunk's time covers its computation, saves come
when due, and a stop asked for ends the loop with the state saved."""
import jax
import jax.numpy as jnp

from rlhf_jax.config import RunConfig
from rlhf_jax import host_loop
from rlhf_jax.host_loop import run_chunks


class Chunks:
    """Chunks of a counter whose compiled call returns at once (dispatched asynchronously)."""

    people = None

    def __init__(self, num_chunks: int):
        self.num_chunks = num_chunks
        self._chunk = jax.jit(lambda state: (state + 1, {"loss": state * 2.0}, {}))

    def run_chunk(self, state, chunk):
        return self._chunk(state)


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


def test_a_chunks_time_ends_when_its_metrics_are_there(monkeypatch):
    """Not when its compiled call returns, which is before the device has run it (async dispatch).
    The clock and the wait are the test's own, so the order is checked, not how long anything took."""
    events = []

    class Clock:  # each reading is the number of events before it
        @staticmethod
        def perf_counter():
            events.append("clock")
            return float(len(events))

    def ready(tree):
        events.append("ready")
        return tree

    class Logged(Chunks):
        def run_chunk(self, state, chunk):
            events.append("run")
            return super().run_chunk(state, chunk)

    monkeypatch.setattr(host_loop, "time", Clock)
    monkeypatch.setattr(host_loop.jax, "block_until_ready", ready)
    done = []
    state, saved, stopped = run_chunks(Logged(2), jnp.int32(0), 0, Saves(), NoStop(),
                                       RunConfig(checkpoint_every_minutes=0), 1, done.append)
    assert [d.chunk for d in done] == [0, 1] and int(state) == 2 and not stopped
    assert events == ["clock", "run", "ready", "clock"] * 2
    assert [d.seconds for d in done] == [3.0, 3.0]  # from the first reading to the one after the wait


def test_saves_when_due_and_at_the_end_and_a_stop_saves_where_it_ends():
    saves = Saves()
    config = RunConfig(checkpoint_every_updates=2, checkpoint_every_minutes=0)
    run_chunks(Chunks(5), jnp.int32(0), 0, saves, NoStop(), config, 1, lambda d: None)
    assert saves.chunks == [(1, 2), (3, 4), (4, 5)]  # every 2 updates of 1 iteration, and the last
    saves, stop = Saves(), NoStop(after=2)

    def count(done):
        stop.seen += 1

    state, saved, stopped = run_chunks(Chunks(5), jnp.int32(0), 0, saves, stop, config, 1, count)
    assert stopped and saved == 2 and saves.chunks == [(1, 2), (2, 3)] and int(state) == 3
