"""From rollouts to labels: cutting segments from the recent-steps ring, choosing queries by
ensemble disagreement, the synthetic teachers, storing labels, and the label schedule."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.envs.core import Discrete, EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.ops.ring import Ring
from rlhf_jax.reward import labelers, queries, schedule, segments
from rlhf_jax.reward.learner import take_clips
from rlhf_jax.reward.data import Segments, empty_labels, empty_segments

N, W, K, CHUNK, S, NUM = 3, 7, 3, 2, 10, 4  # envs, window, segment length, steps per record, capacity, cut
SPEC = EnvSpec(id="test", backend="test", num_envs=N, observation_shape=(2,), observation_dtype="float32",
               action_space=Discrete(1000), fps=15.0, max_episode_steps=100)
SPEC_1D = dataclasses.replace(SPEC, observation_shape=(1,))  # for numbered_segments


@pytest.fixture(scope="module")
def record():
    return jax.jit(segments.record)


@pytest.fixture(scope="module")
def cut():
    return jax.jit(segments.cut_segments, static_argnames="num")


def make_history(steps, seed, done_prob=0.3):
    """Per-env NumPy history ``[T, N]``; obs = (t, env) so every stored step says where it came from."""
    rng = np.random.default_rng(seed)
    t, e = np.meshgrid(np.arange(steps), np.arange(N), indexing="ij")
    return dict(
        obs=np.stack([t, e], -1).astype(np.float32),
        action=(t * N + e).astype(np.int32),
        oracle_reward=rng.normal(size=(steps, N)).astype(np.float32),
        done=rng.random((steps, N)) < done_prob,
    )


def reference_starts(history, written):
    """NumPy: the valid (env, first step) pairs after ``written`` steps were recorded."""
    done = history["done"]
    return {(e, t0) for e in range(N) for t0 in range(max(0, written - W), written - K + 1)
            if not done[t0:t0 + K - 1, e].any()}


def segment_origin(seg_obs, history):
    """(env, first step) of a stored segment, after checking it is a contiguous slice of the history."""
    t, e = seg_obs[:, 0].astype(int), seg_obs[:, 1].astype(int)
    assert (e == e[0]).all()
    np.testing.assert_array_equal(t, t[0] + np.arange(K))
    np.testing.assert_array_equal(seg_obs, history["obs"][t, e])
    return int(e[0]), int(t[0])


def record_chunk(record, recent, history, chunk):
    part = {k: jnp.asarray(v[chunk * CHUNK:(chunk + 1) * CHUNK]) for k, v in history.items()}
    return record(recent, part["obs"], part["action"], part["oracle_reward"], part["done"])


# ---------------------------------------------------------------- record / cut_segments

def test_cut_segments_are_valid_slices_of_the_history_across_both_rings(record, cut):
    chunks = 10  # 20 steps through a 7-step window; 40 segments through 10 rows
    history = make_history(chunks * CHUNK, seed=0)
    recent = segments.empty_recent(SPEC, N, W, segment_length=K)
    segs = empty_segments(SPEC, S, K)
    key = jax.random.PRNGKey(0)
    count = next_row = 0
    for chunk in range(chunks):
        recent = record_chunk(record, recent, history, chunk)
        written = (chunk + 1) * CHUNK
        assert (int(recent.ring.size), int(recent.ring.next)) == (min(written, W), written % W)
        before = jax.tree.map(np.asarray, segs)
        segs = cut(recent, segs, jax.random.fold_in(key, chunk), num=NUM)
        after = jax.tree.map(np.asarray, segs)
        valid = reference_starts(history, written)
        if not valid:  # includes written < K: nothing may change
            jax.tree.map(np.testing.assert_array_equal, after, before)
            continue
        new_rows = (next_row + np.arange(NUM)) % S
        for row in new_rows:
            env, start = segment_origin(after.obs[row], history)
            assert (env, start) in valid  # inside the window, no episode end before the last step
            steps = start + np.arange(K)
            np.testing.assert_array_equal(after.action[row], history["action"][steps, env])
            np.testing.assert_array_equal(after.oracle_reward[row], history["oracle_reward"][steps, env])
        untouched = np.setdiff1d(np.arange(S), new_rows)
        np.testing.assert_array_equal(after.obs[untouched], before.obs[untouched])
        count, next_row = min(count + NUM, S), (next_row + NUM) % S
        assert (int(segs.ring.size), int(segs.ring.next)) == (count, next_row)
    assert count == S and next_row != 0  # both rings wrapped


def test_nothing_is_cut_from_fewer_than_k_steps_or_from_episodes_shorter_than_k(record, cut):
    history = make_history(W, seed=1, done_prob=0.0)
    recent = record_chunk(record, segments.empty_recent(SPEC, N, W), history, 0)
    assert int(recent.ring.size) == CHUNK < K
    segs = cut(recent, empty_segments(SPEC, S, K), jax.random.PRNGKey(1), num=NUM)
    assert (int(segs.ring.size), int(segs.ring.next)) == (0, 0)
    assert not np.asarray(segs.obs).any()

    history["done"][:] = True  # every episode lasts one step: no valid start at all
    recent = segments.empty_recent(SPEC, N, W)
    for chunk in range(3):
        recent = record_chunk(record, recent, history, chunk)
    segs = cut(recent, empty_segments(SPEC, S, K), jax.random.PRNGKey(1), num=NUM)
    assert (int(segs.ring.size), int(segs.ring.next)) == (0, 0)


def test_every_valid_start_is_drawn_and_an_end_at_the_last_step_is_allowed(record, cut):
    history = make_history(5 * CHUNK, seed=2, done_prob=0.4)
    history["done"][7, 0] = True  # env 0: an episode ends at step 7, so start 5 (steps 5..7) is valid
    history["done"][5:7, 0] = False
    recent = segments.empty_recent(SPEC, N, W)
    for chunk in range(5):
        recent = record_chunk(record, recent, history, chunk)
    written = 5 * CHUNK
    valid = reference_starts(history, written)
    assert (0, 5) in valid
    np.testing.assert_array_equal(
        np.asarray(segments.valid_starts(recent, K)).sum(), len(valid))
    drawn = set()
    for i in range(40):
        segs = cut(recent, empty_segments(SPEC, S, K), jax.random.PRNGKey(100 + i), num=NUM)
        drawn |= {segment_origin(obs, history) for obs in np.asarray(segs.obs[:NUM])}
    assert drawn == valid


def test_window_shorter_than_a_segment_and_oversized_record_are_errors():
    with pytest.raises(ValueError, match="shorter than a segment"):
        segments.empty_recent(SPEC, N, 2, segment_length=K)
    with pytest.raises(ValueError, match="shorter than a segment"):
        segments.cut_segments(segments.empty_recent(SPEC, N, 2), empty_segments(SPEC, S, K),
                              jax.random.PRNGKey(0), num=1)
    history = {k: jnp.asarray(v) for k, v in make_history(W + 1, seed=0).items()}
    with pytest.raises(ValueError, match="at most the window"):
        segments.record(segments.empty_recent(SPEC, N, W), **history)


# ---------------------------------------------------------------- query selection

def numbered_segments(capacity=8, count=6, length=2):
    """Segments whose observations hold their row number; rows >= count are not valid."""
    rows = np.arange(capacity, dtype=np.float32)
    obs = np.broadcast_to(rows[:, None, None], (capacity, length, 1))
    reward = np.arange(capacity * length, dtype=np.float32).reshape(capacity, length) / 10
    return Segments(obs=jnp.asarray(obs), action=jnp.zeros((capacity, length), jnp.int32),
                    oracle_reward=jnp.asarray(reward), ring=Ring(jnp.int32(count), jnp.int32(count)))


SPREAD = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 5.0, 9.0, 9.0], np.float32)  # members disagree about row 5


def member_returns(obs, action):
    """Three members: one indifferent, two with opposite opinions of size SPREAD[row]."""
    d = jnp.asarray(SPREAD)[obs[:, 0, 0].astype(jnp.int32)]
    return jnp.stack([jnp.zeros_like(d), d, -d])


def test_returns_of_rows_score_each_held_segment_once_when_the_rows_outnumber_them():
    """8 segments held: rows 3 + 2 are scored as drawn (passes of 3 and 2 segments); rows
    5 + 4 in one pass over the 8 segments, then gathered. The returns are the same."""
    segs, batches = numbered_segments(), []

    def returns_fn(obs, action):
        batches.append(obs.shape[0])
        return member_returns(obs, action)

    few = ([5, 0, 5], [1, 2])
    many = ([5, 0, 5, 7, 1], [1, 2, 3, 6])
    expected = {5: 5.0, 0: 0.0, 7: 9.0, 1: 0.1, 2: 0.2, 3: 0.3, 6: 9.0}  # SPREAD by hand
    for rows, passes in ((few, [3, 2]), (many, [8])):
        batches.clear()
        got = queries.returns_of_rows(returns_fn, segs, *(jnp.array(r) for r in rows))
        assert batches == passes
        for r, returns in zip(rows, got):
            d = np.array([expected[i] for i in r], np.float32)
            np.testing.assert_array_equal(returns, np.stack([0 * d, d, -d]))


def test_candidate_pairs_are_distinct_valid_rows_covering_all_pairs():
    index_1, index_2 = map(np.asarray, jax.jit(queries.candidate_pairs, static_argnames="num")(
        jax.random.PRNGKey(0), numbered_segments(), num=3000))
    assert index_1.dtype == np.int32 and (index_1 != index_2).all()
    assert max(index_1.max(), index_2.max()) == 5 and min(index_1.min(), index_2.min()) == 0
    assert len(set(zip(index_1, index_2))) == 30  # every ordered pair of the 6 rows
    np.testing.assert_allclose(np.bincount(index_2) / 3000, 1 / 6, atol=0.03)


def test_preference_variance_matches_equation_1_with_random_answers():
    r1 = np.array([[0.0, 1.0], [2.0, 1.0], [-1.0, 1.0]], np.float32)
    r2 = np.zeros_like(r1)
    prob = 0.9 / (1 + np.exp(-(r1 - r2))) + 0.05
    np.testing.assert_allclose(queries.preference_variance(r1, r2, 0.1), prob.var(axis=0), rtol=1e-5)
    assert float(queries.preference_variance(r1, r2, 1.0).max()) == 0.0  # pure coin flips agree


@pytest.fixture(scope="module")
def select():
    return jax.jit(queries.select_queries, static_argnames=("member_returns_fn", "num_queries", "method"))


def test_disagreement_selects_the_largest_variance_candidates(select):
    segs, key = numbered_segments(), jax.random.PRNGKey(3)
    cand_1, cand_2 = map(np.asarray, queries.candidate_pairs(key, segs, 30))
    index_1, index_2 = map(np.asarray, select(key, segs, member_returns, num_queries=3))
    returns = lambda i: np.stack([0 * SPREAD[i], SPREAD[i], -SPREAD[i]])  # noqa: E731
    variance = np.asarray(queries.preference_variance(returns(cand_1), returns(cand_2), 0.1))
    chosen = np.asarray(queries.preference_variance(returns(index_1), returns(index_2), 0.1))
    np.testing.assert_allclose(np.sort(chosen), np.sort(variance)[-3:])
    assert set(zip(index_1, index_2)) <= set(zip(cand_1, cand_2))
    assert ((index_1 == 5) | (index_2 == 5)).all()  # the strongly disputed row
    assert ((cand_1 != 5) & (cand_2 != 5)).any()  # ... although not every candidate has it


def test_random_selection_returns_the_first_candidates(select):
    segs, key = numbered_segments(), jax.random.PRNGKey(4)
    cand_1, cand_2 = queries.candidate_pairs(key, segs, 30)
    index_1, index_2 = select(key, segs, member_returns, num_queries=3, method="random")
    np.testing.assert_array_equal(index_1, cand_1[:3])
    np.testing.assert_array_equal(index_2, cand_2[:3])
    with pytest.raises(ValueError, match="method"):
        queries.select_queries(key, segs, member_returns, 3, method="entropy")


# ---------------------------------------------------------------- synthetic teachers

@pytest.fixture(scope="module")
def answer():
    return jax.jit(labelers.oracle_answers, static_argnames="config")


def answers(answer, reward_1, reward_2, seed=0, **config):
    mu, answered = answer(jax.random.PRNGKey(seed), jnp.asarray(reward_1, jnp.float32),
                          jnp.asarray(reward_2, jnp.float32), config=labelers.TeacherConfig(**config))
    return np.asarray(mu), np.asarray(answered)


REWARD_1 = [[1.0, 0.0], [0.0, 0.0], [0.5, 0.5], [-2.0, 0.0], [0.3, 0.0]]
REWARD_2 = [[0.0, 0.5], [0.0, 1.0], [1.0, 0.0], [-1.0, -1.0], [0.0, 0.0]]  # sums: 1|.5, 0|1, 1|1, -2|-2, .3|0


def test_perfect_oracle_prefers_the_higher_return_and_ties_equal_returns(answer):
    mu, answered = answers(answer, REWARD_1, REWARD_2)
    assert mu.dtype == np.float32 and answered.all()
    np.testing.assert_array_equal(mu, [1.0, 0.0, 0.5, 0.5, 1.0])


def test_tie_gap_skip_and_mistakes(answer):
    mu, _ = answers(answer, REWARD_1, REWARD_2, tie_gap=0.4)
    np.testing.assert_array_equal(mu, [1.0, 0.0, 0.5, 0.5, 0.5])  # |0.3| <= 0.4 is a tie now
    mu, answered = answers(answer, REWARD_1, REWARD_2, skip_below=0.5)
    np.testing.assert_array_equal(answered, [True, True, True, False, False])  # both below 0.5
    mu, _ = answers(answer, REWARD_1, REWARD_2, mistake_prob=1.0)
    np.testing.assert_array_equal(mu, [0.0, 1.0, 0.5, 0.5, 0.0])  # every choice flipped, ties stay


def test_myopic_teacher_cares_about_the_end(answer):
    early, late = [[1.0, 0.0, 0.0]], [[0.0, 0.0, 0.8]]
    assert answers(answer, early, late)[0][0] == 1.0  # 1 > 0.8 undiscounted
    assert answers(answer, early, late, myopic_gamma=0.5)[0][0] == 0.0  # 0.25 < 0.8


def test_boltzmann_teacher_between_the_oracle_and_coin_flips(answer):
    rng = np.random.default_rng(0)
    reward_1, reward_2 = rng.normal(size=(2, 2000, 3))
    exact, _ = answers(answer, reward_1, reward_2)
    mu, _ = answers(answer, reward_1, reward_2, boltzmann_temperature=1e-6)
    np.testing.assert_array_equal(mu, exact)
    better_1 = np.maximum(reward_1, reward_2 + 0.1)  # segment 1 always better
    mu, _ = answers(answer, better_1, reward_2, boltzmann_temperature=1e4)
    assert abs(mu.mean() - 0.5) < 0.05


@pytest.mark.parametrize("field, value", [
    ("boltzmann_temperature", -1.0), ("boltzmann_temperature", math.inf), ("mistake_prob", 1.5),
    ("skip_below", math.nan), ("tie_gap", -0.1), ("myopic_gamma", 1.1)])
def test_bad_teacher_config_is_a_config_error(field, value):
    with pytest.raises(ConfigError, match=field):
        labelers.TeacherConfig(**{field: value})


# ---------------------------------------------------------------- storing labels

@pytest.fixture(scope="module")
def add():
    """``add_labels`` of the pairs ``(segs[index_1], segs[index_2])``."""
    store = jax.jit(labelers.add_labels)
    return lambda labels, segs, index_1, index_2, *rest: store(labels, take_clips(segs, index_1, index_2), *rest)


def check_rows(labels, segs, rows, index_1, index_2, mu):
    obs = np.asarray(segs.obs)
    stored = np.asarray(labels.observations(np.asarray(rows)))
    np.testing.assert_array_equal(stored[:, 0], obs[index_1])
    np.testing.assert_array_equal(stored[:, 1], obs[index_2])
    np.testing.assert_array_equal(labels.mu[rows], mu)
    sums = np.asarray(segs.oracle_reward).sum(-1)
    np.testing.assert_allclose(labels.oracle_return[rows], np.stack([sums[index_1], sums[index_2]], 1))


def test_add_labels_compacts_answered_pairs_and_wraps(add):
    segs, labels = numbered_segments(), empty_labels(SPEC_1D, 5, 2, 3)
    index_1, index_2 = np.array([0, 1, 2, 3], np.int32), np.array([5, 4, 3, 2], np.int32)
    mu = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
    key = jax.random.PRNGKey(0)
    labels = add(labels, segs, index_1, index_2, mu, np.array([True, False, True, True]), key, 1 / math.e)
    assert (int(labels.ring.size), int(labels.ring.next)) == (3, 3)
    kept = [0, 2, 3]
    check_rows(jax.tree.map(np.asarray, labels), segs, [0, 1, 2], index_1[kept], index_2[kept], mu[kept])
    labels = add(labels, segs, index_1[::-1], index_2[::-1], mu[::-1], np.ones(4, bool), key, 1 / math.e)
    assert (int(labels.ring.size), int(labels.ring.next)) == (5, 2)  # count capped, next wrapped
    check_rows(jax.tree.map(np.asarray, labels), segs, [3, 4, 0, 1], index_1[::-1], index_2[::-1], mu[::-1])

    # more answers than rows: the newest `capacity` are kept, as if written one by one from row 2
    index_1, index_2 = np.arange(8, dtype=np.int32) % 6, (np.arange(8, dtype=np.int32) + 1) % 6
    mu = np.linspace(0, 1, 8).astype(np.float32)
    labels = add(labels, segs, index_1, index_2, mu, np.ones(8, bool), key, 1 / math.e)
    assert (int(labels.ring.size), int(labels.ring.next)) == (5, 0)
    check_rows(jax.tree.map(np.asarray, labels), segs, [0, 1, 2, 3, 4], index_1[3:], index_2[3:], mu[3:])


def test_holdout_fraction_is_about_one_over_e(add):
    segs, members, rows = numbered_segments(), 3, 400
    labels = empty_labels(SPEC_1D, rows, 2, members)
    index = np.zeros(rows, np.int32)
    labels = add(labels, segs, index, index + 1, np.ones(rows, np.float32), np.ones(rows, bool),
                 jax.random.PRNGKey(5), 1 / math.e)
    holdout = np.asarray(labels.holdout)
    assert abs(holdout.mean() - 1 / math.e) < 0.04
    assert not (holdout == holdout[:, :1]).all()  # drawn per member


# ---------------------------------------------------------------- label schedule

def test_label_schedule_shape():
    total, budget, c = 10_000_000, 1000, 2_000_000
    initial = schedule.initial_labels(budget, atari=False)
    assert initial == 250 and schedule.initial_labels(budget, atari=True) == 500
    assert schedule.initial_labels(300, atari=True) == 300
    due = [schedule.labels_due(t, total, budget, initial, c) for t in range(0, total + 1, 100_000)]
    assert due[0] == initial and due[-1] == budget
    assert schedule.labels_due(2 * total, total, budget, initial, c) == budget
    assert all(b >= a for a, b in zip(due, due[1:]))

    big, h = 10**12, 1_000  # a large budget so flooring does not blur the rates
    rate_0 = schedule.labels_due(h, total, big, 0, c) - schedule.labels_due(0, total, big, 0, c)
    rate_c = schedule.labels_due(c + h, total, big, 0, c) - schedule.labels_due(c, total, big, 0, c)
    assert abs(rate_c / rate_0 - 0.5) < 1e-3


@pytest.mark.parametrize("args", [
    (0, 100, 10, 20, 5), (-1, 100, 10, 5, 5), (0, 100, -1, 0, 5), (0, 0, 10, 5, 5), (0, 100, 10, 5, 0)])
def test_label_schedule_errors(args):
    with pytest.raises(ValueError):
        schedule.labels_due(*args)


def test_initial_labels_errors():
    with pytest.raises(ValueError, match="initial_fraction"):
        schedule.initial_labels(10, atari=False, initial_fraction=1.5)
    with pytest.raises(ValueError, match="budget"):
        schedule.initial_labels(-1, atari=True)
