"""Multi-step return targets computed backwards through a rollout.

Conventions shared by every function here:

* **Time-major.** Sequences have time as their leading axis, ``[T, ...]``; the
  trailing axes (e.g. a batch of environments ``[T, B]``) are carried along
  element-wise. ``rewards[t]``, ``discounts[t]`` and ``values[t]`` all belong to
  the transition ``s_t --a_t--> s_{t+1}``; ``bootstrap_value`` is ``V(s_T)``, the
  value of the state after the last transition, with shape ``[...]``.
* **The discount carries the done mask.** ``discounts[t] = gamma * (1 - done_t)``,
  where ``done_t`` says that the episode ended with transition ``t`` (so
  ``s_{t+1}`` is terminal, or already the first state of the next episode under
  automatic reset). A zero discount cuts every sum at the episode boundary, and a
  per-step ``gamma`` needs no separate argument. A time-limit end that should be
  bootstrapped through cannot be expressed by a discount alone (it needs the value
  of the last state of the old episode): :func:`rlhf_jax.ops.fold_time_limits` folds
  it into the reward before calling here.

None of these functions stops gradients: the results are targets, and the losses
in :mod:`rlhf_jax.ops` apply ``jax.lax.stop_gradient`` to them.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _check_sequence(rewards, discounts, bootstrap_value, values=None) -> None:
    chex.assert_rank(rewards, jnp.ndim(bootstrap_value) + 1)  # [T, ...] against [...]
    chex.assert_equal_shape([rewards, discounts])
    chex.assert_shape(bootstrap_value, rewards.shape[1:])
    if values is not None:
        chex.assert_equal_shape([rewards, values])


def _next_values(values: jax.Array, bootstrap_value: jax.Array) -> jax.Array:
    """``V(s_{t+1})`` for t = 0..T-1: values shifted one step, bootstrap appended."""
    return jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)


def n_step_returns(rewards: chex.Array, discounts: chex.Array, bootstrap_value: chex.Array) -> jax.Array:
    """Forward-view n-step returns of A3C (Mnih et al. 2016, Algorithm S3).

    ``R = V(s_T)``, then for ``t = T-1, ..., 0``: ``R_t = r_t + gamma_t R_{t+1}``, i.e.

        R_t = sum_{i=0}^{k-1} gamma^i r_{t+i} + gamma^k V(s_{t+k}),   k = T - t,

    so the first step of a rollout gets a T-step return and the last a one-step
    return, as in the paper; a zero ``gamma_t`` (episode end) restarts the sum.

    Args:
      rewards: ``[T, ...]`` rewards ``r_t``.
      discounts: ``[T, ...]`` ``gamma * (1 - done_t)``.
      bootstrap_value: ``[...]`` ``V(s_T)``.

    Returns:
      ``[T, ...]`` returns ``R_t``.
    """
    _check_sequence(rewards, discounts, bootstrap_value)

    def step(next_return, inputs):
        reward, discount = inputs
        ret = reward + discount * next_return
        return ret, ret

    _, returns = jax.lax.scan(step, bootstrap_value, (rewards, discounts), reverse=True)
    return returns


def lambda_returns(
    rewards: chex.Array,
    discounts: chex.Array,
    values: chex.Array,
    bootstrap_value: chex.Array,
    lambda_: chex.Numeric,
) -> jax.Array:
    """TD(lambda) returns (Sutton & Barto 2018, eq. 12.18, recursive form).

        G_t = r_t + gamma_t [(1 - lambda) V(s_{t+1}) + lambda G_{t+1}],   G_T = V(s_T).

    ``lambda_ = 0`` gives the one-step targets ``r_t + gamma_t V(s_{t+1})``;
    ``lambda_ = 1`` gives :func:`n_step_returns` (Monte Carlo returns when the
    rollout ends in a terminal state).

    Args:
      rewards, discounts: ``[T, ...]`` as in :func:`n_step_returns`.
      values: ``[T, ...]`` ``V(s_t)``.
      bootstrap_value: ``[...]`` ``V(s_T)``.
      lambda_: a scalar, or an array broadcastable to ``[T, ...]``.

    Returns:
      ``[T, ...]`` returns ``G_t``.
    """
    _check_sequence(rewards, discounts, bootstrap_value, values)
    lambdas = jnp.broadcast_to(jnp.asarray(lambda_, rewards.dtype), rewards.shape)
    next_values = _next_values(values, bootstrap_value)

    def step(next_return, inputs):
        reward, discount, next_value, lam = inputs
        ret = reward + discount * ((1.0 - lam) * next_value + lam * next_return)
        return ret, ret

    _, returns = jax.lax.scan(
        step, bootstrap_value, (rewards, discounts, next_values, lambdas), reverse=True
    )
    return returns


def gae_advantages(
    rewards: chex.Array,
    discounts: chex.Array,
    values: chex.Array,
    bootstrap_value: chex.Array,
    lambda_: chex.Numeric,
) -> jax.Array:
    """Generalised advantage estimates (Schulman et al. 2016, "GAE", eqs. 11 and 16).

        delta_t = r_t + gamma_t V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma_t lambda A_{t+1},   A_T = 0,

    i.e. ``A_t = sum_l (gamma lambda)^l delta_{t+l}``, cut at episode ends by the
    discount. ``A_t = G^lambda_t - V(s_t)`` with ``G^lambda`` from
    :func:`lambda_returns`, so the matching value targets are ``A_t + V(s_t)``.

    Args: as :func:`lambda_returns`.

    Returns:
      ``[T, ...]`` advantages ``A_t``.
    """
    return lambda_returns(rewards, discounts, values, bootstrap_value, lambda_) - values
