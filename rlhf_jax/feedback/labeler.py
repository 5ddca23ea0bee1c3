"""People as the RLHF loop's labeler: queries go into the label store, answers come back out.

:class:`PeopleLabeler` is the :class:`rlhf_jax.reward.people.AsyncLabeler` that training
uses when ``labeler: people``. :meth:`ask` returns at once: a thread of its own saves each
query's arrays, renders its clips (:mod:`rlhf_jax.feedback.clips`) and only then makes it
visible in the store, so training keeps going while clips are made. :meth:`answers` reads
whatever people have answered since (the web app, ``rlhf-jax label RUN_DIR``, writes them).

Nothing answered is lost when either side restarts. An answer stays "not in a
checkpoint" until training has saved a checkpoint whose labels hold it
(:meth:`checkpoint_saved`); a restarted training run restores a checkpoint, which names the
answers it holds, and gets every other answer delivered again (:meth:`restore`), and the
web app keeps no state of its own beyond the store.

Nor is a query lost. :meth:`ask` saves each query's arrays before it returns, so a checkpoint
that counts a query as asked never outlives its arrays; the renderer publishes queries in the
order asked and stops at a failure, so the store holds every query up to its newest, and the
saved queries beyond it are those a restart renders again (:meth:`restore`). The end of a run
waits for the renderer (:meth:`wait_for_renders`).
"""
from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

import numpy as np

from rlhf_jax.feedback.store import STORE_FILE, LabelStore, QueryRow
from rlhf_jax.files import write_atomically
from rlhf_jax.reward.kinds import kind_named
from rlhf_jax.reward.people import Answer, Query

CLIPS_DIR = "clips"
QUERIES_DIR = "queries"


def save_arrays(path: Path, **arrays) -> None:
    """``np.savez`` written whole or not at all, so a reader never sees half a file."""

    def write(partial: Path) -> None:
        with open(partial, "wb") as file:  # a file object: np.savez adds no suffix of its own
            np.savez(file, **arrays)

    write_atomically(path, write)


class PeopleLabeler:
    """Queries to people through the label store of ``run_dir``.

    ``render(obs [k, ...], path, fps)`` writes one clip at ``fps`` frames a second
    (:func:`rlhf_jax.feedback.clips.render_clip` for the run's environment); ``fps`` is the
    environment's frame rate, from which each query's kind of feedback sets its clips'
    (:meth:`~rlhf_jax.reward.kinds.FeedbackKind.clip_fps`)."""

    def __init__(self, run_dir: str | Path, render, fps: float):
        self.run_dir = Path(run_dir)
        self.store = LabelStore(self.run_dir / STORE_FILE)
        (self.run_dir / CLIPS_DIR).mkdir(exist_ok=True)
        (self.run_dir / QUERIES_DIR).mkdir(exist_ok=True)
        self.render, self.fps = render, fps
        self._delivered: set[int] = set()  # answers handed to training since it last saved them
        self._to_render: queue.Queue[tuple[Query, int]] = queue.Queue()
        self._error: BaseException | None = None
        threading.Thread(target=self._render_queries, name="clip-renderer", daemon=True).start()

    # ------------------------------------------------------------- AsyncLabeler
    def ask(self, queries: list[Query]) -> None:
        """Save ``queries`` (best first) and queue them for rendering; they reach people once
        their clips exist."""
        self._raise_render_error()
        for priority, query in enumerate(queries):
            save_arrays(self.run_dir / QUERIES_DIR / f"q{query.id}.npz", obs=query.obs, action=query.action,
                        oracle_reward=query.oracle_reward, kind=query.kind, priority=priority)
            self._to_render.put((query, priority))

    def answers(self) -> list[Answer]:
        """Every answer not yet handed over, and not yet in a saved checkpoint."""
        self._raise_render_error()
        arrived = []
        for row in self.store.answers_not_in_checkpoint():
            if row.query_id in self._delivered:
                continue
            self._delivered.add(row.query_id)
            frames = self.store.query(row.query_id).frames
            arrived.append(Answer(row.query_id, *kind_named(row.kind).answer_of(row.choice, row.marks, frames)))
        return arrived

    # --------------------------------------------------------- surviving restarts
    def checkpoint_saved(self, query_ids) -> None:
        """Training saved a checkpoint holding the answers to ``query_ids``. Marked, never
        unmarked: a state restored from a checkpoint that named no answers (written before
        checkpoints did) still holds those the store had marked."""
        self.store.mark_in_checkpoint(query_ids)
        self._delivered.difference_update(query_ids)

    def restore(self, in_checkpoint=None) -> tuple[list[Query], int]:
        """After a restart from a checkpoint holding exactly the answers to ``in_checkpoint``
        (``None``: as the store last heard): the queries whose labels it does not hold (their
        answers, if any, will be delivered again), and the next free query id. Queries asked
        but never rendered (saved beyond the store's newest) are queued for rendering again."""
        if in_checkpoint is not None:
            self.store.set_in_checkpoint(in_checkpoint)
        in_store = [self._load(row) for row in self.store.queries_not_in_checkpoint()]
        newest = self.store.last_query_id()
        saved = (re.fullmatch(r"q(\d+)\.npz", path.name) for path in (self.run_dir / QUERIES_DIR).iterdir())
        unrendered = sorted(int(match.group(1)) for match in saved if match and int(match.group(1)) > newest)
        queries = []
        for query_id in unrendered:
            with np.load(self.run_dir / QUERIES_DIR / f"q{query_id}.npz") as arrays:
                query = Query(query_id, str(arrays["kind"]), arrays["obs"], arrays["action"], arrays["oracle_reward"])
                self._to_render.put((query, int(arrays["priority"])))
            queries.append(query)
        return in_store + queries, max([newest, *unrendered]) + 1

    def where(self) -> str:
        return f"label them with: rlhf-jax label {self.run_dir}"

    def wait_for_renders(self, stopped=lambda: False) -> bool:
        """Block until every asked query is in the store (tests, and the end of a run), or
        until ``stopped()``; whether every one is."""
        while self._to_render.unfinished_tasks and not stopped():
            time.sleep(0.02)
        self._raise_render_error()
        return not self._to_render.unfinished_tasks

    # ---------------------------------------------------------------- internals
    def _render_queries(self) -> None:
        while True:
            query, priority = self._to_render.get()
            try:
                if self._error is None:  # after a failure nothing more: the store keeps the order asked
                    self._publish(query, priority)
            except BaseException as error:  # raised to the training loop at each of its calls
                self._error = error
            finally:
                self._to_render.task_done()

    def _publish(self, query: Query, priority: int) -> None:
        arrays = f"q{query.id}.npz"  # saved by ask
        frames = query.obs.shape[1]
        # The environment's own rate for a comparison (the paper's clips play in real time), slower
        # for an episode to mark (FeedbackKind.clip_fps). The store keeps it with the query, so the
        # page maps a clip's time to frames by it.
        fps = kind_named(query.kind).clip_fps(frames, self.fps)
        clips = []
        for side, obs in enumerate(query.obs):
            name = f"q{query.id}_{side}.mp4"
            self.render(np.asarray(obs), self.run_dir / CLIPS_DIR / name, fps)
            clips.append(name)
        self.store.add_query(query.id, query.kind, clips, arrays, frames=frames, fps=fps, priority=priority)

    def _load(self, row: QueryRow) -> Query:
        with np.load(self.run_dir / QUERIES_DIR / row.segments) as arrays:
            return Query(row.id, row.kind, arrays["obs"], arrays["action"], arrays["oracle_reward"])

    def _raise_render_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"rendering a clip failed: {self._error!r}") from self._error
