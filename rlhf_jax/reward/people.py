"""Labelers that answer from outside the compiled loop, at their own pace: people.

The paper's labels came from contractors working asynchronously beside training (section
2.2: three asynchronous processes). A host-side labeler gets queries with :meth:`ask` and
hands back whatever answers have arrived with :meth:`answers`; the RLHF loop keeps training
on the labels it has meanwhile. The label store and web page
(:class:`rlhf_jax.feedback.labeler.PeopleLabeler`) implement this interface;
:class:`SimulatedPerson` is a stand-in that answers like the synthetic oracle after a
delay, from another thread. :class:`HostLabels` is the loops' side of the exchange.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import NamedTuple, Protocol

import numpy as np

from rlhf_jax.reward.kinds import kind_named


class Query(NamedTuple):
    """Two segments to compare, or (IBT) one clip to mark: ``obs [2 or 1, k, *obs_shape]``."""

    id: int
    kind: str  # its FeedbackKind's name (rlhf_jax.reward.kinds): "compare" (a pair) or "annotate" (one clip)
    obs: np.ndarray  # [2, k, *observation_shape]: the two segments ([1, k, ...]: the episode)
    action: np.ndarray  # [2, k, *action_shape]
    oracle_reward: np.ndarray  # [2, k]: for simulated people and metrics, never shown to a person


class Answer(NamedTuple):
    id: int
    mu: float | None  # P[segment 0 preferred]: 1.0, 0.0 or 0.5 (tie); None: "can't tell"
    marks: np.ndarray | None = None  # IBT: int [k] in {-1, 0, +1}, one per frame of the episode


class AsyncLabeler(Protocol):
    """What a loop needs of a host-side labeler."""

    def ask(self, queries: list[Query]) -> None:
        """Hand queries over; must return at once."""

    def answers(self) -> list[Answer]:
        """The answers that arrived since the last call (possibly none); must return at once."""

    def checkpoint_saved(self, query_ids: list[int]) -> None:
        """The newest saved checkpoint holds the answers to ``query_ids``: a labeler that
        keeps answers on disk (:class:`rlhf_jax.feedback.labeler.PeopleLabeler`) need not
        deliver them again."""

    def restore(self, in_checkpoint: list[int] | None) -> tuple[list[Query], int]:
        """After a restart from a checkpoint holding exactly the answers to ``in_checkpoint``
        (``None``: not recorded): the queries still waiting for an answer, and the next
        query id (``([], 0)`` for a labeler that keeps nothing)."""

    def where(self) -> str:
        """Where a person answers, for the messages a waiting run prints."""

    def wait_for_renders(self, stopped) -> bool:
        """Block until every query asked has reached people (the end of a run), or until
        ``stopped()``; whether every one has."""


class HostLabels:
    """A loop's bookkeeping of the queries it has put to a host labeler.

    It pairs each answer with its query, and keeps the ids of the answers the loop's state
    holds, which a checkpoint records (:meth:`in_state`): a restart then tells a durable
    labeler exactly which answers the restored state holds, even if the run was killed
    between writing a checkpoint and telling the labeler about it."""

    def __init__(self, labeler: AsyncLabeler):
        self.labeler = labeler
        self.pending: dict[int, Query] = {}  # asked, not yet answered
        self._in_state: set[int] = set()  # answered, and handed to the loop

    def ask(self, queries: list[Query]) -> None:
        self.labeler.ask(queries)
        self.pending.update((q.id, q) for q in queries)

    def arrived(self) -> list[tuple[Query, Answer]]:
        """The answers that came in since the last call, each with its query (the loop stores
        them in its state at once)."""
        arrived = [a for a in self.labeler.answers() if a.id in self.pending]
        self._in_state.update(a.id for a in arrived)
        return [(self.pending.pop(a.id), a) for a in arrived]

    def in_state(self) -> list[int]:
        """The ids of every answer the loop's state holds."""
        return sorted(self._in_state)

    def checkpoint_saved(self) -> None:
        """The state is saved: the labeler need never deliver the answers it holds again."""
        self.labeler.checkpoint_saved(self.in_state())

    def restore(self, asked: int, in_state: list[int] | None) -> int:
        """After a restart from a checkpoint whose state holds the answers ``in_state`` (``None``:
        not recorded; the labeler's own record stands): take back the queries the labeler still
        holds; returns how many queries have been asked in all (at least ``asked``, the
        restored checkpoint's count)."""
        if in_state is not None:
            self._in_state = set(in_state)
        queries, next_id = self.labeler.restore(in_state)
        self.pending.update((q.id, q) for q in queries)
        return max(asked, next_id)


def wait_for_answers(host: HostLabels, state, exchange, poll_s: float = 1.0, say=print, stopped=lambda: False):
    """``exchange(state) -> state`` again and again until every query put to ``host`` has
    its answer (or ``stopped()``): the paper's start, where RL begins once the initial labels are in."""
    total = len(host.pending)
    last_said = None
    while host.pending and not stopped():
        waiting = len(host.pending)
        if waiting != last_said:
            say(f"waiting for people: {total - waiting} of {total} initial queries answered "
                f"({host.labeler.where()})", flush=True)
            last_said = waiting
        time.sleep(poll_s)
        state = exchange(state)
    return state


class SimulatedPerson:
    """Answers each query like the synthetic oracle, ``delay`` seconds after it was asked,
    from a thread of its own; ``cant_tell`` answers "can't tell" to every n-th query (for an
    episode: no marks, so it is not stored). An episode (IBT) is marked like the synthetic
    annotator with ``signal=reward, threshold=0``."""

    def __init__(self, delay: float = 0.0, cant_tell: int = 0):
        self.delay, self.cant_tell = delay, cant_tell
        self._asked: queue.Queue[tuple[float, Query]] = queue.Queue()
        self._answered: queue.Queue[Answer] = queue.Queue()
        self._count = 0
        threading.Thread(target=self._work, daemon=True).start()

    def ask(self, queries: list[Query]) -> None:
        for query in queries:
            self._asked.put((time.monotonic() + self.delay, query))

    def checkpoint_saved(self, query_ids: list[int]) -> None:
        """Nothing kept on disk: nothing to forget."""

    def restore(self, in_checkpoint: list[int] | None) -> tuple[list[Query], int]:
        return [], 0

    def where(self) -> str:
        return "a simulated person answers"

    def wait_for_renders(self, stopped) -> bool:
        """Nothing to render: a query is with the simulated person as soon as it is asked."""
        return True

    def answers(self) -> list[Answer]:
        arrived = []
        while not self._answered.empty():
            arrived.append(self._answered.get_nowait())
        return arrived

    def _work(self) -> None:
        while True:
            due, query = self._asked.get()
            time.sleep(max(0.0, due - time.monotonic()))
            self._count += 1
            if self.cant_tell and self._count % self.cant_tell == 0:
                self._answered.put(Answer(query.id, None))
                continue
            self._answered.put(Answer(query.id, *kind_named(query.kind).simulated_answer(query.oracle_reward)))
