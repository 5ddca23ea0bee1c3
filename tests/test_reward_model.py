"""The reward model of Christiano et al. 2017 (section 2.2.3): likelihood, ensemble, fitting."""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.envs.core import Box, Discrete, EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.ops.ring import Ring
from rlhf_jax.reward import ensemble
from rlhf_jax.reward.data import empty_labels
from rlhf_jax.reward.ensemble import RewardModelConfig
from rlhf_jax.reward.networks import RewardCNN, RewardMLP, reward_network_for
from rlhf_jax.reward.preference import preference_loss, preference_probability, target_loss

# A toy task: observations in R^2, 2 actions, true reward obs[0].
SPEC = EnvSpec(id="toy", backend="test", num_envs=4, observation_shape=(2,), observation_dtype="float32",
               action_space=Discrete(2), fps=10.0, max_episode_steps=100)
ATARI_SPEC = dataclasses.replace(SPEC, id="atari", observation_shape=(84, 84, 4), observation_dtype="uint8")
CONFIG = RewardModelConfig()
LENGTH = 5  # steps per segment
CAPACITY = 256
FIT_STEPS = 50  # one compiled fit; the learning test calls it repeatedly
PAIRS = 500  # pairs scored by the normalisation and learning tests: one compiled shape

init_ensemble = jax.jit(ensemble.init_ensemble, static_argnums=(1, 2))
fit = jax.jit(ensemble.fit, static_argnums=(1, 2, 5))
member_returns = jax.jit(ensemble.member_returns, static_argnums=(1, 2))
normalized_reward = jax.jit(ensemble.normalized_reward, static_argnums=(1, 2))
update_normalization = jax.jit(ensemble.update_normalization, static_argnums=(1, 2))
validation_losses = jax.jit(ensemble.validation_losses, static_argnums=(1, 2, 5))
sample_training_rows = jax.jit(ensemble.sample_training_rows, static_argnums=3)


def random_pairs(key, n):
    """Random segment pairs [n, 2, k, 2] and actions [n, 2, k], with the true returns [n, 2]."""
    k_obs, k_act = jax.random.split(key)
    obs = jax.random.normal(k_obs, (n, 2, LENGTH, 2))
    action = jax.random.randint(k_act, (n, 2, LENGTH), 0, 2)
    return obs, action, obs[..., 0].sum(-1)


def toy_labels(key, count, capacity=CAPACITY, holdout_prob=1 / math.e):
    k_pairs, k_hold = jax.random.split(key)
    labels = empty_labels(SPEC, capacity, LENGTH, CONFIG.ensemble_size)
    obs, action, returns = random_pairs(k_pairs, count)
    pad = ((0, capacity - count),)
    return labels.replace(
        frames=jnp.pad(obs, pad + ((0, 0),) * 3),  # vectors: the observations themselves
        action=jnp.pad(action, pad + ((0, 0),) * 2),
        mu=jnp.pad((returns[:, 0] > returns[:, 1]).astype(jnp.float32), pad),
        oracle_return=jnp.pad(returns, pad + ((0, 0),)),
        holdout=jax.random.bernoulli(k_hold, holdout_prob, (capacity, CONFIG.ensemble_size)),
        ring=Ring(jnp.asarray(count % capacity, jnp.int32), jnp.asarray(count, jnp.int32)),
    )


@pytest.fixture(scope="module")
def state():
    return init_ensemble(jax.random.key(0), CONFIG, SPEC)


@pytest.fixture(scope="module")
def trained(state):
    """The ensemble fit on 200 labels made with the true reward sums."""
    labels = toy_labels(jax.random.key(1), 200)
    for key in jax.random.split(jax.random.key(2), 6):  # 300 steps
        state, metrics = fit(state, CONFIG, SPEC, labels, key, FIT_STEPS)
    return state, metrics, labels


# --- Likelihood ---------------------------------------------------------------------


