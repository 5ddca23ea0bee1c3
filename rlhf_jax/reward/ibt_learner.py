"""Progress and regress marks inside clips as a :class:`~rlhf_jax.reward.learner.RewardLearner`
(the IBT paper, DeepMind Interactive Agents Team 2022, sections 4-5).

* **propose**: clips of ``ibt.episode_length`` steps drawn at random from the recent ones;
* **oracle**: the synthetic annotator marks a frame +1 / -1 where its progress signal
  rises / falls (:mod:`rlhf_jax.reward.annotators`);
* **store**: annotated clips go to the dataset D of Algorithm 1 (a clip with no marks from
  a person, "skipped", is not stored);
* **fit_step**: one Adam step on Algorithm 1's loss over a batch of annotated clips;
* **refresh**: rescale equation 2's reward ``U(x_{t+1}) - U(x_t)`` to ``ibt.normalized_std``
  on recent clips, and score U's rise against the annotator's progress signal;
* **head_start**: a label dataset's marked clips (``ibt.marks_from``) first in D, and a
  utility fitted offline (``rlhf-jax fit-reward``, ``reward_model.init_from``) in place of
  the untrained one.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.reward import ibt
from rlhf_jax.ops import ring
from rlhf_jax.ops.ring import Ring, empty_ring
from rlhf_jax.reward.annotators import progress_increments, synthetic_marks
from rlhf_jax.reward.data import MarkedClips, Segments
from rlhf_jax.reward.kinds import Marks
from rlhf_jax.reward.learner import Budget, HeadStart, Queries, fit_steps, pearson, take_clips
from rlhf_jax.reward.schedule import initial_labels
from rlhf_jax.reward.segments import check_fits_episode

SCORE_CLIPS = 64  # recent clips the reward is scored (and scaled) on at each refresh


class Annotated(NamedTuple):
    """Annotated clips: the dataset D of Algorithm 1. Its capacity is the budget, so it fills in
    order and its ring (:mod:`rlhf_jax.ops.ring`) never wraps."""

    obs: jax.Array  # [C, T, *obs_shape]
    marks: jax.Array  # [C, T] int32 in {-1, 0, +1}
    ring: Ring  # the row the next clip goes to, and the clips annotated


def append(annotated: Annotated, clips: MarkedClips, keep: jax.Array) -> Annotated:
    """``annotated`` with the ``keep`` rows of ``clips`` written in order (:func:`rlhf_jax.ops.ring.kept_rows`)."""
    rows, after = ring.kept_rows(annotated.ring, keep, annotated.marks.shape[0])
    return Annotated(ring.put(annotated.obs, rows, clips.obs), ring.put(annotated.marks, rows, clips.marks), after)


class IBTLearnerState(NamedTuple):
    model: ibt.IBTState  # what the agent's reward_fn takes
    annotated: Annotated


class IBTLearner:
    """The IBT learner: everything on the host (people's marks, saving them) is :data:`~rlhf_jax.reward.kinds.IBT`'s."""


    def __init__(self, config: ibt.IBTConfig, spec: EnvSpec, preloaded: int = 0):
        """``preloaded``: marked clips a label dataset gives the run at its start (``ibt.marks_from``)."""
        self.config, self.spec = config, spec
        check_fits_episode("ibt.episode_length", config.episode_length, spec)
        self.clip_length = config.episode_length
        self.clip_capacity = config.episode_capacity
        self.batch_size = config.batch_episodes
        initial = initial_labels(config.episodes, atari=False) if config.initial_episodes < 0 else config.initial_episodes
        self.budget = Budget(config.episodes, initial, config.annotation_decay_steps, preloaded)
        self.pretrain_steps = max(1, fit_steps(config.pretrain_epochs, self.budget.held_before_rl,
                                               config.batch_episodes))
        self.refresh_every = 0  # a refresh adapts nothing: once, after each fit
        self.reward_fn = ibt.make_reward_fn(config, spec)

    def fit_steps(self, env_steps: int) -> int:
        return fit_steps(self.config.fit_episodes_per_env_step, env_steps, self.config.batch_episodes)

    # ------------------------------------------------------------ pure functions
    def init(self, key, clips: Segments) -> IBTLearnerState:
        """An untrained utility whose inputs are standardised by the untrained policy's clips."""
        spec, length, budget = self.spec, self.clip_length, self.config.episodes
        model = ibt.set_input_statistics(ibt.init_ibt(key, self.config, spec), spec, clips.obs)
        annotated = Annotated(jnp.zeros((budget, length, *spec.observation_shape), spec.observation_dtype),
                              jnp.zeros((budget, length), jnp.int32), empty_ring())
        return IBTLearnerState(model, annotated)

    def head_start(self, state: IBTLearnerState, given: HeadStart, key) -> IBTLearnerState:
        """``state`` with a fitted utility in place of the untrained one, its input statistics
        and reward scale included, and a dataset's marked clips first in D."""
        del key  # nothing is drawn: D holds out no clips
        model, annotated = state
        if given.model is not None:
            model = given.model.into(model)
        if given.answers is not None:
            annotated = append(annotated, given.answers, jnp.ones(given.answers.marks.shape[:1], bool))
        return IBTLearnerState(model, annotated)

    def reward_params(self, state: IBTLearnerState):
        return state.model

    def answers_held(self, state: IBTLearnerState) -> jax.Array:
        return state.annotated.ring.size

    def propose(self, state: IBTLearnerState, clips: Segments, key, num: int) -> Queries:
        return take_clips(clips, jax.random.randint(key, (num,), 0, jnp.maximum(clips.ring.size, 1)))

    def oracle(self, key, queries: Queries) -> Marks:
        increments = progress_increments(self.config.annotator, self.spec.id, queries.obs[:, 0],
                                         queries.oracle_reward[:, 0])
        marks = synthetic_marks(key, self.config.annotator, increments)
        return Marks(marks, jnp.ones(marks.shape[:1], bool))

    def store(self, state: IBTLearnerState, queries: Queries, answers: Marks, key) -> IBTLearnerState:
        """Append the answered clips in order; beyond the budget's room they are dropped."""
        del key
        clips = MarkedClips(queries.obs[:, 0], answers.marks)
        return state._replace(annotated=append(state.annotated, clips, answers.answered))

    def fit_step(self, state: IBTLearnerState, key) -> tuple[IBTLearnerState, jax.Array]:
        """One Adam step on a batch of annotated clips drawn with replacement."""
        pick_key, loss_key = jax.random.split(key)
        annotated = state.annotated
        index = jax.random.randint(pick_key, (self.config.batch_episodes,), 0, jnp.maximum(annotated.ring.size, 1))
        marks = annotated.marks[index]
        valid = jnp.broadcast_to(annotated.ring.size > 0, marks.shape)
        model, loss = ibt.fit_step(state.model, self.config, self.spec, annotated.obs[index], marks, valid, loss_key)
        # Before the first annotation there is nothing to fit: NaN, as the preferences' loss.
        return state._replace(model=model), jnp.where(annotated.ring.size > 0, loss, jnp.nan)

    def refresh(self, state: IBTLearnerState, clips: Segments, key) -> tuple[IBTLearnerState, dict]:
        index = jax.random.randint(key, (SCORE_CLIPS,), 0, jnp.maximum(clips.ring.size, 1))
        obs = clips.obs[index]
        model = ibt.update_reward_scale(state.model, self.config, self.spec, obs)
        rise = ibt.utility_rises(model, self.config, self.spec, obs)
        signal = progress_increments(self.config.annotator, self.spec.id, obs, clips.oracle_reward[index])
        metrics = {"labels": state.annotated.ring.size, "reward_correlation": pearson(rise, signal),
                   "marks": jnp.abs(state.annotated.marks).sum()}
        return state._replace(model=model), metrics
