"""EnvPool back end: Atari (Mnih et al. 2015 preprocessing) and C MuJoCo, inside compiled code.

Both step through EnvPool's XLA interface (``env.xla()``): the C++ pool's send and receive
become custom calls, so stepping happens inside ``jit`` and ``lax.scan`` with no Python in
the loop. Consequences that shape this module:

* The pool lives on the host. Its "state" is an opaque handle: threading an old
  handle through ``step`` does not rewind the pool, and a pool cannot be ``vmap``ped
  as such. A sweep's runs share one pool instead (``members``): one pool of
  ``members x num_envs`` environments, of which each run gets ``num_envs``; under
  ``vmap`` over the runs, their actions join into one call of the pool and its results
  are split among them (:func:`~rlhf_jax.envs.shared_pool.shared_by_members`).
* The pool is seeded when it is built (``EnvConfig.seed``); ``reset(key)`` ignores
  the key and asks the pool for fresh episodes through an ``io_callback``, so it
  can be called inside ``jit`` too.
* EnvPool's MuJoCo buffers (observations, actions, most of ``info``) are float64. JAX
  declares a custom call's buffers float64 only with 64-bit types on, so the interface is
  built, and every call into it traced, under ``jax.enable_x64(True)`` (:func:`x64`); what
  leaves the call is cast to 32 bits there. The rest of the program keeps JAX's default.
* EnvPool resets a finished environment on the *next* step: the step after an
  episode end returns the new episode's first observation with reward 0 and ignores
  the action. We keep that behaviour (cheaper than a second pool call) and mark it
  with ``TimeStep.action_ignored``. So a step never replaces the observation it
  reached: ``final_obs`` is ``obs``, real also on a time-limit end.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from rlhf_jax.envs.atari_masks import hide_score
from rlhf_jax.envs.core import MUJOCO_SEGMENT_FPS, Box, Discrete, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import ATARI_NAMES, EnvConfig, reject_options
from rlhf_jax.envs.shared_pool import shared_by_members
from rlhf_jax.envs.smooth_oracle import check_oracle, hidden_end_oracle, tip_height
from rlhf_jax.errors import ConfigError
from rlhf_jax.extras import require

# Appendix A.2: episode ends become an oracle penalty "in all games except Pong".
NO_PENALTY_GAMES = ("Pong-v5",)
ATARI_FPS = 60.0 / 4  # the emulator's 60 Hz with frame skip 4



def _envpool(name: str):
    """EnvPool, imported when an ``envpool/`` id is asked for; where it is not installed, a
    one-line error naming the extra that installs it (and, for MuJoCo, MuJoCo itself)."""
    if name in ATARI_NAMES:
        require(f"envpool/{name}", "atari", "envpool")
    else:
        require(f"envpool/{name}", "mujoco", "envpool", "mujoco")
    import envpool

    return envpool


class PoolState(NamedTuple):
    handle: jax.Array
    lives: jax.Array  # Atari: lives before this step, to see a life lost
    failed: jax.Array  # MuJoCo with hidden episode ends: unhealthy earlier in this episode
    # (hidden_end="reset": the previous step failed, so this one is its restart)


def x64():
    """The context EnvPool's XLA interface is built and called in: 64-bit types on, so that
    float64 buffers are declared float64 (declared float32, the pool would write past them)."""
    return jax.enable_x64(True)


def narrowed(tree):
    """Every float64 or int64 leaf of ``tree`` cast to 32 bits, inside :func:`x64`."""
    wide = {jnp.dtype(jnp.float64): jnp.float32, jnp.dtype(jnp.int64): jnp.int32}
    return jax.tree.map(lambda x: x.astype(wide.get(x.dtype, x.dtype)), tree)


class EnvPoolEnv(Environment):
    """What both pools share: construction and EnvPool's XLA interface, the reset (shared by a
    sweep's members where there are several), the initial state and the empty info of a reset.

    Subclasses say what a reset's ``(obs, info)`` gives the agent in ``_first``.
    """

    copies_on_host = True

    def __init__(self, config: EnvConfig, spec: EnvSpec, members: int = 1, **pool_options):
        self._config = config
        self.pool_options = pool_options  # what a second pool needs to step as this one does (benchmarks)
        self.pool = _envpool(config.name).make(
            config.name, env_type="gymnasium", num_envs=config.num_envs * members, seed=config.seed, **pool_options
        )
        with x64():
            handle, self._recv, _, self._xla_step = self.pool.xla()
        self._handle = np.asarray(handle)
        self._reset_call = self._reset_pool if members == 1 else shared_by_members(self._reset_pool, members)
        self.spec = spec

    def _first(self, obs, info):
        """``(obs, lives)`` of a reset, from what the pool's receive gave (cast to 32 bits)."""
        raise NotImplementedError

    def _reset(self, key):
        handle, (obs, info) = self._reset_call(jnp.asarray(self._handle), key)
        obs, lives = self._first(obs, info)
        n = self.num_envs
        zero, no = jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool)
        return PoolState(handle, lives, no), first_timestep(obs, {"true_reward": zero, "true_done": no})

    def _reset_pool(self, handle, key):
        """Reset every copy of the pool: ``(handle, (obs, info))`` as EnvPool's receive gives
        them, cast to 32 bits."""
        del key  # the pool was seeded when it was built

        # The handle handed to the receive depends on the callback's result, so XLA
        # cannot move the receive before the reset it collects.
        def host_reset(handle):
            self.pool.async_reset()
            return handle

        handle = io_callback(host_reset, jax.ShapeDtypeStruct(handle.shape, handle.dtype), handle, ordered=True)
        with x64():
            handle, (obs, _, _, _, info) = self._recv(handle)
            return handle, narrowed((obs, info))


