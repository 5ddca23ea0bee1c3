"""A replay memory that lives on the device (Mnih et al. 2015, Methods, "experience replay").

DQN stores the agent's experiences e_t = (s_t, a_t, r_t, s_{t+1}) in a data set
D = {e_1, ..., e_N} of the N most recent ones and learns from minibatches drawn
uniformly, (s, a, r, s') ~ U(D). Here D is a ring buffer of arrays, a pytree: ``init``,
``add`` and ``sample`` are pure functions that ``jit``, ``vmap`` and ``lax.scan``
accept, so acting, storing and learning fuse into one compiled program.

**Layout.** The batch of ``num_envs`` environments adds one row per vector step, so
every array has leading axes ``[rows, num_envs]`` with ``rows = capacity // num_envs``.
Row t of an environment holds its observation o_t (before acting), the action a_t,
the reward r_{t+1} and the done flag that followed. The next observation o_{t+1} is
the *next row*: nothing is stored twice, and the newest row cannot be sampled yet.

**Frames stored once.** An Atari observation is a stack of the 4 newest frames
(EnvPool, uint8 ``[84, 84, 4]``, oldest first). With ``stack = 4`` a row keeps only the
newest frame ``o_t[..., -1]`` and ``gather`` rebuilds the stack from the rows before
it. At an episode start EnvPool fills the whole stack with the first frame (its
``PushStack(push_all=true)`` at reset), so the rebuilt stack walks back one row per
frame and stops at the episode's first row, repeating that frame:

    stack(t)[..., 3 - k] = frame(max(t - k, start(t))),   k = 0, 1, 2, 3,

where start(t) is the row of the episode's first observation. It never reaches into
the previous episode, and equals EnvPool's observation exactly.

**Episode boundaries.** ``add`` takes, for each environment,

* ``done``: do not bootstrap from o_{t+1} (the target is r alone);
* ``next_first``: o_{t+1} is the first observation of a new episode (the stack
  starts afresh there); the flag is kept until o_{t+1} is added, in the next call;
* ``valid``: (o_t, a_t, r, o_{t+1}) is a real transition. Back ends that reset on
  the step *after* an episode end (EnvPool) spend one step whose action is ignored,
  going from the last observation to the new episode's first; it must never be sampled.

``init`` assumes the first observation added starts an episode (as after ``env.reset``).

**Sampling.** A row can be sampled when its next row exists, it is ``valid``, and
every frame of its stack is still in memory (after a wrap the oldest rows lose the
frames before them). ``sample`` draws (row, environment) pairs uniformly and redraws
the ones that cannot be sampled, which is uniform over the ones that can. After
``max_draws`` rounds a still-invalid draw comes back with ``mask = False``; that
happens only when (almost) nothing can be sampled, e.g. in a nearly empty buffer.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.networks import is_atari_frames


@struct.dataclass
class ReplayState:
    frames: jax.Array  # [R, N, *frame] o_t's newest frame (stack > 1) or o_t itself
    action: jax.Array  # [R, N] int32 a_t
    reward: jax.Array  # [R, N] float32 the reward after a_t
    done: jax.Array  # [R, N] bool: no bootstrap from o_{t+1}
    first: jax.Array  # [R, N] bool: o_t is an episode's first observation
    valid: jax.Array  # [R, N] bool: (o_t, a_t, r, o_{t+1}) is a real transition
    next_first: jax.Array  # [N] bool: ``first`` of the observation the next ``add`` stores
    position: jax.Array  # () int32: the row the next ``add`` writes
    size: jax.Array  # () int32: rows written so far, at most R
    stack: int = struct.field(pytree_node=False, default=1)

    @property
    def rows(self) -> int:
        return self.action.shape[0]

    @property
    def num_envs(self) -> int:
        return self.action.shape[1]


class Batch(NamedTuple):
    obs: jax.Array  # [B, *obs_shape]
    action: jax.Array  # [B]
    reward: jax.Array  # [B]
    done: jax.Array  # [B] bool
    next_obs: jax.Array  # [B, *obs_shape]
    mask: jax.Array  # [B] bool: a transition that may be sampled (see the module docstring)


def frame_stack(spec: EnvSpec) -> int:
    """How many frames an observation stacks: 4 for Atari frames (stored once each, here and in
    the label database), else 1 (stored whole). The rule is the reward model's and the agents'
    (:func:`rlhf_jax.networks.is_atari_frames`), so all of them agree on what a frame stack is."""
    return int(spec.observation_shape[-1]) if is_atari_frames(spec.observation_shape) else 1


def init(capacity: int, num_envs: int, obs_shape: Sequence[int], obs_dtype, stack: int = 1) -> ReplayState:
    """An empty memory of ``capacity // num_envs`` rows of ``num_envs`` transitions.

    With ``stack > 1`` observations are frame stacks ``[..., stack]`` (channel last) and
    one frame ``obs_shape[:-1]`` is stored per row; otherwise the whole observation.
    """
    rows = capacity // num_envs
    if rows < 2:
        raise ValueError(f"replay capacity {capacity} holds fewer than 2 steps of {num_envs} environments")
    if stack < 1 or (stack > 1 and obs_shape[-1] != stack):
        raise ValueError(f"a stack of {stack} frames does not fit observations of shape {tuple(obs_shape)}")
    frame_shape = tuple(obs_shape[:-1]) if stack > 1 else tuple(obs_shape)
    flags = jnp.zeros((rows, num_envs), bool)
    return ReplayState(
        frames=jnp.zeros((rows, num_envs) + frame_shape, obs_dtype),
        action=jnp.zeros((rows, num_envs), jnp.int32),
        reward=jnp.zeros((rows, num_envs), jnp.float32),
        done=flags,
        first=flags,
        valid=flags,
        next_first=jnp.ones((num_envs,), bool),
        position=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        stack=stack,
    )


def nbytes(capacity: int, num_envs: int, obs_shape: Sequence[int], obs_dtype, stack: int = 1) -> int:
    """Bytes of the memory ``init`` would make, found with ``jax.eval_shape`` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: init(capacity, num_envs, obs_shape, obs_dtype, stack))
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes)))


