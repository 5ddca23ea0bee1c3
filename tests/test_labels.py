"""The label database keeps each Atari frame once (rlhf_jax.reward.data): with the frames before
each clip it gives the stacks back exactly; without them (the default), as if each clip began an
episode."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.envs.core import Discrete, EnvSpec
from rlhf_jax.ops.ring import full_ring
from rlhf_jax.reward import ensemble
from rlhf_jax.reward.data import (Labels, LabelledPairs, Segments, empty_labels, frames_on_host, labels_nbytes,
                                  observations_on_host)
from rlhf_jax.reward.labelers import add_labels, add_pairs
from rlhf_jax.reward.learner import take_clips

ATARI = EnvSpec(id="envpool/Pong-v5", backend="envpool-atari", num_envs=1, observation_shape=(84, 84, 4),
                observation_dtype="uint8", action_space=Discrete(6), fps=15.0, max_episode_steps=27_000)
MINATAR = EnvSpec(id="gymnax/Breakout-MinAtar", backend="gymnax", num_envs=1, observation_shape=(10, 10, 4),
                  observation_dtype="bool", action_space=Discrete(3), fps=10.0, max_episode_steps=1_000)

add = jax.jit(add_labels)


def segments_of(stacks, seed=0) -> Segments:
    """Segments with these observations ``[S, k, 84, 84, 4]``, random actions and rewards."""
    rng = np.random.default_rng(seed)
    count, length = stacks.shape[:2]
    return Segments(obs=jnp.asarray(stacks), action=jnp.asarray(rng.integers(0, 6, (count, length)), jnp.int32),
                    oracle_reward=jnp.asarray(rng.normal(size=(count, length)), jnp.float32),
                    ring=full_ring(count))


def add_all(labels, segments, index_1, index_2, key=0):
    """Every pair answered (mu 1), into rows next, next+1, ..."""
    n = len(index_1)
    pairs = take_clips(segments, jnp.asarray(index_1, jnp.int32), jnp.asarray(index_2, jnp.int32))
    return add(labels, pairs, jnp.ones(n, jnp.float32), jnp.ones(n, bool), jax.random.key(key), 1 / math.e)


# ---------------------------------------------------------------- a hand-worked example


def numbered(*steps):
    """A segment ``[k, 84, 84, 4]`` whose frames are images filled with their number."""
    return np.stack([np.broadcast_to(np.array(step, np.uint8), (84, 84, 4)) for step in steps])


def hand_segments() -> Segments:
    return segments_of(np.stack([
        numbered((1, 2, 3, 4), (2, 3, 4, 5), (3, 4, 5, 6)),  # runs on
        numbered((7, 7, 7, 7), (7, 7, 7, 8), (7, 7, 8, 9)),  # starts an episode: EnvPool repeats frame 7
        numbered((10, 11, 12, 13), (14, 14, 14, 14), (14, 14, 14, 15)),  # a new episode at step 1
        numbered((16, 17, 18, 19), (17, 18, 19, 20), (21, 21, 21, 21)),  # and at step 2
    ]))


def test_two_labels_by_hand_with_the_frames_before_each_clip():
    segments = hand_segments()
    labels = add_all(empty_labels(ATARI, 2, 3, 3, frames_before_clip=True), segments, [0, 2], [1, 3])
    # k + 3 = 6 frames per segment: the first stack, then each later step's newest frame.
    assert labels.stack == 4 and labels.frames.shape == (2, 2, 6, 84, 84) and labels.frames.dtype == jnp.uint8
    np.testing.assert_array_equal(labels.frames[:, :, :, 0, 0], [[[1, 2, 3, 4, 5, 6], [7, 7, 7, 7, 8, 9]],
                                                                  [[10, 11, 12, 13, 14, 15], [16, 17, 18, 19, 20, 21]]])
    np.testing.assert_array_equal(labels.frames, np.broadcast_to(labels.frames[..., :1, :1], labels.frames.shape))
    np.testing.assert_array_equal(labels.restart, [[[False] * 3, [False] * 3], [[False, True, False], [False, False, True]]])
    # Read back: the very stacks that were written, in each label's order.
    obs = np.asarray(segments.obs)
    np.testing.assert_array_equal(labels.observations(jnp.array([1, 0, 1])),
                                  np.stack([obs[[2, 3]], obs[[0, 1]], obs[[2, 3]]]))


def test_two_labels_by_hand_with_the_clips_own_frames():
    """The default: k = 3 frames per segment, each step's newest; the first step counts as an
    episode's first, so the first stacks repeat the clip's first frame where they reached back."""
    labels = add_all(empty_labels(ATARI, 2, 3, 3), hand_segments(), [0, 2], [1, 3])
    assert labels.history == 0 and labels.frames.shape == (2, 2, 3, 84, 84)
    np.testing.assert_array_equal(labels.frames[:, :, :, 0, 0], [[[4, 5, 6], [7, 8, 9]], [[13, 14, 15], [19, 20, 21]]])
    np.testing.assert_array_equal(labels.restart, [[[False] * 3, [False] * 3], [[False, True, False], [False, False, True]]])
    np.testing.assert_array_equal(labels.observations(jnp.array([0, 1])), np.stack([
        [numbered((4, 4, 4, 4), (4, 4, 4, 5), (4, 4, 5, 6)), numbered((7, 7, 7, 7), (7, 7, 7, 8), (7, 7, 8, 9))],
        [numbered((13, 13, 13, 13), (14, 14, 14, 14), (14, 14, 14, 15)),
         numbered((19, 19, 19, 19), (19, 19, 19, 20), (21, 21, 21, 21))]]))


# ---------------------------------------------------------------- EnvPool-like rollouts, read back bit for bit


def envpool_like_segments(count, length, seed):
    """``count`` segments of random uint8 frames stacked by EnvPool's rule: a step drops the oldest
    frame and appends a new one; an episode's first stack (at random steps, 1 in 5) repeats its frame."""
    rng = np.random.default_rng(seed)
    stacks = np.zeros((count, length, 84, 84, 4), np.uint8)
    for s in range(count):
        stack = np.repeat(rng.integers(0, 256, (84, 84, 1), np.uint8), 4, axis=-1)
        for t in range(length):
            frame = rng.integers(0, 256, (84, 84, 1), np.uint8)
            if t > 0 or rng.random() < 0.5:  # half the segments start mid-episode
                stack = np.repeat(frame, 4, -1) if rng.random() < 0.2 else np.concatenate([stack[..., 1:], frame], -1)
            stacks[s, t] = stack
    return stacks


