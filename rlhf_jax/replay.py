"""A replay memory that lives on the device (Mnih et al. 2015, Methods, "experience replay").

DQN stores the agent's experiences e_t = (s_t, a_t, r_t, s_{t+1}) in a data set
D = {e_1, ..., e_N} of the N most recent ones and learns from minibatches drawn
uniformly, (s, a, r, s') ~ U(D). Here D is a ring buffer of arrays, a pytree: ``init``,
``add`` and ``sample`` are pure functions that ``jit``, ``vmap`` and ``lax.scan``
accept, so acting, storing and learning fuse into one compiled program.

**Layout.** The batch of ``num_envs`` environments adds one row per vector step, so
every array has leading axes ``[rows, num_envs]`` with ``rows = capacity // num_envs``.
Row t of an environment holds its observation o_t (before acting), the action a_t and
what the step returned (:class:`rlhf_jax.envs.core.TimeStep`): the environment's reward
``timestep.reward``, ``terminated``, ``truncated`` and ``action_ignored``. Never a
learned reward: an agent computes r̂ from the current reward model when it samples
(:mod:`rlhf_jax.agents.base`). The next observation o_{t+1} is the *next row*: nothing
is stored twice, and the newest row cannot be sampled yet.

**Final observations.** A step's ``final_obs`` is the observation it reached. On
EnvPool that is always o_{t+1}, the next row (its reset comes one step later), so
nothing more is kept. A back end that restarts a copy within the step (gymnax, MJX)
puts the new episode's first observation in o_{t+1}, so there the memory keeps
``final_obs`` in an array of its own (:func:`keeps_final_obs`): one more observation
per transition, 16 bytes on CartPole, 1,600 on Breakout-MinAtar (10x10x4 float32).

**Frames stored once.** An Atari observation is a stack of the 4 newest frames
(EnvPool, uint8 ``[84, 84, 4]``, oldest first). With ``stack = 4`` a row keeps only the
newest frame ``o_t[..., -1]`` and ``gather`` rebuilds the stack from the rows before
it. At an episode start EnvPool fills the whole stack with the first frame (its
``PushStack(push_all=true)`` at reset), so the rebuilt stack walks back one row per
frame and stops at the episode's first row, repeating that frame:

    stack(t)[..., 3 - k] = frame(max(t - k, start(t))),   k = 0, 1, 2, 3,

where start(t) is the row of the episode's first observation. It never reaches into
the previous episode, and equals EnvPool's observation exactly. That first observation
is the one a reset step returns (``action_ignored``): frames are stacked on EnvPool only
(:func:`frame_stack`), the back end that resets on the step after an end.

**Which transitions are real.** A reset step goes from an episode's last observation to
the next one's first, its action ignored: it is never sampled. Every other step is,
episode ends included: the agent's target reads ``terminated`` and ``truncated``
(:mod:`rlhf_jax.ops.episode_ends`). ``init`` assumes the first observation added starts
an episode (as after ``env.reset``).

**Sampling.** A row can be sampled when its next row exists, its action was not
ignored, and every frame of its stack is still in memory (after a wrap the oldest rows
lose the frames before them). ``sample`` draws (row, environment) pairs uniformly and
redraws the ones that cannot be sampled, which is uniform over the ones that can. After
``max_draws`` rounds a still-invalid draw comes back with ``mask = False``; that
happens only when (almost) nothing can be sampled, e.g. in a nearly empty buffer.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhf_jax.envs.core import EnvSpec, TimeStep
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.ops import ring
from rlhf_jax.ops.ring import Ring, empty_ring


@struct.dataclass
class ReplayState:
    frames: jax.Array  # [R, N, *frame] o_t's newest frame (stack > 1) or o_t itself
    final_obs: Optional[jax.Array]  # [R, N, *obs] the observation the step reached; None: the next row's (EnvPool)
    action: jax.Array  # [R, N] int32 a_t
    reward: jax.Array  # [R, N] float32 the environment's reward after a_t (timestep.reward)
    terminated: jax.Array  # [R, N] bool
    truncated: jax.Array  # [R, N] bool
    action_ignored: jax.Array  # [R, N] bool: a reset step, never sampled
    first: jax.Array  # [R, N] bool: o_t is an episode's first observation (where its frame stack starts)
    next_first: jax.Array  # [N] bool: ``first`` of the observation the next ``add`` stores
    ring: Ring  # the row the next ``add`` writes, and the rows written so far (at most R)
    stack: int = struct.field(pytree_node=False, default=1)

    @property
    def rows(self) -> int:
        return self.action.shape[0]

    @property
    def num_envs(self) -> int:
        return self.action.shape[1]


class Batch(NamedTuple):
    obs: jax.Array  # [B, *obs_shape] o_t
    action: jax.Array  # [B]
    reward: jax.Array  # [B] the environment's reward (timestep.reward)
    terminated: jax.Array  # [B] bool
    truncated: jax.Array  # [B] bool
    action_ignored: jax.Array  # [B] bool (False wherever ``mask``)
    next_obs: jax.Array  # [B, *obs_shape] o_{t+1}: after an automatic reset, the new episode's first
    final_obs: jax.Array  # [B, *obs_shape] the observation the step reached (``next_obs`` on EnvPool)
    mask: jax.Array  # [B] bool: a transition that may be sampled (see the module docstring)

    @property
    def timestep(self) -> TimeStep:
        """The ``TimeStep`` the step returned, rebuilt from what the memory keeps (``info={}``),
        for a reward function on replayed transitions (:mod:`rlhf_jax.agents.base`)."""
        return TimeStep(self.next_obs, self.reward, self.terminated, self.truncated, self.final_obs,
                        self.action_ignored, {})


def frame_stack(spec: EnvSpec) -> int:
    """How many frames an observation stacks: 4 for Atari frames (stored once each, here and in
    the label database), else 1 (stored whole). The rule is the reward model's and the agents'
    (:func:`rlhf_jax.networks.is_atari_frames`), so all of them agree on what a frame stack is."""
    return int(spec.observation_shape[-1]) if is_atari_frames(spec.observation_shape) else 1


def keeps_final_obs(spec: EnvSpec) -> bool:
    """Whether a memory of this environment's steps must keep ``final_obs`` besides the
    observations: wherever a step can restart a copy itself (gymnax, MJX). EnvPool resets on
    the *next* step, so its ``final_obs`` is always ``obs``, the next stored observation
    (:mod:`rlhf_jax.envs.core`)."""
    return not spec.backend.startswith("envpool")


def init(capacity: int, num_envs: int, obs_shape: Sequence[int], obs_dtype, stack: int = 1,
         keep_final_obs: bool = False) -> ReplayState:
    """An empty memory of ``capacity // num_envs`` rows of ``num_envs`` transitions.

    With ``stack > 1`` observations are frame stacks ``[..., stack]`` (channel last) and
    one frame ``obs_shape[:-1]`` is stored per row; otherwise the whole observation.
    ``keep_final_obs`` (:func:`keeps_final_obs`) adds a whole final observation per row.
    """
    rows = capacity // num_envs
    if rows < 2:
        raise ValueError(f"replay capacity {capacity} holds fewer than 2 steps of {num_envs} environments")
    if stack < 1 or (stack > 1 and obs_shape[-1] != stack):
        raise ValueError(f"a stack of {stack} frames does not fit observations of shape {tuple(obs_shape)}")
    if stack > 1 and keep_final_obs:
        raise ValueError("frames are stored once only where the next row holds the final observation (EnvPool)")
    frame_shape = tuple(obs_shape[:-1]) if stack > 1 else tuple(obs_shape)
    flags = jnp.zeros((rows, num_envs), bool)
    return ReplayState(
        frames=jnp.zeros((rows, num_envs) + frame_shape, obs_dtype),
        final_obs=jnp.zeros((rows, num_envs) + tuple(obs_shape), obs_dtype) if keep_final_obs else None,
        action=jnp.zeros((rows, num_envs), jnp.int32),
        reward=jnp.zeros((rows, num_envs), jnp.float32),
        terminated=flags,
        truncated=flags,
        action_ignored=flags,
        first=flags,
        next_first=jnp.ones((num_envs,), bool),
        ring=empty_ring(),
        stack=stack,
    )


def nbytes(capacity: int, num_envs: int, obs_shape: Sequence[int], obs_dtype, stack: int = 1,
           keep_final_obs: bool = False) -> int:
    """Bytes of the memory ``init`` would make, found with ``jax.eval_shape`` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: init(capacity, num_envs, obs_shape, obs_dtype, stack, keep_final_obs))
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes)))