def add(state: ReplayState, obs, action, reward, done, next_first, valid) -> ReplayState:
    """Store one vector step: ``obs`` o_t ``[N, *obs_shape]`` and, each ``[N]``, a_t, the
    reward after it, ``done``, ``next_first`` (o_{t+1} starts an episode) and ``valid``."""
    frame = obs[..., -1] if state.stack > 1 else obs

    def put(buffer, value):
        return jax.lax.dynamic_update_index_in_dim(buffer, jnp.asarray(value, buffer.dtype), state.position, 0)

    return state.replace(
        frames=put(state.frames, frame),
        action=put(state.action, action),
        reward=put(state.reward, reward),
        done=put(state.done, done),
        first=put(state.first, state.next_first),
        valid=put(state.valid, valid),
        next_first=jnp.asarray(next_first, bool),
        position=(state.position + 1) % state.rows,
        size=jnp.minimum(state.size + 1, state.rows),
    )


def _age(state: ReplayState, rows):
    """Steps since a row was written: 0 for the newest, ``size - 1`` for the oldest."""
    return (state.position - 1 - rows) % state.rows


def _stack_rows(state: ReplayState, rows, envs):
    """The rows of the frames stacked into the observation of ``rows`` (oldest first), and
    whether they are all still in memory. Walks back one row per frame, stopping at an
    episode's first row."""
    found = [rows]
    steps = jnp.zeros_like(rows)
    for _ in range(state.stack - 1):
        back = ~state.first[found[-1], envs]
        steps = steps + back
        found.append(jnp.where(back, (found[-1] - 1) % state.rows, found[-1]))
    in_memory = _age(state, rows) + steps <= state.size - 1
    return found[::-1], in_memory


def can_sample(state: ReplayState, rows, envs) -> jax.Array:
    """Whether transitions ``(rows, envs)`` (broadcast together) may be sampled."""
    age = _age(state, rows)
    _, in_memory = _stack_rows(state, rows, envs)
    return (age >= 1) & (age < state.size) & state.valid[rows, envs] & in_memory


def valid_mask(state: ReplayState) -> jax.Array:
    """``[R, N]``: which stored transitions ``sample`` may return."""
    rows = jnp.arange(state.rows)[:, None]
    envs = jnp.arange(state.num_envs)[None, :]
    return can_sample(state, jnp.broadcast_to(rows, (state.rows, state.num_envs)), envs)


def _observation(state: ReplayState, rows, envs):
    if state.stack == 1:
        return state.frames[rows, envs]
    found, _ = _stack_rows(state, rows, envs)
    return jnp.stack([state.frames[r, envs] for r in found], axis=-1)


def gather(state: ReplayState, rows, envs) -> Batch:
    """The transitions ``(rows, envs)``, with stacks rebuilt and o_{t+1} from the next row."""
    return Batch(
        obs=_observation(state, rows, envs),
        action=state.action[rows, envs],
        reward=state.reward[rows, envs],
        done=state.done[rows, envs],
        next_obs=_observation(state, (rows + 1) % state.rows, envs),
        mask=can_sample(state, rows, envs),
    )


def sample_indices(state: ReplayState, key, batch_size: int, max_draws: int = 32):
    """``(rows, envs, mask)``, each ``[batch_size]``: draws uniform over the transitions that
    may be sampled (rejection: invalid draws are redrawn, at most ``max_draws`` times)."""

    def draw(key):
        age_key, env_key = jax.random.split(key)
        # Ages 1 .. size-1: every stored row but the newest, whose next observation is missing.
        age = jax.random.randint(age_key, (batch_size,), 1, jnp.maximum(state.size, 2))
        envs = jax.random.randint(env_key, (batch_size,), 0, state.num_envs)
        return (state.position - 1 - age) % state.rows, envs

    def redraw(carry):
        count, key, rows, envs, ok = carry
        key, draw_key = jax.random.split(key)
        new_rows, new_envs = draw(draw_key)
        rows, envs = jnp.where(ok, rows, new_rows), jnp.where(ok, envs, new_envs)
        return count + 1, key, rows, envs, can_sample(state, rows, envs)

    def keep_drawing(carry):
        count, _, _, _, ok = carry
        return (count < max_draws) & ~jnp.all(ok)

    start = jnp.zeros((batch_size,), jnp.int32)
    carry = (jnp.zeros((), jnp.int32), key, start, start, jnp.zeros((batch_size,), bool))
    _, _, rows, envs, ok = jax.lax.while_loop(keep_drawing, redraw, carry)
    return rows, envs, ok


def sample(state: ReplayState, key, batch_size: int) -> Batch:
    """A minibatch (s, a, r, s') ~ U(D) of ``batch_size`` transitions (Mnih et al. 2015, Algorithm 1)."""
    rows, envs, _ = sample_indices(state, key, batch_size)
    return gather(state, rows, envs)
