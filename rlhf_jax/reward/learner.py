"""What the RLHF loop needs of a reward learner: the contract both feedback types implement.

Christiano et al. (2017) learn a reward from preferences between pairs of segments; the
IBT paper (DeepMind 2022) learns a utility from progress and regress marks inside
episodes. Around the model, the loop is the same (:mod:`rlhf_jax.loop`): the agent plays
on the learned reward, clips are cut from its play, some become queries, a labeler answers
them, the answers are stored and the model is fitted to them. A :class:`RewardLearner` is
everything that differs, as pure functions over its own state (a pytree: the model and
the answers it holds)::

    state = learner.init(key, clips)                     # from the untrained policy's clips
    state = learner.head_start(state, given, key)        # a dataset's answers, a fitted model
    reward_fn(learner.reward_params(state), obs, action, timestep)  # what the agent calls
    queries = learner.propose(state, clips, key, num)    # the clips to ask about, best first
    answers = learner.oracle(key, queries)               # the synthetic labeler, on the device
    state = learner.store(state, queries, answers, key)  # answers that say nothing are dropped
    state, loss = learner.fit_step(state, key)           # one step of fitting
    state, metrics = learner.refresh(state, clips, key)  # after a block of fitting: adapt, normalise, score

A fit of many steps is cut into blocks of about ``learner.refresh_every`` steps, each followed
by a refresh (:func:`fitting_blocks`), so that what a refresh adapts (the preferences' l2)
moves at a rate per fitting step, not per call.

People answer the same :class:`Queries` from the host (:mod:`rlhf_jax.reward.people`): the
kind of feedback (:class:`~rlhf_jax.reward.kinds.FeedbackKind`, ``answers_from_people``)
turns what they said into the same typed answers the oracle gives, so one ``store`` serves
both. Everything else a kind of feedback means on the host (its files, its config keys, its
words, saving a run's answers) is its :class:`~rlhf_jax.reward.kinds.FeedbackKind`'s too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from rlhf_jax.reward.data import Segments
from rlhf_jax.reward.schedule import labels_due


class Queries(NamedTuple):
    """``Q`` queries of ``c`` clips each (``c = 2``: a pair to compare; ``c = 1``: a clip to mark)."""

    obs: jax.Array  # [Q, c, k, *observation_shape]
    action: jax.Array  # [Q, c, k, *action_shape]
    oracle_reward: jax.Array  # [Q, c, k]: for synthetic labelers and metrics, never shown to a person


def take_clips(clips: Segments, *index: jax.Array) -> Queries:
    """The clips at rows ``index[0][q], index[1][q], ...`` of ``clips`` as queries of ``len(index)`` clips."""
    pick = lambda x: jnp.stack([x[i] for i in index], axis=1)
    return Queries(pick(clips.obs), pick(clips.action), pick(clips.oracle_reward))


@dataclasses.dataclass(frozen=True)
class Budget:
    """How many answers a run asks for and when: ``initial`` before RL from the untrained
    policy, the rest at the rate of :func:`rlhf_jax.reward.schedule.labels_due`.

    ``preloaded`` answers, from a label dataset before the run (``preferences.labels_from``,
    ``ibt.marks_from``), count as the schedule's first: the labeler is asked only for the
    rest of the budget, whenever the schedule's count passes them."""

    total: int
    initial: int
    decay_steps: float
    preloaded: int = 0

    @property
    def initial_asked(self) -> int:
        """Answers the labeler is asked for before RL."""
        return max(0, self.initial - self.preloaded)

    @property
    def held_before_rl(self) -> int:
        """Answers held when RL starts, which pretraining's epochs run over: the initial ones,
        or more if more were preloaded."""
        return max(self.initial, self.preloaded)

    def due(self, env_steps: float, total_env_steps: float) -> int:
        """Answers the labeler is asked for by ``env_steps``: the schedule's, less those preloaded."""
        due = labels_due(env_steps, total_env_steps, self.total, self.initial, self.decay_steps)
        return max(0, due - self.preloaded)


