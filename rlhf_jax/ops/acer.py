"""The pieces of ACER (Wang et al. 2016, "Sample Efficient Actor-Critic with Experience
Replay", arXiv 1611.01224): Retrace targets, truncated importance sampling with bias
correction, the efficient trust region, and the stochastic dueling network.

Sequences are time-major ``[T, ...]`` and a discount carries the done mask,
``discount_t = gamma * (1 - done_t)``, as everywhere in :mod:`rlhf_jax.ops`.
Importance weights come in as logarithms, ``log rho = log pi(a|x) - log mu(a|x)``:
a Gaussian ratio overflows float32 long before its logarithm does, and every use
below (a minimum with a constant, ``[1 - c / rho]_+``, a power) is exact in log space.
Targets and weights are held fixed: the functions ``stop_gradient`` them.
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp


def retrace_targets(
    rewards: chex.Array,
    discounts: chex.Array,
    q_taken: chex.Array,
    values: chex.Array,
    traces: chex.Array,
    bootstrap_value: chex.Array,
) -> jax.Array:
    """Retrace targets Q_ret (Munos et al. 2016; Wang et al. 2016, eq. 5 and Algorithm 2),
    computed backwards from ``Q_ret = V(x_T)``: for t = T-1, ..., 0,

        Q_ret <- r_t + gamma_t Q_ret                      (the target of step t)
        Q_ret <- c_t (Q_ret - Q(x_t, a_t)) + V(x_t)       (carried to step t-1)

    With ``c_t = min(1, rho_t)`` this is Retrace; ACER's continuous variant truncates
    with ``c_t = min(1, rho_t)^(1/d)``, and ``c_t = 1`` gives its Q_opc target. A zero
    ``gamma_t`` (episode end) cuts the carry: the target is r_t alone.

    Args:
      rewards: ``[T, ...]`` r_t.
      discounts: ``[T, ...]`` ``gamma * (1 - done_t)``.
      q_taken: ``[T, ...]`` Q(x_t, a_t) of the actions taken.
      values: ``[T, ...]`` V(x_t) = E_{a ~ pi} Q(x_t, a).
      traces: ``[T, ...]`` c_t.
      bootstrap_value: ``[...]`` V(x_T), the state after the last step.

    Returns:
      ``[T, ...]`` Q_ret(x_t, a_t), without gradient.
    """
    chex.assert_rank(rewards, jnp.ndim(bootstrap_value) + 1)
    chex.assert_equal_shape([rewards, discounts, q_taken, values, traces])
    chex.assert_shape(bootstrap_value, rewards.shape[1:])

    def step(q_ret, inputs):
        reward, discount, q, value, trace = inputs
        target = reward + discount * q_ret
        return trace * (target - q) + value, target

    inputs = jax.lax.stop_gradient((rewards, discounts, q_taken, values, traces))
    _, targets = jax.lax.scan(step, jax.lax.stop_gradient(bootstrap_value), inputs, reverse=True)
    return targets


def retrace_traces(log_rho: chex.Array, action_dim: int = 1) -> jax.Array:
    """The traces c_t = min(1, rho_t)^(1/d) (Wang et al. 2016, section 5: d = 1 for
    discrete actions, the action dimension for continuous ones, which keeps the product
    of traces of a high-dimensional Gaussian from vanishing)."""
    return jnp.exp(jnp.minimum(0.0, jax.lax.stop_gradient(log_rho) / action_dim))


def truncated_is_policy_objective(
    log_pi_taken: chex.Array,
    log_rho_taken: chex.Array,
    advantage_taken: chex.Array,
    log_pi_other: chex.Array,
    log_rho_other: chex.Array,
    advantage_other: chex.Array,
    weight_other: chex.Array,
    c: float = 10.0,
) -> jax.Array:
    """Truncated importance sampling with bias correction (Wang et al. 2016, eq. 7), as a
    surrogate objective per state whose gradient is the ACER policy gradient:

        J_t = min(c, rho_t) A_t log pi(a_t|x_t)
              + sum_b w_b [1 - c / rho_t(b)]_+ A_t(b) log pi(b|x_t),

        grad J_t = min(c, rho_t) grad log pi(a_t|x_t) (Q_ret - V(x_t))
                   + E_{b ~ pi} [1 - c/rho_t(b)]_+ grad log pi(b|x_t) (Q(x_t, b) - V(x_t)).

    The first term is the importance-weighted gradient, its weight truncated at c;
    the second adds back, in expectation under pi and with the critic's estimate, what
    the truncation removed (it is active only where rho(b) > c). For discrete actions the
    expectation is exact: ``b`` ranges over every action with ``w_b = pi(b|x_t)``. For
    continuous ones it is a Monte Carlo estimate: ``b`` are actions sampled from pi with
    ``w_b = 1 / n``. Only the ``log_pi`` arguments carry gradient.

    Args:
      log_pi_taken: ``[...]`` log pi(a_t|x_t), with gradient.
      log_rho_taken: ``[...]`` log rho_t = log pi(a_t|x_t) - log mu(a_t|x_t).
      advantage_taken: ``[...]`` A_t, e.g. Q_ret - V(x_t) (Q_opc - V(x_t) for Gaussians).
      log_pi_other: ``[..., K]`` log pi(b|x_t), with gradient.
      log_rho_other: ``[..., K]`` log rho_t(b).
      advantage_other: ``[..., K]`` Q(x_t, b) - V(x_t).
      weight_other: ``[..., K]`` w_b.
      c: the truncation threshold (10 in the paper).

    Returns:
      ``[...]`` J_t, an objective to maximise.
    """
    chex.assert_equal_shape([log_pi_taken, log_rho_taken, advantage_taken])
    chex.assert_equal_shape([log_pi_other, log_rho_other, advantage_other, weight_other])
    chex.assert_rank(log_pi_other, jnp.ndim(log_pi_taken) + 1)
    sg = jax.lax.stop_gradient
    log_c = math.log(c)
    truncated = jnp.exp(jnp.minimum(log_c, sg(log_rho_taken)))  # min(c, rho_t)
    correction = jax.nn.relu(1.0 - jnp.exp(log_c - sg(log_rho_other)))  # [1 - c/rho(b)]_+
    taken = truncated * sg(advantage_taken) * log_pi_taken
    other = jnp.sum(sg(weight_other * correction * advantage_other) * log_pi_other, axis=-1)
    return taken + other


def trust_region_projection(g: chex.Array, k: chex.Array, delta: float = 1.0) -> jax.Array:
    """The efficient trust region (Wang et al. 2016, eq. 12 and 13): the step z closest to
    the gradient g whose first-order change of KL(pi_avg || pi) stays below delta,

        minimise ||g - z||^2 / 2  subject to  k . z <= delta,
        z* = g - max(0, (k . g - delta) / ||k||^2) k,

    where g and k = grad KL(pi_avg || pi) are gradients with respect to the policy's
    distribution statistics, one vector per state (the last axis). Where k . g <= delta
    z = g; otherwise k . z = delta exactly.

    Args:
      g: ``[..., S]`` the policy gradient per state.
      k: ``[..., S]`` the gradient of the KL divergence from the average policy.
      delta: the bound (1 in the paper).

    Returns:
      ``[..., S]`` z, without gradient.
    """
    chex.assert_equal_shape([g, k])
    g, k = jax.lax.stop_gradient((g, k))
    k_dot_g = jnp.sum(k * g, axis=-1, keepdims=True)
    k_norm2 = jnp.sum(k * k, axis=-1, keepdims=True)
    # k = 0 means k . g = 0 <= delta: no correction, and no 0/0 either.
    scale = jnp.maximum(0.0, k_dot_g - delta) / jnp.where(k_norm2 > 0.0, k_norm2, 1.0)
    return g - scale * k


def stochastic_dueling_q(value: chex.Array, advantage: chex.Array, sampled_advantages: chex.Array) -> jax.Array:
    """The stochastic dueling network's Q (Wang et al. 2016, eq. 14):

        Q~(x, a) = V(x) + A(x, a) - (1/n) sum_i A(x, u_i),   u_i ~ pi(.|x),

    an unbiased estimate of Q whose expectation under pi is V(x), so that both Q~ and V
    can learn from the targets of one trajectory.

    Args:
      value: ``[...]`` V(x).
      advantage: ``[...]`` A(x, a) for the action of interest.
      sampled_advantages: ``[..., n]`` A(x, u_i).

    Returns:
      ``[...]`` Q~(x, a).
    """
    chex.assert_equal_shape([value, advantage])
    chex.assert_rank(sampled_advantages, jnp.ndim(value) + 1)
    return value + advantage - jnp.mean(sampled_advantages, axis=-1)


def truncated_value_target(
    q_ret: chex.Array, q_taken: chex.Array, values: chex.Array, log_rho: chex.Array
) -> jax.Array:
    """The value target of ACER's continuous critic (Wang et al. 2016, eq. 15 and Algorithm 3):

        V_target(x_t) = min(1, rho_t) (Q_ret(x_t, a_t) - Q~(x_t, a_t)) + V(x_t).

    Returns ``[...]`` without gradient."""
    chex.assert_equal_shape([q_ret, q_taken, values, log_rho])
    weight = jnp.exp(jnp.minimum(0.0, log_rho))
    return jax.lax.stop_gradient(weight * (q_ret - q_taken) + values)

