"""The data the reward model learns from, held on the device as fixed-size ring buffers.

* :class:`Segments`: trajectory segments of ``k`` steps cut from recent rollouts, each
  step an (observation, action) pair with the oracle's reward beside it (the agent
  never reads it; a synthetic oracle labels with it and metrics score with it).
* :class:`Labels`: the database D of Christiano et al. section 2.2.2, triples
  (segment 1, segment 2, mu) with mu = P[segment 1 is preferred]: 1.0 or 0.0 for a
  choice, 0.5 for a tie ("can't tell" is never stored). Only the newest ``capacity``
  labels are kept (3,000 on Atari, appendix A.2), and each member of the ensemble holds
  out its own random 1/e of them for validation (section 2.2.3).

**Frames stored once.** An Atari observation is a stack of the 4 newest 84x84 frames,
so a segment's ``k`` stacks hold only ``k + 3`` distinct frames: the ``k`` it shows and
the 3 before it that its first stacks reach back to. ``Labels`` keeps each frame once (as
:mod:`rlhf_jax.replay` does, and by the same rule, :func:`~rlhf_jax.replay.frame_stack`):
each step's newest frame, after ``history`` frames from before the segment. Each step's
stack either continues the one before (drops the oldest frame, appends one) or restarts:
at an episode's first observation EnvPool fills the whole stack with that one frame. A
restarted step is flagged (``add_labels`` compares neighbouring stacks), and
:meth:`Labels.observations` rebuilds every stack from the frames (:func:`segment_stacks`,
the replay's rule: walk back one frame per channel, stopping at the episode's first).

How much history a label keeps is ``preferences.frames_before_clip``. By default none: the
reward model is fitted on the frames the labeller saw ("only decide on events you actually
witness in the clip", appendix B), each segment's first step rebuilt as an episode's first
stack is, its frame repeated; so 3,000 Atari labels take 25 frames a segment (0.99 GiB)
instead of 28 (1.10 GiB), and the first 3 stacks of each labelled clip differ from the ones
the policy saw in their older frames. With ``frames_before_clip`` (``history = 3``) every
stack comes back bit for bit, as it was played. Other observations (vectors, MinAtar's
grids) are stored whole, ``frames`` being the observations themselves. Label datasets on
disk always keep the history (:func:`frames_on_host`).

Both are pytrees of arrays (``Labels`` also carries its static ``stack`` and ``history``), so
they travel through ``jit``, ``vmap`` and ``lax.scan`` and are saved with the rest of a run's
state.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhf_jax.envs.core import Box, EnvSpec
from rlhf_jax.ops.ring import Ring, empty_ring
from rlhf_jax.replay import frame_stack


def action_shape_dtype(spec: EnvSpec) -> tuple[tuple[int, ...], jnp.dtype]:
    """Per-environment action shape and dtype: ``()`` int32 for discrete, ``(d,)`` float32 for boxes."""
    if isinstance(spec.action_space, Box):
        return tuple(spec.action_space.shape), jnp.float32
    return (), jnp.int32


class Segments(NamedTuple):
    """A batch (or ring buffer) of ``S`` segments of ``k`` steps: what queries are drawn from.

    Rows below ``ring.size`` are valid (:mod:`rlhf_jax.ops.ring`). To query segments of your
    own, build one directly, e.g. ``Segments(obs, action, oracle_reward, full_ring(S))``.
    """

    obs: jax.Array  # [S, k, *observation_shape]
    action: jax.Array  # [S, k, *action_shape]
    oracle_reward: jax.Array  # [S, k] float32: the reward a synthetic oracle judges by
    ring: Ring  # the row the next segment is written to, and the valid rows (<= S)

    @property
    def capacity(self) -> int:
        return self.obs.shape[0]

    @property
    def length(self) -> int:
        return self.obs.shape[1]


@struct.dataclass
class Labels:
    frames: jax.Array  # [C, 2, history + k, *frame_shape] each segment's frames, oldest first (stack 1: its k observations)
    restart: jax.Array  # [C, 2, k] bool: step t's stack does not continue step t-1's (always False at t = 0)
    action: jax.Array  # [C, 2, k, *action_shape]
    mu: jax.Array  # [C] float32: probability that segment 0 is the preferred one
    oracle_return: jax.Array  # [C, 2] float32: oracle reward sums (the "target" ablation; metrics)
    holdout: jax.Array  # [C, M] bool: row is in member m's validation set
    ring: Ring  # the row the next label is written to, and the valid rows (<= C)
    stack: int = struct.field(pytree_node=False, default=1)  # frames per observation: replay.frame_stack(spec)
    history: int = struct.field(pytree_node=False, default=0)  # frames kept from before each segment: 0 or stack - 1

    @property
    def capacity(self) -> int:
        return self.frames.shape[0]

    @property
    def length(self) -> int:
        return self.action.shape[2]

    def observations(self, rows: jax.Array) -> jax.Array:
        """``[B, 2, k, *observation_shape]``: both segments' observations of label ``rows [B]``,
        Atari stacks rebuilt from their frames (module docstring). The one way to read them."""
        if self.stack == 1:
            return self.frames[rows]
        rebuild = jax.vmap(jax.vmap(functools.partial(segment_stacks, stack=self.stack, history=self.history)))
        return rebuild(self.frames[rows], self.restart[rows])


class LabelledPairs(NamedTuple):
    """Answered pairs as :class:`Labels` keeps them, frames once, without the ring around
    them: what a label dataset gives a run to start from (``preferences.labels_from``;
    :func:`rlhf_jax.reward.labelers.add_pairs` stores them)."""

    frames: jax.Array  # [P, 2, k + stack - 1, *frame_shape]: the history always kept, as on disk
    restart: jax.Array  # [P, 2, k] bool
    action: jax.Array  # [P, 2, k, *action_shape]
    mu: jax.Array  # [P] float32
    oracle_return: jax.Array  # [P, 2] float32, NaN where the dataset does not know it


class MarkedClips(NamedTuple):
    """Clips with their IBT marks, without the dataset around them: what a label dataset gives
    an IBT run to start from (``ibt.marks_from``; :func:`rlhf_jax.reward.ibt_learner.append`
    stores them in the annotated clips D)."""

    obs: jax.Array  # [N, T, *obs_shape]
    marks: jax.Array  # [N, T] int32 in {-1, 0, +1}


def pair_frames(obs: jax.Array, stack: int, history: int) -> tuple[jax.Array, jax.Array]:
    """``(frames, restart)`` as ``Labels`` stores pairs of segments ``obs [P, 2, k, *observation_shape]``
    (:func:`segment_frames` of each, cut to ``history`` frames before each segment by
    :func:`drop_history`; with ``stack = 1`` the observations and no restarts).
    :meth:`Labels.observations` is its inverse."""
    if stack == 1:
        return obs, jnp.zeros(obs.shape[:3], bool)
    frames, restart = jax.vmap(jax.vmap(functools.partial(segment_frames, stack=stack)))(obs)
    return drop_history(frames, obs.shape[2], history), restart


def segment_frames(obs: jax.Array, stack: int) -> tuple[jax.Array, jax.Array]:
    """Every distinct frame of one segment's stacks ``obs [k, *frame_shape, stack]``: its
    frames ``[k + stack - 1, *frame_shape]``, the first stack's then each later step's newest,
    and ``restart [k]``, where a stack does not continue the one before (module docstring)."""
    frame_axes = tuple(range(1, obs.ndim))
    continues = jnp.all(obs[1:, ..., :-1] == obs[:-1, ..., 1:], axis=frame_axes)  # [k - 1]
    restart = jnp.concatenate([jnp.zeros((1,), bool), ~continues])
    frames = jnp.concatenate([jnp.moveaxis(obs[0], -1, 0), obs[1:, ..., -1]])
    return frames, restart


def segment_stacks(frames: jax.Array, restart: jax.Array, stack: int, history: int) -> jax.Array:
    """One segment's stacks ``[k, *frame_shape, stack]`` from :func:`segment_frames`'s output.
    Step t's newest frame is ``frames[history + t]``; each channel walks back one frame:

        stack(t)[..., c] = frames[max(history + t - (stack - 1) + c, floor(t))],   c = 0 .. stack - 1,

    ``floor(t)`` the newest frame of the last restarted step at or before t, 0 if none: with
    ``history = 0`` the first step's own frame, so the first stacks repeat it as an episode's
    first stack does. Exact (bit for bit) with ``history = stack - 1`` when every stack
    continued the one before or restarted as EnvPool's do, its newest frame repeated."""
    steps = jnp.arange(restart.shape[0])
    floor = jax.lax.cummax(jnp.where(restart, steps + history, 0))
    index = jnp.maximum(steps[:, None] + history - (stack - 1) + jnp.arange(stack), floor[:, None])  # [k, stack]
    return jnp.moveaxis(frames[index], 1, -1)


