"""Flax (linen) networks: the papers' torsos and the agents' heads.

A network is a torso (observation -> feature vector) followed by a head
(features -> Q-values, or policy and value). Every module accepts any number of
leading batch axes. The reward networks, which build on :func:`orthogonal_dense` and
:func:`frames_to_float` here, are in :mod:`rlhf_jax.reward.networks`.

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

ATARI_SHAPE = (84, 84, 4)


def orthogonal_dense(features: int, gain: float, name: str | None = None) -> nn.Dense:
    """A dense layer with orthogonal weights of scale ``gain`` and zero biases: every dense
    layer of the agents' and the reward networks (gains in the module docstring). It is a
    plain :class:`flax.linen.Dense`, so its parameters are named ``Dense_<i>`` (or ``name``)."""
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(gain), name=name)


def _conv(features: int, size: int, stride: int) -> nn.Conv:
    return nn.Conv(
        features, (size, size), (stride, stride), padding="VALID",
        kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
    )


def frames_to_float(x: jax.Array) -> jax.Array:
    """uint8 frames -> float32 in [0, 1]; float inputs are taken as already scaled. Every
    network that reads Atari frames (the torsos here, the reward CNN) scales them with this."""
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
        x = frames_to_float(frames).reshape((-1,) + frames.shape[-3:])
        for features, size, stride in self.convs:
            x = nn.relu(_conv(features, size, stride)(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(orthogonal_dense(self.hidden, math.sqrt(2.0))(x))
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
            x = self.activation(orthogonal_dense(features, math.sqrt(2.0))(x))
        return x


class QHead(nn.Module):
    """A linear output per action: ``[..., F] -> [..., num_actions]`` Q-values (Mnih et al. 2015)."""

    num_actions: int

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        return orthogonal_dense(self.num_actions, 1.0)(features)


class PolicyValueHead(nn.Module):
    """A3C's two outputs (Mnih et al. 2016, section 8): softmax policy logits and a
    linear value. ``[..., F] -> (logits [..., num_actions], value [...])``."""

    num_actions: int

    @nn.compact
    def __call__(self, features: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = orthogonal_dense(self.num_actions, 0.01, name="policy")(features)
        value = orthogonal_dense(1, 1.0, name="value")(features)[..., 0]
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
        mean = orthogonal_dense(self.action_dim, 0.01, name="mean")(features)
        log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,))
        value = orthogonal_dense(1, 1.0, name="value")(features)[..., 0]
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
