"""Cutting fixed-length trajectory segments from recent rollouts (Christiano et al. section 2.2.2).

A segment is ``k`` consecutive (observation, action) steps of one environment, shown to
the overseer as a clip of 1 to 2 seconds. The steps come from :class:`Recent`, a
time-major ring holding the last ``W`` steps of every one of ``N`` environments, and
are written into the :class:`~rlhf_jax.reward.data.Segments` ring for query selection.

A start ``j`` of environment ``e`` is *valid* when

* all ``k`` steps ``j .. j+k-1`` are among the ``ring.size`` (at most ``W``) recorded ones
  (read in time order, across the ring's wrap), and
* ``done`` is false at the segment's steps ``0 .. k-2``: a clip must not run across a
  reset, which would splice two episodes into one; an episode may end at its last step.

Every size is a static Python int, so everything here ``jit``s.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.ops import ring
from rlhf_jax.ops.ring import Ring, empty_ring
from rlhf_jax.reward.data import Segments, action_shape_dtype


class Recent(NamedTuple):
    obs: jax.Array  # [W, N, *observation_shape]
    action: jax.Array  # [W, N, *action_shape]
    oracle_reward: jax.Array  # [W, N] float32
    done: jax.Array  # [W, N] bool: the episode ended right after the action at this step
    ring: Ring  # the row the next step goes to, and the steps recorded (all environments step together)

    @property
    def window(self) -> int:
        return self.obs.shape[0]

    @property
    def num_envs(self) -> int:
        return self.obs.shape[1]


def empty_recent(spec: EnvSpec, num_envs: int, window: int, segment_length: int | None = None) -> Recent:
    """An empty ring of ``window`` steps of ``num_envs`` environments.

    Give ``segment_length`` to check ``window >= segment_length`` here, at
    construction; :func:`cut_segments` checks it again when traced.
    """
    if window < 1 or num_envs < 1:
        raise ValueError(f"Recent needs window >= 1 and num_envs >= 1, got {window} and {num_envs}")
    if segment_length is not None:
        _check_window(window, segment_length)
    shape, dtype = action_shape_dtype(spec)
    return Recent(
        obs=jnp.zeros((window, num_envs, *spec.observation_shape), spec.observation_dtype),
        action=jnp.zeros((window, num_envs, *shape), dtype),
        oracle_reward=jnp.zeros((window, num_envs), jnp.float32),
        done=jnp.zeros((window, num_envs), bool),
        ring=empty_ring(),
    )


def check_fits_episode(key: str, length: int, spec: EnvSpec) -> None:
    """Refuse clips of ``length`` steps (config ``key``) longer than an episode: as a clip never
    spans a reset, none would ever be cut and the learner would wait for clips in vain."""
    if length > spec.max_episode_steps:
        raise ConfigError(f"{key}={length} is longer than an episode of {spec.id} "
                          f"({spec.max_episode_steps} steps): no clip of it could ever be cut")


def _check_window(window: int, length: int) -> None:
    if window < length:
        raise ValueError(
            f"the recent-steps window ({window} steps) is shorter than a segment ({length} steps): "
            f"make the window at least the segment length"
        )


def record(recent: Recent, obs, action, oracle_reward, done) -> Recent:
    """Append ``T <= W`` steps of every environment (arrays ``[T, N, ...]``) at ring rows
    ``next + t`` (mod ``W``), overwriting the oldest."""
    steps, window = obs.shape[0], recent.window
    if steps > window:
        raise ValueError(f"record takes at most the window ({window}) steps at once, got {steps}")
    chex.assert_shape(obs, (steps, *recent.obs.shape[1:]))
    chex.assert_shape(action, (steps, *recent.action.shape[1:]))
    chex.assert_shape([oracle_reward, done], (steps, recent.num_envs))
    rows = ring.next_rows(recent.ring, steps, window)  # distinct, since T <= W
    return Recent(
        obs=recent.obs.at[rows].set(obs.astype(recent.obs.dtype)),
        action=recent.action.at[rows].set(action.astype(recent.action.dtype)),
        oracle_reward=recent.oracle_reward.at[rows].set(oracle_reward.astype(jnp.float32)),
        done=recent.done.at[rows].set(done.astype(bool)),
        ring=ring.advance(recent.ring, steps, window),
    )


def _chronological_rows(recent: Recent) -> jax.Array:
    """Ring row of chronological position ``j = 0 .. W-1``, oldest slot first.

    Position ``j`` holds a recorded step iff ``j >= W - ring.size``: before the ring is
    full the first slots in this order are the never-written ones.
    """
    return ring.oldest_first(recent.ring, recent.window)


def valid_starts(recent: Recent, length: int) -> jax.Array:
    """``[W - k + 1, N]`` bool: chronological start ``j`` of environment ``e`` is valid
    (module docstring). Episode ends inside are counted with a cumulative sum, so
    ``ends(j) = C[j + k - 1] - C[j]`` with ``C[i] = sum_{t < i} done_t``."""
    window = recent.window
    _check_window(window, length)
    recorded = recent.ring.size
    done = recent.done[_chronological_rows(recent)].astype(jnp.int32)  # [W, N], time order
    ends_before = jnp.concatenate([jnp.zeros_like(done[:1]), jnp.cumsum(done, axis=0)])  # [W + 1, N]
    ends_inside = ends_before[length - 1 : window] - ends_before[: window - length + 1]  # steps 0..k-2
    starts = jnp.arange(window - length + 1)[:, None]
    return (starts >= window - recorded) & (ends_inside == 0)


def cut_segments(recent: Recent, segments: Segments, key: jax.Array, num: int) -> Segments:
    """Write ``num`` new segments of ``k = segments.length`` steps at rows ``next, next+1, ...``
    (mod capacity) of ``segments``.

    Each comes from a uniformly random environment among those with a valid start, and a
    uniformly random valid start of that environment. Where no environment has one (e.g.
    fewer than ``k`` steps recorded) nothing is written: the writes are masked, not skipped,
    so this stays one traced program.
    """
    length, capacity = segments.length, segments.capacity
    if num > capacity:
        raise ValueError(f"cut_segments writes at most the capacity ({capacity}) at once, got {num}")
    valid = valid_starts(recent, length)  # [starts, N]
    env_ok = valid.any(axis=0)
    any_ok = env_ok.any()
    key_env, key_start = jax.random.split(key)
    # Uniform choice among the allowed entries: categorical over logits 0 (allowed) / -inf.
    env = jax.random.categorical(key_env, jnp.where(env_ok, 0.0, -jnp.inf), shape=(num,))
    start = jax.random.categorical(key_start, jnp.where(valid[:, env].T, 0.0, -jnp.inf))  # [num]

    rows_in = _chronological_rows(recent)[start[:, None] + jnp.arange(length)]  # [num, k]
    env = env[:, None]
    # Out-of-range rows are dropped by the scatter, which is how "write nothing" is masked.
    rows_out, after = ring.kept_rows(segments.ring, jnp.broadcast_to(any_ok, (num,)), capacity)

    def write(buffer, recent_array):
        return ring.put(buffer, rows_out, recent_array[rows_in, env])

    return Segments(
        obs=write(segments.obs, recent.obs),
        action=write(segments.action, recent.action),
        oracle_reward=write(segments.oracle_reward, recent.oracle_reward),
        ring=after,
    )
