"""Every op in rlhf_jax.ops pinned against a plain NumPy loop or a value worked out by hand."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import ops

T, B, A = 7, 3, 4
GAMMA = 0.9


def random_rollout(seed=0):
    """Time-major rewards, discounts with episode ends mid-sequence, values and a bootstrap."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    dones = np.zeros((T, B), np.float32)
    dones[2, 0] = dones[5, 1] = dones[0, 2] = dones[6, 2] = 1.0
    discounts = GAMMA * (1.0 - dones)
    values = rng.normal(size=(T, B)).astype(np.float32)
    bootstrap = rng.normal(size=(B,)).astype(np.float32)
    return rewards, discounts, values, bootstrap


def numpy_n_step(rewards, discounts, bootstrap):
    out, ret = np.zeros_like(rewards), bootstrap.copy()
    for t in reversed(range(len(rewards))):
        ret = rewards[t] + discounts[t] * ret
        out[t] = ret
    return out


def numpy_lambda(rewards, discounts, values, bootstrap, lam):
    next_values = np.concatenate([values[1:], bootstrap[None]])
    out, ret = np.zeros_like(rewards), bootstrap.copy()
    for t in reversed(range(len(rewards))):
        ret = rewards[t] + discounts[t] * ((1 - lam) * next_values[t] + lam * ret)
        out[t] = ret
    return out


def numpy_gae(rewards, discounts, values, bootstrap, lam):
    next_values = np.concatenate([values[1:], bootstrap[None]])
    out, adv = np.zeros_like(rewards), np.zeros_like(bootstrap)
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + discounts[t] * next_values[t] - values[t]
        adv = delta + discounts[t] * lam * adv
        out[t] = adv
    return out


# ---------------------------------------------------------------- returns


def test_n_step_returns_matches_numpy_with_done_masks():
    rewards, discounts, _, bootstrap = random_rollout()
    got = ops.n_step_returns(rewards, discounts, bootstrap)
    np.testing.assert_allclose(got, numpy_n_step(rewards, discounts, bootstrap), rtol=1e-5, atol=1e-6)


def test_n_step_returns_by_hand():
    # Episode ends after step 1: R_1 = r_1 = 2; R_0 = 1 + 0.5 * 2 = 2; R_2 = 3 + 0.5 * 10 = 8.
    got = ops.n_step_returns(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 0.0, 0.5]), jnp.array(10.0))
    np.testing.assert_allclose(got, [2.0, 2.0, 8.0])


