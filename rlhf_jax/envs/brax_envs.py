"""Brax / MuJoCo Playground environments: any ``Env`` of the Brax interface, vmapped over ``num_envs`` copies.

The interface (``brax.envs.base.Env``, and MuJoCo Playground's ``MjxEnv``, which keeps it) is
two pure functions of one copy and a state that carries the step's results:

    reset(rng) -> State          step(state, action) -> State

with ``State.obs`` (an array), ``State.reward``, ``State.done`` (1.0 where the copy reached a
terminal state) and the environment's own ``metrics``, ``info`` and physics state, and
``env.action_size`` (actions are ``[-1, 1]^action_size`` unless ``action_bounds`` says otherwise).
Neither ``brax`` nor ``mujoco_playground`` is imported: the adapter only calls those methods.

:class:`BraxEnv` maps

* ``reset`` of ``num_envs`` copies, each from its own key, to ``reset``;
* ``step`` to the step: ``terminated`` is ``done``, ``truncated`` this adapter's own time limit
  (``max_episode_steps``, or ``env.max_episode_steps`` of the config), the oracle's reward the
  env's ``reward`` or ``oracle(obs, action, next_obs, reward)`` of the step;
* the ends, under the episode-end options, as :func:`rlhf_jax.envs.auto_reset.end_rules` says; a
  copy whose episode ends restarts within the step from a fresh ``reset`` (a new key each time),
  ``final_obs`` the observation it reached.

Give it the *unwrapped* environment: Brax's ``training`` wrappers (``EpisodeWrapper``,
``AutoResetWrapper``, ``VmapWrapper``) do what this adapter does, their own way. The reset of the
copies that restart runs only on steps where some copy does (``lax.cond``; under a sweep's ``vmap``
both branches run). ``fps`` defaults to ``1 / env.dt``, the control rate, where the env has ``dt``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rlhf_jax.envs.auto_reset import (Oracle, check_fps, end_rules, first_step_info, oracle_reward,
                                     restart_ended, step_info)
from rlhf_jax.envs.core import Box, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options


class BraxInner(NamedTuple):
    state: Any  # the copies' State, [N] leading axis
    steps: jax.Array  # int32 [N]: steps into the agent's episode
    key: jax.Array
    failed: jax.Array  # reached a terminal state earlier in this (fixed-length) episode


class BraxEnv(Environment):
    """An ``Env`` of the Brax interface as an :class:`~rlhf_jax.envs.core.Environment` of
    ``config.num_envs`` copies (the mapping is in the module docstring).

    ``max_episode_steps``: the time limit (Brax's training default, 1000), unless
    ``env.max_episode_steps`` in the config sets one. ``fps``: frames per second, which sizes the
    1.5 s segments; by default ``1 / env.dt``. ``oracle``: as :class:`~rlhf_jax.envs.GymnaxEnv`'s.
    """

    def __init__(self, env, config: EnvConfig, *, max_episode_steps: int = 1000, fps: Optional[float] = None,
                 action_bounds: tuple[float, float] = (-1.0, 1.0), oracle: Optional[Oracle] = None):
        reject_options(config, "Brax", hide_score=False, episodic_life=False, noop_max=30, control_cost=True,
                       oracle="penalty")
        self._env, self._config, self._oracle = env, config, oracle
        first = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        if not hasattr(first.obs, "shape"):
            raise TypeError(f"{config.id}: State.obs must be one array; this env's is {type(first.obs).__name__} "
                            f"(a dict of observations: pick or concatenate them in a wrapper of your own)")
        if fps is None:
            if not hasattr(env, "dt"):
                raise ValueError(f"{config.id}: the env has no dt; give fps")
            fps = 1.0 / float(env.dt)
        self._limit = int(config.max_episode_steps or max_episode_steps)
        if self._limit <= 0:
            raise ValueError(f"{config.id}: max_episode_steps must be positive, got {self._limit}")
        self.spec = EnvSpec(
            id=config.id,
            backend="brax",
            num_envs=config.num_envs,
            observation_shape=tuple(first.obs.shape),
            observation_dtype="float32",
            action_space=Box(float(action_bounds[0]), float(action_bounds[1]), (int(env.action_size),)),
            fps=check_fps(fps),
            max_episode_steps=self._limit,
        )

    def _fresh(self, key, like=None):
        """``num_envs`` fresh copies; with ``like``, in its dtypes (a restart's copies replace a step's)."""
        state = jax.vmap(self._env.reset)(jax.random.split(key, self.num_envs))
        return state if like is None else jax.tree.map(lambda x, y: x.astype(y.dtype), state, like)

    def _reset(self, key):
        key, reset_key = jax.random.split(key)
        state = self._fresh(reset_key)
        n = self.num_envs
        inner = BraxInner(state, jnp.zeros((n,), jnp.int32), key, jnp.zeros((n,), bool))
        return inner, first_timestep(state.obs.astype(jnp.float32), first_step_info(self._oracle, n))

    def _step(self, inner: BraxInner, action):
        after = jax.vmap(self._env.step)(inner.state, action)
        obs = after.obs.astype(jnp.float32)
        env_reward = after.reward.astype(jnp.float32)
        terminated = after.done.astype(jnp.float32) > 0.5
        steps = inner.steps + 1
        truncated = steps >= self._limit
        reward = oracle_reward(self._oracle, inner.state.obs.astype(jnp.float32), action, obs, env_reward)
        ends = end_rules(self._config, reward, terminated, truncated, inner.failed)

        state, key = restart_ended(ends.restart, inner.key, self._fresh, after)
        inner = BraxInner(state, jnp.where(ends.restart, 0, steps), key, ends.failed & ~ends.restart)
        info = step_info(self._oracle, ends.true_reward, ends.true_done, env_reward)
        ignored = jnp.zeros_like(terminated)
        return inner, TimeStep(state.obs.astype(jnp.float32), ends.reward, ends.terminated, ends.truncated, obs,
                               ignored, info)
