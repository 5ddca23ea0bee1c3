"""gymnax back end: classic control and MinAtar, pure JAX, vmapped over ``num_envs`` copies.

A step resets a finished copy within the step; ``TimeStep.final_obs`` is the observation
the copy reached before that reset. With ``hide_episode_end`` and ``hidden_end="reset"`` a
failing copy restarts without the agent being told: there ``final_obs`` is the real last
observation and ``obs`` the new episode's first, on a step that is neither terminated
nor truncated for the agent.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import gymnax
import jax
import jax.numpy as jnp

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
    env_state: Any
    key: jax.Array
    # True once a copy has reached a terminal state in this (fixed-length) episode:
    # from then on the unmodified environment would have paid no reward.
    failed: jax.Array


class GymnaxEnv(Environment):
    def __init__(self, name: str, config: EnvConfig):
        reject_options(config, "gymnax", hide_score=False, episodic_life=False, noop_max=30, control_cost=True,
                       oracle="penalty")
        self._env, params = gymnax.make(name)
        if config.max_episode_steps:
            params = params.replace(max_steps_in_episode=config.max_episode_steps)
        self._params = params
        self._config = config
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
            fps=GYMNAX_FPS[name],
            max_episode_steps=int(params.max_steps_in_episode),
        )

    def _reset_copies(self, key):
        keys = jax.random.split(key, self.num_envs)
        obs, env_state = jax.vmap(self._env.reset_env, in_axes=(0, None))(keys, self._params)
        return obs.astype(jnp.float32), env_state

    def _reset(self, key):
        key, reset_key = jax.random.split(key)
        obs, env_state = self._reset_copies(reset_key)
        n = self.num_envs
        inner = GymnaxInner(env_state, key, jnp.zeros((n,), bool))
        info = {"true_reward": jnp.zeros((n,)), "true_done": jnp.zeros((n,), bool)}
        return inner, first_timestep(obs, info)

    def _step(self, inner: GymnaxInner, action):
        key, step_key, reset_key = jax.random.split(inner.key, 3)
        step_keys = jax.random.split(step_key, self.num_envs)
        obs, env_state, reward, terminated, _ = jax.vmap(self._env.step_env, in_axes=(0, 0, 0, None))(
            step_keys, inner.env_state, action, self._params
        )
        obs, reward = obs.astype(jnp.float32), reward.astype(jnp.float32)
        truncated = jax.vmap(self._env.is_truncated, in_axes=(0, None))(env_state, self._params)

        if self._config.hide_episode_end and self._config.hidden_end == "reset":
            # Appendix A's Atari treatment: the copy restarts at once, the agent is not told
            # (only the time limit of a life that lasts ends its episode), the oracle pays
            # the penalty on the failing step.
            agent_terminated, agent_truncated = jnp.zeros_like(terminated), truncated & ~terminated
            true_reward, failed = reward, inner.failed
            reward = reward - self._config.termination_penalty * terminated
            true_done = terminated | truncated
            restart = terminated | truncated
        elif self._config.hide_episode_end:
            # Appendix A: the copy runs on to its time limit; every step in a terminal
            # state costs the oracle `termination_penalty`, and the unmodified return
            # stops counting at the first failure.
            agent_terminated, agent_truncated = jnp.zeros_like(terminated), truncated
            true_reward = jnp.where(inner.failed, 0.0, reward)
            reward = reward - self._config.termination_penalty * terminated
            failed = inner.failed | terminated
            true_done = restart = truncated
        else:
            agent_terminated, agent_truncated = terminated, truncated & ~terminated
            true_reward, failed = reward, inner.failed
            true_done = restart = terminated | truncated

        reset_obs, reset_state = self._reset_copies(reset_key)
        env_state = jax.tree.map(
            lambda fresh, old: jnp.where(restart.reshape((-1,) + (1,) * (old.ndim - 1)), fresh, old),
            reset_state,
            env_state,
        )
        next_obs = jnp.where(restart.reshape((-1,) + (1,) * (obs.ndim - 1)), reset_obs, obs)
        inner = GymnaxInner(env_state, key, failed & ~restart)
        info = {"true_reward": true_reward, "true_done": true_done}
        ignored = jnp.zeros_like(terminated)
        return inner, TimeStep(next_obs, reward, agent_terminated, agent_truncated, obs, ignored, info)
