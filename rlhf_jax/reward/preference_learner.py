"""Preferences between pairs of segments as a :class:`~rlhf_jax.reward.learner.RewardLearner`
(Christiano et al. 2017, section 2.2).

* **propose**: disagreement selection (the ensemble's variance of P[1 > 2]) over
  ``candidates_factor`` times as many random pairs of recent segments (section 2.2.4);
* **oracle**: the synthetic overseer prefers the segment of larger oracle return (section 3.1);
* **store**: answered pairs go to the label ring D, each member holding out its own 1/e;
* **fit_step**: one Adam step of every member on the Bradley-Terry cross-entropy (equation 1);
* **refresh**: adapt each member's l2 to its validation loss, renormalise r̂ on recent
  steps, and score r̂ against the oracle on fresh pairs.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.reward import ensemble as reward_model
from rlhf_jax.reward.config import PreferenceConfig, resolve
from rlhf_jax.reward.data import Labels, Segments, empty_labels
from rlhf_jax.reward.kinds import Preferences
from rlhf_jax.reward.labelers import add_labels, add_pairs, oracle_answers
from rlhf_jax.reward.learner import Budget, HeadStart, Queries, fit_steps, pearson, take_clips
from rlhf_jax.reward.queries import candidate_pairs, returns_of_rows, select_queries

# Steps of recent segments the normalisation statistics are taken over.
NORMALIZATION_STEPS = 4_096
# The adaptive l2's losses are estimated on at most this many labels at each refresh (a
# uniform sample once more are held; the paper does not say on how many): on Pong, scoring
# all 3,000 of them was most of a chunk's refresh, 52 s on 2 cores.
VALIDATION_PAIRS = 1_024


class PreferenceState(NamedTuple):
    ensemble: reward_model.EnsembleState  # what the agent's reward_fn takes
    labels: Labels  # the database D


class PreferenceLearner:
    """The preference learner: everything on the host (people's answers, saving the labels) is
    :data:`~rlhf_jax.reward.kinds.PREFERENCES`'s."""

    def __init__(self, prefs: PreferenceConfig, model: reward_model.RewardModelConfig, spec: EnvSpec,
                 preloaded: int = 0):
        """``preloaded``: answers a label dataset gives the run at its start (``preferences.labels_from``)."""
        self.spec, self.model = spec, model
        if model.ensemble_size == 1 and prefs.selection == "disagreement":
            # One predictor cannot disagree with itself: the paper's "no ensemble" queries at random.
            prefs = dataclasses.replace(prefs, selection="random")
        self.prefs = prefs
        self.settings = resolve(prefs, spec)
        self.clip_length = self.settings.segment_length
        self.clip_capacity = prefs.segment_capacity
        # (Offline, every label is initial, so the schedule has nothing left to spread.)
        self.budget = Budget(self.settings.labels, self.settings.initial_labels, self.settings.label_decay_steps,
                             preloaded)
        self.batch_size = model.batch_size
        self.pretrain_steps = max(1, fit_steps(self.settings.pretrain_epochs, self.budget.held_before_rl,
                                               model.batch_size))
        # Each refresh adapts l2 once (section 2.2.3): so many fitting steps between two.
        self.refresh_every = model.l2_adapt_every if model.adapt_l2 else 0
        self.reward_fn = reward_model.make_reward_fn(model, spec)

    def fit_steps(self, env_steps: int) -> int:
        return fit_steps(self.prefs.fit_pairs_per_env_step, env_steps, self.model.batch_size)

    # ------------------------------------------------------------ pure functions
    def init(self, key, clips: Segments) -> PreferenceState:
        """An untrained ensemble whose inputs are standardised by the untrained policy's
        steps, once, so that later fits never see their inputs move; no labels."""
        ensemble = reward_model.init_ensemble(key, self.model, self.spec)
        obs = clips.obs.reshape(-1, *self.spec.observation_shape)
        ensemble = reward_model.set_input_statistics(ensemble, self.model, self.spec, obs)
        labels = empty_labels(self.spec, self.settings.label_capacity, self.clip_length, self.model.ensemble_size,
                              self.prefs.frames_before_clip)
        return PreferenceState(ensemble, labels)

    def head_start(self, state: PreferenceState, given: HeadStart, key) -> PreferenceState:
        """``state`` with a fitted model in place of the untrained one, its input statistics
        included, and a dataset's answers in the label ring, held out by this run's ``key``."""
        ensemble, labels = state
        if given.model is not None:
            ensemble = given.model.into(ensemble)
        if given.answers is not None:
            labels = add_pairs(labels, given.answers, key, self.model.validation_fraction)
        return PreferenceState(ensemble, labels)

    def reward_params(self, state: PreferenceState):
        return state.ensemble

    def answers_held(self, state: PreferenceState) -> jax.Array:
        return state.labels.ring.size

    def _member_returns(self, ensemble):
        """Each member's summed predicted reward per segment: ``[P, k, ...] -> [M, P]``."""
        return lambda obs, action: reward_model.member_returns(ensemble, self.model, self.spec, obs, action).sum(-1)

    def propose(self, state: PreferenceState, clips: Segments, key, num: int) -> Queries:
        first, second = select_queries(
            key, clips, self._member_returns(state.ensemble), num,
            candidates_factor=self.prefs.candidates_factor, method=self.prefs.selection,
            random_answer_prob=self.model.random_answer_prob,
        )
        return take_clips(clips, first, second)

    def oracle(self, key, queries: Queries) -> Preferences:
        return Preferences(*oracle_answers(key, queries.oracle_reward[:, 0], queries.oracle_reward[:, 1],
                                           self.prefs.teacher))

    def store(self, state: PreferenceState, queries: Queries, answers: Preferences, key) -> PreferenceState:
        labels = add_labels(state.labels, queries, answers.mu, answers.answered, key, self.model.validation_fraction)
        return state._replace(labels=labels)

    def fit_step(self, state: PreferenceState, key) -> tuple[PreferenceState, jax.Array]:
        """One step of fitting every member (:func:`rlhf_jax.reward.ensemble.fit`)."""
        ensemble, metrics = reward_model.fit(state.ensemble, self.model, self.spec, state.labels, key, 1)
        return state._replace(ensemble=ensemble), metrics["loss"].mean()

    def refresh(self, state: PreferenceState, clips: Segments, key) -> tuple[PreferenceState, dict]:
        """Adapt each member's l2 to its validation loss, renormalise on recent steps, score.

        The normalisation's steps and the scored pairs are rows of the same recent clips,
        and the members' rewards of those rows do not depend on the l2 or the normalisation:
        they are computed once for both (:func:`~rlhf_jax.reward.queries.returns_of_rows`)."""
        loss_key, norm_key, score_key = jax.random.split(key, 3)
        ensemble = state.ensemble
        train_loss, val_loss = reward_model.validation_losses(ensemble, self.model, self.spec, state.labels,
                                                              loss_key, VALIDATION_PAIRS)
        ensemble = ensemble._replace(l2=reward_model.adapt_l2(ensemble.l2, train_loss, val_loss, self.model))
        rows = [self._recent_rows(clips, norm_key)]
        # The normalisation's rows alone choose how the clips are scored, so the scored pairs
        # (monitoring only) leave the run the same bit for bit.
        whole_buffer = clips.capacity <= rows[0].shape[0]
        if self.prefs.score_pairs:
            rows += candidate_pairs(score_key, clips, self.prefs.score_pairs)
        rewards = lambda obs, action: reward_model.member_returns(ensemble, self.model, self.spec, obs, action)
        recent, *pairs = returns_of_rows(rewards, clips, *rows, whole_buffer=whole_buffer)  # [M, rows, k] each
        ensemble = reward_model.normalization_from(ensemble, recent)
        metrics = {"labels": state.labels.ring.size, "reward_train_loss": jnp.nanmean(train_loss),
                   "reward_val_loss": jnp.nanmean(val_loss), "reward_l2": ensemble.l2.mean(),
                   **self._score(ensemble, clips, rows[1:], pairs)}
        return state._replace(ensemble=ensemble), metrics

    @staticmethod
    def _recent_rows(clips: Segments, key) -> jax.Array:
        """The rows of recent segments whose steps the normalisation statistics are taken over."""
        rows = min(clips.capacity, max(1, NORMALIZATION_STEPS // clips.length))
        return jax.random.randint(key, (rows,), 0, jnp.maximum(clips.ring.size, 1))

    def _score(self, ensemble, clips: Segments, rows: list, member_rewards: list) -> dict:
        """r̂ against the oracle on fresh pairs (rows ``(first, second)`` of ``clips``, their
        members' rewards ``[M, P, k]`` each): the share of untied pairs ranked right, and the
        correlation of r̂ with the oracle's reward over their steps (``score_pairs`` of them:
        monitoring only)."""
        if not rows:
            return {"reward_accuracy": jnp.float32(jnp.nan), "reward_correlation": jnp.float32(jnp.nan)}
        oracle = jnp.stack([clips.oracle_reward[r] for r in rows], axis=1)  # [P, 2, k]
        predicted = reward_model.average_normalized(ensemble, self.model, self.spec, jnp.stack(member_rewards, 2))
        true_diff = oracle[:, 0].sum(-1) - oracle[:, 1].sum(-1)
        decided = true_diff != 0
        agree = jnp.sign(predicted[:, 0].sum(-1) - predicted[:, 1].sum(-1)) == jnp.sign(true_diff)
        # NaN when every fresh pair ties (e.g. a policy that never fails): nothing to score.
        accuracy = jnp.where(decided.any(), jnp.where(decided, agree, False).sum() / jnp.maximum(decided.sum(), 1),
                             jnp.nan)
        return {"reward_accuracy": accuracy, "reward_correlation": pearson(predicted, oracle)}
