"""IBT (rlhf_jax.reward.ibt, rlhf_jax.ibt_pipeline): Algorithm 1's vectorised loss against a
direct transcription, where the marks count, the annotator, equation 2's reward, the AR
baseline, and A2C learning CartPole from synthetic progress/regress marks."""
import csv
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from rlhf_jax.config import ExperimentConfig, apply_overrides, build
from rlhf_jax.envs.core import Discrete, EnvSpec, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward import ibt
from rlhf_jax.reward.annotators import AnnotatorConfig, progress_increments, synthetic_marks
from small_runs import evaluated_return, trained

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "ibt_cartpole.yaml"


def algorithm_1(utility, marks, length, c):
    """Algorithm 1 transcribed pair by pair (marks between t1 and t2: frames t1 < t <= t2)."""
    total, counted = 0.0, 0
    for t1 in range(length):
        for t2 in range(t1 + 1, length):
            between = marks[t1 + 1:t2 + 1]
            positive, negative = (between > 0).any(), (between < 0).any()
            u1, u2 = float(utility[t1]), float(utility[t2])
            if positive and not negative:
                loss = math.log1p(math.exp(-(u2 - u1)))
            elif negative and not positive:
                loss = math.log1p(math.exp(-(u1 - u2)))
            elif not positive and not negative:
                loss = c * (u2 - u1) ** 2
            else:
                continue
            total, counted = total + loss, counted + 1
    return total, counted


def test_vectorised_loss_equals_algorithm_1_on_random_episodes():
    rng = np.random.default_rng(0)
    batch, steps, c = 6, 23, 0.7
    utility = rng.normal(size=(batch, steps)).astype(np.float32)
    marks = rng.choice([-1, 0, 0, 0, 1], size=(batch, steps)).astype(np.int32)
    lengths = rng.integers(1, steps + 1, size=batch)
    valid = np.arange(steps)[None] < lengths[:, None]
    results = [algorithm_1(utility[b], marks[b], lengths[b], c) for b in range(batch)]
    expected = sum(r[0] for r in results) / sum(r[1] for r in results)
    got = float(jax.jit(ibt.ibt_loss)(utility, marks, valid, c))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_the_mark_on_t1_is_not_between_t1_and_t2():
    utility = jnp.array([0.0, 1.0, 3.0])
    marks = jnp.array([0, 1, 0])  # progress seen on frame 1
    loss, counted = ibt.ibt_pair_losses(utility, marks, jnp.ones(3, bool), 2.0)
    # (0, 1) and (0, 2) have the mark between: -log sigmoid(u2 - u1).
    np.testing.assert_allclose(loss[0, 1], math.log1p(math.exp(-1.0)), rtol=1e-6)
    np.testing.assert_allclose(loss[0, 2], math.log1p(math.exp(-3.0)), rtol=1e-6)
    # (1, 2) starts on the marked frame: nothing between, so C (u2 - u1)^2.
    np.testing.assert_allclose(loss[1, 2], 2.0 * 4.0, rtol=1e-6)
    # t1 = t2 and t1 > t2 are never counted.
    assert not np.asarray(counted)[np.tril_indices(3)].any()


def test_marks_of_both_signs_are_ignored():
    loss, counted = ibt.ibt_pair_losses(jnp.array([0.0, 5.0, -5.0]), jnp.array([0, 1, -1]), jnp.ones(3, bool), 1.0)
    assert not bool(counted[0, 2]) and float(loss[0, 2]) == 0.0
    assert bool(counted[0, 1]) and bool(counted[1, 2])


@pytest.mark.slow
def test_sampled_pairs_estimate_the_mean_over_pairs():
    rng = np.random.default_rng(1)
    utility = rng.normal(size=(4, 30)).astype(np.float32)
    marks = rng.choice([-1, 0, 0, 1], size=(4, 30)).astype(np.int32)
    valid = np.ones((4, 30), bool)
    full = float(ibt.ibt_loss(utility, marks, valid, 0.5))
    sample = jax.jit(lambda k: ibt.sampled_ibt_loss(k, utility, marks, valid, 4096, 0.5))
    estimate = np.mean([float(sample(jax.random.PRNGKey(i))) for i in range(8)])
    np.testing.assert_allclose(estimate, full, rtol=0.03)