class AtariEnv(EnvPoolEnv):
    """Atari with EnvPool's Mnih-2015 wrappers: 0-30 no-ops, max over 2 frames, 84x84 grey, 4-frame stack, skip 4.

    Observations are uint8 of shape (84, 84, 4), channel last as Flax convolutions expect.
    """

    def __init__(self, name: str, config: EnvConfig, members: int = 1):
        reject_options(config, "EnvPool Atari", control_cost=True, hidden_end="continue", oracle="penalty")
        if config.hide_episode_end and config.episodic_life:
            raise ConfigError("env.hide_episode_end and env.episodic_life contradict each other: choose one")
        self._game = name.split("-")[0]
        self._penalise = config.hide_episode_end and name not in NO_PENALTY_GAMES
        options = dict(noop_max=config.noop_max, reward_clip=False, episodic_life=False)
        if config.max_episode_steps:
            options["max_episode_steps"] = config.max_episode_steps
        pool = _envpool(name).make_spec(name, num_envs=config.num_envs, **options)
        spec = EnvSpec(
            id=config.id, backend="envpool-atari", num_envs=config.num_envs,
            observation_shape=(84, 84, 4), observation_dtype="uint8",
            action_space=Discrete(int(pool.action_space.n)), fps=ATARI_FPS,
            max_episode_steps=int(pool.config.max_episode_steps),
        )
        super().__init__(config, spec, members, **options)
        if members > 1:
            self._xla_step = shared_by_members(self._xla_step, members)

    def _observe(self, obs):
        obs = jnp.transpose(obs, (0, 2, 3, 1))
        return hide_score(obs, self._game) if self._config.hide_score else obs

    def _first(self, obs, info):
        return self._observe(obs), info["lives"]

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


def _survive_bonus_paid(obs, reward, info, task):
    """Hopper, Walker2d, Ant: EnvPool (like Gymnasium v5) pays ``healthy_reward`` only while
    healthy; Ant says what it paid (``reward_survive``), the others pay it beside the forward
    term alone (the pool computes no control cost here)."""
    bonus = info["reward_survive"] if "reward_survive" in info else reward - task.forward_reward_weight * info["x_velocity"]
    return bonus > 0.5 * task.healthy_reward


def _pendulum_upright(obs, reward, info, task):
    """InvertedPendulum-v5's health, ``all(isfinite(obs)) and abs(qpos[1]) <= 0.2`` (obs = qpos, qvel)."""
    return jnp.all(jnp.isfinite(obs), axis=-1) & (jnp.abs(obs[:, 1]) <= 0.2)