def test_preference_probability_and_loss_by_hand():
    r1, r2 = jnp.array([math.log(3.0)]), jnp.array([0.0])  # sigmoid(ln 3) = 3/4
    np.testing.assert_allclose(preference_probability(r1, r2, 0.1), [0.9 * 0.75 + 0.05], rtol=1e-6)
    np.testing.assert_allclose(preference_probability(r2, r1, 0.1), [0.275], rtol=1e-6)
    np.testing.assert_allclose(preference_loss(r1, r2, jnp.array([1.0]), 0.1), [-math.log(0.725)], rtol=1e-6)
    np.testing.assert_allclose(preference_loss(r1, r2, jnp.array([0.0]), 0.1), [-math.log(0.275)], rtol=1e-6)
    tie = -(math.log(0.725) + math.log(0.275)) / 2
    np.testing.assert_allclose(preference_loss(r1, r2, jnp.array([0.5]), 0.1), [tie], rtol=1e-6)


def test_likelihood_is_stable_far_apart():
    """Returns 1000 apart: the noise floor holds (P = 1 - eps/2) and gradients stay finite."""
    r1, r2, mu = jnp.array([1000.0]), jnp.array([0.0]), jnp.array([0.0])
    np.testing.assert_allclose(preference_probability(r1, r2, 0.1), [0.95], rtol=1e-6)
    np.testing.assert_allclose(preference_loss(r1, r2, mu, 0.1), [-math.log(0.05)], rtol=1e-5)
    for eps in (0.1, 0.0):
        grad = jax.grad(lambda r: preference_loss(r, r2, mu, eps).sum())(r1)
        assert np.isfinite(grad).all()
    # eps = 0 is equation 1 itself: -log sigmoid(-1000) = 1000.
    np.testing.assert_allclose(preference_loss(r1, r2, mu, 0.0), [1000.0], rtol=1e-6)


def test_target_loss_against_numpy():
    r1, r2, o1, o2 = np.random.default_rng(0).normal(size=(4, 7)).astype(np.float32)
    expected = ((r1 - o1) ** 2 + (r2 - o2) ** 2) / 2
    np.testing.assert_allclose(target_loss(r1, r2, o1, o2), expected, rtol=1e-6)


# --- Bootstrap, held-out rows, empty buffers --------------------------------------


def test_sampler_draws_every_training_row_and_no_held_out_row():
    capacity, count = 32, 20
    holdout = jnp.arange(capacity) % 3 == 0  # rows 0, 3, 6, ... are this member's validation set
    rows, num_rows = sample_training_rows(jax.random.key(0), holdout, jnp.int32(count), 4000)
    training = {r for r in range(count) if r % 3 != 0}
    assert int(num_rows) == len(training)
    assert set(np.asarray(rows).tolist()) == training  # every training row, nothing else
    counts = np.bincount(np.asarray(rows), minlength=capacity)[sorted(training)]
    assert counts.min() > 4000 / len(training) / 2  # roughly uniform


def test_different_keys_draw_different_rows():
    keys = jax.random.split(jax.random.key(0), 2)
    none = jnp.zeros((32,), bool)
    a, _ = sample_training_rows(keys[0], none, jnp.int32(32), 4000)
    b, _ = sample_training_rows(keys[1], none, jnp.int32(32), 4000)
    assert not np.array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("bootstrap", [True, False])
def test_empty_buffer_changes_nothing(bootstrap):
    config = dataclasses.replace(CONFIG, bootstrap=bootstrap)
    state = init_ensemble(jax.random.key(0), config, SPEC)
    labels = empty_labels(SPEC, CAPACITY, LENGTH, config.ensemble_size)
    fitted, metrics = fit(state, config, SPEC, labels, jax.random.key(1), FIT_STEPS)
    jax.tree.map(np.testing.assert_array_equal, fitted, state)
    np.testing.assert_array_equal(metrics["loss"], np.zeros(3))


# --- Adaptive l2 ---------------------------------------------------------------------