def add(state: ReplayState, obs, action, timestep: TimeStep) -> ReplayState:
    """Store one vector step: ``obs`` o_t ``[N, *obs_shape]``, the action a_t ``[N]`` and the
    ``TimeStep`` the step returned (its ``obs``, o_{t+1}, is stored by the next ``add``)."""
    frame = obs[..., -1] if state.stack > 1 else obs

    def put(buffer, value):
        return jax.lax.dynamic_update_index_in_dim(buffer, jnp.asarray(value, buffer.dtype), state.ring.next, 0)

    return state.replace(
        frames=put(state.frames, frame),
        final_obs=None if state.final_obs is None else put(state.final_obs, timestep.final_obs),
        action=put(state.action, action),
        reward=put(state.reward, timestep.reward),
        terminated=put(state.terminated, timestep.terminated),
        truncated=put(state.truncated, timestep.truncated),
        action_ignored=put(state.action_ignored, timestep.action_ignored),
        first=put(state.first, state.next_first),
        # After a reset step o_{t+1} is a new episode's first observation: its stack starts afresh.
        next_first=jnp.asarray(timestep.action_ignored, bool),
        ring=ring.advance(state.ring, 1, state.rows),
    )


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
    in_memory = ring.age(state.ring, rows, state.rows) + steps <= state.ring.size - 1
    return found[::-1], in_memory


