"""Scoring a policy on the true reward: the mean return of whole, unmodified episodes."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import Environment


def evaluate(act, params, env: Environment, key, max_steps: int) -> dict:
    """Run ``act(params, obs, key)`` for up to ``max_steps`` steps and score each copy's first episode.

    Only the first true episode of each copy counts: counting every finished episode
    in a fixed window would favour short (often bad) episodes. Returns the sum and
    count of first-episode returns (copies still running at ``max_steps`` do not count).
    """

    def step(carry, key):
        env_state, obs, scored, total = carry
        env_state, timestep = env.step(env_state, act(params, obs, key))
        first = timestep.info["true_done"] & ~scored
        total = total + jnp.where(first, timestep.info["episode_return"], 0.0)
        return (env_state, timestep.obs, scored | timestep.info["true_done"], total), None

    reset_key, key = jax.random.split(key)
    env_state, timestep = env.reset(reset_key)
    none = jnp.zeros((env.num_envs,), bool)
    carry = (env_state, timestep.obs, none, jnp.zeros((env.num_envs,)))
    (_, _, scored, total), _ = jax.lax.scan(step, carry, jax.random.split(key, max_steps))
    return {"episodes": scored.sum(), "episode_return_sum": total.sum()}