def test_n_step_returns_under_jit_and_vmap_over_batch():
    rewards, discounts, _, bootstrap = random_rollout(1)
    # vmap over the batch axis (axis 1 of time-major inputs): each call sees [T] and [].
    f = jax.jit(jax.vmap(ops.n_step_returns, in_axes=(1, 1, 0), out_axes=1))
    np.testing.assert_allclose(
        f(rewards, discounts, bootstrap), numpy_n_step(rewards, discounts, bootstrap), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("lam", [0.0, 0.7, 1.0])
def test_lambda_returns_matches_numpy(lam):
    rewards, discounts, values, bootstrap = random_rollout(2)
    got = ops.lambda_returns(rewards, discounts, values, bootstrap, lam)
    want = numpy_lambda(rewards, discounts, values, bootstrap, lam)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lambda_returns_limits():
    rewards, discounts, values, bootstrap = random_rollout(3)
    next_values = np.concatenate([values[1:], bootstrap[None]])
    one_step = rewards + discounts * next_values
    np.testing.assert_allclose(
        ops.lambda_returns(rewards, discounts, values, bootstrap, 0.0), one_step, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        ops.lambda_returns(rewards, discounts, values, bootstrap, 1.0),
        ops.n_step_returns(rewards, discounts, bootstrap),
        rtol=1e-5,
        atol=1e-6,
    )


def test_lambda_one_is_monte_carlo_when_the_episode_ends():
    rewards = np.array([1.0, 2.0, 4.0], np.float32)
    discounts = np.array([0.5, 0.5, 0.0], np.float32)  # terminal after the last step
    values = np.array([100.0, -100.0, 7.0], np.float32)  # ignored at lambda = 1
    got = ops.lambda_returns(rewards, discounts, values, np.float32(55.0), 1.0)
    np.testing.assert_allclose(got, [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0])


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_numpy_and_lambda_returns(lam):
    rewards, discounts, values, bootstrap = random_rollout(4)
    got = ops.gae_advantages(rewards, discounts, values, bootstrap, lam)
    np.testing.assert_allclose(got, numpy_gae(rewards, discounts, values, bootstrap, lam), rtol=1e-5, atol=1e-5)
    returns = ops.lambda_returns(rewards, discounts, values, bootstrap, lam)
    np.testing.assert_allclose(got, returns - values, rtol=1e-5, atol=1e-5)


def test_returns_reject_bad_shapes():
    rewards, discounts, values, bootstrap = random_rollout()
    with pytest.raises(AssertionError):  # bootstrap must be [B], not [T, B]
        ops.n_step_returns(rewards, discounts, values)
    with pytest.raises(AssertionError):  # rewards and discounts must match
        ops.n_step_returns(rewards, discounts[:-1], bootstrap)
    with pytest.raises(AssertionError):
        ops.gae_advantages(rewards, discounts, values[:, :2], bootstrap, 0.9)


# ---------------------------------------------------------------- episode ends


def test_fold_time_limits_by_hand():
    # gamma 0.5; step 1 terminates, step 2 is cut by the time limit with V(final_obs_2) = 8.
    # r' = [1, 2, 3 + 0.5 * 8, 4], discount = [0.5, 0, 0, 0.5]; the other final values (NaN
    # included: a diverged copy's) are never read.
    reward = jnp.array([1.0, 2.0, 3.0, 4.0])
    terminated = jnp.array([False, True, False, False])
    truncated = jnp.array([False, False, True, False])
    final_value = jnp.array([jnp.nan, 200.0, 8.0, 300.0])
    folded, discount = ops.fold_time_limits(reward, terminated, truncated, final_value, 0.5)
    np.testing.assert_allclose(folded, [1.0, 2.0, 7.0, 4.0])
    np.testing.assert_allclose(discount, [0.5, 0.0, 0.0, 0.5])
    # Through n-step returns with V(s_T) = 10: R_3 = 4 + 5 = 9, R_2 = 7 (nothing flows back
    # across the cut), R_1 = 2 (terminal), R_0 = 1 + 0.5 * 2 = 2.
    np.testing.assert_allclose(ops.n_step_returns(folded, discount, jnp.array(10.0)), [2.0, 2.0, 7.0, 9.0])
    # A target: no gradient reaches the value of the final observation.
    grad = jax.grad(lambda v: ops.fold_time_limits(reward, terminated, truncated, v, 0.5)[0].sum())(final_value)
    np.testing.assert_array_equal(grad, 0.0)
    with pytest.raises(AssertionError):
        ops.fold_time_limits(reward, terminated, truncated[:3], final_value, 0.5)


def test_loss_mask_and_masked_mean_by_hand():
    mask = ops.loss_mask(jnp.array([[False, True], [False, False]]))
    assert mask.dtype == jnp.float32
    np.testing.assert_array_equal(mask, [[1.0, 0.0], [1.0, 1.0]])
    # (1 + 3 + 4) / 3: the reset step's 100 carries nothing.
    np.testing.assert_allclose(ops.masked_mean(jnp.array([[1.0, 100.0], [3.0, 4.0]]), mask), 8.0 / 3.0)
    assert float(ops.masked_mean(jnp.ones(3), jnp.zeros(3))) == 0.0  # nothing to average


def test_actor_critic_loss_masks_reset_steps():
    # Two steps, the second a reset step: every part is the first step's alone.
    log_pi_a, entropy = jnp.array([-1.0, -5.0]), jnp.array([0.5, 9.0])
    values, returns = jnp.array([1.0, 0.0]), jnp.array([3.0, 50.0])
    loss, parts = ops.actor_critic_loss(log_pi_a, entropy, values, returns, entropy_coef=0.1, value_coef=1.0,
                                        mask=ops.loss_mask(jnp.array([False, True])))
    np.testing.assert_allclose(parts["policy_loss"], -(-1.0 * 2.0))
    np.testing.assert_allclose(parts["value_loss"], 0.5 * 2.0**2)
    np.testing.assert_allclose(parts["entropy"], 0.5)
    np.testing.assert_allclose(loss, 2.0 - 0.05 + 2.0)
    grad = jax.grad(lambda v: ops.actor_critic_loss(log_pi_a, entropy, v, returns,
                                                    mask=jnp.array([1.0, 0.0]))[0])(values)
    assert float(grad[1]) == 0.0


# ---------------------------------------------------------------- Q-learning


def test_q_learning_target_with_a_terminal_transition():
    reward = np.array([1.0, -1.0], np.float32)
    discount = np.array([0.99, 0.0], np.float32)  # the second transition ends the episode
    q_next = np.array([[0.5, 2.0, -1.0], [10.0, 20.0, 30.0]], np.float32)
    np.testing.assert_allclose(ops.q_learning_target(reward, discount, q_next), [1.0 + 0.99 * 2.0, -1.0])


def test_double_q_learning_target():
    reward = np.array([1.0, 0.0], np.float32)
    discount = np.array([0.5, 0.5], np.float32)
    online = np.array([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]], np.float32)  # picks actions 1 and 0
    target = np.array([[9.0, 2.0, 7.0], [4.0, 8.0, 8.0]], np.float32)
    np.testing.assert_allclose(ops.double_q_learning_target(reward, discount, online, target), [2.0, 2.0])


