"""gymnax back end: any gymnax environment object, pure JAX, vmapped over ``num_envs`` copies.

:class:`GymnaxEnv` adapts a ``gymnax.environments.environment.Environment`` and its params
(the listed ids, ``gymnax/<name>``, are ``gymnax.make(name)`` through it: :func:`make_gymnax`;
one of your own goes through the same class, :mod:`rlhf_jax.envs.registry`). It maps

* ``reset_env`` of ``num_envs`` copies, each from its own key, to ``reset``;
* ``step_env`` to the step, ``terminated`` its done flag and ``truncated`` the env's
  ``is_truncated`` (its ``max_steps_in_episode``; ``env.max_episode_steps`` replaces it), the
  oracle's reward the env's reward or ``oracle(obs, action, next_obs, reward)`` of the step;
* the ends, under the episode-end options, as :func:`rlhf_jax.envs.auto_reset.end_rules` says.

A step resets a finished copy within the step; ``TimeStep.final_obs`` is the observation
the copy reached before that reset. With ``hide_episode_end`` and ``hidden_end="reset"`` a
failing copy restarts without the agent being told: there ``final_obs`` is the real last
observation and ``obs`` the new episode's first, on a step that is neither terminated
nor truncated for the agent.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import gymnax
import jax
import jax.numpy as jnp

from rlhf_jax.envs.auto_reset import (Oracle, check_fps, end_rules, first_step_info, oracle_reward,
                                     restart_where, step_info)
from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options

# name -> frames per second of real time, used to size segments and play clips
# (classic control: Gym's render fps; MinAtar has no clock, 10 fps reads well).
GYMNAX_FPS = {
    "CartPole-v1": 50.0,
    "Acrobot-v1": 15.0,
    "MountainCar-v0": 30.0,
    "Pendulum-v1": 30.0,
    "MountainCarContinuous-v0": 30.0,
    "Breakout-MinAtar": 10.0,
    "SpaceInvaders-MinAtar": 10.0,
    "Asterix-MinAtar": 10.0,
    "Freeway-MinAtar": 10.0,
}


class GymnaxInner(NamedTuple):
    env_state: Any  # the copies' gymnax state; with an oracle, Observed(state, its observation)
    key: jax.Array
    # True once a copy has reached a terminal state in this (fixed-length) episode:
    # from then on the unmodified environment would have paid no reward.
    failed: jax.Array


class Observed(NamedTuple):
    """A copy's gymnax state and the observation it gave: what an oracle of the step reads as ``obs``."""

    state: Any
    obs: jax.Array


def make_gymnax(name: str, config: EnvConfig) -> "GymnaxEnv":
    """A listed gymnax environment (``gymnax/<name>``): ``gymnax.make(name)`` through :class:`GymnaxEnv`."""
    env, params = gymnax.make(name)
    return GymnaxEnv(env, params, config, fps=GYMNAX_FPS[name])


class GymnaxEnv(Environment):
    """Any gymnax environment object and its params as an :class:`~rlhf_jax.envs.core.Environment`
    of ``config.num_envs`` copies (the mapping is in the module docstring).

    ``fps``: frames per second of real time, which sizes the 1.5 s segments (45 steps at 30) and
    plays clips. ``oracle``: the reward a synthetic labeler judges by and the true return is
    scored by, ``oracle(obs, action, next_obs, reward)`` of one copy's step (None: the env's
    reward); with one, ``info["env_reward"]`` keeps the env's own. Options that do not apply to
    gymnax (Atari's, MuJoCo's) are refused.
    """

    def __init__(self, env: gymnax.environments.environment.Environment, params, config: EnvConfig,
                 *, fps: float = 30.0, oracle: Optional[Oracle] = None):
        reject_options(config, "gymnax", hide_score=False, episodic_life=False, noop_max=30, control_cost=True,
                       oracle="penalty")
        self._env = env
        if config.max_episode_steps:
            params = params.replace(max_steps_in_episode=config.max_episode_steps)
        self._params = params
        self._config = config
        self._oracle = oracle
        space = self._env.action_space(params)
        if isinstance(space, gymnax.environments.spaces.Discrete):
            action_space = Discrete(int(space.n))
        else:
            action_space = Box(float(jnp.min(space.low)), float(jnp.max(space.high)), tuple(space.shape))
        self.spec = EnvSpec(
            id=config.id,
            backend="gymnax",
            num_envs=config.num_envs,
            observation_shape=tuple(self._env.observation_space(params).shape),
            observation_dtype="float32",
            action_space=action_space,
            fps=check_fps(fps),
            max_episode_steps=int(params.max_steps_in_episode),
        )

    def _reset_copies(self, key):
        keys = jax.random.split(key, self.num_envs)
        obs, env_state = jax.vmap(self._env.reset_env, in_axes=(0, None))(keys, self._params)
        obs = obs.astype(jnp.float32)
        return obs, (env_state if self._oracle is None else Observed(env_state, obs))

    def _reset(self, key):
        key, reset_key = jax.random.split(key)
        obs, env_state = self._reset_copies(reset_key)
        n = self.num_envs
        inner = GymnaxInner(env_state, key, jnp.zeros((n,), bool))
        info = first_step_info(self._oracle, n)
        return inner, first_timestep(obs, info)

    def _step(self, inner: GymnaxInner, action):
        key, step_key, reset_key = jax.random.split(inner.key, 3)
        step_keys = jax.random.split(step_key, self.num_envs)
        env_state = inner.env_state if self._oracle is None else inner.env_state.state
        obs, env_state, env_reward, terminated, _ = jax.vmap(self._env.step_env, in_axes=(0, 0, 0, None))(
            step_keys, env_state, action, self._params
        )
        obs, env_reward = obs.astype(jnp.float32), env_reward.astype(jnp.float32)
        truncated = jax.vmap(self._env.is_truncated, in_axes=(0, None))(env_state, self._params)
        if self._oracle is None:
            reward = env_reward
        else:
            reward = oracle_reward(self._oracle, inner.env_state.obs, action, obs, env_reward)
            env_state = Observed(env_state, obs)
        ends = end_rules(self._config, reward, terminated, truncated, inner.failed)

        reset_obs, reset_state = self._reset_copies(reset_key)
        env_state = restart_where(ends.restart, reset_state, env_state)
        next_obs = restart_where(ends.restart, reset_obs, obs)
        inner = GymnaxInner(env_state, key, ends.failed & ~ends.restart)
        info = step_info(self._oracle, ends.true_reward, ends.true_done, env_reward)
        ignored = jnp.zeros_like(terminated)
        return inner, TimeStep(next_obs, ends.reward, ends.terminated, ends.truncated, obs, ignored, info)