def _double_pendulum_tip_up(obs, reward, info, task):
    """InvertedDoublePendulum-v5's health: the tip's height (:func:`tip_height`) above 1."""
    return tip_height(obs) > 1.0


class RunOn(NamedTuple):
    """How a task that ends its episodes when unhealthy is kept running past that end
    (``hide_episode_end``): EnvPool options, the reading of health from a step's float64
    results, and whether the pool then pays the healthy bonus on every step."""

    options: dict
    healthy: Callable  # (obs, reward, info, the task's EnvPool config) -> bool [n], traced under x64
    bonus_always: bool


# Appendix A: "we replaced these termination conditions by a penalty". EnvPool can switch
# Hopper's, Walker2d's and Ant's off; the two pendulums' end is a healthy range of the
# model's state, which set to the whole line never ends them (and pays the bonus always).
RUN_ON = {
    "Hopper-v5": RunOn(dict(terminate_when_unhealthy=False), _survive_bonus_paid, False),
    "Walker2d-v5": RunOn(dict(terminate_when_unhealthy=False), _survive_bonus_paid, False),
    "Ant-v5": RunOn(dict(terminate_when_unhealthy=False), _survive_bonus_paid, False),
    "InvertedPendulum-v5": RunOn(dict(healthy_z_min=-np.inf, healthy_z_max=np.inf), _pendulum_upright, True),
    "InvertedDoublePendulum-v5": RunOn(dict(healthy_z_max=-np.inf), _double_pendulum_tip_up, True),
}