def test_the_annotator_marks_the_frame_a_transition_arrives_at():
    increments = jnp.array([[0.5, -0.2, 0.05, 0.0]])
    marks = synthetic_marks(jax.random.PRNGKey(0), AnnotatorConfig(threshold=0.1), increments)
    np.testing.assert_array_equal(marks, [[0, 1, -1, 0, 0]])
    none = synthetic_marks(jax.random.PRNGKey(0), AnnotatorConfig(fraction=0.0), increments)
    assert not np.asarray(none).any()
    flipped = synthetic_marks(jax.random.PRNGKey(0), AnnotatorConfig(threshold=0.1, noise=1.0), increments)
    np.testing.assert_array_equal(flipped, [[0, -1, 1, 0, 0]])
    thinned = synthetic_marks(jax.random.PRNGKey(3), AnnotatorConfig(fraction=0.5), jnp.ones((1, 4000)))
    assert 0.45 < float(jnp.mean(thinned[0, 1:])) < 0.55


def test_progress_signals():
    reward = jnp.array([1.0, 2.0, 3.0])
    obs = jnp.array([[0.0, 0, 0.1, 0], [0.0, 0, 0.05, 0], [1.2, 0, 0.05, 0]])
    np.testing.assert_array_equal(progress_increments(AnnotatorConfig(), "gymnax/CartPole-v1", obs, reward), [1.0, 2.0])
    potential = progress_increments(AnnotatorConfig(signal="potential"), "gymnax/CartPole-v1", obs, reward)
    np.testing.assert_allclose(potential, [0.05 / 0.2095, -0.5], rtol=1e-5)  # more upright, then off centre
    with pytest.raises(ConfigError, match="no built-in potential"):
        progress_increments(AnnotatorConfig(signal="potential"), "envpool/Pong-v5", obs, reward)


SPEC = EnvSpec(id="test", backend="gymnax", observation_shape=(3,), observation_dtype="float32",
               action_space=Discrete(2), num_envs=2, max_episode_steps=10, fps=50)


def test_equation_2_reward_is_the_rise_to_the_final_observation_and_zero_on_a_reset_step():
    config = ibt.IBTConfig(normalized_std=0.5)
    state = ibt.init_ibt(jax.random.PRNGKey(0), config, SPEC)._replace(reward_std=jnp.float32(2.0))
    # Row 0 steps on; row 1 ends and restarts (obs is the new episode's first, final_obs the
    # state it reached); row 2 is EnvPool's reset step (its action ignored).
    obs = jnp.array([[0.1, 0.2, 0.3], [1.0, -1.0, 0.5], [0.4, 0.4, 0.4]])
    final_obs = jnp.array([[0.3, 0.1, 0.0], [2.0, -2.0, 1.0], [-0.5, 0.9, 0.2]])
    next_obs = final_obs.at[1].set(0.0)
    no = jnp.zeros(3, bool)
    timestep = TimeStep(next_obs, jnp.zeros(3), no.at[1].set(True), no, final_obs, no.at[2].set(True),
                        {"true_done": no.at[1].set(True)})
    reward = ibt.make_reward_fn(config, SPEC)(state, obs, jnp.zeros(3, jnp.int32), timestep)
    u = lambda x: ibt.utilities(state, config, SPEC, x[:, None])[:, 0]
    np.testing.assert_allclose(reward[:2], 0.5 * (u(final_obs) - u(obs))[:2] / 2.0, rtol=1e-5)
    assert abs(float(reward[1]) - float(0.5 * (u(next_obs) - u(obs))[1] / 2.0)) > 1e-3  # not the new episode's
    assert float(reward[2]) == 0.0
    with pytest.raises(ConfigError, match="utility=mlp"):
        ibt.make_reward_fn(ibt.IBTConfig(utility="lstm"), SPEC)


def test_the_lstm_utility_depends_on_the_history():
    network = ibt.UtilityLSTM((3,))
    episodes = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 3))
    episodes = episodes.at[1, :2].set(episodes[1, :2] + 1.0)  # same last frames, other past
    episodes = episodes.at[1, 2:].set(episodes[0, 2:])
    u = network.apply(network.init(jax.random.PRNGKey(1), episodes), episodes)
    assert u.shape == (2, 5)
    assert not np.allclose(u[0, -1], u[1, -1])


@pytest.mark.slow
def test_the_ar_baseline_is_teacher_forced_on_the_previous_mark():
    marks = jnp.array([[1, 0, -1, 1]])
    np.testing.assert_array_equal(ibt.previous_classes(marks), [[0, 1, 0, 2]])
    logits = jnp.log(jnp.array([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.2, 0.6], [0.4, 0.4, 0.2]]]))
    valid = jnp.array([[True, True, True, False]])
    expected = -(np.log(0.3) + np.log(0.1) + np.log(0.6)) / 3
    np.testing.assert_allclose(ibt.annotation_nll(logits, marks, valid), expected, rtol=1e-5)
    model = ibt.AnnotationLSTM((3,))
    obs = jnp.ones((2, 6, 3))
    params = model.init(jax.random.PRNGKey(0), obs, jnp.zeros((2, 6), jnp.int32))
    sampled = model.apply(params, obs, jax.random.PRNGKey(1), method=ibt.AnnotationLSTM.sample)
    assert sampled.shape == (2, 6) and set(np.unique(sampled)) <= {-1, 0, 1}


