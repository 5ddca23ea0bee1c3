"""Gymnasium environments with no JAX version, stepped on the host from inside compiled code.

:class:`GymnasiumEnv` runs ``num_envs`` copies as a ``gymnasium.vector.SyncVectorEnv`` in this
process and calls it through ``jax.experimental.io_callback``: a step of the copies is one host
call inside the agent's ``jit`` and ``lax.scan``, the rest of the run (the agent, the reward
model, the labeler) stays on the device. It maps

* ``reset(seed=...)`` of the vector env, the seed drawn from the key, to ``reset``;
* ``step`` to the step: ``terminated`` and ``truncated`` as Gymnasium returns them (the time limit
  is the env's ``TimeLimit``, or ``env.max_episode_steps`` of the config), the oracle's reward the
  env's reward or ``oracle(obs, action, next_obs, reward)`` of the step, computed on the device;
* the ends, under the episode-end options, as :func:`rlhf_jax.envs.auto_reset.end_rules` says. The
  vector env resets a finished copy in the same step (``AutoresetMode.SAME_STEP``): ``obs`` is the
  new episode's first observation and ``final_obs`` the one the copy reached (Gymnasium's
  ``info["final_obs"]``). ``hide_episode_end`` works with ``hidden_end="reset"`` only: a copy on the
  host cannot run on past its end.

Limits, all from the environment's state living on the host:

* **Slower.** Every step leaves the device and runs Python: thousands of steps per second where
  a pure JAX environment gives millions; use it where no JAX version exists.
* **No plain ``vmap``.** The copies are one object in this process, not a value: ``jax.vmap`` of a
  run over seeds cannot step them. A sweep's members share one vector env of ``members x num_envs``
  copies instead, each member stepping its own ``num_envs`` in one host call (``members``, as
  EnvPool's pools are shared: :func:`rlhf_jax.envs.shared_pool.shared_by_members`).
* **State not in the checkpoint.** Threading an old state through ``step`` does not rewind the
  copies. A run resumed in a new process finds copies never reset: its first step resets them,
  and is marked ``action_ignored`` (reward 0, no end, no loss), as EnvPool's reset step is.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Union

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from jax.experimental import io_callback

from rlhf_jax.envs.auto_reset import Oracle, check_fps, end_rules, first_step_info, oracle_reward, step_info
from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options
from rlhf_jax.envs.shared_pool import shared_by_members
from rlhf_jax.errors import ConfigError


class HostState(NamedTuple):
    handle: jax.Array  # int32: a token each host call returns, so that calls run in order


class HostStep(NamedTuple):
    """One host step of every copy, ``[copies, ...]``."""

    obs: np.ndarray  # after Gymnasium's same-step reset
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray  # the observation reached
    before: np.ndarray  # the observation the action was taken on
    ignored: np.ndarray  # the copies were not reset in this process: this step reset them


class GymnasiumEnv(Environment):
    """A Gymnasium environment (a registered id such as ``"CartPole-v1"``, or a function that makes
    one) as an :class:`~rlhf_jax.envs.core.Environment` of ``config.num_envs`` copies stepped on the
    host (the mapping and the limits are in the module docstring).

    ``members``: the runs of a sweep that share the copies (the factory's second argument).
    ``fps``: by default the env's ``metadata["render_fps"]``, else 30. ``oracle``: as
    :class:`~rlhf_jax.envs.GymnaxEnv`'s, a JAX function, run on the device.
    """

    copies_on_host = True

    def __init__(self, make_env: Union[str, Callable[[], gymnasium.Env]], config: EnvConfig, members: int = 1,
                 *, fps: Optional[float] = None, oracle: Optional[Oracle] = None):
        reject_options(config, "Gymnasium", hide_score=False, episodic_life=False, noop_max=30, control_cost=True,
                       oracle="penalty")
        if config.hide_episode_end and config.hidden_end != "reset":
            raise ConfigError(f"{config.id}: a Gymnasium environment restarts a copy at its end: with "
                              f"env.hide_episode_end use env.hidden_end=reset")
        self._config, self._oracle, self._members = config, oracle, members
        limit = config.max_episode_steps or None

        def one():
            if isinstance(make_env, str):
                return gymnasium.make(make_env, max_episode_steps=limit)
            env = make_env()
            return gymnasium.wrappers.TimeLimit(env, limit) if limit else env

        copies = config.num_envs * members
        self.envs = SyncVectorEnv([one] * copies, autoreset_mode=AutoresetMode.SAME_STEP)
        probe = self.envs.envs[0]
        max_steps = limit or (probe.spec.max_episode_steps if probe.spec is not None else None)
        if not max_steps:
            raise ConfigError(f"{config.id}: the environment has no time limit; set env.max_episode_steps "
                              f"(clips, scoring and evaluation need episodes that end)")
        obs_space, action_space = self.envs.single_observation_space, self.envs.single_action_space
        if not isinstance(obs_space, gymnasium.spaces.Box):
            raise TypeError(f"{config.id}: observations must be a Box (an array), got {obs_space}")
        if isinstance(action_space, gymnasium.spaces.Discrete):
            space = Discrete(int(action_space.n))
        elif isinstance(action_space, gymnasium.spaces.Box):
            space = Box(float(np.min(action_space.low)), float(np.max(action_space.high)), tuple(action_space.shape))
        else:
            raise TypeError(f"{config.id}: actions must be Discrete or Box, got {action_space}")
        self._obs_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
        self.spec = EnvSpec(
            id=config.id,
            backend="gymnasium",
            num_envs=config.num_envs,
            observation_shape=tuple(obs_space.shape),
            observation_dtype=np.dtype(self._obs_dtype).name,
            action_space=space,
            fps=check_fps(fps or probe.metadata.get("render_fps") or 30.0),
            max_episode_steps=int(max_steps),
        )
        self._action_dtype = action_space.dtype
        self._last_obs: Optional[np.ndarray] = None  # None: the copies were never reset in this process
        self._reset_call, self._step_call = self._host_reset, self._host_step
        if members > 1:
            self._reset_call = shared_by_members(self._host_reset, members)
            self._step_call = shared_by_members(self._host_step, members)

    # ----------------------------------------------------------- on the host
    def _observations(self, obs) -> np.ndarray:
        return np.asarray(obs, self._obs_dtype)

    def _reset_copies(self, seed: int) -> np.ndarray:
        obs, _ = self.envs.reset(seed=seed)
        self._last_obs = self._observations(obs)
        return self._last_obs

    def _host_reset(self, handle, seed):
        """``(handle, obs)`` of every copy: ``reset(seed)`` inside compiled code."""
        copies = self.envs.num_envs
        shape = jax.ShapeDtypeStruct((copies, *self.spec.observation_shape), self._obs_dtype)

        def reset(handle, seed):
            return (np.asarray(handle + 1, np.int32), self._reset_copies(int(np.ravel(seed)[0])))

        return io_callback(reset, (jax.ShapeDtypeStruct((), jnp.int32), shape), handle, seed, ordered=True)

    def _step_copies(self, action: np.ndarray) -> HostStep:
        copies = self.envs.num_envs
        if self._last_obs is None:  # a run resumed in a new process: reset, the action ignored
            obs = self._reset_copies(self._config.seed)
            no = np.zeros((copies,), bool)
            return HostStep(obs, np.zeros((copies,), np.float32), no, no, obs, obs, np.ones((copies,), bool))
        before = self._last_obs
        obs, reward, terminated, truncated, info = self.envs.step(np.asarray(action, self._action_dtype))
        obs = self._observations(obs)
        final = obs.copy()
        for i in np.flatnonzero(info.get("_final_obs", np.zeros((copies,), bool))):
            final[i] = info["final_obs"][i]
        self._last_obs = obs
        return HostStep(obs, np.asarray(reward, np.float32), np.asarray(terminated, bool), np.asarray(truncated, bool),
                        final, before, np.zeros((copies,), bool))

    def _host_step(self, handle, action):
        copies = self.envs.num_envs
        obs = jax.ShapeDtypeStruct((copies, *self.spec.observation_shape), self._obs_dtype)
        flag = jax.ShapeDtypeStruct((copies,), bool)
        shapes = HostStep(obs, jax.ShapeDtypeStruct((copies,), jnp.float32), flag, flag, obs, obs, flag)

        def step(handle, action):
            return np.asarray(handle + 1, np.int32), self._step_copies(action)

        return io_callback(step, (jax.ShapeDtypeStruct((), jnp.int32), shapes), handle, action, ordered=True)

    # --------------------------------------------------------- on the device
    def _reset(self, key):
        seed = jax.random.randint(key, (), 0, 2**31 - 1, dtype=jnp.int32)
        handle, obs = self._reset_call(jnp.zeros((), jnp.int32), seed)
        n = self.num_envs
        return HostState(handle), first_timestep(obs, first_step_info(self._oracle, n))

    def _step(self, inner: HostState, action):
        handle, host = self._step_call(inner.handle, action)
        reward = oracle_reward(self._oracle, host.before, action, host.final_obs, host.reward)
        ends = end_rules(self._config, reward, host.terminated, host.truncated, jnp.zeros_like(host.terminated))
        paid = lambda x: jnp.where(host.ignored, 0.0, x)  # noqa: E731
        info = step_info(self._oracle, paid(ends.true_reward), ends.true_done, host.reward)
        timestep = TimeStep(host.obs, paid(ends.reward), ends.terminated, ends.truncated, host.final_obs,
                            host.ignored, info)
        return HostState(handle), timestep