class HeadStart(NamedTuple):
    """What a run may start from besides an untrained model and no answers, given to the
    learner's ``head_start`` as arrays (``None``: not given): answers from a label dataset
    (``preferences.labels_from``: :class:`~rlhf_jax.reward.data.LabelledPairs`;
    ``ibt.marks_from``: :class:`~rlhf_jax.reward.data.MarkedClips`) and a reward
    model fitted offline (``reward_model.init_from``: a
    :class:`~rlhf_jax.reward.kinds.SavedModel` or
    :class:`~rlhf_jax.reward.kinds.SavedUtility`)."""

    answers: Any = None
    model: Any = None

    @property
    def empty(self) -> bool:
        return self.answers is None and self.model is None


class RewardLearner(Protocol):
    """A reward model with the answers it learns from (module docstring): its sizes, and pure
    functions of arrays (``num`` and sizes static; ``fit_steps`` of a count). What runs on the
    host, people's answers and saving them, is the kind of feedback's
    (:class:`~rlhf_jax.reward.kinds.FeedbackKind`)."""

    clip_length: int  # steps per clip cut from the agent's play
    clip_capacity: int  # recent clips kept to propose queries from
    budget: Budget
    pretrain_steps: int  # fitting steps over the initial answers before RL (at least one)
    refresh_every: int  # fitting steps between two refreshes inside one fit (0: one refresh, after it)
    batch_size: int  # answers a fitting step draws
    reward_fn: Callable  # reward_fn(reward_params, obs, action, timestep) -> [N]

    def init(self, key: jax.Array, clips: Segments) -> Any: ...

    def head_start(self, state, given: HeadStart, key: jax.Array) -> Any: ...

    def reward_params(self, state) -> Any: ...

    def answers_held(self, state) -> jax.Array: ...

    def propose(self, state, clips: Segments, key: jax.Array, num: int) -> Queries: ...

    def oracle(self, key: jax.Array, queries: Queries) -> Any: ...

    def store(self, state, queries: Queries, answers, key: jax.Array) -> Any: ...

    def fit_steps(self, env_steps: int) -> int: ...

    def fit_step(self, state, key: jax.Array) -> tuple[Any, jax.Array]: ...

    def refresh(self, state, clips: Segments, key: jax.Array) -> tuple[Any, dict]: ...


def fitting_blocks(steps: int, every: int) -> tuple[tuple[int, int], ...]:
    """``steps`` fitting steps as blocks of about ``every`` steps, each to be followed by a refresh:
    ``n = max(1, round(steps / every))`` blocks (``every = 0``: one) of as equal a length as can be,
    given as ``(length, how many)``, the longer first (``()`` for no step). E.g. 187 steps, every 50:
    ``((47, 3), (46, 1))``."""
    if steps <= 0:
        return ()
    blocks = 1 if every <= 0 else max(1, round(steps / every))
    length, longer = divmod(steps, blocks)
    return tuple((size, count) for size, count in ((length + 1, longer), (length, blocks - longer)) if count)


def fit_steps(examples_per_env_step: float, env_steps: int, batch_size: int) -> int:
    """Fitting steps that process ``examples_per_env_step`` examples per env step in batches of ``batch_size``."""
    return math.ceil(examples_per_env_step * env_steps / batch_size)


def pearson(x: jax.Array, y: jax.Array) -> jax.Array:
    """The correlation of two arrays, flattened: ``sum(x' y') / sqrt(sum(x'^2) sum(y'^2))`` with
    ``x' = x - mean(x)``; 0 where either is constant."""
    x, y = x.ravel() - x.mean(), y.ravel() - y.mean()
    return (x * y).sum() / jnp.sqrt((x * x).sum() * (y * y).sum() + 1e-12)