def test_bad_ibt_settings_are_refused():
    for overrides in (["ibt.utility=gru"], ["ibt.episode_length=1"], ["ibt.initial_episodes=500"],
                      ["ibt.annotator.fraction=2"], ["ibt.annotator.signal=magic"]):
        with pytest.raises(ConfigError):
            build(ExperimentConfig, apply_overrides(yaml.safe_load(CONFIG.read_text()), overrides))


@pytest.fixture(scope="module")
def ibt_run(tmp_path_factory):
    """`rlhf-jax train configs/ibt_cartpole.yaml seed=1`, and the same agent and budget on the true
    reward. Seed 1 is one that A2C without its entropy bonus leaves pushing the cart one way
    (an evaluation return of 9 here, 500 with the bonus); seed 0 learns either way."""
    root = tmp_path_factory.mktemp("ibt")
    return {name: (trained(root / name, str(CONFIG), "seed=1", *extra), evaluated_return(root / name))
            for name, extra in (("ibt", []), ("true", ["reward=env"]))}


@pytest.mark.slow
def test_a2c_learns_cartpole_from_ibt_marks(ibt_run):
    (run_dir, ibt_return), (_, true_return) = ibt_run["ibt"], ibt_run["true"]
    # At least 80% of what the same budget gives on the true reward (500 here); random play ~20.
    # In a sweep, 10 of seeds 0-11 of this config passed 400 by the end of driver.
    assert ibt_return >= 0.8 * true_return, (ibt_return, true_return)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["labels"]) == 200  # the whole annotation budget is spent
    assert float(rows[-1]["reward_correlation"]) > 0.5  # U's rise follows the annotator's signal
    saved = np.load(run_dir / "labels.npz")
    assert saved["marks"].shape == (200, 50) and set(np.unique(saved["marks"])) <= {-1, 0, 1}
    assert (saved["marks"][:, 0] == 0).all()  # frame 0 of a clip follows no transition of the clip


@pytest.mark.slow
def test_acer_learns_cartpole_from_ibt_marks(tmp_path):
    """`rlhf-jax train configs/ibt_acer_cartpole.yaml`: IBT's reward drives an off-policy agent
    whose replay recomputes r-hat from the newest utility. With ACER's own entropy bonus
    (0.001) every seed pushed one way for good (return 9.4)."""
    # Seeds 0-2 of this config (a 3-seed sweep): 500.0, 495.4 and 500.0 in the last chunk,
    # above 400 from chunks 7, 14 and 8 of 20; with entropy_coef 0.001: 9.4. Random play ~20.
    assert evaluated_return(trained(tmp_path, str(CONFIG.parent / "ibt_acer_cartpole.yaml"))) >= 400


@pytest.mark.slow
def test_people_mark_episodes_at_their_own_pace():
    """A host annotator (the web page's interface) in place of the device's: marks arrive late,
    training goes on meanwhile, and an episode returned without marks is never stored."""
    from rlhf_jax.reward.people import SimulatedPerson
    from rlhf_jax.driver import Driver
    from rlhf_jax.people_seam import attach_people

    config = build(ExperimentConfig, apply_overrides(yaml.safe_load(CONFIG.read_text()), [
        "a2c.total_env_steps=20480", "run.chunk_env_steps=4096", "ibt.episodes=40", "ibt.episode_capacity=64",
        "ibt.batch_episodes=8", "ibt.annotator.signal=reward"]))
    person = SimulatedPerson(delay=0.05, cant_tell=5)
    driver = Driver(config)
    attach_people(driver, person)
    state = driver.init(jax.random.PRNGKey(0))
    annotated = lambda state: state.learner.annotated
    assert int(annotated(state).ring.size) == 0  # people mark the initial episodes too
    state = driver.people.prepare(state, 0)  # sends 25% of the budget before RL, waits for the marks
    assert int(state.asked) == 10 and int(annotated(state).ring.size) == 10 - 2  # 5th, 10th: unmarked
    for chunk in range(driver.num_chunks):
        state, metrics, learned = driver.run_chunk(state, chunk)
    time.sleep(0.3)
    state = driver.people.exchange(state, 0)
    assert int(state.asked) == 40 and not driver.people.host.pending
    assert int(annotated(state).ring.size) == 40 - 40 // 5  # every 5th came back unmarked
    marks = np.asarray(annotated(state).marks[:int(annotated(state).ring.size)])
    # CartPole's reward is +1 on every step of a clip: each frame after the first is marked progress.
    assert (marks[:, 0] == 0).all() and (marks[:, 1:] == 1).all()