def drop_history(frames: jax.Array, length: int, history: int) -> jax.Array:
    """Pairs' frames kept with their full history (``[P, 2, length + stack - 1, ...]``, as
    :func:`segment_frames` gives them and as on disk) cut down to ``history`` frames before
    each segment, for ``Labels``: the one place a layout's history is chosen."""
    return frames[:, :, frames.shape[2] - length - history:]


def empty_segments(spec: EnvSpec, capacity: int, length: int) -> Segments:
    shape, dtype = action_shape_dtype(spec)
    return Segments(
        obs=jnp.zeros((capacity, length, *spec.observation_shape), spec.observation_dtype),
        action=jnp.zeros((capacity, length, *shape), dtype),
        oracle_reward=jnp.zeros((capacity, length), jnp.float32),
        ring=empty_ring(),
    )


def empty_labels(spec: EnvSpec, capacity: int, length: int, ensemble_size: int,
                 frames_before_clip: bool = False) -> Labels:
    """An empty database of ``capacity`` labels of ``length``-step segments; Atari frame
    stacks (:func:`~rlhf_jax.replay.frame_stack`) are kept as frames, each once, with the
    ``stack - 1`` frames before each segment if ``frames_before_clip`` (module docstring)."""
    shape, dtype = action_shape_dtype(spec)
    stack = frame_stack(spec)
    history = stack - 1 if frames_before_clip else 0
    frame_shape = tuple(spec.observation_shape[:-1]) if stack > 1 else tuple(spec.observation_shape)
    return Labels(
        frames=jnp.zeros((capacity, 2, history + length, *frame_shape), spec.observation_dtype),
        restart=jnp.zeros((capacity, 2, length), bool),
        action=jnp.zeros((capacity, 2, length, *shape), dtype),
        mu=jnp.zeros((capacity,), jnp.float32),
        oracle_return=jnp.zeros((capacity, 2), jnp.float32),
        holdout=jnp.zeros((capacity, ensemble_size), bool),
        ring=empty_ring(),
        stack=stack,
        history=history,
    )


