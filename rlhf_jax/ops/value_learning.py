"""Q-learning targets and the DQN loss (Mnih et al. 2015, Methods).

Shapes: ``[..., A]`` action values with any leading batch axes (``[B, A]`` in a
minibatch, ``[A]`` under ``vmap``); rewards, discounts and actions have the same
leading axes ``[...]``. As in :mod:`rlhf_jax.ops.returns`, ``discount`` is
``gamma * (1 - done)``, so a terminal transition's target is just its reward.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _check_target_inputs(reward, discount, *q_next) -> None:
    chex.assert_equal_shape([reward, discount])
    chex.assert_rank(q_next, jnp.ndim(reward) + 1)
    chex.assert_equal_shape(q_next)
    chex.assert_equal_shape_prefix([reward, *q_next], jnp.ndim(reward))


def q_learning_target(reward: chex.Array, discount: chex.Array, target_q_next: chex.Array) -> jax.Array:
    """The DQN target of Mnih et al. 2015 (Methods, loss L_i(theta_i)):

        y = r + gamma max_a' Q(s', a'; theta^-)

    with ``theta^-`` the periodically copied target network, and ``y = r`` when
    ``s'`` is terminal (``discount = 0``).

    Args:
      reward, discount: ``[...]``.
      target_q_next: ``[..., A]`` ``Q(s', .; theta^-)``.
    """
    _check_target_inputs(reward, discount, target_q_next)
    return reward + discount * jnp.max(target_q_next, axis=-1)


def double_q_learning_target(
    reward: chex.Array, discount: chex.Array, q_next_online: chex.Array, q_next_target: chex.Array
) -> jax.Array:
    """The Double DQN target (van Hasselt et al. 2016, eq. 4): the online network
    picks the action, the target network evaluates it,

        y = r + gamma Q(s', argmax_a' Q(s', a'; theta); theta^-).

    Args:
      reward, discount: ``[...]``.
      q_next_online, q_next_target: ``[..., A]``.
    """
    _check_target_inputs(reward, discount, q_next_online, q_next_target)
    best = jnp.argmax(q_next_online, axis=-1)
    q_best = jnp.take_along_axis(q_next_target, best[..., None], axis=-1)[..., 0]
    return reward + discount * q_best


def huber_loss(x: chex.Array, delta: float = 1.0) -> jax.Array:
    """Element-wise Huber loss (Huber 1964):

        L(x) = x^2 / 2                   if |x| <= delta
               delta (|x| - delta / 2)   otherwise.

    Its derivative is ``clip(x, -delta, delta)``; with ``delta = 1`` this is the
    error clipping of Mnih et al. 2015 (Methods: the error term
    ``r + gamma max Q(s', a'; theta^-) - Q(s, a; theta)`` clipped to [-1, 1]).
    """
    abs_x = jnp.abs(x)
    quadratic = jnp.minimum(abs_x, delta)
    return 0.5 * quadratic**2 + delta * (abs_x - quadratic)


def q_learning_loss(
    q_values: chex.Array, actions: chex.Array, targets: chex.Array, delta: float = 1.0
) -> jax.Array:
    """The DQN loss with error clipping (Mnih et al. 2015, Methods):

        L(theta) = mean_batch Huber(y - Q(s, a; theta)),

    with no gradient through the target ``y`` (it comes from the fixed
    ``theta^-``; ``stop_gradient`` makes that explicit whatever the caller passes).

    Args:
      q_values: ``[B, A]`` ``Q(s, .; theta)`` (any leading axes ``[...]``).
      actions: ``[B]`` integer actions taken.
      targets: ``[B]`` targets ``y`` from :func:`q_learning_target` or
        :func:`double_q_learning_target`.

    Returns:
      The scalar mean loss.
    """
    chex.assert_rank(q_values, jnp.ndim(actions) + 1)
    chex.assert_equal_shape([actions, targets])
    chex.assert_equal_shape_prefix([q_values, actions], jnp.ndim(actions))
    chex.assert_type(actions, int)
    q_taken = jnp.take_along_axis(q_values, actions[..., None], axis=-1)[..., 0]
    td_error = jax.lax.stop_gradient(targets) - q_taken
    return jnp.mean(huber_loss(td_error, delta))
