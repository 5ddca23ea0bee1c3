"""Epsilon-greedy action selection (Mnih et al. 2015, Methods and Algorithm 1)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def epsilon_greedy(key: chex.PRNGKey, q_values: chex.Array, epsilon: chex.Numeric) -> jax.Array:
    """Pick ``argmax_a Q(s, a)`` with probability ``1 - epsilon`` and a uniformly
    random action with probability ``epsilon`` (Mnih et al. 2015, Algorithm 1:
    "with probability epsilon select a random action a_t, otherwise select
    a_t = argmax_a Q(phi(s_t), a; theta)"). The random action may be the greedy one,
    so the greedy action's total probability is ``1 - epsilon + epsilon / A``.

    Args:
      key: a PRNG key.
      q_values: ``[..., A]`` action values (``[B, A]`` for a batch of environments).
      epsilon: a scalar, or ``[...]`` for one rate per environment (as A3C's actors).

    Returns:
      ``[...]`` int32 actions.
    """
    chex.assert_axis_dimension_gt(q_values, -1, 0)  # at least the action axis
    batch_shape, num_actions = q_values.shape[:-1], q_values.shape[-1]
    explore_key, action_key = jax.random.split(key)
    explore = jax.random.uniform(explore_key, batch_shape) < epsilon
    random_actions = jax.random.randint(action_key, batch_shape, 0, num_actions, dtype=jnp.int32)
    greedy_actions = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
    return jnp.where(explore, random_actions, greedy_actions)