def labels_nbytes(spec: EnvSpec, capacity: int, length: int, ensemble_size: int,
                  frames_before_clip: bool = False) -> int:
    """Device bytes of ``empty_labels(...)``, found with ``jax.eval_shape`` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: empty_labels(spec, capacity, length, ensemble_size, frames_before_clip))
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes)))


def observations_on_host(labels: Labels, chunk: int = 256) -> np.ndarray:
    """``[size, 2, k, *observation_shape]``: every stored label's observations in NumPy
    (e.g. for ``labels.npz``), rebuilt ``chunk`` rows at a time so that the device never
    holds the whole database as stacks."""
    read, rows = jax.jit(Labels.observations), np.arange(int(labels.ring.size))
    return np.concatenate([np.asarray(read(labels, rows[i : i + chunk])) for i in range(0, max(len(rows), 1), chunk)])


def frames_on_host(obs: np.ndarray, stack: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pair_frames` of ``obs [N, c, k, *observation_shape]`` (``c`` segments a row) in
    NumPy, ``chunk`` rows at a time: ``(frames [N, c, k + stack - 1, *frame_shape], restart [N, c, k])``."""
    if stack == 1:
        return np.asarray(obs), np.zeros(obs.shape[:3], bool)
    split = jax.jit(functools.partial(pair_frames, stack=stack, history=stack - 1))
    parts = [jax.device_get(split(obs[i:i + chunk])) for i in range(0, len(obs), chunk)]
    if not parts:
        return (np.zeros((0, *obs.shape[1:2], obs.shape[2] + stack - 1, *obs.shape[3:-1]), obs.dtype),
                np.zeros(obs.shape[:3], bool))
    return np.concatenate([f for f, _ in parts]), np.concatenate([r for _, r in parts])


@functools.cache
def _stacks_rebuilder(stack: int):
    """:func:`segment_stacks` of ``[N, c]`` segments, compiled once (per shape) for every call
    of :func:`stacks_on_host`, which a writer calls a few rows at a time."""
    return jax.jit(jax.vmap(jax.vmap(functools.partial(segment_stacks, stack=stack, history=stack - 1))))


def stacks_on_host(frames: np.ndarray, restart: np.ndarray, stack: int, chunk: int = 256) -> np.ndarray:
    """The inverse of :func:`frames_on_host`: ``[N, c, k, *observation_shape]``, every stack
    rebuilt from its frames (:func:`segment_stacks`), ``chunk`` rows at a time."""
    if stack == 1:
        return np.asarray(frames)
    rebuild = _stacks_rebuilder(stack)
    parts = [np.asarray(rebuild(frames[i:i + chunk], restart[i:i + chunk])) for i in range(0, len(frames), chunk)]
    if not parts:
        return np.zeros((*restart.shape, *frames.shape[3:], stack), frames.dtype)
    return np.concatenate(parts)
