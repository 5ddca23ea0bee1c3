"""Synthetic labelers, and writing their answers into the label database D (section 2.2.2).

The paper's synthetic oracle "prefers whichever trajectory segment actually receives a
higher reward in the underlying task" (section 3): ``mu = 1`` when segment 1 has the
larger summed oracle reward, ``0`` when segment 2 has, ``0.5`` for a tie. Its options
add the simulated teachers of Lee et al. 2021 (B-Pref): Boltzmann-rational, mistaken,
skipping, tie-prone and myopic overseers.
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.ops import ring
from rlhf_jax.reward.config import TeacherConfig
from rlhf_jax.reward.data import Labels, LabelledPairs, drop_history, pair_frames
from rlhf_jax.reward.learner import Queries


def teacher_returns(reward: chex.Array, gamma: float) -> jax.Array:
    """``[P]`` the myopic teacher's return ``sum_t gamma^(k-1-t) r_t`` of ``[P, k]`` rewards."""
    length = reward.shape[-1]
    weights = jnp.asarray(gamma, jnp.float32) ** jnp.arange(length - 1, -1, -1, dtype=jnp.float32)
    return jnp.sum(reward.astype(jnp.float32) * weights, axis=-1)


def oracle_answers(
    key: jax.Array, reward_1: chex.Array, reward_2: chex.Array, config: TeacherConfig = TeacherConfig()
) -> tuple[jax.Array, jax.Array]:
    """The synthetic overseer's answers to ``P`` queries (rules in :class:`TeacherConfig`).

    Args:
      key: randomness for Boltzmann choices and mistakes (unused by the default oracle).
      reward_1, reward_2: ``[P, k]`` oracle rewards of each pair's two segments.
      config: the teacher; static under ``jit``.

    Returns:
      ``mu [P]`` float32, P[segment 1 is preferred] (1, 0 or 0.5), and ``answered [P]``
      bool, False for "can't tell" (such pairs are never stored).
    """
    chex.assert_rank(reward_1, 2)
    chex.assert_equal_shape([reward_1, reward_2])
    return_1 = teacher_returns(reward_1, config.myopic_gamma)
    return_2 = teacher_returns(reward_2, config.myopic_gamma)
    gap = return_1 - return_2
    key_choice, key_mistake = jax.random.split(key)

    if config.boltzmann_temperature > 0:
        scale = jnp.mean(jnp.abs(gap))
        scale = jnp.where(scale > 0, scale, 1.0)  # all gaps 0: every answer is a tie anyway
        prob_1 = jax.nn.sigmoid(gap / (config.boltzmann_temperature * scale))
        prefers_1 = jax.random.bernoulli(key_choice, prob_1)
    else:
        prefers_1 = gap > 0
    if config.mistake_prob > 0:
        prefers_1 = prefers_1 ^ jax.random.bernoulli(key_mistake, config.mistake_prob, gap.shape)

    tie = (jnp.abs(gap) <= config.tie_gap) | (gap == 0)
    mu = jnp.where(tie, 0.5, prefers_1.astype(jnp.float32))
    if config.skip_below is None:
        answered = jnp.ones(gap.shape, bool)
    else:
        answered = jnp.maximum(return_1, return_2) >= config.skip_below
    return mu.astype(jnp.float32), answered


def add_labels(
    labels: Labels,
    pairs: Queries,
    mu: chex.Array,
    answered: chex.Array,
    key: jax.Array,
    validation_fraction: chex.Numeric = 1.0 / math.e,
) -> Labels:
    """Store the answered ``pairs`` (``P`` queries of two segments each, ``obs [P, 2, k, ...]``;
    :func:`~rlhf_jax.reward.learner.take_clips` makes them from a segment buffer) with their
    answers ``mu [P]`` in the ring D.

    Answered pairs take rows ``next, next+1, ...`` (mod capacity) in order, unanswered
    ones take none: pair ``p`` goes to ``next + (number answered before p)``. Should more
    than the capacity be answered at once, only the newest ``capacity`` are kept, as if
    written one by one. Each new row is held out of member ``m``'s training set, for its
    validation, with probability ``validation_fraction`` independently ("a fraction of
    1/e of the data is held out ... for each predictor", section 2.2.3). Atari stacks are
    written as their frames, each once (:func:`~rlhf_jax.reward.data.pair_frames`).
    """
    count = pairs.obs.shape[0]
    chex.assert_shape([mu, answered], (count,))
    frames, restart = pair_frames(pairs.obs, labels.stack, labels.history)
    holdout = jax.random.bernoulli(key, validation_fraction, (count, labels.holdout.shape[1]))
    labelled = LabelledPairs(frames, restart, pairs.action, mu, pairs.oracle_reward.sum(axis=-1))
    return _write(labels, labelled, answered.astype(bool), holdout)


def add_pairs(labels: Labels, pairs: LabelledPairs, key: jax.Array,
              validation_fraction: chex.Numeric = 1.0 / math.e) -> Labels:
    """Store pairs already answered and split into frames (a label dataset's, at the start of a
    run: ``preferences.labels_from``) in the ring D, in order, each held out of each member's
    training set as :func:`add_labels` holds out new labels: this run's own draw."""
    count = pairs.mu.shape[0]
    holdout = jax.random.bernoulli(key, validation_fraction, (count, labels.holdout.shape[1]))
    frames = drop_history(pairs.frames, labels.length, labels.history)
    return _write(labels, pairs._replace(frames=frames), jnp.ones((count,), bool), holdout)


def _write(labels: Labels, pairs: LabelledPairs, answered: jax.Array, holdout: jax.Array) -> Labels:
    """The ring D with the ``answered`` rows of ``pairs`` written at ``next, next+1, ...``
    (mod capacity; of more than the capacity, the newest), as :func:`add_labels` says."""
    rows, after = ring.kept_rows(labels.ring, answered, labels.capacity)
    return labels.replace(
        frames=ring.put(labels.frames, rows, pairs.frames),
        restart=ring.put(labels.restart, rows, pairs.restart),
        action=ring.put(labels.action, rows, pairs.action),
        mu=ring.put(labels.mu, rows, pairs.mu),
        oracle_return=ring.put(labels.oracle_return, rows, pairs.oracle_return),
        holdout=ring.put(labels.holdout, rows, holdout),
        ring=after,
    )
