"""Output shapes, input dtypes and parameter counts of rlhf_jax.networks, and the reward
networks' Dropout (rlhf_jax.reward.networks)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.networks import (
    A3CCNN,
    GaussianPolicyValueHead,
    MLPTorso,
    NatureCNN,
    PolicyValueHead,
    QHead,
    apply_time_major,
    torso_for,
)
from rlhf_jax.reward.networks import Dropout

KEY = jax.random.key(0)


def count(params) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


def shapes(net, x):
    """Parameter and output shapes, traced without compiling (compiling dominates these tests)."""
    params = jax.eval_shape(net.init, KEY, x)
    return params, jax.eval_shape(net.apply, params, x)


def init_apply(net, x):
    """Initialise and apply in one compiled call, for tests that need numbers."""

    @jax.jit
    def run(x):
        params = net.init(KEY, x)
        return params, net.apply(params, x)

    return run(x)


def frames(*batch):
    return jax.random.randint(KEY, batch + (84, 84, 4), 0, 256, jnp.int32).astype(jnp.uint8)


def test_nature_cnn_shapes_and_parameter_count():
    params, out = shapes(NatureCNN(), frames(2))
    assert out.shape == (2, 512) and out.dtype == jnp.float32
    p = params["params"]
    # By hand: weights (kernel area * in channels * filters) + biases.
    conv_counts = [8 * 8 * 4 * 32 + 32, 4 * 4 * 32 * 64 + 64, 3 * 3 * 64 * 64 + 64]  # 8224, 32832, 36928
    assert [count(p[f"Conv_{i}"]) for i in range(3)] == conv_counts
    assert sum(conv_counts) == 77_984
    assert count(p["Dense_0"]) == 7 * 7 * 64 * 512 + 512  # 84 -> 20 -> 9 -> 7


def test_a3c_cnn_shapes_parameter_count_and_uint8_scaling():
    net = A3CCNN()

    @jax.jit
    def run(x):
        params = net.init(KEY, x)
        return params, net.apply(params, x), net.apply(params, x.astype(jnp.float32) / 255.0)

    params, out, out_from_floats = run(frames(2, 1))  # e.g. [T, B] leading axes
    assert out.shape == (2, 1, 256)
    # uint8 frames are divided by 255 inside the network.
    np.testing.assert_allclose(out, out_from_floats, rtol=1e-5, atol=1e-6)
    p = params["params"]
    assert count(p["Conv_0"]) == 8 * 8 * 4 * 16 + 16
    assert count(p["Conv_1"]) == 4 * 4 * 16 * 32 + 32
    assert count(p["Dense_0"]) == 9 * 9 * 32 * 256 + 256  # 84 -> 20 -> 9


def test_mlp_torso_flattens_observation_axes():
    obs = jnp.ones((5, 10, 10, 3), bool)  # MinAtar-like
    params, out = shapes(MLPTorso(hidden=(32, 16), obs_ndim=3), obs)
    assert out.shape == (5, 16)
    assert count(params) == (300 * 32 + 32) + (32 * 16 + 16)
    _, out = shapes(MLPTorso(activation=nn.tanh), jnp.zeros((2, 4, 6)))  # [T, B, D]
    assert out.shape == (2, 4, 64)


def test_heads():
    features = jnp.ones((3, 8))
    _, q = shapes(QHead(num_actions=6), features)
    assert q.shape == (3, 6)

    _, (logits, value) = shapes(PolicyValueHead(num_actions=6), features)
    assert logits.shape == (3, 6) and value.shape == (3,)

    params, (mean, log_std, value) = init_apply(GaussianPolicyValueHead(action_dim=2, log_std_init=-0.5), features)
    assert mean.shape == log_std.shape == (3, 2) and value.shape == (3,)
    np.testing.assert_allclose(log_std, -0.5)
    assert params["params"]["log_std"].shape == (2,)  # one per action dim, not per state


def test_torso_for():
    assert isinstance(torso_for((84, 84, 4)), NatureCNN)
    assert isinstance(torso_for((84, 84, 4), "a3c"), A3CCNN)
    minatar = torso_for((10, 10, 4))
    assert isinstance(minatar, MLPTorso) and minatar.obs_ndim == 3
    cartpole = torso_for((4,), hidden=(8,))
    assert cartpole.obs_ndim == 1 and cartpole.hidden == (8,)
    with pytest.raises(ValueError):
        torso_for((84, 84, 4), "resnet")


def test_torso_and_head_compose():
    net = nn.Sequential([torso_for((4,)), PolicyValueHead(num_actions=2)])
    _, (logits, value) = shapes(net, jnp.zeros((7, 4)))
    assert logits.shape == (7, 2) and value.shape == (7,)


def test_time_major_atari_frames_go_through_in_passes_of_whole_time_steps_joined_in_order():
    """84 frames of 12 copies: 32 // 12 = 2 time steps a pass, so passes of 2, 2, 2 and 1 steps,
    and the joined outputs are the one-pass outputs; vector observations go in one pass."""
    passes = []

    def per_frame(params, obs):
        passes.append(obs.shape[:2])
        value = obs.reshape(*obs.shape[:2], -1).astype(jnp.float32).mean(-1) * params
        return value, -value

    obs = frames(7, 12)
    joined = apply_time_major(per_frame, 2.0, obs)
    assert passes == [(2, 12), (2, 12), (2, 12), (1, 12)]
    for part, whole in zip(joined, per_frame(2.0, obs)):
        np.testing.assert_array_equal(part, whole)
    passes.clear()
    vectors = jnp.arange(7 * 12 * 4, dtype=jnp.float32).reshape(7, 12, 4)
    np.testing.assert_array_equal(apply_time_major(per_frame, 2.0, vectors)[0], per_frame(2.0, vectors)[0])
    assert passes == [(7, 12), (7, 12)]


@pytest.mark.parametrize("rate", [0.5, 0.25, 0.75, 0.1])
def test_dropout_drops_each_unit_on_its_own_with_the_rate_and_scales_the_rest(rate):
    """The reward networks' Dropout, one random bit per unit where the rate allows (0.1 falls
    back to flax's): the share dropped is the rate, a kept unit is x / (1 - rate), and the
    units that draw from one 32-bit word (32 rows of a feature) are dropped independently."""
    x = jnp.ones((4_000, 3, 16))  # 12,000 rows of 16 features
    out = np.asarray(Dropout(rate).apply({}, x, True, rngs={"dropout": KEY}))
    kept = out != 0
    np.testing.assert_allclose(out[kept], 1.0 / (1.0 - rate), rtol=1e-6)
    sigma = np.sqrt(rate * (1 - rate) / kept.size)
    assert abs((1 - kept.mean()) - rate) < 5 * sigma
    rows = kept.reshape(-1, 16).astype(float)
    for lag in (1, 31, 32):  # neighbours within a word, across its ends and one word on
        correlation = np.corrcoef(rows[:-lag].ravel(), rows[lag:].ravel())[0, 1]
        assert abs(correlation) < 0.03, (lag, correlation)
    assert abs(np.corrcoef(rows[:, :-1].ravel(), rows[:, 1:].ravel())[0, 1]) < 0.03  # neighbouring features
    np.testing.assert_array_equal(Dropout(rate).apply({}, x, False), x)  # evaluation: no dropout