def test_q_learning_target_matches_numpy_and_vmaps():
    rng = np.random.default_rng(5)
    reward, discount = rng.normal(size=B).astype(np.float32), np.float32([0.9, 0.0, 0.9])
    q_next = rng.normal(size=(B, A)).astype(np.float32)
    want = reward + discount * q_next.max(-1)
    np.testing.assert_allclose(ops.q_learning_target(reward, discount, q_next), want, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(ops.q_learning_target)(reward, discount, q_next), want, rtol=1e-6)


def test_huber_loss_by_hand():
    np.testing.assert_allclose(ops.huber_loss(jnp.array([0.5, -0.5, 3.0, -3.0])), [0.125, 0.125, 2.5, 2.5])
    np.testing.assert_allclose(ops.huber_loss(jnp.array(3.0), delta=2.0), 2.0 * (3.0 - 1.0))
    # The gradient is the clipped error, as DQN's error clipping.
    grads = jax.vmap(jax.grad(ops.huber_loss))(jnp.array([0.5, -0.5, 3.0, -3.0]))
    np.testing.assert_allclose(grads, [0.5, -0.5, 1.0, -1.0])


def test_q_learning_loss_matches_numpy_and_stops_target_gradient():
    rng = np.random.default_rng(6)
    q = rng.normal(size=(B, A)).astype(np.float32) * 3
    actions = np.array([0, 3, 1], np.int32)
    targets = rng.normal(size=B).astype(np.float32) * 3
    err = targets - q[np.arange(B), actions]
    huber = np.where(np.abs(err) <= 1, 0.5 * err**2, np.abs(err) - 0.5)
    np.testing.assert_allclose(ops.q_learning_loss(q, actions, targets), huber.mean(), rtol=1e-6)
    d_targets = jax.grad(ops.q_learning_loss, argnums=2)(q, actions, targets)
    np.testing.assert_array_equal(d_targets, np.zeros(B))


