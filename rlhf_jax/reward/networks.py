"""Flax (linen) reward networks: the predictors r̂(o, a) of Christiano et al. 2017 (appendix A),
their dropout, and the input statistics the reward models standardise observations by.

:class:`RewardMLP` is the predictor of the simulated-robotics tasks, :class:`RewardCNN` the
Atari one; :func:`reward_network_for` picks between them for an environment, and the
ensemble (:mod:`rlhf_jax.reward.ensemble`) stacks several. The IBT utility networks are in
:mod:`rlhf_jax.reward.ibt`. Both use the agents' dense layer and frame scaling
(:func:`rlhf_jax.networks.orthogonal_dense`, :func:`rlhf_jax.networks.frames_to_float`),
so their initialisation is the agents' (orthogonal weights, zero biases).
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import Discrete
from rlhf_jax.networks import frames_to_float, is_atari_frames, orthogonal_dense
from rlhf_jax.ops.conv import conv as conv_fast_gradients


def input_statistics(observation_shape: Sequence[int], obs: jax.Array, std_floor: float) -> tuple[jax.Array, jax.Array]:
    """Mean and std (at least ``std_floor``) of each input over ``obs [..., *observation_shape]``,
    for an MLP's standardisation ``(o - mean) / std``."""
    flat = obs.reshape((-1, *observation_shape)).astype(jnp.float32)
    return flat.mean(0), jnp.maximum(flat.std(0), std_floor)


def _dyadic_bits(rate: float, most: int = 8) -> int | None:
    """The fewest bits ``b <= most`` with ``rate * 2**b`` a whole number, or None."""
    for bits in range(1, most + 1):
        if (rate * 2**bits).is_integer():
            return bits
    return None


