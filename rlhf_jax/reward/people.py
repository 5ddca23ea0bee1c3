"""Labelers that answer from outside the compiled loop, at their own pace: people.

The paper's labels came from contractors working asynchronously beside training (section
2.2: three asynchronous processes). A host-side labeler gets queries with :meth:`ask` and
hands back whatever answers have arrived with :meth:`answers`; the RLHF loop keeps training
on the labels it has meanwhile. Issue 7's label store and web page implement this
interface; :class:`SimulatedPerson` is a stand-in that answers like the synthetic oracle
after a delay, from another thread.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import NamedTuple, Protocol

import numpy as np


class Query(NamedTuple):
    """Two segments to compare, or (IBT) one episode to mark: ``obs [2 or 1, k, *obs_shape]``."""

    id: int
    obs: np.ndarray  # [2, k, *observation_shape]: the two segments ([1, k, ...]: the episode)
    action: np.ndarray  # [2, k, *action_shape]
    oracle_reward: np.ndarray  # [2, k]: for simulated people and metrics, never shown to a person


class Answer(NamedTuple):
    id: int
    mu: float | None  # P[segment 0 preferred]: 1.0, 0.0 or 0.5 (tie); None: "can't tell"
    marks: np.ndarray | None = None  # IBT: int [k] in {-1, 0, +1}, one per frame of the episode


class AsyncLabeler(Protocol):
    def ask(self, queries: list[Query]) -> None:
        """Hand queries over; must return at once."""

    def answers(self) -> list[Answer]:
        """The answers that arrived since the last call (possibly none); must return at once."""


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
            if len(query.obs) == 1:  # an episode to mark: +1 / -1 on the frame after a reward above / below 0
                reward = query.oracle_reward[0, :-1]
                marks = np.concatenate([[0], np.sign(reward)]).astype(np.int32)
                self._answered.put(Answer(query.id, None, marks))
                continue
            first, second = query.oracle_reward.sum(-1)
            self._answered.put(Answer(query.id, 1.0 if first > second else 0.0 if first < second else 0.5))