@pytest.fixture(scope="module")
def both_ways():
    """The same pairs added to the frame database and, as before, stored as whole stacks (``stack=1``)."""
    count, length, pairs = 12, 5, 8
    stacks = envpool_like_segments(count, length, seed=0)
    segments = segments_of(stacks)
    rng = np.random.default_rng(1)
    index_1, index_2 = rng.integers(0, count, pairs), rng.integers(0, count, pairs)
    labels = add_all(empty_labels(ATARI, 10, length, 2, frames_before_clip=True), segments, index_1, index_2)
    whole = np.zeros((10, 2, length, 84, 84, 4), np.uint8)
    whole[:pairs] = np.stack([stacks[index_1], stacks[index_2]], axis=1)
    as_stacks = labels.replace(frames=jnp.asarray(whole), restart=jnp.zeros_like(labels.restart), stack=1)
    return labels, as_stacks, pairs


def test_rebuilt_stacks_are_bit_identical(both_ways):
    labels, as_stacks, pairs = both_ways
    assert np.asarray(labels.restart[:pairs, :, 1:]).any()  # some stacks restart inside a segment
    rows = jnp.arange(10)
    np.testing.assert_array_equal(jax.jit(Labels.observations)(labels, rows), as_stacks.frames)
    np.testing.assert_array_equal(observations_on_host(labels, chunk=3), as_stacks.frames[:pairs])


@pytest.mark.slow
def test_fitting_sees_the_same_inputs(both_ways):
    """One step of the CNN ensemble, and its validation losses, are the same from frames as from stacks."""
    labels, as_stacks, _ = both_ways
    config = ensemble.RewardModelConfig(ensemble_size=2, batch_size=4)
    state = jax.jit(ensemble.init_ensemble, static_argnums=(1, 2))(jax.random.key(0), config, ATARI)
    fit = jax.jit(ensemble.fit, static_argnums=(1, 2, 5))
    losses = jax.jit(ensemble.validation_losses, static_argnums=(1, 2, 5))
    fitted = [fit(state, config, ATARI, x, jax.random.key(1), 1)[0] for x in (labels, as_stacks)]
    jax.tree.map(np.testing.assert_array_equal, fitted[0].params, fitted[1].params)
    jax.tree.map(np.testing.assert_array_equal, fitted[0].batch_stats, fitted[1].batch_stats)
    assert any(jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), fitted[0].params, state.params)))
    val = [losses(fitted[0], config, ATARI, x, jax.random.key(2), 10) for x in (labels, as_stacks)]
    np.testing.assert_array_equal(val[0], val[1])


