"""Log-probabilities and entropies of the policies' action distributions.

Discrete policies are softmax distributions given by logits ``[..., A]``
(normalised log-probabilities work too: ``log_softmax`` leaves them unchanged).
Continuous policies are diagonal Gaussians given by a mean and a log standard
deviation ``[..., D]``; their log-probability and entropy sum over the ``D``
action dimensions.
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

_LOG_2PI = math.log(2.0 * math.pi)


def categorical_log_prob(logits: chex.Array, actions: chex.Array) -> jax.Array:
    """``log pi(a|s) = logits_a - log sum_b exp(logits_b)`` for the actions taken.

    Args:
      logits: ``[..., A]``.
      actions: ``[...]`` integer actions.

    Returns:
      ``[...]`` log-probabilities.
    """
    chex.assert_rank(logits, jnp.ndim(actions) + 1)
    chex.assert_equal_shape_prefix([logits, actions], jnp.ndim(actions))
    chex.assert_type(actions, int)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, actions[..., None], axis=-1)[..., 0]


def entropy(logits: chex.Array) -> jax.Array:
    """Entropy of a softmax policy, ``H(pi(.|s)) = -sum_a pi(a|s) log pi(a|s)``
    (the regulariser of Mnih et al. 2016, section 4, after Williams & Peng 1991).

    Args:
      logits: ``[..., A]``, finite.

    Returns:
      ``[...]`` entropies in nats.
    """
    chex.assert_axis_dimension_gt(logits, -1, 0)  # at least the action axis
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def gaussian_log_prob(mean: chex.Array, log_std: chex.Array, action: chex.Array) -> jax.Array:
    """Log-density of a diagonal Gaussian policy, summed over action dimensions:

        log pi(a|s) = sum_d [ -(a_d - mu_d)^2 / (2 sigma_d^2) - log sigma_d - log(2 pi) / 2 ].

    Args:
      mean: ``[..., D]``.
      log_std: ``log sigma``, broadcastable to ``mean`` (e.g. a state-independent ``[D]``).
      action: ``[..., D]``.

    Returns:
      ``[...]`` log-densities.
    """
    chex.assert_equal_shape([mean, action])
    chex.assert_equal_shape_suffix([mean, log_std], 1)
    z = (action - mean) * jnp.exp(-log_std)
    per_dim = -0.5 * z**2 - log_std - 0.5 * _LOG_2PI
    return jnp.sum(per_dim, axis=-1)


def gaussian_entropy(log_std: chex.Array) -> jax.Array:
    """Differential entropy of a diagonal Gaussian, summed over action dimensions:

        H = sum_d [ log sigma_d + (log(2 pi) + 1) / 2 ] = sum_d (log(2 pi e sigma_d^2)) / 2

    (the continuous-action entropy cost of Mnih et al. 2016, Supplementary section 9).
    It depends on ``sigma`` only, not on the mean.

    Args:
      log_std: ``[..., D]``.

    Returns:
      ``[...]`` entropies in nats.
    """
    chex.assert_axis_dimension_gt(log_std, -1, 0)  # at least the action axis
    return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)
