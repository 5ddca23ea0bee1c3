"""Flax (linen) networks: the papers' torsos and the agents' heads.

A network is a torso (observation -> feature vector) followed by a head
(features -> Q-values, or policy and value). Every module accepts any number of
leading batch axes.

Initialisation: orthogonal weights (Saxe et al. 2014) and zero biases, with the
gains used by the A2C/PPO reference implementations: sqrt(2) for ReLU/tanh
hidden layers, 0.01 for policy outputs (a near-uniform starting policy), 1 for
values and Q-values. Neither paper prescribes an initialisation we could follow
exactly (the 2015 DQN used Torch 7's defaults), so we take the one that is
commonly reported to train reliably.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlhf_jax.ops.conv import conv as conv_fast_gradients

ATARI_SHAPE = (84, 84, 4)


def _dense(features: int, gain: float, name: str | None = None) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(gain), name=name)


def _conv(features: int, size: int, stride: int) -> nn.Conv:
    return nn.Conv(
        features, (size, size), (stride, stride), padding="VALID",
        kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
    )


def _frames_to_float(x: jax.Array) -> jax.Array:
    """uint8 frames -> float32 in [0, 1]; float inputs are taken as already scaled."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


class _AtariCNN(nn.Module):
    """Base of the Atari torsos: convolutions ``(features, size, stride)``, ReLU after
    each, then one ReLU dense layer of ``hidden`` units.

    Input: ``[..., 84, 84, C]`` frames, channel last, uint8 (scaled by 1/255 here,
    so frames stay uint8 until the network). Output: ``[..., hidden]``.
    """

    convs: Sequence[tuple[int, int, int]]
    hidden: int

    @nn.compact
    def __call__(self, frames: jax.Array) -> jax.Array:
        batch_shape = frames.shape[:-3]
        x = _frames_to_float(frames).reshape((-1,) + frames.shape[-3:])
        for features, size, stride in self.convs:
            x = nn.relu(_conv(features, size, stride)(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(_dense(self.hidden, math.sqrt(2.0))(x))
        return x.reshape(batch_shape + (self.hidden,))


class NatureCNN(_AtariCNN):
    """The DQN torso (Mnih et al. 2015, Methods "Model architecture"): 32 filters 8x8
    stride 4, 64 filters 4x4 stride 2, 64 filters 3x3 stride 1, then 512 units, all
    ReLU. 84x84 -> 20x20 -> 9x9 -> 7x7, so the dense layer sees 7*7*64 = 3136 inputs."""

    convs: Sequence[tuple[int, int, int]] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    hidden: int = 512


class A3CCNN(_AtariCNN):
    """The 2013 DQN torso used by A3C (Mnih et al. 2016, Supplementary section 8):
    16 filters 8x8 stride 4, 32 filters 4x4 stride 2, then 256 units, all ReLU.
    84x84 -> 20x20 -> 9x9, so the dense layer sees 9*9*32 = 2592 inputs."""

    convs: Sequence[tuple[int, int, int]] = ((16, 8, 4), (32, 4, 2))
    hidden: int = 256


class MLPTorso(nn.Module):
    """A multilayer perceptron for vector (or small grid) observations.

    The trailing ``obs_ndim`` axes form one observation and are flattened, so a
    MinAtar ``[..., 10, 10, C]`` observation (``obs_ndim=3``) works as well as a
    classic-control ``[..., D]`` one (``obs_ndim=1``). Inputs of any dtype (MinAtar's
    are bool) are cast to float32. Output: ``[..., hidden[-1]]``.
    """

    hidden: Sequence[int] = (64, 64)
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        batch_shape = obs.shape[: obs.ndim - self.obs_ndim]
        x = obs.astype(jnp.float32).reshape(batch_shape + (-1,))
        for features in self.hidden:
            x = self.activation(_dense(features, math.sqrt(2.0))(x))
        return x


class QHead(nn.Module):
    """A linear output per action: ``[..., F] -> [..., num_actions]`` Q-values (Mnih et al. 2015)."""

    num_actions: int

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        return _dense(self.num_actions, 1.0)(features)


class PolicyValueHead(nn.Module):
    """A3C's two outputs (Mnih et al. 2016, section 8): softmax policy logits and a
    linear value. ``[..., F] -> (logits [..., num_actions], value [...])``."""

    num_actions: int

    @nn.compact
    def __call__(self, features: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = _dense(self.num_actions, 0.01, name="policy")(features)
        value = _dense(1, 1.0, name="value")(features)[..., 0]
        return logits, value


class GaussianPolicyValueHead(nn.Module):
    """A diagonal Gaussian policy and a linear value for continuous actions.

    The mean is linear in the features; the log standard deviation is a learned
    parameter independent of the state (as in TRPO, Schulman et al. 2015).
    ``[..., F] -> (mean [..., action_dim], log_std [..., action_dim], value [...])``,
    with ``log_std`` broadcast to the mean's shape for
    :func:`rlhf_jax.ops.gaussian_log_prob`.
    """

    action_dim: int
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, features: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        mean = _dense(self.action_dim, 0.01, name="mean")(features)
        log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,))
        value = _dense(1, 1.0, name="value")(features)[..., 0]
        return mean, jnp.broadcast_to(log_std, mean.shape), value


def is_atari_frames(observation_shape: Sequence[int]) -> bool:
    """Whether :func:`torso_for` gives these observations a CNN (stacked 84x84 frames)."""
    shape = tuple(observation_shape)
    return len(shape) == 3 and shape[:2] == ATARI_SHAPE[:2]


# XLA:CPU (2 cores) runs the Nature CNN at 120-160 GFLOP/s on passes of up to about 80 frames and at
# 45-72 on 160-336 (docs/notes.md, "Atari frames through the CNN in passes"): on a CPU, time-major
# batches of Atari frames go through in smaller passes. An accelerator, unmeasured, keeps one pass.
ATARI_FRAMES_PER_PASS = 32


def apply_time_major(apply: Callable, params, obs: jax.Array):
    """``apply(params, obs)`` on time-major observations ``[T, N, *observation_shape]``.

    On a CPU, Atari frames go through in passes of ``max(1, ATARI_FRAMES_PER_PASS // N)`` time
    steps, written out one after another (in a ``lax.map`` loop the convolutions ran 4x slower
    still), and the outputs are joined on the time axis: the same values up to float rounding,
    since the weight gradient then sums the passes in another order. Other observations, and
    every observation on an accelerator, go in one pass.
    """
    if not is_atari_frames(obs.shape[2:]) or jax.default_backend() != "cpu":
        return apply(params, obs)
    steps = max(1, ATARI_FRAMES_PER_PASS // obs.shape[1])
    passes = [apply(params, obs[t : t + steps]) for t in range(0, obs.shape[0], steps)]
    return jax.tree.map(lambda *outputs: jnp.concatenate(outputs), *passes)


def input_statistics(observation_shape: Sequence[int], obs: jax.Array, std_floor: float) -> tuple[jax.Array, jax.Array]:
    """Mean and std (at least ``std_floor``) of each input over ``obs [..., *observation_shape]``,
    for an MLP's standardisation ``(o - mean) / std``."""
    flat = obs.reshape((-1, *observation_shape)).astype(jnp.float32)
    return flat.mean(0), jnp.maximum(flat.std(0), std_floor)


def torso_for(observation_shape: Sequence[int], kind: str = "nature", **mlp_kwargs) -> nn.Module:
    """The torso for an observation shape: a CNN for Atari frames ``[84, 84, C]``
    (``kind="nature"`` for :func:`NatureCNN`, ``"a3c"`` for :func:`A3CCNN`), otherwise
    an :class:`MLPTorso` over the whole observation (``mlp_kwargs`` go to it)."""
    shape = tuple(observation_shape)
    if is_atari_frames(shape):
        cnns = {"nature": NatureCNN, "a3c": A3CCNN}
        if kind not in cnns:
            raise ValueError(f"unknown CNN kind {kind!r}; expected one of {sorted(cnns)}")
        return cnns[kind]()
    return MLPTorso(obs_ndim=len(shape), **mlp_kwargs)


# --- Reward predictors r̂(o, a) (Christiano et al. 2017, appendix A) -----------------


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


def _leaky_relu(x: jax.Array, slope: float) -> jax.Array:
    return nn.leaky_relu(x, negative_slope=slope)


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
            x = _leaky_relu(_dense(features, math.sqrt(2.0))(x), self.slope)
            x = Dropout(self.dropout)(x, train)
        return _dense(1, 1.0)(x)[:, 0]


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
        x = _frames_to_float(obs)
        for features, size, stride in self.convs:
            # Batch norm's shift makes a convolution bias redundant.
            x = nn.Conv(
                features, (size, size), (stride, stride), padding="VALID", use_bias=not self.batch_norm,
                kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
                conv_general_dilated=conv_fast_gradients,  # XLA:CPU's own gradients are several times slower
            )(x)
            if self.batch_norm:
                x = nn.BatchNorm(use_running_average=not train)(x)
            x = _leaky_relu(x, self.slope)
            x = Dropout(self.dropout)(x, train)
        x = x.reshape((x.shape[0], -1))
        x = _leaky_relu(_dense(self.hidden, math.sqrt(2.0))(x), self.slope)
        return _dense(1, 1.0)(x)[:, 0]


def reward_network_for(spec, config) -> nn.Module:
    """The paper's reward predictor for an environment: :class:`RewardCNN` on stacked
    Atari frames, otherwise a :class:`RewardMLP` over observation and action.

    ``spec`` is an :class:`rlhf_jax.envs.core.EnvSpec`; ``config`` a
    :class:`rlhf_jax.reward.ensemble.RewardModelConfig` (read for its network fields).
    """
    if is_atari_frames(spec.observation_shape):
        return RewardCNN(slope=config.leaky_relu_slope, dropout=config.cnn_dropout, batch_norm=config.cnn_batch_norm)
    from rlhf_jax.envs.core import Discrete  # here, not at the top: networks stay free of env imports

    num_actions = spec.action_space.n if isinstance(spec.action_space, Discrete) else 0
    return RewardMLP(
        num_actions=num_actions, hidden=tuple(config.hidden), slope=config.leaky_relu_slope,
        dropout=config.mlp_dropout,
    )
