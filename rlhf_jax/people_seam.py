"""Where people meet the loop: the one seam between the compiled chunks and the host.

Between a chunk's iterations and its fitting, the queries the schedule wants leave the device
as :class:`~rlhf_jax.reward.people.Query` (``propose``), people's answers that arrived come back
as the learner's typed answers (the kind's ``answers_from_people``) and are stored by the same
:meth:`Loop.store <rlhf_jax.loop.Loop.store>` the synthetic labeler's go through, then the model
is fitted and refreshed. Before RL the initial queries go to people and, by default, RL waits
for their answers (the paper's start).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.loop import LoopState
from rlhf_jax.reward.kinds import FeedbackKind
from rlhf_jax.reward.learner import Queries
from rlhf_jax.reward.people import HostLabels, Query, wait_for_answers


class PeopleSeam:
    """People (any :class:`~rlhf_jax.reward.people.AsyncLabeler`) answering every query of a
    run, the initial ones too, in place of the synthetic labeler (``compiled``: the run's
    :class:`~rlhf_jax.driver.CompiledLoop`)."""

    def __init__(self, compiled, host: HostLabels, kind: FeedbackKind, wait_for_initial_labels: bool = True):
        self.compiled, self.host, self.kind, self.wait_for_initial = compiled, host, kind, wait_for_initial_labels
        self.loop = loop = compiled.loop
        self.learner = loop.learner
        self.size = loop.max_queries
        self._propose = jax.jit(loop.propose, static_argnums=1, donate_argnums=0)
        self._store = jax.jit(loop.store, donate_argnums=0)

    def prepare(self, state: LoopState, first_chunk: int, stopped=lambda: False,
                notes: dict | None = None) -> LoopState:
        """Before the first chunk a run (fresh, or resumed from a checkpoint saved with
        ``notes``) drives: take back the queries whose answers the state does not hold; before
        RL, put the initial queries to people, wait for their answers
        (``people.wait_for_initial_labels``, until ``stopped()``) and pretrain on them."""
        in_state = (notes or {}).get("answers_in_state")
        state = state._replace(asked=jnp.int32(self.host.restore(int(state.asked), in_state)))
        if first_chunk > 0:
            return state
        state = self.exchange(state, max(0, self.learner.budget.initial_asked - int(state.asked)))
        if self.wait_for_initial:
            state = wait_for_answers(self.host, state, lambda s: self.exchange(s, 0), stopped=stopped)
        if stopped():  # the run stops before its first chunk: nothing to pretrain for
            return state
        return self.compiled.fit_and_refresh(state, self.learner.pretrain_steps)[0]

    def chunk(self, state: LoopState, chunk: int, length: int):
        """Chunk ``chunk`` with people: its iterations, the queries the schedule wants by its
        end put to people, the answers that arrived stored, then fitting and refresh."""
        state, metrics = self.compiled.collect(state, length)
        state = self.exchange(state, max(0, self.loop.due_after(chunk) - int(state.asked)))
        state, learned = self.compiled.fit_and_refresh(state, self.loop.fit_steps)
        return state, metrics, {**learned, "labels_waiting": len(self.host.pending)}

    def exchange(self, state: LoopState, wanted: int) -> LoopState:
        """Ask people ``wanted`` more queries and store whatever answers arrived."""
        while wanted > 0:  # at most `size` queries per proposal
            state, queries = self._propose(state, self.size)
            queries = jax.device_get(queries)
            first_id = int(state.asked)
            asked = [Query(first_id + i, self.kind.name, *(x[i] for x in queries))
                     for i in range(min(wanted, self.size))]
            self.host.ask(asked)
            state = state._replace(asked=state.asked + len(asked))
            wanted -= len(asked)
        arrived = self.host.arrived()
        for start in range(0, len(arrived), self.size):
            batch, answers = zip(*arrived[start:start + self.size])
            padding = self.size - len(batch)
            stack = lambda xs: np.concatenate([np.stack(xs), np.zeros((padding, *xs[0].shape), xs[0].dtype)])
            queries = Queries(*(stack(field) for field in zip(*((q.obs, q.action, q.oracle_reward) for q in batch))))
            state = self._store(state, queries,
                                self.kind.answers_from_people(answers, self.size, self.learner.clip_length))
        return state

    def checkpoint_notes(self) -> dict:
        """The ids of the answers the state holds (a restore tells the label store, even if the
        run died before :meth:`checkpoint_saved` could)."""
        return {"answers_in_state": self.host.in_state()}

    def checkpoint_saved(self) -> None:
        """The answers in the state just saved need never be delivered again."""
        self.host.checkpoint_saved()

    def finish(self, stopped) -> bool:
        """The end of a run: wait until every query asked has reached people (or ``stopped()``);
        whether every one has. The queries a stop leaves unrendered are rendered by a resume."""
        labeler = self.host.labeler
        if labeler.wait_for_renders(stopped=lambda: True):
            return True
        print(f"making the clips of the last queries for people ({labeler.where()})", flush=True)
        return labeler.wait_for_renders(stopped)


def attach_people(driver, labeler) -> PeopleSeam:
    """People (``labeler``) answer every query of ``driver``'s run from now on."""
    driver.people = PeopleSeam(driver.compiled, HostLabels(labeler), driver.kind,
                               driver.config.people.wait_for_initial_labels)
    return driver.people


def check_people(env_id: str) -> None:
    """A :class:`~rlhf_jax.errors.ConfigError` now, not at the first clip, if people cannot label
    a run on ``env_id`` here: its clips cannot be drawn, or the people extra is not installed."""
    from rlhf_jax.extras import WEB_APP_MODULES, require
    from rlhf_jax.feedback.clips import check_renderable

    check_renderable(env_id)
    require("labeler=people (its page: rlhf-jax label)", "people", *WEB_APP_MODULES)


def connect_people(driver, run_dir: Path) -> PeopleSeam:
    """``labeler: people``: the run's queries go to the label store and web page in ``run_dir``
    (whose run :func:`check_people` has passed, before anything was written)."""
    from rlhf_jax.feedback.clips import render_clip
    from rlhf_jax.feedback.labeler import PeopleLabeler

    spec = driver.env.spec
    seam = attach_people(driver, PeopleLabeler(run_dir, partial(render_clip, spec), fps=spec.fps))
    print(f"queries go to people: label them with  rlhf-jax label {run_dir}", flush=True)
    return seam