def test_q_learning_ops_reject_bad_shapes():
    q = jnp.zeros((B, A))
    with pytest.raises(AssertionError):  # Q-values need an action axis
        ops.q_learning_target(jnp.zeros(B), jnp.zeros(B), jnp.zeros(B))
    with pytest.raises(AssertionError):  # batch sizes differ
        ops.q_learning_target(jnp.zeros(B), jnp.zeros(B), jnp.zeros((B + 1, A)))
    with pytest.raises(AssertionError):
        ops.q_learning_loss(q, jnp.zeros((B, 1), jnp.int32), jnp.zeros(B))
    with pytest.raises(AssertionError):  # actions must be integers
        ops.q_learning_loss(q, jnp.zeros(B), jnp.zeros(B))


# ---------------------------------------------------------------- policy gradient


def test_policy_gradient_loss_and_entropy_by_hand():
    # Two actions, probabilities (1/4, 3/4): logits (0, log 3).
    logits = jnp.array([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    actions = jnp.array([0, 1])
    advantages = jnp.array([2.0, -1.0])
    want = -0.5 * (math.log(0.25) * 2.0 + math.log(0.75) * -1.0)
    np.testing.assert_allclose(ops.policy_gradient_loss(logits, actions, advantages), want, rtol=1e-6)
    # Normalised log-probabilities give the same loss.
    log_probs = jnp.log(jnp.array([[0.25, 0.75], [0.25, 0.75]]))
    np.testing.assert_allclose(ops.policy_gradient_loss(log_probs, actions, advantages), want, rtol=1e-6)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(ops.entropy(logits), [h, h], rtol=1e-6)
    np.testing.assert_allclose(ops.entropy(jnp.zeros(4)), math.log(4.0), rtol=1e-6)  # uniform
    # No gradient flows into the advantages.
    np.testing.assert_array_equal(jax.grad(ops.policy_gradient_loss, argnums=2)(logits, actions, advantages), 0.0)


def test_policy_gradient_loss_gradient_by_hand():
    # d/dlogits of -log softmax(logits)_a * A is -(onehot(a) - pi) * A; loss is a mean over 1 sample.
    logits = jnp.array([[0.0, math.log(3.0)]])
    grad = jax.grad(ops.policy_gradient_loss)(logits, jnp.array([0]), jnp.array([2.0]))
    np.testing.assert_allclose(grad, [[-(1 - 0.25) * 2.0, -(0 - 0.75) * 2.0]], rtol=1e-6)


def test_actor_critic_loss_parts():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(T, B, A)).astype(np.float32)
    actions = rng.integers(0, A, size=(T, B)).astype(np.int32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    returns = rng.normal(size=(T, B)).astype(np.float32)

    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_pi_a = np.take_along_axis(log_probs, actions[..., None], -1)[..., 0]
    ent = -(np.exp(log_probs) * log_probs).sum(-1)
    pg = -np.mean(log_pi_a * (returns - values))
    vl = 0.5 * np.mean((returns - values) ** 2)
    want = pg - 0.01 * ent.mean() + 0.5 * vl

    loss, parts = ops.actor_critic_loss(
        ops.categorical_log_prob(logits, actions), ops.entropy(logits), values, returns,
        entropy_coef=0.01, value_coef=0.5,
    )
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(parts["policy_loss"], pg, rtol=1e-5)
    np.testing.assert_allclose(parts["value_loss"], vl, rtol=1e-5)
    np.testing.assert_allclose(parts["entropy"], ent.mean(), rtol=1e-5)

    # The value gradient is value_coef * (V - R) / N only: no path through the advantage.
    def loss_of_values(v):
        return ops.actor_critic_loss(jnp.asarray(log_pi_a), jnp.asarray(ent), v, returns, value_coef=0.5)[0]

    np.testing.assert_allclose(jax.grad(loss_of_values)(values), 0.5 * (values - returns) / values.size, rtol=1e-5)


def test_actor_critic_loss_with_given_advantages_and_scalar_entropy():
    log_pi_a = jnp.array([-1.0, -2.0])
    values, returns = jnp.array([0.0, 1.0]), jnp.array([1.0, 1.0])
    loss, parts = ops.actor_critic_loss(
        log_pi_a, jnp.array(1.5), values, returns, entropy_coef=0.1, value_coef=1.0, advantages=jnp.array([3.0, 1.0])
    )
    np.testing.assert_allclose(parts["policy_loss"], -0.5 * (-3.0 - 2.0))
    np.testing.assert_allclose(parts["entropy"], 1.5)
    np.testing.assert_allclose(loss, 2.5 - 0.15 + 0.25)
    with pytest.raises(AssertionError):
        ops.actor_critic_loss(log_pi_a, jnp.zeros(2), values, jnp.zeros(3))


def test_gaussian_log_prob_and_entropy_by_hand():
    rng = np.random.default_rng(8)
    mean = rng.normal(size=(B, 2)).astype(np.float32)
    log_std = np.array([0.3, -0.5], np.float32)  # state-independent, broadcast over the batch
    action = rng.normal(size=(B, 2)).astype(np.float32)
    std = np.exp(log_std)
    density = np.exp(-((action - mean) ** 2) / (2 * std**2)) / (std * np.sqrt(2 * np.pi))
    want = np.log(density).sum(-1)
    np.testing.assert_allclose(ops.gaussian_log_prob(mean, log_std, action), want, rtol=1e-5)
    want_h = sum(0.5 * math.log(2 * math.pi * math.e * s**2) for s in std)
    np.testing.assert_allclose(ops.gaussian_entropy(log_std), want_h, rtol=1e-5)
    np.testing.assert_allclose(ops.gaussian_entropy(np.broadcast_to(log_std, (B, 2))), [want_h] * B, rtol=1e-5)
    with pytest.raises(AssertionError):  # action dimensions differ
        ops.gaussian_log_prob(mean, log_std, action[:, :1])
    with pytest.raises(AssertionError):  # the entropy needs an action axis
        ops.gaussian_entropy(jnp.array(0.0))


# ---------------------------------------------------------------- exploration and schedules


def test_epsilon_greedy_zero_is_greedy():
    q = jax.random.normal(jax.random.key(0), (64, A))
    actions = ops.epsilon_greedy(jax.random.key(1), q, 0.0)
    np.testing.assert_array_equal(actions, jnp.argmax(q, -1))
    assert actions.dtype == jnp.int32


def test_epsilon_greedy_one_is_uniform():
    n = 20_000
    q = jnp.tile(jnp.arange(A, dtype=jnp.float32), (n, 1))  # greedy action would always be A-1
    actions = np.asarray(ops.epsilon_greedy(jax.random.key(2), q, 1.0))
    counts = np.bincount(actions, minlength=A)
    # Each count is Binomial(n, 1/A): sd = sqrt(n p (1-p)) ~ 61; allow 5 sd.
    sd = math.sqrt(n * (1 / A) * (1 - 1 / A))
    assert np.all(np.abs(counts - n / A) < 5 * sd), counts


def test_epsilon_greedy_per_environment_epsilon_under_jit():
    q = jnp.tile(jnp.arange(A, dtype=jnp.float32), (2, 1))
    eps = jnp.array([0.0, 1.0])
    keys = jax.random.split(jax.random.key(3), 2000)
    actions = jax.jit(jax.vmap(ops.epsilon_greedy, in_axes=(0, None, None)))(keys, q, eps)
    assert np.all(actions[:, 0] == A - 1)
    assert 0.15 < np.mean(actions[:, 1] == A - 1) < 0.35  # 1/A = 0.25
    with pytest.raises(AssertionError):
        ops.epsilon_greedy(jax.random.key(0), jnp.array(1.0), 0.1)


def test_linear_schedule_endpoints_and_clamp():
    eps = ops.linear_schedule(1.0, 0.1, 1000)
    np.testing.assert_allclose(eps(0), 1.0)
    np.testing.assert_allclose(eps(500), 0.55, rtol=1e-6)
    np.testing.assert_allclose(eps(1000), 0.1, rtol=1e-6)
    np.testing.assert_allclose(eps(10_000), 0.1, rtol=1e-6)  # held at the end
    np.testing.assert_allclose(eps(-5), 1.0)  # clamped below too
    counts = jnp.array([0, 250, 2000], jnp.int32)
    np.testing.assert_allclose(jax.jit(eps)(counts), [1.0, 0.775, 0.1], rtol=1e-6)
    with pytest.raises(ValueError):
        ops.linear_schedule(1.0, 0.0, 0)


# ---------------------------------------------------------------- shuffles


@pytest.mark.parametrize("n", [1, 7, 632, 5056])
def test_permutation_is_the_one_jax_draws(n):
    """The same permutation as ``jax.random.permutation`` for the same key (their 32-bit sort
    keys do not collide at these sizes), under jit and vmap, 32-bit, with x64 left off."""
    keys = jax.random.split(jax.random.PRNGKey(n), 8)
    ours = jax.jit(jax.vmap(lambda k: ops.permutation(k, n)))(keys)
    theirs = jax.vmap(lambda k: jax.random.permutation(k, n))(keys)
    assert ours.dtype == jnp.int32 and not jax.config.jax_enable_x64
    np.testing.assert_array_equal(ours, theirs)


def test_permutation_of_many_is_a_uniform_shuffle():
    """Past a million elements ties between sort keys happen: still every element once, and
    each position's element uniform (the mean position of element 0 over 400 draws of 5)."""
    big = np.asarray(jax.jit(lambda k: ops.permutation(k, 2_000_000))(jax.random.PRNGKey(0)))
    np.testing.assert_array_equal(np.sort(big), np.arange(2_000_000))
    draws = np.asarray(jax.jit(jax.vmap(lambda k: ops.permutation(k, 5)))(jax.random.split(jax.random.PRNGKey(1), 400)))
    where_zero = np.argmax(draws == 0, axis=1)
    assert abs(where_zero.mean() - 2.0) < 0.25  # uniform over 0..4: mean 2, std of the mean 0.07
    assert np.bincount(where_zero, minlength=5).min() > 50  # 80 expected in each


def test_running_moments_of_batches_are_those_of_everything_seen():
    """Three batches merged one by one give the NumPy mean and variance of all their rows; the
    start's count of 1e-4 moves them by less than the tolerance."""
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc, scale, size=(n, 4, 3)) for loc, scale, n in ((5.0, 2.0, 7), (-1.0, 0.5, 11), (3.0, 4.0, 2))]
    moments = ops.init_moments((3,))
    for batch in batches:
        moments = jax.jit(ops.merge_moments)(moments, jnp.asarray(batch, jnp.float32))
    rows = np.concatenate([b.reshape(-1, 3) for b in batches])
    np.testing.assert_allclose(moments.mean, rows.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(moments.var, rows.var(0), rtol=1e-4)
    assert float(moments.count) == pytest.approx(len(rows), abs=1e-3)


def test_standardize_by_hand():
    """(x - mean) / std, with the std floored at 0.1 and the result clipped to [-5, 5]."""
    moments = ops.Moments(jnp.array([1.0, 0.0, 2.0]), jnp.array([4.0, 1e-6, 0.25]), jnp.asarray(10.0))
    x = jnp.array([[5.0, 0.2, 2.5], [1.0, -3.0, -10.0]])
    np.testing.assert_allclose(ops.standardize(moments, x), [[2.0, 2.0, 1.0], [0.0, -5.0, -5.0]], rtol=1e-6)
