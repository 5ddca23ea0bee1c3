"""A synthetic annotator for IBT: the stand-in for people marking moments of progress and
regress while they watch an episode (the IBT paper, appendix A.1).

It watches a *progress signal*: the increment ``d_t`` of the transition ``x_t -> x_{t+1}`` is

* ``signal="reward"``: the true (oracle's) reward ``r_t``, i.e. the rise of the return so far;
* ``signal="potential"``: ``phi(x_{t+1}) - phi(x_t)`` for a shaped potential ``phi`` of the
  observation, built in for the classic-control tasks below (:data:`POTENTIALS`).

and marks the frame the transition arrives at, ``t + 1`` (see :mod:`rlhf_jax.reward.ibt` for
why the mark goes on the later frame): +1 where ``d_t > threshold``, -1 where
``d_t < -threshold``. Like a person it marks only some moments, each event kept with
probability ``fraction``, and it can err: a kept mark has its sign flipped with
probability ``noise``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.config import AnnotatorConfig


def _cartpole(obs):
    """Upright and centred: 0 at the centre with the pole vertical, -2 at the failure limits."""
    return -jnp.abs(obs[..., 2]) / 0.2095 - jnp.abs(obs[..., 0]) / 2.4


def _acrobot(obs):
    """Height of the tip above the pivot, -cos(t1) - cos(t1 + t2), from (cos, sin) of each angle."""
    cos_1, sin_1, cos_2, sin_2 = obs[..., 0], obs[..., 1], obs[..., 2], obs[..., 3]
    return -cos_1 - (cos_1 * cos_2 - sin_1 * sin_2)


def _mountain_car(obs):
    """Mechanical energy (per unit of the task's gravity 0.0025): height of the track plus speed."""
    position, velocity = obs[..., 0], obs[..., 1]
    return jnp.sin(3.0 * position) * 0.45 + 0.5 * jnp.square(velocity) / 0.0025


def _pendulum(obs):
    """Height of the pendulum's tip, cos(theta)."""
    return obs[..., 0]


POTENTIALS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gymnax/CartPole-v1": _cartpole,
    "gymnax/Acrobot-v1": _acrobot,
    "gymnax/MountainCar-v0": _mountain_car,
    "gymnax/MountainCarContinuous-v0": _mountain_car,
    "gymnax/Pendulum-v1": _pendulum,
}


def progress_increments(config: AnnotatorConfig, env_id: str, obs: jax.Array, reward: jax.Array) -> jax.Array:
    """``d_t`` of each transition inside episodes ``obs [..., T, *obs_shape]``, ``reward [..., T]``:
    ``[..., T - 1]`` (the last frame's transition leaves the clip)."""
    if config.signal == "reward":
        return reward[..., :-1]
    if env_id not in POTENTIALS:
        raise ConfigError(f"no built-in potential for {env_id}: ibt.annotator.signal=potential "
                          f"works on {sorted(POTENTIALS)}; use signal=reward elsewhere")
    phi = POTENTIALS[env_id](obs)
    return phi[..., 1:] - phi[..., :-1]


def synthetic_marks(key: jax.Array, config: AnnotatorConfig, increments: jax.Array) -> jax.Array:
    """Marks ``int32 [..., T]`` on frames ``0 .. T-1`` from increments ``[..., T - 1]``:
    frame 0 is never marked, frame ``t + 1`` by the sign of ``d_t`` beyond the threshold,
    thinned by ``fraction`` and flipped with probability ``noise``."""
    keep_key, flip_key = jax.random.split(key)
    sign = jnp.where(increments > config.threshold, 1, jnp.where(increments < -config.threshold, -1, 0))
    kept = jax.random.bernoulli(keep_key, config.fraction, sign.shape)
    flipped = jax.random.bernoulli(flip_key, config.noise, sign.shape)
    marks = jnp.where(kept, jnp.where(flipped, -sign, sign), 0).astype(jnp.int32)
    return jnp.concatenate([jnp.zeros_like(marks[..., :1]), marks], axis=-1)
