"""Running moments of observations, and the standardised input the usual TRPO and PPO for
MuJoCo give their networks (OpenAI Baselines' ``RunningMeanStd`` and ``MlpPolicy``)."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class Moments(NamedTuple):
    """The per-coordinate mean and variance of every vector seen so far, and how many there were."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_moments(shape: tuple[int, ...]) -> Moments:
    """Nothing seen yet: mean 0, variance 1, and a count of 1e-4 (as Baselines starts it), so
    that the first batch's moments replace these almost entirely."""
    return Moments(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.asarray(1e-4, jnp.float32))


def merge_moments(moments: Moments, batch: jax.Array) -> Moments:
    """The moments of everything seen with ``batch`` ``[..., *shape]`` added, by the pairwise
    rule of Chan, Golub and LeVeque (1979), for ``a`` the moments so far and ``b`` the batch's:

        n = n_a + n_b,   delta = mean_b - mean_a,
        mean = mean_a + delta n_b / n,
        var = (var_a n_a + var_b n_b + delta^2 n_a n_b / n) / n.
    """
    chex.assert_equal_shape_suffix([batch, moments.mean], moments.mean.ndim)
    rows = batch.reshape((-1,) + moments.mean.shape).astype(jnp.float32)
    n_b = jnp.asarray(rows.shape[0], jnp.float32)
    mean_b, var_b = rows.mean(0), rows.var(0)
    n = moments.count + n_b
    delta = mean_b - moments.mean
    mean = moments.mean + delta * n_b / n
    var = (moments.var * moments.count + var_b * n_b + delta**2 * moments.count * n_b / n) / n
    return Moments(mean, var, n)


def standardize(moments: Moments, x: jax.Array, clip: float = 5.0, min_std: float = 0.1) -> jax.Array:
    """``clip((x - mean) / max(std, min_std), -clip, clip)``: Baselines' ``MlpPolicy`` input, whose
    floor on the standard deviation (0.1) keeps a coordinate that hardly varies from being blown up."""
    std = jnp.maximum(jnp.sqrt(moments.var), min_std)
    return jnp.clip((x - moments.mean) / std, -clip, clip)