def as_if_each_clip_began_an_episode(stacks: np.ndarray) -> np.ndarray:
    """EnvPool's stacking rule run over each clip's own newest frames ``[S, k, 84, 84, 4]``: the
    first step fills its stack with its frame; later ones append theirs, or refill where the
    original stack restarted."""
    out = np.empty_like(stacks)
    for s, clip in enumerate(stacks):
        out[s, 0] = np.repeat(clip[0, ..., -1:], 4, -1)
        for t in range(1, len(clip)):
            restarted = not np.array_equal(clip[t, ..., :-1], clip[t - 1, ..., 1:])
            out[s, t] = clip[t] if restarted else np.concatenate([out[s, t - 1, ..., 1:], clip[t, ..., -1:]], -1)
    return out


def test_clips_own_frames_rebuild_as_episode_starts(both_ways):
    """Without the frames before each clip, every stack is the one EnvPool would have stacked had
    the clip begun an episode: from step 3 on (or a restart) exactly the one played."""
    exact, _, pairs = both_ways
    played = np.asarray(exact.observations(jnp.arange(pairs)))  # [P, 2, k, 84, 84, 4]
    segments = segments_of(played.reshape(-1, *played.shape[2:]))
    labels = add_all(empty_labels(ATARI, 10, played.shape[2], 2), segments, np.arange(0, 2 * pairs, 2),
                     np.arange(1, 2 * pairs, 2))
    assert labels.frames.shape[2] == played.shape[2]
    rebuilt = np.asarray(jax.jit(Labels.observations)(labels, jnp.arange(pairs)))
    expected = as_if_each_clip_began_an_episode(played.reshape(-1, *played.shape[2:])).reshape(played.shape)
    np.testing.assert_array_equal(rebuilt, expected)
    np.testing.assert_array_equal(rebuilt[:, :, 3:], played[:, :, 3:])
    assert not np.array_equal(rebuilt, played)  # the first stacks did reach back before their clips


def test_pairs_from_a_dataset_keep_what_the_run_keeps(both_ways):
    """A label dataset keeps every frame (k + 3 a segment); a run that keeps only the clips' own
    frames stores its pairs as if it had labelled them itself."""
    exact, _, pairs = both_ways
    played = np.asarray(exact.observations(jnp.arange(pairs)))
    frames, restart = frames_on_host(played, 4)
    given = LabelledPairs(jnp.asarray(frames), jnp.asarray(restart), exact.action[:pairs], exact.mu[:pairs],
                          exact.oracle_return[:pairs])
    for keep in (True, False):
        labels = jax.jit(add_pairs)(empty_labels(ATARI, 10, played.shape[2], 2, keep), given, jax.random.key(0))
        expected = played if keep else as_if_each_clip_began_an_episode(
            played.reshape(-1, *played.shape[2:])).reshape(played.shape)
        np.testing.assert_array_equal(labels.observations(jnp.arange(pairs)), expected)


# ---------------------------------------------------------------- other observations, and the bytes


def test_other_observations_are_stored_whole():
    labels = empty_labels(MINATAR, 3, 5, 2)
    assert labels.stack == 1 and labels.frames.shape == (3, 2, 5, 10, 10, 4)
    frames = jax.random.bernoulli(jax.random.key(0), 0.5, labels.frames.shape)
    np.testing.assert_array_equal(labels.replace(frames=frames).observations(jnp.array([2, 0])), frames[jnp.array([2, 0])])


@pytest.mark.parametrize("frames_before_clip", [False, True])
def test_bytes_of_3000_atari_labels(frames_before_clip):
    capacity, k, members = 3_000, 25, 3
    frames = 2 * (k + 3 * frames_before_clip) * 84 * 84  # uint8, each frame once
    per_label = frames + 2 * k + 2 * k * 4 + 4 + 2 * 4 + members  # restart, int32 actions, mu, oracle returns, holdout
    assert labels_nbytes(ATARI, capacity, k, members, frames_before_clip) == capacity * per_label + 2 * 4  # + count, next
    stacks = 2 * k * 84 * 84 * 4  # what the frames replace: every step's whole stack
    assert stacks / frames == pytest.approx(100 / 28 if frames_before_clip else 4)