class MujocoPoolEnv(EnvPoolEnv):
    """EnvPool's C MuJoCo (Gymnasium v5 definitions): the CPU back end for machines without an accelerator.

    Appendix A's modifications, as :mod:`rlhf_jax.envs.mjx_tasks` defines them:

    * ``control_cost=False``: "the OpenAI Gym continuous control tasks penalize large
      torques ... so we removed them" (from the tasks: neither the oracle's reward nor the
      true reward that scores a run pays them, as in the paper's curves). The pool never
      computes the control cost; it is ``ctrl_cost_weight * sum(action**2)`` of the
      (clipped) action, computed here and paid unless the option removes it.
    * ``hide_episode_end``: fixed-length episodes. The tasks that end when unhealthy run on
      (:data:`RUN_ON`); every step in an unhealthy state costs the oracle
      ``termination_penalty``, the healthy bonus is paid only while healthy, and the true
      reward (the task's) stops counting after the first unhealthy step, so the true return
      is the unmodified episode's. ``oracle="smooth"`` pays :mod:`rlhf_jax.envs.smooth_oracle`'s
      reward instead of the bonus and the penalty. With ``hidden_end="reset"`` the pool ends the
      episode as Gymnasium does and restarts the copy on its next step instead, the agent is
      not told, and the oracle pays the penalty on the failing step only.

    ``members`` runs of a sweep share one pool of ``members x num_envs`` copies
    (:func:`~rlhf_jax.envs.shared_pool.shared_by_members`).
    """

    def __init__(self, name: str, config: EnvConfig, members: int = 1):
        reject_options(config, "EnvPool MuJoCo", hide_score=False, episodic_life=False, noop_max=30)
        check_oracle(name, config.oracle, config.hide_episode_end)
        defaults = _envpool(name).make_spec(name, num_envs=1).config
        self._name, self._task = name, defaults
        self._ctrl_cost_weight = float(getattr(defaults, "ctrl_cost_weight", 0.0))
        self._healthy_reward = float(getattr(defaults, "healthy_reward", 0.0))
        hidden = config.hide_episode_end and name in RUN_ON
        self._run_on = RUN_ON[name] if hidden and config.hidden_end == "continue" else None
        self._restart_hidden = hidden and config.hidden_end == "reset"
        options = dict(self._run_on.options) if self._run_on else {}
        if self._ctrl_cost_weight:
            options["ctrl_cost_weight"] = 0.0  # paid in _step, from the action
        if config.max_episode_steps:
            options["max_episode_steps"] = config.max_episode_steps
        pool = _envpool(name).make_spec(name, num_envs=config.num_envs, **options)
        space = pool.action_space
        spec = EnvSpec(
            id=config.id, backend="envpool-mujoco", num_envs=config.num_envs,
            observation_shape=tuple(pool.observation_space.shape), observation_dtype="float32",
            action_space=Box(float(np.min(space.low)), float(np.max(space.high)), tuple(space.shape)),
            fps=1.0 / (float(defaults.frame_skip) * _timestep(name)),
            max_episode_steps=int(pool.config.max_episode_steps),
            segment_fps=MUJOCO_SEGMENT_FPS.get(name, 0.0),
        )
        super().__init__(config, spec, members, **options)
        self._step_call = self._step_pool if members == 1 else shared_by_members(self._step_pool, members)

    def _reset(self, key):
        state, timestep = super()._reset(key)
        no = jnp.zeros((self.num_envs,), bool)
        return state, timestep._replace(info={**timestep.info, "unhealthy": no})  # a step's keys

    def _first(self, obs, info):
        return obs, jnp.zeros((self.num_envs,), jnp.int32)  # no lives

    def _step_pool(self, handle, action):
        """One step of every copy of the pool: ``(handle, (obs, reward, terminated, truncated, elapsed, healthy))``,
        health read from the pool's float64 results before they are cast to 32 bits."""
        with x64():
            handle, (obs, reward, terminated, truncated, info) = self._xla_step(handle, action.astype(jnp.float64))
            healthy = self._run_on.healthy(obs, reward, info, self._task) if self._run_on else ~terminated
            return handle, narrowed((obs, reward, terminated, truncated, info["elapsed_step"], healthy))

    def _step(self, inner: PoolState, action):
        handle, (obs, reward, terminated, truncated, elapsed, healthy) = self._step_call(inner.handle, action)
        reset_step = elapsed == 0  # EnvPool's reset step: the action was ignored, reward 0
        game_over = terminated | truncated
        if self._run_on and self._run_on.bonus_always:
            reward = reward - self._healthy_reward * ~healthy  # v5 pays it only while healthy
        ctrl_cost = self._ctrl_cost_weight * jnp.sum(jnp.square(action), axis=-1)
        # The task's reward: Gymnasium's v5 reward, without its torque cost if the option removed it.
        task_reward = jnp.where(reset_step, 0.0, reward - ctrl_cost * self._config.control_cost)
        oracle = true_reward = task_reward
        failed = inner.failed
        failing = ~healthy & ~reset_step  # this step's result is outside the healthy range
        # The steps that pay termination_penalty: the failing ones, or with penalty_step="restart"
        # the restart after a hidden failure, the one step whose observation shows the failed state.
        charged = failing
        if self._restart_hidden and self._config.penalty_step == "restart":
            charged = reset_step & inner.failed
        if self._run_on or self._restart_hidden:
            oracle = jnp.where(reset_step & ~charged, 0.0, hidden_end_oracle(
                self._config, self._name, task_reward, self._healthy_reward * healthy, charged, obs))
        if self._run_on:
            true_reward = jnp.where(failed, 0.0, task_reward)  # the unmodified episode has ended
            failed = (failed | ~healthy) & ~game_over & ~reset_step
        elif self._restart_hidden:
            failed = failing  # the next step is this copy's restart
        # hidden_end="reset": the pool ends the episode and restarts the copy on its next step,
        # and the agent is not told; only a time limit ends its episode. A charged restart is an
        # ordinary step to the agent, which is told neither of the restart nor of its ignored action.
        told_terminated = terminated & ~self._restart_hidden
        info = {"true_reward": true_reward, "true_done": game_over, "unhealthy": failing}
        timestep = TimeStep(obs, oracle, told_terminated, truncated & ~terminated, obs, reset_step & ~charged, info)
        return PoolState(handle, inner.lives, failed), timestep


def _timestep(name: str) -> float:
    """The model's integration step, read from Gymnasium's copy of the XML EnvPool uses
    (EnvPool's own copies use a compiler option MuJoCo 3+ no longer reads)."""
    import pathlib

    import gymnasium
    import mujoco

    xml_file = _envpool(name).make_spec(name, num_envs=1).config.xml_file
    path = pathlib.Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / xml_file
    return float(mujoco.MjModel.from_xml_path(str(path)).opt.timestep)
