"""EnvPool back end: Atari (Mnih et al. 2015 preprocessing) and C MuJoCo, inside compiled code.

Atari steps through EnvPool's XLA interface (``env.xla()``): the C++ pool becomes a
custom call, so stepping happens inside ``jit`` and ``lax.scan`` with no Python in the
loop. Consequences that shape this module:

* The pool lives on the host. Its "state" is an opaque handle: threading an old
  handle through ``step`` does not rewind the pool, and a pool cannot be ``vmap``ped
  as such. A sweep's runs share one pool instead (``members``): one pool of
  ``members x num_envs`` Atari environments, of which each run gets ``num_envs``; under
  ``vmap`` over the runs, their actions join into one call of the pool and its results
  are split among them (:func:`shared_by_members`).
* The pool is seeded when it is built (``EnvConfig.seed``); ``reset(key)`` ignores
  the key and asks the pool for fresh episodes through an ``io_callback``, so it
  can be called inside ``jit`` too.
* EnvPool resets a finished environment on the *next* step: the step after an
  episode end returns the new episode's first observation with reward 0 and ignores
  the action. We keep that behaviour (cheaper than a second pool call) and mark it
  with ``TimeStep.action_ignored``. So a step never replaces the observation it
  reached: ``final_obs`` is ``obs``, real also on a time-limit end.

EnvPool's MuJoCo XLA call exchanges float64 buffers, which JAX refuses without the
global ``jax_enable_x64`` switch; so the MuJoCo pool is stepped through an ordered
``io_callback`` instead, still from inside ``jit`` and ``lax.scan``.
"""
from __future__ import annotations

from typing import NamedTuple

import envpool
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback

from rlhf_jax.envs.atari_masks import hide_score
from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options
from rlhf_jax.errors import ConfigError

# Appendix A.2: episode ends become an oracle penalty "in all games except Pong".
NO_PENALTY_GAMES = ("Pong-v5",)
ATARI_FPS = 60.0 / 4  # the emulator's 60 Hz with frame skip 4

# Tasks whose episodes end when the body leaves a healthy range; EnvPool lets us
# switch that off, and pays the healthy bonus only while healthy.
TERMINATING_TASKS = ("Hopper-v5", "Walker2d-v5", "Ant-v5")
# Tasks whose only "healthy" signal is the episode end, which EnvPool cannot switch off.
ALWAYS_TERMINATING_TASKS = ("InvertedPendulum-v5", "InvertedDoublePendulum-v5")


class PoolState(NamedTuple):
    handle: jax.Array
    lives: jax.Array  # Atari: lives before this step, to see a life lost
    failed: jax.Array  # MuJoCo with hidden episode ends: unhealthy earlier in this episode


