"""The likelihood of a preference under the reward model (Christiano et al. 2017, section 2.2.3).

A segment's predicted return is the sum of r̂ over its steps; everything here works on
those sums, element-wise over any batch shape. Probabilities are computed in log space
(``log_sigmoid``, ``logaddexp``), so returns far apart give exact 0/1 limits and finite
gradients instead of ``log(0)``.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def preference_probability(
    return_1: chex.Array, return_2: chex.Array, random_answer_prob: float = 0.1
) -> jax.Array:
    """P̂[σ¹ ≻ σ²] of equation 1, with a chance ``eps`` of a uniformly random answer:

        P̂ = (1 - eps) exp R¹ / (exp R¹ + exp R²) + eps / 2
          = (1 - eps) sigmoid(R¹ - R²) + eps / 2,

    where ``R^i = sum_t r̂(o^i_t, a^i_t)``. The noise term keeps the probability inside
    ``[eps/2, 1 - eps/2]``: "human raters have a constant probability of making an
    error, which doesn't decay to 0 as the difference in reward becomes extreme".
    ``sigmoid`` of the difference never forms ``exp R`` itself, so large returns
    cannot overflow.
    """
    chex.assert_equal_shape([return_1, return_2])
    return (1.0 - random_answer_prob) * jax.nn.sigmoid(return_1 - return_2) + 0.5 * random_answer_prob


def _log_noisy_sigmoid(x: jax.Array, random_answer_prob: float) -> jax.Array:
    """``log((1 - eps) sigmoid(x) + eps / 2)`` as a log-sum of the two mixture terms."""
    eps = jnp.asarray(random_answer_prob, jnp.float32)
    # log(0) = -inf is the right mixture weight when eps is 0 (or 1): logaddexp then
    # returns the other term, and its gradient stays finite.
    return jnp.logaddexp(jnp.log1p(-eps) + jax.nn.log_sigmoid(x), jnp.log(0.5 * eps))


def preference_loss(
    return_1: chex.Array, return_2: chex.Array, mu: chex.Array, random_answer_prob: float = 0.1
) -> jax.Array:
    """The cross-entropy loss of one label (section 2.2.3), per pair:

        loss = -( mu log P̂[σ¹ ≻ σ²] + (1 - mu) log P̂[σ² ≻ σ¹] ),

    with ``mu`` the label's probability that σ¹ is preferred: 1 or 0 for a choice, 0.5
    for a tie ("equally preferable": the loss is then the mean of both logs).

    Returns:
      the loss, of the common shape of the arguments.
    """
    chex.assert_equal_shape([return_1, return_2, mu])
    difference = return_1 - return_2
    log_p1 = _log_noisy_sigmoid(difference, random_answer_prob)
    log_p2 = _log_noisy_sigmoid(-difference, random_answer_prob)
    return -(mu * log_p1 + (1.0 - mu) * log_p2)


def target_loss(
    return_1: chex.Array, return_2: chex.Array, oracle_return_1: chex.Array, oracle_return_2: chex.Array
) -> jax.Array:
    """The "target" ablation (section 3.3): fit r̂ to the oracle's true total reward of
    each segment by mean squared error instead of learning from comparisons,

        loss = ((R¹ - R¹_oracle)² + (R² - R²_oracle)²) / 2,

    per pair (the mean over its two segments), so that it averages like
    :func:`preference_loss`.
    """
    chex.assert_equal_shape([return_1, return_2, oracle_return_1, oracle_return_2])
    return 0.5 * (jnp.square(return_1 - oracle_return_1) + jnp.square(return_2 - oracle_return_2))
