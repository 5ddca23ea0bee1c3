"""The data the reward model learns from, held on the device as fixed-size ring buffers.

* :class:`Segments`: trajectory segments of ``k`` steps cut from recent rollouts, each
  step an (observation, action) pair with the oracle's reward beside it (the agent
  never reads it; a synthetic oracle labels with it and metrics score with it).
* :class:`Labels`: the database D of Christiano et al. section 2.2.2, triples
  (segment 1, segment 2, mu) with mu = P[segment 1 is preferred]: 1.0 or 0.0 for a
  choice, 0.5 for a tie ("can't tell" is never stored). Only the newest ``capacity``
  labels are kept (3,000 on Atari, appendix A.2), and each member of the ensemble holds
  out its own random 1/e of them for validation (section 2.2.3).

Both are NamedTuples of arrays, so they travel through ``jit``, ``vmap`` and ``lax.scan``
and are saved with the rest of a run's state.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import Box, EnvSpec


def action_shape_dtype(spec: EnvSpec) -> tuple[tuple[int, ...], jnp.dtype]:
    """Per-environment action shape and dtype: ``()`` int32 for discrete, ``(d,)`` float32 for boxes."""
    if isinstance(spec.action_space, Box):
        return tuple(spec.action_space.shape), jnp.float32
    return (), jnp.int32


class Segments(NamedTuple):
    obs: jax.Array  # [S, k, *observation_shape]
    action: jax.Array  # [S, k, *action_shape]
    oracle_reward: jax.Array  # [S, k] float32: the reward a synthetic oracle judges by
    count: jax.Array  # int32: valid rows (<= S)
    next: jax.Array  # int32: the row the next segment is written to (ring)

    @property
    def capacity(self) -> int:
        return self.obs.shape[0]

    @property
    def length(self) -> int:
        return self.obs.shape[1]


class Labels(NamedTuple):
    obs: jax.Array  # [C, 2, k, *observation_shape]
    action: jax.Array  # [C, 2, k, *action_shape]
    mu: jax.Array  # [C] float32: probability that segment 0 is the preferred one
    oracle_return: jax.Array  # [C, 2] float32: oracle reward sums (the "target" ablation; metrics)
    holdout: jax.Array  # [C, M] bool: row is in member m's validation set
    count: jax.Array  # int32: valid rows (<= C)
    next: jax.Array  # int32: the row the next label is written to (ring)

    @property
    def capacity(self) -> int:
        return self.obs.shape[0]


def empty_segments(spec: EnvSpec, capacity: int, length: int) -> Segments:
    shape, dtype = action_shape_dtype(spec)
    return Segments(
        obs=jnp.zeros((capacity, length, *spec.observation_shape), spec.observation_dtype),
        action=jnp.zeros((capacity, length, *shape), dtype),
        oracle_reward=jnp.zeros((capacity, length), jnp.float32),
        count=jnp.zeros((), jnp.int32),
        next=jnp.zeros((), jnp.int32),
    )


def empty_labels(spec: EnvSpec, capacity: int, length: int, ensemble_size: int) -> Labels:
    shape, dtype = action_shape_dtype(spec)
    return Labels(
        obs=jnp.zeros((capacity, 2, length, *spec.observation_shape), spec.observation_dtype),
        action=jnp.zeros((capacity, 2, length, *shape), dtype),
        mu=jnp.zeros((capacity,), jnp.float32),
        oracle_return=jnp.zeros((capacity, 2), jnp.float32),
        holdout=jnp.zeros((capacity, ensemble_size), bool),
        count=jnp.zeros((), jnp.int32),
        next=jnp.zeros((), jnp.int32),
    )