class Dropout(nn.Module):
    """Dropout (training only; needs a ``"dropout"`` rng) that draws one random bit per unit
    where the rate allows: each unit is zeroed with probability ``rate`` and the rest scaled
    by ``1 / (1 - rate)``, as :class:`flax.linen.Dropout` does.

    Why not flax's: it draws a 32-bit uniform per unit, and on XLA:CPU the threefry draws
    cost more than the reward network's own arithmetic (a 700-label InvertedPendulum run at
    dropout 0.5 ran at half the speed of one without). Where ``rate`` is a multiple of
    ``2**-b`` (``b <= 8``; 0.5 needs one bit), a unit is dropped when its ``b`` random bits,
    read as a number below ``2**b``, fall under ``rate * 2**b``; every 32-bit word serves 32
    units of one feature (32 rows). Other rates fall back to flax's Dropout.
    """

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        if not train or self.rate == 0.0:
            return x
        bits = _dyadic_bits(self.rate)
        if bits is None:
            return nn.Dropout(self.rate, deterministic=False)(x)
        rows, features = math.prod(x.shape[:-1]), x.shape[-1]
        words = jax.random.bits(self.make_rng("dropout"), (bits, -(-rows // 32), features), jnp.uint32)
        shifts = jnp.arange(32, dtype=jnp.uint32)[:, None]
        planes = ((words[:, :, None, :] >> shifts) & 1).reshape(bits, -1, features)[:, :rows]
        number = sum(planes[i] << i for i in range(bits))  # b random bits per unit: uniform below 2**b
        keep = (number >= round(self.rate * 2**bits)).reshape(x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), 0.0)


class RewardMLP(nn.Module):
    """The reward predictor of the simulated-robotics tasks (Christiano et al. 2017, A.1):
    two hidden layers of 64 leaky ReLUs (alpha = 0.01) and a scalar output,

        r̂(o, a) = w_3 · lrelu(W_2 lrelu(W_1 [flatten(o); a] + b_1) + b_2) + b_3.

    The input is the flattened observation beside the action: one-hot over
    ``num_actions`` classes for a discrete action space (an integer index is no
    quantity to scale), the raw vector for a continuous one (``num_actions = 0``).
    ``dropout`` (after each hidden layer, training only) is the paper's "in some
    domains we also apply dropout" (section 2.2.3); it needs a ``"dropout"`` rng.

    ``__call__(obs [B, *obs_shape], action [B] int or [B, d] float, train) -> [B]``.
    """

    num_actions: int
    hidden: Sequence[int] = (64, 64)
    slope: float = 0.01
    dropout: float = 0.0

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, train: bool) -> jax.Array:
        batch = obs.shape[0]
        if self.num_actions > 0:
            action = jax.nn.one_hot(action, self.num_actions, dtype=jnp.float32)
        x = jnp.concatenate(
            [obs.astype(jnp.float32).reshape(batch, -1), action.astype(jnp.float32).reshape(batch, -1)], axis=-1
        )
        for features in self.hidden:
            x = nn.leaky_relu(orthogonal_dense(features, math.sqrt(2.0))(x), negative_slope=self.slope)
            x = Dropout(self.dropout)(x, train)
        return orthogonal_dense(1, 1.0)(x)[:, 0]


class RewardCNN(nn.Module):
    """The Atari reward predictor (Christiano et al. 2017, A.2): 84x84x4 frames through
    4 convolutions of 16 filters, 7x7 stride 3, 5x5 stride 2, 3x3 stride 1, 3x3 stride 1
    (84 -> 26 -> 11 -> 9 -> 7), each followed by batch norm, a leaky ReLU (alpha = 0.01)
    and dropout 0.5; then 64 leaky-ReLU units and a scalar output.

    The paper's Atari predictor sees frames only, so ``action`` is accepted (one call
    signature for every reward network) and ignored. Batch norm keeps its running
    statistics in the ``"batch_stats"`` collection: training calls need
    ``mutable=["batch_stats"]`` and a ``"dropout"`` rng; ``train=False`` uses the
    running averages and no dropout.

    ``__call__(frames [B, 84, 84, 4] uint8, action, train) -> [B]``.
    """

    slope: float = 0.01
    dropout: float = 0.5
    batch_norm: bool = True
    convs: Sequence[tuple[int, int, int]] = ((16, 7, 3), (16, 5, 2), (16, 3, 1), (16, 3, 1))
    hidden: int = 64

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, train: bool) -> jax.Array:
        del action
        x = frames_to_float(obs)
        for features, size, stride in self.convs:
            # Batch norm's shift makes a convolution bias redundant.
            x = nn.Conv(
                features, (size, size), (stride, stride), padding="VALID", use_bias=not self.batch_norm,
                kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
                conv_general_dilated=conv_fast_gradients,  # XLA:CPU's own gradients are several times slower
            )(x)
            if self.batch_norm:
                x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.leaky_relu(x, negative_slope=self.slope)
            x = Dropout(self.dropout)(x, train)
        x = x.reshape((x.shape[0], -1))
        x = nn.leaky_relu(orthogonal_dense(self.hidden, math.sqrt(2.0))(x), negative_slope=self.slope)
        return orthogonal_dense(1, 1.0)(x)[:, 0]


def reward_network_for(spec, config) -> nn.Module:
    """The paper's reward predictor for an environment: :class:`RewardCNN` on stacked
    Atari frames, otherwise a :class:`RewardMLP` over observation and action.

    ``spec`` is an :class:`rlhf_jax.envs.core.EnvSpec`; ``config`` a
    :class:`rlhf_jax.reward.ensemble.RewardModelConfig` (read for its network fields).
    """
    if is_atari_frames(spec.observation_shape):
        return RewardCNN(slope=config.leaky_relu_slope, dropout=config.cnn_dropout, batch_norm=config.cnn_batch_norm)
    num_actions = spec.action_space.n if isinstance(spec.action_space, Discrete) else 0
    return RewardMLP(
        num_actions=num_actions, hidden=tuple(config.hidden), slope=config.leaky_relu_slope,
        dropout=config.mlp_dropout,
    )