def can_sample(state: ReplayState, rows, envs) -> jax.Array:
    """Whether transitions ``(rows, envs)`` (broadcast together) may be sampled."""
    age = ring.age(state.ring, rows, state.rows)
    _, in_memory = _stack_rows(state, rows, envs)
    return (age >= 1) & (age < state.ring.size) & ~state.action_ignored[rows, envs] & in_memory


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
    next_obs = _observation(state, (rows + 1) % state.rows, envs)
    return Batch(
        obs=_observation(state, rows, envs),
        action=state.action[rows, envs],
        reward=state.reward[rows, envs],
        terminated=state.terminated[rows, envs],
        truncated=state.truncated[rows, envs],
        action_ignored=state.action_ignored[rows, envs],
        next_obs=next_obs,
        final_obs=next_obs if state.final_obs is None else state.final_obs[rows, envs],
        mask=can_sample(state, rows, envs),
    )


def sample_indices(state: ReplayState, key, batch_size: int, max_draws: int = 32):
    """``(rows, envs, mask)``, each ``[batch_size]``: draws uniform over the transitions that
    may be sampled (rejection: invalid draws are redrawn, at most ``max_draws`` times)."""

    def draw(key):
        age_key, env_key = jax.random.split(key)
        # Ages 1 .. size-1: every stored row but the newest, whose next observation is missing.
        age = jax.random.randint(age_key, (batch_size,), 1, jnp.maximum(state.ring.size, 2))
        envs = jax.random.randint(env_key, (batch_size,), 0, state.num_envs)
        return ring.row_of_age(state.ring, age, state.rows), envs

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
