"""Scoring a policy on the true reward: the mean return of whole, unmodified episodes, and
recording some of those episodes to watch (:func:`record_episodes`).

Both play the same way (:func:`play`): with the same key and environment, the episodes
recorded are the episodes scored.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax.agents.base import RewardFn, rollout_rewards
from rlhf_jax.envs.core import Environment, TimeStep


class LearnedReward(NamedTuple):
    """A run's learned reward, r̂ = ``fn(params, obs, action, timestep)`` (see :mod:`rlhf_jax.agents.base`)."""

    fn: RewardFn
    params: Any


class EpisodeRecording(NamedTuple):
    """The first ``max_steps`` steps of ``n`` environment copies, time-major ``[T, n]``.

    Copy ``k``'s first true episode is its steps ``t < length[k]``."""

    obs: jax.Array  # [T, n, *observation_shape]: o_t, the observation the action was chosen on
    true_reward: jax.Array  # [T, n]: the unmodified environment's reward for step t
    true_return: jax.Array  # [T, n]: the true episode's return so far, step t's reward included
    learned_reward: jax.Array | None  # [T, n]: r̂ of step t; None without a learned reward
    length: jax.Array  # [n]: steps of the first true episode (max_steps where it had not ended)


def play(act, params, env: Environment, key, max_steps: int, observe: Callable[[jax.Array, jax.Array, TimeStep], Any]):
    """Run ``act(params, obs, key)`` on every copy of ``env`` for ``max_steps`` steps from a reset.

    Returns ``observe(obs, action, timestep)`` of every step, stacked time-major.
    """

    def step(carry, key):
        env_state, obs = carry
        action = act(params, obs, key)
        env_state, timestep = env.step(env_state, action)
        return (env_state, timestep.obs), observe(obs, action, timestep)

    reset_key, key = jax.random.split(key)
    env_state, timestep = env.reset(reset_key)
    _, observed = jax.lax.scan(step, (env_state, timestep.obs), jax.random.split(key, max_steps))
    return observed


def first_episode_ends(true_done: jax.Array) -> jax.Array:
    """``[T, N]`` -> where each copy's first true episode ends (at most one True per copy)."""
    return true_done & (jnp.cumsum(true_done, axis=0) == 1)


class Score(NamedTuple):
    """What :func:`evaluate` measured: the count and the summed true return of the copies'
    first episodes that ended in time (device scalars, so that ``evaluate`` can be jitted)."""

    episodes: jax.Array
    return_sum: jax.Array

    def mean_return(self) -> float:
        """The mean first-episode return on the host; NaN where no episode ended in time."""
        episodes = int(self.episodes)
        return float(self.return_sum) / episodes if episodes else math.nan


def evaluate(act, params, env: Environment, key, max_steps: int) -> Score:
    """Run ``act(params, obs, key)`` for up to ``max_steps`` steps and score each copy's first episode.

    Only the first true episode of each copy counts: counting every finished episode
    in a fixed window would favour short (often bad) episodes. Copies still running at
    ``max_steps`` do not count.
    """
    true_done, episode_return = play(act, params, env, key, max_steps,
                                     lambda obs, action, t: (t.info["true_done"], t.info["episode_return"]))
    first = first_episode_ends(true_done)
    return Score(episodes=first.sum(), return_sum=jnp.where(first, episode_return, 0.0).sum())


def record_episodes(act, params, env: Environment, key, max_steps: int, copies: int,
                    reward_fn: RewardFn | None = None, reward_params=None) -> EpisodeRecording:
    """The first ``copies`` copies' steps of the play :func:`evaluate` scores with the same
    arguments, with r̂ = ``reward_fn(reward_params, ...)`` of each step where a learned reward is given."""
    keep = lambda x: x[:copies]

    def observe(obs, action, timestep):
        # the action as sampled, as the agents hand it to r̂ (which clips it or not: its config)
        return keep(obs), keep(action), jax.tree.map(keep, timestep)

    obs, action, timestep = play(act, params, env, key, max_steps, observe)
    true_done = timestep.info["true_done"]
    ended = true_done.any(axis=0)
    length = jnp.where(ended, jnp.argmax(true_done, axis=0) + 1, max_steps)
    learned_reward = None if reward_fn is None else rollout_rewards(reward_fn, reward_params, obs, action, timestep)
    return EpisodeRecording(obs, timestep.info["true_reward"], timestep.info["episode_return"], learned_reward, length)
