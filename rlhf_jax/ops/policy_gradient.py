"""Policy-gradient and actor-critic losses (Mnih et al. 2016, A3C).

Losses are means over every element of their inputs, so batched ``[B]`` and
time-major ``[T, B]`` rollouts both work unchanged (A3C's Algorithm S3 sums the
gradients over its ``t_max`` steps instead; a mean only rescales the step size).
Advantages and returns are targets: the losses ``stop_gradient`` them.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.ops.distributions import categorical_log_prob
from rlhf_jax.ops.episode_ends import masked_mean


def policy_gradient_loss(logits: chex.Array, actions: chex.Array, advantages: chex.Array) -> jax.Array:
    """REINFORCE with a baseline, as a loss to minimise (Williams 1992; Mnih et al. 2016, section 4):

        L(theta) = -mean_t [ log pi(a_t|s_t; theta) A_t ],

    whose gradient is ``-mean grad log pi(a_t|s_t) A_t`` with the advantage held fixed.

    Args:
      logits: ``[..., A]`` logits (or normalised log-probabilities) of a softmax policy.
      actions: ``[...]`` integer actions taken.
      advantages: ``[...]`` advantage estimates, e.g. ``R_t - V(s_t)``.

    Returns:
      The scalar loss.
    """
    chex.assert_equal_shape([actions, advantages])
    log_pi_a = categorical_log_prob(logits, actions)
    return -jnp.mean(log_pi_a * jax.lax.stop_gradient(advantages))


def actor_critic_loss(
    log_pi_a: chex.Array,
    entropy: chex.Array,
    values: chex.Array,
    returns: chex.Array,
    *,
    entropy_coef: float = 0.01,
    value_coef: float = 0.5,
    advantages: chex.Array | None = None,
    mask: chex.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The advantage actor-critic loss of A3C (Mnih et al. 2016, Algorithm S3 and section 4),
    in the synchronous, shared-network form (A2C):

        L = -mean[log pi(a_t|s_t) A_t] - beta mean[H(pi(.|s_t))] + c_v mean[(R_t - V(s_t))^2 / 2],
        A_t = R_t - V(s_t)   (no gradient through A_t or R_t).

    Algorithm S3 applies two separate gradients, ``grad log pi(a_t|s_t) A_t`` (plus
    ``beta grad H``) to the policy parameters and ``d(R_t - V(s_t))^2 / d theta_v`` to
    the value parameters. With one network and one optimiser they become a single
    loss in which ``value_coef`` weighs the critic against the actor (``c_v = 2``
    reproduces the paper's unscaled ``(R - V)^2`` gradient; 0.5 is the usual A2C
    choice).

    Works for any policy distribution: pass log-probabilities and entropies from
    :func:`~rlhf_jax.ops.categorical_log_prob` and :func:`~rlhf_jax.ops.entropy`
    (discrete) or :func:`~rlhf_jax.ops.gaussian_log_prob` and
    :func:`~rlhf_jax.ops.gaussian_entropy` (continuous).

    Args:
      log_pi_a: ``[...]`` ``log pi(a_t|s_t)`` of the actions taken.
      entropy: ``[...]`` ``H(pi(.|s_t))``, or a scalar (e.g. a state-independent Gaussian).
      values: ``[...]`` ``V(s_t)``, with gradient.
      returns: ``[...]`` value targets ``R_t``, e.g. from :func:`~rlhf_jax.ops.n_step_returns`.
      entropy_coef: ``beta`` (0.01 on Atari in the paper).
      value_coef: ``c_v``.
      advantages: ``[...]`` optional advantages (e.g. GAE); default ``R_t - V(s_t)``.
      mask: ``[...]`` optional weights (:func:`~rlhf_jax.ops.loss_mask`): each mean becomes
        ``sum(x * mask) / sum(mask)``, so a masked step (EnvPool's reset step) carries no loss.

    Returns:
      ``(loss, parts)`` with ``parts = {"policy_loss", "value_loss", "entropy"}``, where
      ``value_loss = mean (R - V)^2 / 2`` before weighting and ``entropy`` is the mean entropy.
    """
    chex.assert_equal_shape([log_pi_a, values, returns])
    chex.assert_rank(entropy, {0, jnp.ndim(values)})
    returns = jax.lax.stop_gradient(returns)
    if advantages is None:
        advantages = returns - values
    chex.assert_equal_shape([advantages, values])
    advantages = jax.lax.stop_gradient(advantages)

    mask = jnp.ones_like(values) if mask is None else mask
    chex.assert_equal_shape([mask, values])
    policy_loss = -masked_mean(log_pi_a * advantages, mask)
    value_loss = 0.5 * masked_mean((returns - values) ** 2, mask)
    mean_entropy = masked_mean(jnp.broadcast_to(entropy, values.shape), mask)
    loss = policy_loss - entropy_coef * mean_entropy + value_coef * value_loss
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": mean_entropy}