def test_adaptive_l2_moves_each_member_its_own_way():
    l2 = jnp.array([1.0, 1.0, 1.0, 1.0])
    train = jnp.array([1.0, 1.0, 1.0, 1.0])
    val = jnp.array([2.0, 1.0, 1.3, jnp.nan])  # overfit, underfit, in the band, no validation data
    np.testing.assert_allclose(ensemble.adapt_l2(l2, train, val, CONFIG), [1.1, 1 / 1.1, 1.0, 1.0], rtol=1e-6)
    ablation = dataclasses.replace(CONFIG, adapt_l2=False)
    np.testing.assert_array_equal(ensemble.adapt_l2(l2, train, val, ablation), np.zeros(4))


# --- Normalisation -------------------------------------------------------------------


@pytest.mark.slow
def test_normalization_gives_each_member_zero_mean_and_paper_std(state):
    obs, action, _ = random_pairs(jax.random.key(3), PAIRS)  # [P, 2, k, ...]: any leading axes
    state = update_normalization(state, CONFIG, SPEC, obs, action)
    raw = np.asarray(member_returns(state, CONFIG, SPEC, obs, action))  # [M, 40, 2, k]
    assert raw.shape == (3, PAIRS, 2, LENGTH)
    assert CONFIG.reward_std(SPEC) == 1.0 and CONFIG.reward_std(ATARI_SPEC) == 0.05
    mean, std = np.asarray(state.norm_mean)[:, None], np.asarray(state.norm_std)[:, None]
    normalised = (raw.reshape(3, -1) - mean) / std
    np.testing.assert_allclose(normalised.mean(1), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalised.std(1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(
        normalized_reward(state, CONFIG, SPEC, obs, action), normalised.mean(0).reshape(PAIRS, 2, LENGTH),
        rtol=1e-4, atol=1e-5,
    )
    # A mask (e.g. a ring buffer's rows below its count) restricts the statistics to valid steps.
    first_half = jnp.arange(PAIRS)[:, None, None] < PAIRS // 2
    masked = update_normalization(state, CONFIG, SPEC, obs, action, first_half)
    valid = raw[:, : PAIRS // 2].reshape(3, -1)
    np.testing.assert_allclose(masked.norm_mean, valid.mean(1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(masked.norm_std, valid.std(1), rtol=1e-4)
    reward_fn = ensemble.make_reward_fn(CONFIG, SPEC)
    assert reward_fn(state, obs[:4, 0, 0], action[:4, 0, 0], None).shape == (SPEC.num_envs,)


# --- Learning ------------------------------------------------------------------------


def test_fit_learns_true_preferences(trained):
    state, metrics, _ = trained
    obs, action, returns = random_pairs(jax.random.key(4), PAIRS)  # fresh pairs
    predicted = np.asarray(normalized_reward(state, CONFIG, SPEC, obs, action)).sum(-1)  # [P, 2]
    agree = (predicted[:, 0] > predicted[:, 1]) == (returns[:, 0] > returns[:, 1])
    assert agree.mean() >= 0.9
    assert metrics["loss"].shape == (3,) and np.all(metrics["loss"] < math.log(2))
    assert int(state.step) == 300


def test_validation_losses_and_adaptation(trained):
    state, _, labels = trained
    train, val = validation_losses(state, CONFIG, SPEC, labels, jax.random.key(5), CAPACITY)
    assert train.shape == val.shape == (3,)
    assert np.isfinite(train).all() and np.isfinite(val).all()
    l2 = ensemble.adapt_l2(state.l2, train, val, CONFIG)
    ratio = np.asarray(val / train)
    expected = np.where(ratio > 1.5, 1.1e-3, np.where(ratio < 1.1, 1e-3 / 1.1, 1e-3))
    np.testing.assert_allclose(l2, expected, rtol=1e-5)
    # A member that holds nothing out reports NaN and keeps its l2.
    no_holdout = labels.replace(holdout=labels.holdout.at[:, 1].set(False))
    train, val = validation_losses(state, CONFIG, SPEC, no_holdout, jax.random.key(5), CAPACITY)
    val = np.asarray(val)
    assert np.isnan(val[1]) and np.isfinite(val[[0, 2]]).all()
    assert ensemble.adapt_l2(state.l2, train, val, CONFIG)[1] == state.l2[1]


def test_validation_scores_each_label_held_once(trained):
    """Each member's mean pair loss over its own training rows and its held-out rows, worked
    out from the members' returns on all 150 rows at once (3 batches of 64); the buffer holds
    256, and its last batch, past the 150th row, is not scored (the cost followed the capacity)."""
    state, _, labels = trained
    labels = labels.replace(ring=labels.ring._replace(size=jnp.asarray(150, jnp.int32)))
    train, val = validation_losses(state, CONFIG, SPEC, labels, jax.random.key(5), CAPACITY)
    obs, action = labels.observations(jnp.arange(150)), labels.action[:150]
    returns = np.asarray(ensemble.member_returns(state, CONFIG, SPEC, obs, action)).sum(-1)  # [M, 150, 2]
    losses = np.stack([np.asarray(preference_loss(r[:, 0], r[:, 1], labels.mu[:150], CONFIG.random_answer_prob))
                       for r in returns])  # [M, 150]
    held_out = np.asarray(labels.holdout[:150]).T
    np.testing.assert_allclose(train, [l[~h].mean() for l, h in zip(losses, held_out)], rtol=1e-5)
    np.testing.assert_allclose(val, [l[h].mean() for l, h in zip(losses, held_out)], rtol=1e-5)


def _losses_on_rows(state, labels, rows):
    """Each member's mean pair loss over its training and its held-out rows among ``rows``
    (repeats counted as often as they come), worked out in NumPy from the members' returns."""
    obs, action = labels.observations(rows), labels.action[rows]
    returns = np.asarray(ensemble.member_returns(state, CONFIG, SPEC, obs, action)).sum(-1)  # [M, rows, 2]
    losses = np.stack([np.asarray(preference_loss(r[:, 0], r[:, 1], labels.mu[rows], CONFIG.random_answer_prob))
                       for r in returns])
    held_out = np.asarray(labels.holdout[rows]).T
    return [l[~h].mean() for l, h in zip(losses, held_out)], [l[h].mean() for l, h in zip(losses, held_out)]


def test_validation_scores_every_label_up_to_max_rows_and_a_sample_past_it(trained):
    """Below ``max_rows`` held labels every one is scored, as with the whole capacity; past it,
    ``max_rows`` rows drawn with replacement by the key, the same rows for every member."""
    state, _, labels = trained
    labels = labels.replace(ring=labels.ring._replace(size=jnp.asarray(150, jnp.int32)))
    key = jax.random.key(5)
    whole = validation_losses(state, CONFIG, SPEC, labels, key, CAPACITY)
    np.testing.assert_array_equal(validation_losses(state, CONFIG, SPEC, labels, key, 160), whole)
    train, val = validation_losses(state, CONFIG, SPEC, labels, key, 100)
    rows, _ = ensemble.sample_training_rows(key, jnp.zeros((CAPACITY,), bool), jnp.asarray(150), 100)
    assert int(rows.max()) < 150 and len(set(np.asarray(rows).tolist())) < 100  # drawn with replacement
    expected_train, expected_val = _losses_on_rows(state, labels, rows)
    np.testing.assert_allclose(train, expected_train, rtol=1e-5)
    np.testing.assert_allclose(val, expected_val, rtol=1e-5)
    assert not np.allclose(val, whole[1], rtol=1e-3)


# --- Members written out, not vmapped ------------------------------------------------


def _vmapped(fn, *stacked):
    """The ensemble as it was: every network call vmapped over the member axis."""
    return jax.vmap(fn)(*stacked)


def _ensemble_outputs(state, config, spec, labels, obs, action, key):
    """Predictions, one fit step (new state and losses) and validation losses, traced afresh
    (new functions, so no trace cached under the other way of running the members is reused)."""
    predict = jax.jit(lambda state, obs, action: ensemble.member_returns(state, config, spec, obs, action))
    step = jax.jit(lambda state, labels, key: ensemble.fit(state, config, spec, labels, key, 1))
    losses = jax.jit(lambda state, labels, key: ensemble.validation_losses(state, config, spec, labels, key, 10**6))
    fitted, metrics = step(state, labels, key)
    return {"predicted": predict(state, obs, action), "fitted": fitted, "loss": metrics["loss"],
            "validation": losses(state, labels, key)}


def _atari_labels(key, count, capacity):
    """Random frames, actions and answers for the CNN: stacks of 4 rebuilt from k + 3 frames."""
    k_frames, k_act, k_mu, k_hold = jax.random.split(key, 4)
    labels = empty_labels(ATARI_SPEC, capacity, LENGTH, CONFIG.ensemble_size)
    return labels.replace(
        frames=jax.random.randint(k_frames, labels.frames.shape, 0, 256).astype(jnp.uint8),
        action=jax.random.randint(k_act, labels.action.shape, 0, 2),
        mu=jax.random.bernoulli(k_mu, 0.5, (capacity,)).astype(jnp.float32),
        holdout=jax.random.bernoulli(k_hold, 1 / math.e, (capacity, CONFIG.ensemble_size)),
        ring=labels.ring._replace(size=jnp.asarray(count, jnp.int32)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("network", ["mlp", "cnn"])
def test_members_written_out_match_the_vmapped_ensemble(network, monkeypatch):
    """``over_members`` (each member's call written out in turn) gives what vmapping the members
    gave, on the same parameters and keys: each member's own rows, dropout key and batch
    statistics. The MLP with dropout on; the CNN (dropout and batch norm) on 2-pair minibatches."""
    if network == "mlp":
        config, spec = dataclasses.replace(CONFIG, mlp_dropout=0.5, batch_size=16), SPEC
        labels = toy_labels(jax.random.key(1), 40, capacity=48)
        obs, action, _ = random_pairs(jax.random.key(3), 6)
    else:
        config, spec = dataclasses.replace(CONFIG, batch_size=2), ATARI_SPEC
        labels = _atari_labels(jax.random.key(1), 6, capacity=8)
        obs = labels.observations(jnp.arange(2))
        action = labels.action[:2]
    state = init_ensemble(jax.random.key(0), config, spec)
    state = state._replace(norm_mean=jnp.array([0.1, -0.2, 0.3]), l2=jnp.array([1e-3, 2e-3, 0.0]))
    key = jax.random.key(2)
    written_out = _ensemble_outputs(state, config, spec, labels, obs, action, key)
    with monkeypatch.context() as patch:
        patch.setattr(ensemble, "over_members", _vmapped)
        vmapped = _ensemble_outputs(state, config, spec, labels, obs, action, key)
    assert written_out["predicted"].shape == (3, *action.shape)
    assert jax.tree.structure(written_out) == jax.tree.structure(vmapped)
    theirs_by_path = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(vmapped)}
    largest = {moment: max(float(np.abs(leaf).max()) for name, leaf in theirs_by_path.items() if moment in name)
               for moment in (".mu[", ".nu[")}  # gradients are rounded to the scale of the largest
    for path, ours in jax.tree_util.tree_leaves_with_path(written_out):
        name = jax.tree_util.keystr(path)
        ours, theirs = np.asarray(ours), np.asarray(theirs_by_path[name])
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
        moment = next((moment for moment in largest if moment in name), None)
        if moment:  # Adam's moments: the gradient, and its square
            # A batch-norm bias's gradient sums a channel's every position: on the CNN its rounding
            # reached 8e-4 of the largest gradient on one CPU (under 1e-5 on another), so the bound
            # is 1e-2 of it. Giving every member member 0's keys fails it (both networks).
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-2 * largest[moment], err_msg=name)
        elif name.startswith("['fitted'].params"):
            # Adam's first step is lr * g / (|g| + 1e-8): about lr * sign(g), whatever |g|. A weight
            # whose gradient is zero but for rounding (a hidden unit's bias where the leaky ReLU
            # never changes side shifts every step's reward alike, which the loss ignores) can
            # move by up to lr either way; every other weight must agree at float32 tolerance.
            mu = np.asarray(theirs_by_path[name.replace("['fitted'].params", "['fitted'].opt_state.inner_state[0].mu")])
            real = np.abs(mu) > 1e-4 * largest[".mu["]
            np.testing.assert_allclose(ours[real], theirs[real], rtol=1e-5, atol=1e-6, err_msg=name)
            assert np.all(np.abs(ours - theirs) <= 2 * config.learning_rate * (1 + 1e-5)), name
        else:
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=name)
    # The step moved every member, each its own way.
    moved = jax.tree.leaves(jax.tree.map(lambda new, old: jnp.abs(new - old).reshape(3, -1).max(1),
                                         written_out["fitted"].params, state.params))
    assert np.all(np.max(np.stack(moved), axis=0) > 0)
    members = np.asarray(written_out["predicted"]).reshape(3, -1)
    assert not np.allclose(members[0], members[1]) and not np.allclose(members[1], members[2])


def test_over_members_is_vmap_and_checks_the_member_axis():
    params = {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.array([1.0, 2.0, 3.0])}
    keys = jax.random.split(jax.random.key(0), 3)

    def member(params, key):
        return {"y": params["w"] * params["b"] + jax.random.normal(key, (2,)), "s": params["b"].sum()}

    out = ensemble.over_members(member, params, keys)
    jax.tree.map(np.testing.assert_array_equal, out, jax.vmap(member)(params, keys))
    assert ensemble.over_members(lambda p: {}, params) == {}
    with pytest.raises(ValueError, match="member axis"):
        ensemble.over_members(member, params, jax.random.split(jax.random.key(0), 2))


# --- Networks ------------------------------------------------------------------------


def test_input_standardisation_floors_the_std_of_inputs_that_never_moved(state):
    """A brick the untrained policy never breaks (std 0) scales as std 0.1: breaking it later
    moves the input by 10, not by the thousands a tiny floor gave."""
    moving = np.array([-1.0, 1.0, -1.0, 1.0], np.float32)  # mean 0, std 1
    still = np.ones(4, np.float32)  # std 0
    obs = jnp.asarray(np.stack([moving, still], -1))
    standardised = ensemble.set_input_statistics(state, CONFIG, SPEC, obs)
    np.testing.assert_allclose(standardised.obs_mean, [0.0, 1.0])
    np.testing.assert_allclose(standardised.obs_std, [1.0, 0.1])
    broken = (np.array([0.5, 0.0]) - standardised.obs_mean) / standardised.obs_std
    np.testing.assert_allclose(broken, [0.5, -10.0], rtol=1e-6)


def eight_labels(spec, action_bound: float):
    """Eight labelled pairs of random clips, their actions drawn uniformly in [-action_bound, action_bound]."""
    labels = empty_labels(spec, 8, LENGTH, CONFIG.ensemble_size)
    return labels.replace(frames=jax.random.normal(jax.random.key(2), labels.frames.shape),
                          action=jax.random.uniform(jax.random.key(3), labels.action.shape,
                                                    minval=-action_bound, maxval=action_bound),
                          mu=jnp.ones((8,)), ring=labels.ring._replace(size=jnp.asarray(8, jnp.int32)),
                          holdout=jnp.zeros((8, 3), bool))


def first_losses(state, config, spec, labels) -> np.ndarray:
    """The validation losses of ``labels``' pairs under ``state``'s first member, as fitting reads them."""
    return np.asarray(validation_losses(state, config, spec, labels, jax.random.key(5), 8)[0])


@pytest.mark.slow
def test_clip_actions_decides_the_action_r_hat_reads_when_acting_and_when_fitting():
    """Agents hand r̂ the action as sampled; ``clip_actions`` alone says whether r̂ reads it
    clipped into the bounds: in its rewards and in the losses it is fitted by."""
    spec = dataclasses.replace(SPEC, action_space=Box(-1.0, 1.0, (2,)))
    drawn = jnp.array([[[3.0, -0.5], [-2.0, 0.25]]])  # [1, 2, 2]: one step of two copies, out of bounds
    inside = jnp.clip(drawn, -1.0, 1.0)
    obs = jax.random.normal(jax.random.key(1), (1, 2, 2))
    clipped, sampled = CONFIG, dataclasses.replace(CONFIG, clip_actions=False)
    state = init_ensemble(jax.random.key(0), clipped, spec)  # the same parameters under both
    reward = lambda config, action: np.asarray(member_returns(state, config, spec, obs, action))
    np.testing.assert_array_equal(reward(clipped, drawn), reward(clipped, inside))
    np.testing.assert_array_equal(reward(sampled, inside), reward(clipped, inside))
    assert np.abs(reward(sampled, drawn) - reward(sampled, inside)).min() > 1e-4

    labels = eight_labels(spec, action_bound=3.0)
    in_bounds = labels.replace(action=jnp.clip(labels.action, -1.0, 1.0))
    losses = lambda config, labels: first_losses(state, config, spec, labels)
    np.testing.assert_array_equal(losses(clipped, labels), losses(clipped, in_bounds))
    assert np.abs(losses(sampled, labels) - losses(sampled, in_bounds)).min() > 1e-6


def test_reward_cnn_shapes_batch_stats_and_ignores_action():
    network = reward_network_for(ATARI_SPEC, CONFIG)
    assert isinstance(network, RewardCNN) and isinstance(reward_network_for(SPEC, CONFIG), RewardMLP)
    frames = jax.random.randint(jax.random.key(0), (2, 84, 84, 4), 0, 256).astype(jnp.uint8)
    frames = jnp.concatenate([frames, frames])  # the same two frames, with different actions
    actions = jnp.array([0, 1, 3, 5], jnp.int32)

    @jax.jit
    def run(frames, actions):
        variables = network.init(jax.random.key(1), frames, actions, train=False)
        return variables, network.apply(variables, frames, actions, train=False)

    variables, out = run(frames, actions)
    assert "batch_stats" in variables and out.shape == (4,)
    np.testing.assert_array_equal(out[:2], out[2:])
    init = functools.partial(ensemble.init_ensemble, config=CONFIG, spec=ATARI_SPEC)
    state = jax.eval_shape(init, jax.random.key(0))  # shapes only: no compile
    assert jax.tree.leaves(state.batch_stats)[0].shape[0] == CONFIG.ensemble_size


@pytest.mark.parametrize("bad", [
    dict(ensemble_size=0), dict(random_answer_prob=1.0), dict(random_answer_prob=-0.1),
    dict(validation_fraction=1.0), dict(l2_low=1.5, l2_high=1.5), dict(batch_size=0),
    dict(l2_factor=1.0), dict(learning_rate=0.0), dict(mlp_dropout=1.0), dict(loss="mse"),
    dict(hidden=()), dict(normalized_std=-1.0), dict(input_std_floor=0.0),
])
def test_bad_config_values_raise(bad):
    with pytest.raises(ConfigError):
        RewardModelConfig(**bad)


def test_r_hat_without_the_action_pays_every_action_alike_and_is_fitted_without_it():
    """``reads_action=False``: r̂ of a step is the same whatever the action, and the losses it is
    fitted by do not move with the labels' actions; reading it, both do."""
    spec = dataclasses.replace(SPEC, action_space=Box(-1.0, 1.0, (2,)))
    blind = dataclasses.replace(CONFIG, reads_action=False)
    state = init_ensemble(jax.random.key(0), CONFIG, spec)
    obs = jax.random.normal(jax.random.key(1), (1, 2, 2))
    one, other = jnp.full((1, 2, 2), 0.5), jnp.full((1, 2, 2), -0.75)
    reward = lambda config, action: np.asarray(member_returns(state, config, spec, obs, action))
    np.testing.assert_array_equal(reward(blind, one), reward(blind, other))
    assert np.abs(reward(CONFIG, one) - reward(CONFIG, other)).min() > 1e-4

    labels = eight_labels(spec, action_bound=1.0)
    still = labels.replace(action=jnp.zeros_like(labels.action))
    losses = lambda config, labels: first_losses(state, config, spec, labels)
    np.testing.assert_array_equal(losses(blind, labels), losses(blind, still))
    assert np.abs(losses(CONFIG, labels) - losses(CONFIG, still)).min() > 1e-6
