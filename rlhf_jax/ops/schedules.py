"""Schedules: functions of the step count, as optax uses them."""
from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import optax


def linear_schedule(start: float, end: float, steps: int) -> Callable[[chex.Numeric], jax.Array]:
    """Linear annealing from ``start`` to ``end`` over ``steps``, then held at ``end``:

        value(n) = start + (end - start) min(max(n / steps, 0), 1).

    E.g. DQN's exploration rate, annealed from 1.0 to 0.1 over the first million
    frames and fixed at 0.1 thereafter (Mnih et al. 2015, Methods):
    ``epsilon = linear_schedule(1.0, 0.1, 1_000_000)``.

    Why not ``optax.linear_schedule``: it computes ``(start - end) (1 - n / steps) + end``,
    which differs from this in the last bit of float32 on most steps (on 1.0 -> 0.1 over a
    million steps, at 17,325 of 25,083 step counts compared, int32 or float32 alike), so
    switching would change every run's exploration and ACER's learning rate, and runs
    recorded before would no longer replay bit for bit.

    Args:
      start: the value at step 0.
      end: the value from ``steps`` on.
      steps: the length of the transition, > 0.

    Returns:
      ``schedule(count)`` for a Python or JAX (traced, integer or float) step count,
      returning a float32 scalar, or an array of ``count``'s shape.
    """
    if steps <= 0:
        raise ValueError(f"linear_schedule needs steps > 0, got {steps}")

    def schedule(count: chex.Numeric) -> jax.Array:
        fraction = jnp.clip(jnp.asarray(count, jnp.float32) / steps, 0.0, 1.0)
        return start + (end - start) * fraction

    return schedule


def learning_rate_in_state(
    make_optimizer: Callable[[chex.Numeric], optax.GradientTransformation], learning_rate: float
) -> optax.GradientTransformation:
    """``make_optimizer(learning_rate)`` with the rate kept in the optimiser's state
    (``optax.inject_hyperparams``), not baked into the compiled update.

    Runs that differ only in their learning rate then share one program: ``rlhf-jax sweep``
    vmaps them, each state holding its own ``opt_state.hyperparams["learning_rate"]``.
    """
    return optax.inject_hyperparams(lambda learning_rate: make_optimizer(learning_rate))(learning_rate=learning_rate)