def shared_by_members(call, members: int):
    """``call(handle, *inputs) -> (handle, outputs)`` of a pool of ``members x N`` environments,
    as a function of one member's ``N`` that works under ``jax.vmap`` over the members:

        member_call(handle [H], *inputs [N, ...]) -> (handle, outputs [N, ...])

    Vmapped, the members' inputs (each ``[members, N, ...]``; a reset's key, which the pool
    ignores, is joined alike) become one call of the pool, and its outputs
    (``[members x N, ...]``) are split among them; every member gets the new handle.
    Unbatched, a member alone cannot drive the shared pool: that form is only traced for its
    shapes (``custom_vmap`` needs them), and returns zeros.
    """
    def split(x):  # [members x N, ...] -> [members, N, ...]
        return x.reshape(members, x.shape[0] // members, *x.shape[1:])

    def pool_inputs(inputs):  # [members, N, ...] -> [members x N, ...]
        return [x.reshape(-1, *x.shape[2:]) for x in inputs]

    @custom_vmap
    def member_call(handle, *inputs):
        joined_shapes = [jax.ShapeDtypeStruct((members, *x.shape), x.dtype) for x in inputs]
        _, outputs = jax.eval_shape(lambda h, *xs: call(h, *pool_inputs(xs)), handle, *joined_shapes)
        return handle, jax.tree.map(lambda x: jnp.zeros((x.shape[0] // members, *x.shape[1:]), x.dtype), outputs)

    @member_call.def_vmap
    def joined(axis_size, in_batched, handle, *inputs):
        if axis_size != members:
            raise ValueError(f"a pool shared by {members} members was vmapped over {axis_size}")
        if in_batched[0]:
            handle = handle[0]  # the same pool for every member
        inputs = [x if batched else jnp.broadcast_to(x, (members, *x.shape)) for x, batched in zip(inputs, in_batched[1:])]
        handle, outputs = call(handle, *pool_inputs(inputs))
        outputs = jax.tree.map(split, outputs)
        handles = jnp.broadcast_to(handle, (members, *handle.shape))
        return (handles, outputs), (True, jax.tree.map(lambda _: True, outputs))

    return member_call


class EnvPoolEnv(Environment):
    """What both pools share: construction, the initial state and the empty info of a reset."""

    def __init__(self, config: EnvConfig, spec: EnvSpec, members: int = 1, **pool_options):
        self._config = config
        self.pool = envpool.make(
            config.name, env_type="gymnasium", num_envs=config.num_envs * members, seed=config.seed, **pool_options
        )
        self.spec = spec

    def _reset(self, key):
        handle, obs, lives = self._pool_reset(key)
        n = self.num_envs
        zero, no = jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool)
        return PoolState(handle, lives, no), first_timestep(obs, {"true_reward": zero, "true_done": no})


class AtariEnv(EnvPoolEnv):
    """Atari with EnvPool's Mnih-2015 wrappers: 0-30 no-ops, max over 2 frames, 84x84 grey, 4-frame stack, skip 4.

    Observations are uint8 of shape (84, 84, 4), channel last as Flax convolutions expect.
    """

    def __init__(self, name: str, config: EnvConfig, members: int = 1):
        reject_options(config, "EnvPool Atari", control_cost=True, hidden_end="continue")
        if config.hide_episode_end and config.episodic_life:
            raise ConfigError("env.hide_episode_end and env.episodic_life contradict each other: choose one")
        self._game = name.split("-")[0]
        self._penalise = config.hide_episode_end and name not in NO_PENALTY_GAMES
        options = dict(noop_max=config.noop_max, reward_clip=False, episodic_life=False)
        if config.max_episode_steps:
            options["max_episode_steps"] = config.max_episode_steps
        pool = envpool.make_spec(name, num_envs=config.num_envs, **options)
        spec = EnvSpec(
            id=config.id, backend="envpool-atari", num_envs=config.num_envs,
            observation_shape=(84, 84, 4), observation_dtype="uint8",
            action_space=Discrete(int(pool.action_space.n)), fps=ATARI_FPS,
            max_episode_steps=int(pool.config.max_episode_steps),
        )
        super().__init__(config, spec, members, **options)
        self._handle, self._recv, _, self._xla_step = self.pool.xla()
        self._reset_call = self._reset_pool
        if members > 1:
            self._xla_step = shared_by_members(self._xla_step, members)
            self._reset_call = shared_by_members(self._reset_call, members)

    def _observe(self, obs):
        obs = jnp.transpose(obs, (0, 2, 3, 1))
        return hide_score(obs, self._game) if self._config.hide_score else obs

    def _pool_reset(self, key):
        handle, (obs, lives) = self._reset_call(jnp.asarray(self._handle), key)
        return handle, self._observe(obs), lives

    def _reset_pool(self, handle, key):
        """Reset every environment of the pool: ``(handle, (obs, lives))``, obs as EnvPool gives them."""
        del key  # the pool was seeded when it was built

        # The handle handed to the receive depends on the callback's result, so XLA
        # cannot move the receive before the reset it collects.
        def host_reset(handle):
            self.pool.async_reset()
            return handle

        handle = io_callback(host_reset, jax.ShapeDtypeStruct(handle.shape, handle.dtype), handle, ordered=True)
        handle, (obs, _, _, _, info) = self._recv(handle)
        return handle, (obs, info["lives"])

    def _step(self, inner: PoolState, action):
        handle, (obs, reward, terminated, truncated, info) = self._xla_step(inner.handle, action.astype(jnp.int32))
        game_over = terminated | truncated
        lives = info["lives"]
        reset_step = info["elapsed_step"] == 0  # EnvPool's reset step: a new game's first frame
        life_lost = lives < inner.lives  # (lives rise, never fall, at a reset)
        if self._config.hide_episode_end:  # one continuous game: the agent sees no end
            agent_terminated = agent_truncated = jnp.zeros_like(game_over)
        else:
            agent_terminated = terminated | life_lost if self._config.episodic_life else terminated
            agent_truncated = truncated & ~agent_terminated
        oracle_reward = reward
        if self._penalise:
            oracle_reward = reward - self._config.termination_penalty * (life_lost | game_over)
        info = {"true_reward": reward, "true_done": game_over, "lives": lives}
        obs = self._observe(obs)
        timestep = TimeStep(obs, oracle_reward, agent_terminated, agent_truncated, obs, reset_step, info)
        return PoolState(handle, lives, inner.failed), timestep


class MujocoPoolEnv(EnvPoolEnv):
    """EnvPool's C MuJoCo (Gymnasium v5 definitions): the CPU back end for machines without an accelerator."""

    def __init__(self, name: str, config: EnvConfig):
        reject_options(config, "EnvPool MuJoCo", hide_score=False, episodic_life=False, noop_max=30, hidden_end="continue")
        if config.hide_episode_end and name in ALWAYS_TERMINATING_TASKS:
            raise ConfigError(
                f"EnvPool cannot keep {name} running past its end; use mjx/{name} for env.hide_episode_end"
            )
        defaults = envpool.make_spec(name, num_envs=1).config
        self._ctrl_cost_weight = float(getattr(defaults, "ctrl_cost_weight", 0.0))
        self._hide = config.hide_episode_end and name in TERMINATING_TASKS
        options = {}
        if self._hide:
            # The pool runs on when unhealthy and pays the healthy bonus only while
            # healthy; it computes no control cost, so the healthy flag can be read
            # back from the reward (below) and the cost added by us.
            options = dict(terminate_when_unhealthy=False, ctrl_cost_weight=0.0)
            self._healthy_reward = float(defaults.healthy_reward)
        elif not config.control_cost and self._ctrl_cost_weight:
            options = dict(ctrl_cost_weight=0.0)
        if config.max_episode_steps:
            options["max_episode_steps"] = config.max_episode_steps
        pool = envpool.make_spec(name, num_envs=config.num_envs, **options)
        space = pool.action_space
        spec = EnvSpec(
            id=config.id, backend="envpool-mujoco", num_envs=config.num_envs,
            observation_shape=tuple(pool.observation_space.shape), observation_dtype="float32",
            action_space=Box(float(np.min(space.low)), float(np.max(space.high)), tuple(space.shape)),
            fps=1.0 / (float(defaults.frame_skip) * _timestep(name)),
            max_episode_steps=int(pool.config.max_episode_steps),
        )
        super().__init__(config, spec, **options)
        n = config.num_envs
        f32, i32 = jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.int32)
        self._obs_shape = jax.ShapeDtypeStruct((n,) + spec.observation_shape, jnp.float32)
        flag = jax.ShapeDtypeStruct((n,), bool)
        # obs, reward, terminated, truncated, elapsed_step, survive bonus (or x velocity)
        self._step_result = (self._obs_shape, f32, flag, flag, i32, f32)

    def _pool_reset(self, key):
        del key  # the pool was seeded when it was built

        def host_reset(handle):
            obs, _ = self.pool.reset()
            return handle, obs.astype(np.float32)

        handle = jnp.zeros((), jnp.int32)
        handle, obs = io_callback(host_reset, (jax.ShapeDtypeStruct((), jnp.int32), self._obs_shape), handle, ordered=True)
        return handle, obs, jnp.zeros((self.num_envs,), jnp.int32)

    def _host_step(self, action):
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(action, np.float64))
        survive = info.get("reward_survive", reward - info.get("x_velocity", 0.0))
        return (obs.astype(np.float32), reward.astype(np.float32), terminated, truncated,
                info["elapsed_step"].astype(np.int32), np.asarray(survive, np.float32))

    def _step(self, inner: PoolState, action):
        obs, reward, terminated, truncated, elapsed, survive = io_callback(
            self._host_step, self._step_result, action, ordered=True
        )
        ctrl_cost = self._ctrl_cost_weight * jnp.sum(jnp.square(action), axis=-1)
        game_over = terminated | truncated
        reset_step = elapsed == 0
        failed = inner.failed
        if self._hide:
            # reward = forward progress + healthy_reward * healthy (+ Ant's contact cost).
            healthy = survive > 0.5 * self._healthy_reward
            unmodified = reward - ctrl_cost  # Gymnasium v5 pays no bonus on the failing step either
            true_reward = jnp.where(failed | reset_step, 0.0, unmodified)
            failed = (failed | ~healthy) & ~game_over & ~reset_step
            oracle = reward - self._config.termination_penalty * ~healthy
            oracle = oracle - ctrl_cost if self._config.control_cost else oracle
            reward = jnp.where(reset_step, 0.0, oracle)
        else:
            true_reward = reward if self._config.control_cost or not self._ctrl_cost_weight else reward - ctrl_cost
        info = {"true_reward": true_reward, "true_done": game_over}
        timestep = TimeStep(obs, reward, terminated, truncated & ~terminated, obs, reset_step, info)
        return PoolState(inner.handle, inner.lives, failed), timestep


def _timestep(name: str) -> float:
    """The model's integration step, read from Gymnasium's copy of the XML EnvPool uses
    (EnvPool's own copies use a compiler option MuJoCo 3+ no longer reads)."""
    import pathlib

    import gymnasium
    import mujoco

    xml_file = envpool.make_spec(name, num_envs=1).config.xml_file
    path = pathlib.Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / xml_file
    return float(mujoco.MjModel.from_xml_path(str(path)).opt.timestep)
