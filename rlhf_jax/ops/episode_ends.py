"""Episode ends: the one rule every agent applies to a ``TimeStep``'s typed ends.

A step ends the agent's episode in one of two ways (:mod:`rlhf_jax.envs.core`):

* **terminated**: the state reached is terminal, its value is 0, so the return is
  ``r_t``;
* **truncated**: the time limit cut an episode that could have gone on, so the return
  is ``r_t + gamma V(final_obs_t)``: the value of the observation the step reached, not
  of the next episode's first (a time-limit end treated as terminal would make the value
  depend on a clock the agent cannot see).

Both end the sum: nothing of the next episode flows back. Folding the time-limit
bootstrap into the reward keeps every return op of :mod:`rlhf_jax.ops` (n-step,
lambda, GAE, Retrace) as it is, with its convention that the discount carries the done
mask. On EnvPool a step after an end is a reset step (``action_ignored``): its action
did nothing, so it carries no loss.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def fold_time_limits(reward: chex.Array, terminated: chex.Array, truncated: chex.Array, final_value: chex.Array,
                     gamma: chex.Numeric) -> tuple[jax.Array, jax.Array]:
    """The reward and discount that make any return op bootstrap a time-limit end from ``V(final_obs)``:

        r'_t = r_t + gamma * truncated_t * V(final_obs_t)
        discount_t = gamma * (1 - done_t),   done_t = terminated_t or truncated_t

    so a one-step target ``r'_t + discount_t V(s_{t+1})`` is ``r_t`` at a terminal step,
    ``r_t + gamma V(final_obs_t)`` at a truncated one and ``r_t + gamma V(s_{t+1})`` elsewhere.

    Args:
      reward: ``[...]`` rewards ``r_t``.
      terminated, truncated: ``[...]`` booleans (``TimeStep.terminated`` / ``truncated``).
      final_value: ``[...]`` ``V(final_obs_t)``; read only where ``truncated``, so it may be
        anything elsewhere (a caller may skip the network's pass where nothing was truncated). Gradients are stopped: it is a target.
      gamma: the discount factor.

    Returns:
      ``(r', discount)``, both ``[...]`` in ``reward``'s dtype.
    """
    chex.assert_equal_shape([reward, terminated, truncated, final_value])
    truncated = truncated.astype(reward.dtype)
    done = (terminated | truncated.astype(bool)).astype(reward.dtype)
    # Where a copy was not truncated, final_value may be of anything (even NaN): select, do not multiply.
    bootstrap = jnp.where(truncated > 0, gamma * jax.lax.stop_gradient(final_value), 0.0)
    return reward + bootstrap.astype(reward.dtype), (gamma * (1.0 - done)).astype(reward.dtype)


def loss_mask(action_ignored: chex.Array) -> jax.Array:
    """``1 - action_ignored`` as float32: a reset step (EnvPool) carries no loss."""
    return 1.0 - action_ignored.astype(jnp.float32)


def masked_mean(x: chex.Array, mask: chex.Array) -> jax.Array:
    """``sum(x * mask) / sum(mask)`` (0 where the mask is all zeros): a loss's mean over the steps that carry one."""
    mask = jnp.broadcast_to(mask, x.shape)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
