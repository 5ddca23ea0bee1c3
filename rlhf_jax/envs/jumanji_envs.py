"""Jumanji environments: any ``jumanji.Environment``, vmapped over ``num_envs`` copies.

Jumanji's interface is two pure functions of one copy:

    reset(key) -> (state, timestep)          step(state, action) -> (state, timestep)

with dm_env's timestep (``step_type`` FIRST, MID or LAST; ``reward``; ``discount``, 0 at a terminal
state; ``observation``; ``extras``), structured observations (Snake's ``grid``, ``step_count`` and
``action_mask``, a NamedTuple) and ``action_spec`` / ``observation_spec`` of ``jumanji.specs``.

:class:`JumanjiEnv` maps

* ``reset`` of ``num_envs`` copies, each from its own key, to ``reset``;
* ``step`` to the step: ``terminated`` is a LAST step with discount 0, ``truncated`` a LAST step
  with a non-zero discount (Jumanji's own time limit, its ``truncation``) or this adapter's time
  limit; the oracle's reward is the step's ``reward`` or ``oracle(obs, action, next_obs, reward)``;
* the observation to one float32 array: an array keeps its shape; a pytree of arrays (Jumanji's
  NamedTuples) is flattened, each leaf ravelled in the pytree's order (``jax.tree.leaves``: the
  fields' order) and concatenated, booleans as 0 and 1. ``observe`` picks or transforms the
  observation of one copy first;
* the action spec to an action space: ``DiscreteArray`` to ``Discrete(num_values)``;
  ``MultiDiscreteArray`` to one ``Discrete`` of every combination, the integer being the row-major
  index of the action array (``numpy.ravel_multi_index``); a floating ``BoundedArray`` to a ``Box``
  (clipped into its bounds); any other spec is refused, naming it;
* the ends, under the episode-end options, as :func:`rlhf_jax.envs.auto_reset.end_rules` says; a
  copy whose episode ends restarts within the step from a fresh ``reset`` (a new key each time),
  ``final_obs`` the observation it reached.

Give it the *unwrapped* environment: Jumanji's ``AutoResetWrapper`` and ``VmapWrapper`` do what
this adapter does, their own way. ``extras`` are not carried. Jumanji defines nothing after a LAST
step, so ``hide_episode_end`` works with ``hidden_end="reset"`` only. The reward must be one number
a step (a multi-agent environment's per-agent rewards are refused: sum or pick them in a wrapper).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.envs.auto_reset import (Oracle, check_fps, end_rules, first_step_info, oracle_reward,
                                     restart_ended, step_info)
from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options
from rlhf_jax.errors import ConfigError
from rlhf_jax.extras import require

# The most combinations a MultiDiscreteArray may have: one categorical over all of them.
MAX_COMBINED_ACTIONS = 65_536


class JumanjiInner(NamedTuple):
    state: Any  # the copies' Jumanji state, [N] leading axis
    obs: jax.Array  # [N, *obs]: their current observation, flattened (what an oracle reads as obs)
    steps: jax.Array  # int32 [N]: steps into the agent's episode
    key: jax.Array
    failed: jax.Array  # always False: a failed copy restarts (hidden_end="reset" only)


class JumanjiEnv(Environment):
    """A Jumanji environment (an object, or a Jumanji id such as ``"Snake-v1"``) as an
    :class:`~rlhf_jax.envs.core.Environment` of ``config.num_envs`` copies (the mapping is in the
    module docstring).

    ``max_episode_steps``: this adapter's time limit, unless ``env.max_episode_steps`` in the config
    sets one; without either, the environment's own ``time_limit`` (Snake's, Maze's); one without a
    time limit (Game2048) needs one. ``fps``: frames per second of real time, which sizes the 1.5 s
    segments (Jumanji has no clock: 10, 15 steps). ``observe``: a JAX function of one copy's
    observation that returns the array or pytree of arrays the agent sees (default: all of it).
    ``oracle``: as :class:`~rlhf_jax.envs.GymnaxEnv`'s, of the flattened observations and the
    action as the agent gives it.
    """

    def __init__(self, env: Union[str, Any], config: EnvConfig, *, max_episode_steps: Optional[int] = None,
                 fps: float = 10.0, observe: Optional[Callable[[Any], Any]] = None, oracle: Optional[Oracle] = None):
        require("JumanjiEnv", "jumanji", "jumanji")
        import jumanji
        from jumanji import specs
        from jumanji.types import StepType

        reject_options(config, "Jumanji", hide_score=False, episodic_life=False, noop_max=30, control_cost=True,
                       oracle="penalty")
        if config.hide_episode_end and config.hidden_end != "reset":
            raise ConfigError(f"{config.id}: a Jumanji environment defines nothing after its last step: with "
                              f"env.hide_episode_end use env.hidden_end=reset")
        env = jumanji.make(env) if isinstance(env, str) else env
        self._env, self._config, self._oracle = env, config, oracle
        self._observe = observe if observe is not None else (lambda observation: observation)
        self._last = int(StepType.LAST)

        action_spec = self._action_spec = env.action_spec
        self._combined = None
        if isinstance(action_spec, specs.DiscreteArray):
            action_space = Discrete(int(action_spec.num_values))
        elif isinstance(action_spec, specs.MultiDiscreteArray):
            self._combined = tuple(int(n) for n in np.ravel(action_spec.num_values))
            if math.prod(self._combined) > MAX_COMBINED_ACTIONS:
                raise TypeError(f"{config.id}: a MultiDiscreteArray of {list(self._combined)} values is "
                                f"{math.prod(self._combined)} combined actions, more than {MAX_COMBINED_ACTIONS}")
            action_space = Discrete(math.prod(self._combined))
        elif isinstance(action_spec, specs.BoundedArray) and jnp.issubdtype(action_spec.dtype, jnp.floating):
            action_space = Box(float(np.min(action_spec.minimum)), float(np.max(action_spec.maximum)),
                               tuple(action_spec.shape))
        else:
            raise TypeError(f"{config.id}: Jumanji's {type(action_spec).__name__} action spec is not supported "
                            f"(DiscreteArray, MultiDiscreteArray and a floating BoundedArray are)")

        state, first = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        obs = jax.eval_shape(self._flat, first.observation)
        action = jax.ShapeDtypeStruct(action_space.shape, jnp.float32 if isinstance(action_space, Box) else jnp.int32)
        _, after = jax.eval_shape(lambda s, a: env.step(s, self._env_action(a)), state, action)
        if after.reward.shape != ():
            raise TypeError(f"{config.id}: the reward must be one number a step; this env's has shape "
                            f"{tuple(after.reward.shape)} (per agent: sum or pick them in a wrapper of yours)")

        own = getattr(env, "time_limit", None)
        own = int(own) if isinstance(own, (int, np.integer)) and own > 0 else None
        self._limit = int(config.max_episode_steps or max_episode_steps or own or 0)
        if self._limit <= 0:
            raise ConfigError(f"{config.id}: the environment has no time limit; give max_episode_steps or set "
                              f"env.max_episode_steps (clips, scoring and evaluation need episodes that end)")
        self.spec = EnvSpec(
            id=config.id,
            backend="jumanji",
            num_envs=config.num_envs,
            observation_shape=tuple(obs.shape),
            observation_dtype="float32",
            action_space=action_space,
            fps=check_fps(fps),
            max_episode_steps=min(self._limit, own) if own else self._limit,
        )

    def _flat(self, observation) -> jax.Array:
        """One copy's observation as one float32 array (the module docstring says how)."""
        seen = self._observe(observation)
        if isinstance(seen, (jax.Array, np.ndarray)):
            return jnp.asarray(seen, jnp.float32)
        leaves = jax.tree.leaves(seen)
        if not leaves:
            raise TypeError(f"{self._config.id}: the observation holds no arrays: {seen!r}")
        return jnp.concatenate([jnp.ravel(jnp.asarray(leaf, jnp.float32)) for leaf in leaves])

    def _env_action(self, action: jax.Array) -> jax.Array:
        """One copy's action as the environment takes it."""
        spec = self._action_spec
        if self._combined is not None:
            parts = jnp.unravel_index(action, self._combined)
            return jnp.stack(parts).reshape(spec.shape).astype(spec.dtype)
        if jnp.issubdtype(spec.dtype, jnp.floating):
            return jnp.clip(action, spec.minimum, spec.maximum).astype(spec.dtype)
        return action.astype(spec.dtype)

    def _fresh(self, key, like=None):
        """``num_envs`` fresh copies and their observations; with ``like``, in its dtypes."""
        state, timestep = jax.vmap(self._env.reset)(jax.random.split(key, self.num_envs))
        fresh = (state, jax.vmap(self._flat)(timestep.observation))
        return fresh if like is None else jax.tree.map(lambda x, y: x.astype(y.dtype), fresh, like)

    def _reset(self, key):
        key, reset_key = jax.random.split(key)
        state, obs = self._fresh(reset_key)
        n = self.num_envs
        inner = JumanjiInner(state, obs, jnp.zeros((n,), jnp.int32), key, jnp.zeros((n,), bool))
        return inner, first_timestep(obs, first_step_info(self._oracle, n))

    def _step(self, inner: JumanjiInner, action):
        state, timestep = jax.vmap(self._env.step)(inner.state, jax.vmap(self._env_action)(action))
        obs = jax.vmap(self._flat)(timestep.observation)
        env_reward = timestep.reward.astype(jnp.float32)
        last = timestep.step_type == self._last
        terminated = last & (timestep.discount == 0)
        steps = inner.steps + 1
        truncated = (last & ~terminated) | (steps >= self._limit)
        reward = oracle_reward(self._oracle, inner.obs, action, obs, env_reward)
        ends = end_rules(self._config, reward, terminated, truncated, inner.failed)

        (state, next_obs), key = restart_ended(ends.restart, inner.key, self._fresh, (state, obs))
        inner = JumanjiInner(state, next_obs, jnp.where(ends.restart, 0, steps), key, ends.failed & ~ends.restart)
        info = step_info(self._oracle, ends.true_reward, ends.true_done, env_reward)
        ignored = jnp.zeros_like(terminated)
        return inner, TimeStep(next_obs, ends.reward, ends.terminated, ends.truncated, obs, ignored, info)
