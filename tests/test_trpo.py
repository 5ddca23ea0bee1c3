"""TRPO: its trust-region maths against NumPy, its returns at episode ends, and learning Pendulum."""
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from rlhf_jax import ops
from rlhf_jax.agents import trpo
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.evaluation import evaluate

PENDULUM_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "trpo_pendulum.yaml"


def random_spd(n, seed, eigenvalues=None):
    """A random symmetric positive-definite matrix ``Q diag(eigenvalues) Q^T``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    if eigenvalues is None:
        eigenvalues = rng.uniform(0.5, 5.0, size=n)
    return (q * eigenvalues) @ q.T


# --- conjugate gradient -------------------------------------------------------------------


def test_conjugate_gradient_solves_a_random_spd_system():
    n = 12
    a = random_spd(n, seed=0)
    b = np.random.default_rng(1).normal(size=n)
    x = ops.conjugate_gradient(lambda v: jnp.asarray(a, jnp.float32) @ v, jnp.asarray(b, jnp.float32), num_iterations=n)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-3, atol=1e-4)


def test_conjugate_gradient_is_exact_after_as_many_iterations_as_distinct_eigenvalues():
    # Conjugate gradient's defining property: with k distinct eigenvalues it is exact
    # after k iterations, and one iteration short of that it is not.
    a = random_spd(12, seed=2, eigenvalues=np.repeat([1.0, 3.0, 7.0], 4))
    b = np.random.default_rng(3).normal(size=12)
    matvec = lambda v: jnp.asarray(a, jnp.float32) @ v
    exact = np.linalg.solve(a, b)
    np.testing.assert_allclose(ops.conjugate_gradient(matvec, jnp.asarray(b, jnp.float32), 3), exact, rtol=1e-4, atol=1e-5)
    assert np.abs(ops.conjugate_gradient(matvec, jnp.asarray(b, jnp.float32), 2) - exact).max() > 1e-2
    # Iterations after convergence leave the solution where it is (no 0 / 0).
    np.testing.assert_allclose(ops.conjugate_gradient(matvec, jnp.asarray(b, jnp.float32), 10), exact, rtol=1e-4, atol=1e-5)


# --- Fisher-vector products ---------------------------------------------------------------


def tiny_policy(action_space):
    """A policy network with a handful of parameters, its flat parameters and observations."""
    spec = EnvSpec("tiny", "test", 1, (3,), "float32", action_space, 30.0, 10)
    config = trpo.TRPOConfig(policy_hidden=(4,), log_std_init=-0.3)
    policy = trpo.Policy(spec, config)

    @jax.jit  # one compiled call: op by op, these few lines take seconds on 2 cores
    def init():
        obs = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
        params = policy.init(jax.random.PRNGKey(1), obs)
        # Move every parameter off its initial value (the zero biases, the shared log-std).
        params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.PRNGKey(2), p.shape), params)
        return params, obs

    params, obs = init()
    flat, unravel = ravel_pytree(params)
    return policy, flat, unravel, obs


@pytest.mark.parametrize("space", [Box(-1.0, 1.0, (2,)), Discrete(3)], ids=["gaussian", "categorical"])
def test_fisher_vector_product_equals_the_explicit_hessian_of_the_kl(space):
    policy, flat, unravel, obs = tiny_policy(space)
    continuous = isinstance(space, Box)
    old = jax.lax.stop_gradient(policy.apply(unravel(flat), obs))
    mean_kl = lambda theta: trpo._kl(old, policy.apply(unravel(theta), obs), continuous).mean()

    hessian = np.asarray(jax.jit(jax.hessian(mean_kl))(flat))  # the whole P x P matrix, only for the test
    assert hessian.shape == (flat.size, flat.size)
    vectors = jax.random.normal(jax.random.PRNGKey(3), (4, flat.size))
    outputs = lambda theta: policy.apply(unravel(theta), obs)
    kl_from = lambda old, new: trpo._kl(old, new, continuous).mean()

    def products(damping):
        network = ops.linearize(outputs, flat)
        return network.outputs, jax.vmap(ops.fisher_vector_product(network, kl_from, damping))(vectors)

    dist, undamped = jax.jit(lambda: products(0.0))()
    _, damped = jax.jit(lambda: products(0.1))()
    np.testing.assert_allclose(undamped, vectors @ hessian, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(damped, vectors @ hessian + 0.1 * vectors, rtol=1e-4, atol=1e-5)
    # The linearisation hands back the old policy's distribution, which it computes anyway.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), dist, old)


def test_the_linearised_network_applies_its_jacobian_and_its_transpose():
    """``linearize``'s two maps are J v and J^T u with J the network's explicit Jacobian; TRPO's
    policy gradient is the pull-back of the surrogate's gradient in the distribution's parameters."""
    policy, flat, unravel, obs = tiny_policy(Box(-1.0, 1.0, (2,)))
    outputs = lambda theta: jnp.concatenate(policy.apply(unravel(theta), obs), axis=-1)  # [S, 4]
    jacobian = np.asarray(jax.jit(jax.jacobian(outputs))(flat), np.float64)  # [S, 4, P]
    v = jax.random.normal(jax.random.PRNGKey(5), flat.shape)
    u = jax.random.normal(jax.random.PRNGKey(6), (obs.shape[0], 4))

    def maps(v, u):
        network = ops.linearize(outputs, flat)
        return network.outputs, network.push_forward(v), network.pull_back(u)

    value, forward, back = jax.jit(maps)(v, u)
    np.testing.assert_allclose(value, outputs(flat), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(forward, jacobian @ np.asarray(v, np.float64), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(back, np.einsum("skp,sk->p", jacobian, np.asarray(u, np.float64)), rtol=1e-4, atol=1e-6)


def test_the_kl_hessian_is_the_fisher_information_of_the_gaussian_policy():
    # Independently of automatic second derivatives: F = mean_s J_s^T M J_s, with J_s the
    # Jacobian of (mean, log_std) at state s and M = diag(1 / sigma^2, 2) the Fisher
    # information of a Gaussian in those coordinates.
    policy, flat, unravel, obs = tiny_policy(Box(-1.0, 1.0, (2,)))
    old = jax.lax.stop_gradient(policy.apply(unravel(flat), obs))

    outputs = lambda theta: jnp.concatenate(policy.apply(unravel(theta), obs), axis=-1)  # [S, 4]
    jacobian = np.asarray(jax.jit(jax.jacobian(outputs))(flat), np.float64)  # [S, 4, P]
    sigma2 = np.exp(2.0 * np.asarray(old[1], np.float64))  # [S, 2]
    fisher = np.zeros((flat.size, flat.size))
    for s in range(obs.shape[0]):
        m = np.diag(np.concatenate([1.0 / sigma2[s], [2.0, 2.0]]))
        fisher += jacobian[s].T @ m @ jacobian[s] / obs.shape[0]
    v = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (flat.size,)))
    kl_from = lambda old, new: trpo._kl(old, new, True).mean()
    network = lambda: ops.linearize(lambda theta: policy.apply(unravel(theta), obs), flat)
    fvp = jax.jit(lambda v: ops.fisher_vector_product(network(), kl_from)(v))
    np.testing.assert_allclose(fvp(jnp.asarray(v, jnp.float32)), fisher @ v, rtol=1e-3, atol=1e-5)


# --- step size and line search ------------------------------------------------------------


def test_max_step_puts_the_quadratic_kl_on_the_bound():
    a = random_spd(6, seed=5)
    s = np.random.default_rng(6).normal(size=6)
    step = np.asarray(ops.max_step(jnp.asarray(s, jnp.float32), jnp.asarray(a @ s, jnp.float32), 0.01))
    np.testing.assert_allclose(0.5 * step @ a @ step, 0.01, rtol=1e-4)
    np.testing.assert_allclose(step / np.linalg.norm(step), s / np.linalg.norm(s), rtol=1e-5)


def numpy_line_search(surrogate, kl, x, full_step, max_kl, num_steps, decay):
    """The first fraction decay^k that keeps the KL in bounds and improves the surrogate."""
    for k in range(num_steps):
        candidate = x + decay**k * full_step
        if kl(candidate) <= max_kl and surrogate(candidate) > surrogate(x):
            return decay**k
    return 0.0


def test_the_line_search_never_accepts_a_step_that_breaks_the_kl_bound():
    max_kl, trials, n = 0.01, 64, 5
    rng = np.random.default_rng(7)
    a = np.stack([random_spd(n, seed=100 + i) for i in range(trials)])
    x0, g = rng.normal(size=(trials, n)), rng.normal(size=(trials, n))
    quartic = rng.uniform(0.0, 50.0, trials)  # how far the true KL is from its quadratic model
    curvature = rng.uniform(0.0, 20.0, trials)  # how soon the surrogate turns down
    # Natural-gradient steps sized for the quadratic model, then made up to 3000 times too
    # long (1000 > 2^9: some cannot be shrunk enough in 10 tries), or pointed the wrong way.
    direction = np.linalg.solve(a, g[..., None])[..., 0]
    edge = np.sqrt(2 * max_kl / np.einsum("ti,tij,tj->t", direction, a, direction))
    scale = np.exp(rng.uniform(np.log(0.5), np.log(3000.0), trials)) * np.where(rng.random(trials) < 0.2, -1, 1)
    full_step = (edge * scale)[:, None] * direction

    # A KL that grows faster than its quadratic model, and a concave surrogate.
    def kl(x, a, x0, quartic, xp=np):
        d = x - x0
        return 0.5 * d @ a @ d + quartic * xp.sum(d**2) ** 2

    def surrogate(x, x0, g, curvature, xp=np):
        d = x - x0
        return g @ d - 0.5 * curvature * xp.sum(d**2)

    def search(a, x0, g, quartic, curvature, full_step):
        # L(theta_old) = 3, so that the gain reported is not L itself.
        evaluate = lambda x: (3.0 + surrogate(x, x0, g, curvature, jnp), kl(x, a, x0, quartic, jnp))
        return ops.backtracking_line_search(evaluate, x0, full_step, max_kl, 10, 0.5)

    f32 = lambda x: jnp.asarray(x, jnp.float32)
    xs, fractions, gains, kls = jax.jit(jax.vmap(search))(*map(f32, (a, x0, g, quartic, curvature, full_step)))
    for i in range(trials):
        x = np.asarray(xs[i], np.float64)
        assert kl(x, a[i], x0[i], quartic[i]) <= max_kl * (1 + 1e-4)
        # What it reports is measured at the step it took (0 and 0 where it stayed put).
        np.testing.assert_allclose(float(kls[i]), kl(x, a[i], x0[i], quartic[i]), rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(float(gains[i]), surrogate(x, x0[i], g[i], curvature[i]), rtol=1e-3, atol=1e-6)
        expected = numpy_line_search(lambda x: surrogate(x, x0[i], g[i], curvature[i]),
                                     lambda x: kl(x, a[i], x0[i], quartic[i]), x0[i], full_step[i], max_kl, 10, 0.5)
        np.testing.assert_allclose(float(fractions[i]), expected)
        np.testing.assert_allclose(x, x0[i] + expected * full_step[i], rtol=1e-5, atol=1e-5)
    accepted = np.asarray(fractions) > 0
    assert 0 < accepted.sum() < trials  # the trials include both accepted and refused steps
    assert len(set(np.asarray(fractions)[accepted].tolist())) > 3  # and steps shrunk by various amounts


def test_the_line_search_stays_put_when_every_step_makes_things_worse():
    x0 = jnp.zeros(3)
    evaluate = lambda x: (-jnp.sum(x), 0.5 * jnp.sum(x**2))  # the step direction lowers the surrogate
    x, fraction, gain, kl = ops.backtracking_line_search(evaluate, x0, jnp.ones(3), 0.01)
    assert float(fraction) == 0.0 and np.all(np.asarray(x) == 0.0)
    assert float(gain) == 0.0 and float(kl) == 0.0


# --- KL divergences -------------------------------------------------------------------------


def test_gaussian_kl_against_numerical_integration():
    mean_p, log_std_p = np.array([0.3, -1.0]), np.array([-0.2, 0.4])
    mean_q, log_std_q = np.array([-0.5, -0.6]), np.array([0.1, 0.0])
    grid = np.linspace(-12.0, 12.0, 200_001)
    expected = 0.0
    for d in range(2):
        log_p = -0.5 * ((grid - mean_p[d]) / np.exp(log_std_p[d])) ** 2 - log_std_p[d] - 0.5 * np.log(2 * np.pi)
        log_q = -0.5 * ((grid - mean_q[d]) / np.exp(log_std_q[d])) ** 2 - log_std_q[d] - 0.5 * np.log(2 * np.pi)
        expected += np.trapezoid(np.exp(log_p) * (log_p - log_q), grid)
    kl = ops.gaussian_kl(*(jnp.asarray(x, jnp.float32) for x in (mean_p, log_std_p, mean_q, log_std_q)))
    np.testing.assert_allclose(kl, expected, rtol=1e-5)


@pytest.mark.parametrize("log_std", [-3.0, 0.0, 10.0, 14.5, 16.0, 20.0])
def test_gaussian_kl_curvature_stays_that_of_the_distribution_at_any_width(log_std):
    """TRPO's Fisher is the KL's Hessian at q = p: 1 / sigma^2 in the mean and 2 in the log-std,
    whatever the width. A policy widened past the action box (a log-std of 14.5 and more, as the
    entropy bonus drives some) once got -2 in float32, and froze."""
    mean, log_std_p = jnp.zeros(1), jnp.full(1, log_std, jnp.float32)
    in_log_std = jax.hessian(lambda q: ops.gaussian_kl(mean, log_std_p, mean, q))(log_std_p)
    in_mean = jax.hessian(lambda m: ops.gaussian_kl(mean, log_std_p, m, log_std_p))(mean)
    np.testing.assert_allclose(np.asarray(in_log_std).ravel(), [2.0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(in_mean).ravel(), [np.exp(-2.0 * log_std)], rtol=1e-5)


def test_categorical_kl():
    logits_p, logits_q = np.array([[1.0, 0.0, -2.0], [0.5, 0.5, 0.5]]), np.array([[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]])
    p = np.exp(logits_p) / np.exp(logits_p).sum(-1, keepdims=True)
    q = np.exp(logits_q) / np.exp(logits_q).sum(-1, keepdims=True)
    expected = (p * np.log(p / q)).sum(-1)
    np.testing.assert_allclose(ops.categorical_kl(jnp.asarray(logits_p), jnp.asarray(logits_q)), expected, rtol=1e-5)


# --- returns at episode ends ----------------------------------------------------------------


def numpy_returns(rewards, dones, next_values, gamma, lam, cut, final_values):
    """TD(lambda) returns, G_t = r_t + gamma [(1 - lam) V(s_{t+1}) + lam G_{t+1}] with G_T = V(s_T):
    a true end (``dones`` without ``cut``) gives r_t, a ``cut`` end r_t + gamma V(final_obs_t)."""
    T, N = rewards.shape
    out = np.zeros((T, N))
    for n in range(N):
        ret = next_values[-1, n]
        for t in reversed(range(T)):
            if dones[t, n] and not cut[t, n]:  # a true end
                ret = rewards[t, n]
            elif cut[t, n]:
                ret = rewards[t, n] + gamma * final_values[t, n]
            else:
                ret = rewards[t, n] + gamma * ((1 - lam) * next_values[t, n] + lam * ret)
            out[t, n] = ret
    return out


def ends(terminated, truncated, action_ignored=None):
    """A stacked [T, N] TimeStep holding only episode ends (what the returns read)."""
    terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
    ignored = np.zeros_like(terminated) if action_ignored is None else np.asarray(action_ignored, bool)
    zeros = jnp.zeros(terminated.shape)
    return TimeStep(zeros, zeros, jnp.asarray(terminated), jnp.asarray(truncated), zeros, jnp.asarray(ignored), {})


def test_returns_treat_true_ends_as_terminal_and_bootstrap_through_time_limits():
    config = trpo.TRPOConfig(gamma=0.9, gae_lambda=0.8)
    rng = np.random.default_rng(8)
    T, N = 6, 2
    rewards, values, bootstrap = rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.normal(size=N)
    final_values = rng.normal(size=(T, N))
    dones = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    dones[1, 0] = True  # a true end
    dones[3, 0] = truncated[3, 0] = True  # a time-limit end
    dones[4, 1] = truncated[4, 1] = True
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    next_values = np.concatenate([values[1:], bootstrap[None]])

    # Reset within the step (gymnax, MJX): the time-limit step bootstraps from V(final_obs).
    returns, mask = trpo.returns_and_mask(config, f32(rewards), ends(dones & ~truncated, truncated), f32(values),
                                          f32(final_values), f32(bootstrap))
    expected = numpy_returns(rewards, dones, next_values, 0.9, 0.8, truncated, final_values)
    np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(mask) == 1.0)

    # EnvPool: final_obs is the next observation (real); the reset step after any end is masked.
    reset_step = np.zeros((T, N), bool)
    reset_step[2, 0] = reset_step[4, 0] = reset_step[5, 1] = True
    returns, mask = trpo.returns_and_mask(config, f32(rewards), ends(dones & ~truncated, truncated, reset_step),
                                          f32(values), f32(next_values), f32(bootstrap))
    expected = numpy_returns(rewards, dones, next_values, 0.9, 0.8, truncated, next_values)
    np.testing.assert_allclose(np.asarray(returns)[~reset_step], expected[~reset_step], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mask, 1.0 - reset_step)


def test_returns_and_advantages_of_a_tiny_episode_by_hand():
    """gamma = lambda = 0.5, two copies, three steps.

    Reset within the step: copy 0 is cut by its time limit at t = 1 with V(final_obs_1) = 8,
    copy 1 terminates at t = 0. V(s_t) = [[10, 20], [30, 40], [50, 60]], V(s_T) = [70, 80].

      copy 0: G_2 = 5 + 0.5 * 70 = 40;  G_1 = 3 + 0.5 * 8 = 7 (nothing of G_2 flows back);
              G_0 = 1 + 0.5 * (0.5 * 30 + 0.5 * 7) = 10.25
      copy 1: G_2 = 6 + 0.5 * 80 = 46;  G_1 = 4 + 0.5 * (0.5 * 60 + 0.5 * 46) = 30.5;  G_0 = 2
    """
    config = trpo.TRPOConfig(gamma=0.5, gae_lambda=0.5)
    rewards = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    values = jnp.array([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])
    bootstrap = jnp.array([70.0, 80.0])
    final_values = jnp.array([[-1.0, -2.0], [8.0, -3.0], [-4.0, -5.0]])  # read only where truncated
    timesteps = ends(terminated=[[0, 1], [0, 0], [0, 0]], truncated=[[0, 0], [1, 0], [0, 0]])
    returns, mask = trpo.returns_and_mask(config, rewards, timesteps, values, final_values, bootstrap)
    expected = np.array([[10.25, 2.0], [7.0, 30.5], [40.0, 46.0]])
    np.testing.assert_allclose(returns, expected, rtol=1e-6)
    np.testing.assert_allclose(returns - values, expected - np.asarray(values), rtol=1e-6)  # GAE
    np.testing.assert_array_equal(mask, np.ones((3, 2)))

    # EnvPool's layout: copy 0 is cut at t = 0 and EnvPool resets at t = 1 (action ignored,
    # reward 0); copy 1 terminates at t = 1 and resets at t = 2. final_obs is the next
    # observation, so V(final_obs_t) = V(s_{t+1}).
    #   copy 0: G_2 = 5 + 0.5 * 70 = 40;  G_0 = 1 + 0.5 * 30 = 16
    #   copy 1: G_1 = 4;  G_0 = 2 + 0.5 * (0.5 * 40 + 0.5 * 4) = 13
    rewards = jnp.array([[1.0, 2.0], [0.0, 4.0], [5.0, 0.0]])
    timesteps = ends(terminated=[[0, 0], [0, 1], [0, 0]], truncated=[[1, 0], [0, 0], [0, 0]],
                     action_ignored=[[0, 0], [1, 0], [0, 1]])
    next_values = jnp.concatenate([values[1:], bootstrap[None]])
    returns, mask = trpo.returns_and_mask(config, rewards, timesteps, values, next_values, bootstrap)
    np.testing.assert_array_equal(mask, [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    counted = np.asarray(mask) > 0
    np.testing.assert_allclose(np.asarray(returns)[counted], np.array([[16.0, 13.0], [0.0, 4.0], [40.0, 0.0]])[counted])


# --- the agent ------------------------------------------------------------------------------


def mean_return(score) -> float:
    assert int(score.episodes) > 0
    return score.mean_return()


@pytest.fixture(scope="module")
def pendulum_run():
    """The shipped Pendulum config, trained once: (config, env, runner, metrics)."""
    experiment = load_config(ExperimentConfig, PENDULUM_CONFIG)
    env = make(experiment.env)
    runner, metrics = jax.jit(trpo.make_train(experiment.trpo, env))(jax.random.PRNGKey(0))
    return experiment.trpo, env, runner, jax.tree.map(np.asarray, metrics)


@pytest.mark.slow
def test_trpo_learns_pendulum(pendulum_run):
    config, env, runner, _ = pendulum_run
    eval_env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=32))
    act = trpo.make_policy(config, env.spec)
    uniform = lambda params, obs, key: jax.random.uniform(key, (32, 1), minval=-2.0, maxval=2.0)
    steps = eval_env.spec.max_episode_steps + 1
    random_return = mean_return(jax.jit(lambda k: evaluate(uniform, None, eval_env, k, steps))(jax.random.PRNGKey(100)))
    trained = mean_return(jax.jit(lambda p, k: evaluate(act, p, eval_env, k, steps))(runner.params, jax.random.PRNGKey(100)))
    assert random_return < -1000
    assert trained >= -300  # about -180 over seeds 0-4 (configs/trpo_pendulum.yaml)


def test_every_update_kept_the_kl_inside_the_trust_region(pendulum_run):
    config, _, _, metrics = pendulum_run
    assert np.all(metrics["kl"] <= config.max_kl * (1 + 1e-5))
    assert np.all(metrics["step_fraction"] >= 0.0)
    assert np.mean(metrics["step_fraction"] > 0) > 0.9  # almost every update moved the policy
    assert np.all(metrics["surrogate_gain"][metrics["step_fraction"] > 0] > 0)


@pytest.mark.slow
def test_discrete_actions():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    config = trpo.TRPOConfig(batch_size=64, total_env_steps=64, policy_hidden=(8,), value_hidden=(8,), value_minibatches=2)
    runner = trpo.init_runner(jax.random.PRNGKey(0), config, env)
    new_runner, metrics, transitions = jax.jit(trpo.make_iteration(config, env, lambda p, o, a, ts: ts.reward))(runner)
    assert transitions.action.shape == (16, 4) and transitions.action.dtype == jnp.int32
    assert 0.0 < float(metrics["kl"]) <= config.max_kl and float(metrics["step_fraction"]) > 0
    assert int(new_runner.env_steps) == 64
    before, _ = ravel_pytree(runner.params["policy"])
    after, _ = ravel_pytree(new_runner.params["policy"])
    assert not np.allclose(before, after)


@pytest.mark.slow
def test_vmap_over_seeds_equals_separate_runs():
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=4))
    config = trpo.TRPOConfig(batch_size=32, total_env_steps=3 * 32, policy_hidden=(8,), value_hidden=(8,),
                             value_minibatches=2)
    train = trpo.make_train(config, env)
    keys = jax.random.split(jax.random.PRNGKey(7), 2)
    batched, batched_metrics = jax.jit(jax.vmap(train))(keys)
    single = jax.jit(train)
    for seed in range(2):
        runner, metrics = single(keys[seed])
        for a, b in zip(jax.tree.leaves(runner.params), jax.tree.leaves(batched.params)):
            np.testing.assert_allclose(a, b[seed], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(metrics["kl"], batched_metrics["kl"][seed], rtol=1e-3, atol=1e-6)
    first = jax.tree.leaves(batched.params)[0]
    assert not np.allclose(first[0], first[1])  # different seeds really are different runs


@pytest.mark.slow
def test_value_targets_are_standardised_by_the_batch_returns():
    """``normalize_value_targets``: an iteration sets V's output scale to the mean and std of its
    lambda-returns (worked out here in NumPy from the same rollout), and V then predicts in the
    returns' units; without the option the scale stays (0, 1)."""
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=4))
    reward = lambda p, o, a, ts: 100.0 * ts.reward  # returns in the thousands, far from V's start at 0
    runs = {}
    for normalize in (False, True):
        config = trpo.TRPOConfig(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,),
                                 value_minibatches=2, normalize_value_targets=normalize)
        runner = trpo.init_runner(jax.random.PRNGKey(3), config, env)
        runs[normalize] = (config, runner, jax.jit(trpo.make_iteration(config, env, reward))(runner)[0])
    _, _, plain = runs[False]
    assert float(plain.value_scale.mean) == 0.0 and float(plain.value_scale.std) == 1.0

    config, runner, after = runs[True]
    (_, last_obs, _), (obs, _, timesteps) = trpo.make_rollout(config, env)(
        runner.params, runner.env_state, runner.obs, runner.key)
    v = lambda o: trpo.Value(env.spec, config).apply(runner.params["value"], o)  # the first scale: (0, 1)
    returns, mask = trpo.returns_and_mask(config, 100.0 * timesteps.reward, timesteps, v(obs),
                                          jnp.zeros_like(timesteps.reward), v(last_obs))  # no time limit in 8 steps
    held = np.asarray(returns)[np.asarray(mask, bool)]
    assert held.mean() < -500  # Pendulum's rewards are -16..0 a step
    np.testing.assert_allclose(float(after.value_scale.mean), held.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(after.value_scale.std), held.std(), rtol=1e-4)
    # After one fit V is in the returns' units; the plain fit is still near its start at 0.
    value = trpo.make_value(config, env.spec)
    error = lambda run: np.abs(np.asarray(value(run.params["value"], run.value_scale, obs) - returns)).mean()
    assert error(after) < 0.75 * error(plain)


class TwinSteps(Environment):
    """Every copy sees its own random observations, each held for two steps (times ``2i`` and
    ``2i + 1`` alike), whatever it does; the reward is ``-|action|^2``. Episodes never end."""

    def __init__(self, num_envs: int):
        self.spec = EnvSpec("twins", "test", num_envs, (3,), "float32", Box(-1.0, 1.0, (2,)), 50.0, 1000)

    def _timestep(self, inner, reward):
        key, t = inner
        obs = jax.random.normal(jax.random.fold_in(key, t // 2), (self.num_envs, 3))
        no = jnp.zeros((self.num_envs,), bool)
        return TimeStep(obs, reward, no, no, obs, no, {"true_reward": reward, "true_done": no})

    def _reset(self, key):
        inner = (key, jnp.zeros((), jnp.int32))
        return inner, self._timestep(inner, jnp.zeros((self.num_envs,)))

    def _step(self, inner, action):
        inner = (inner[0], inner[1] + 1)
        return inner, self._timestep(inner, -jnp.sum(action**2, axis=-1))


@pytest.mark.slow
def test_the_fisher_is_estimated_from_every_kth_time_step_of_every_copy():
    """``fisher_subsample=k``: the Fisher-vector products average over every k-th time step of
    every copy. Where each observation is held for two steps, every 2nd step sees each one once,
    in every copy, as the whole batch does, so the update is the same; every 3rd step is another
    sample, and the step differs. (Striding the flattened batch would keep copies 0 and 2 alone.)"""
    env = TwinSteps(num_envs=4)

    def policy_after_one_update(k):
        config = trpo.TRPOConfig(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,),
                                 value_minibatches=2, fisher_subsample=k)
        runner = trpo.init_runner(jax.random.PRNGKey(0), config, env)
        after, metrics, _ = jax.jit(trpo.make_iteration(config, env, lambda p, o, a, ts: ts.reward))(runner)
        assert float(metrics["step_fraction"]) > 0
        return ravel_pytree(runner.params["policy"])[0], ravel_pytree(after.params["policy"])[0]

    start, full = policy_after_one_update(1)
    _, pairs = policy_after_one_update(2)
    _, thirds = policy_after_one_update(3)
    np.testing.assert_allclose(pairs - start, full - start, rtol=1e-4, atol=1e-7)
    assert np.abs((thirds - start) - (full - start)).max() > 0.05 * np.abs(full - start).max()


def policy_step_on_twin_steps(**options):
    """One update of a small TRPO on :class:`TwinSteps` (4 copies, 32 steps, the whole batch's
    Fisher) with ``options``: the policy's parameter step, flattened, and the update's metrics."""
    env = TwinSteps(num_envs=4)
    config = trpo.TRPOConfig(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,),
                             value_minibatches=2, fisher_subsample=1, **options)
    runner = trpo.init_runner(jax.random.PRNGKey(0), config, env)
    after, metrics, _ = jax.jit(trpo.make_iteration(config, env, lambda p, o, a, ts: ts.reward))(runner)
    return ravel_pytree(after.params["policy"])[0] - ravel_pytree(runner.params["policy"])[0], metrics


@pytest.mark.slow
def test_a_kl_per_action_dimension_is_the_whole_actions_bound_and_damping_times_its_dimensions():
    """``kl_per_action_dimension``: the KL averaged over the action's 2 dimensions, bounded by
    ``max_kl`` with ``cg_damping`` added to its Hessian, takes the step the whole action's KL takes
    with both times 2 (sb3-contrib's trust region in ours); with the same numbers it steps further."""
    def policy_after_one_update(**options):
        step, metrics = policy_step_on_twin_steps(**options)
        assert float(metrics["step_fraction"]) == 1.0
        return step

    per_dimension = policy_after_one_update(max_kl=0.01, cg_damping=0.1, kl_per_action_dimension=True)
    whole_times_two = policy_after_one_update(max_kl=0.02, cg_damping=0.2)
    whole = policy_after_one_update(max_kl=0.01, cg_damping=0.1)
    np.testing.assert_allclose(per_dimension, whole_times_two, rtol=1e-3, atol=1e-6)
    assert np.linalg.norm(per_dimension) > 1.2 * np.linalg.norm(whole)
    cartpole = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=2))
    with pytest.raises(ConfigError, match="kl_per_action_dimension"):
        trpo.make_iteration(trpo.TRPOConfig(kl_per_action_dimension=True), cartpole, lambda p, o, a, ts: ts.reward)


@pytest.mark.slow
def test_a_bonus_per_action_dimension_is_the_whole_actions_bonus_over_its_dimensions():
    """``entropy_per_action_dimension``: the bonus paid on the entropy's mean over the action's 2
    dimensions takes the step the whole action's bonus takes at half the coefficient, and another
    step than the whole action's at the same coefficient; refused for discrete actions."""
    def policy_after_one_update(**options):
        return policy_step_on_twin_steps(kl_per_action_dimension=True, **options)[0]

    per_dimension = policy_after_one_update(entropy_coef=0.5, entropy_per_action_dimension=True)
    whole_halved = policy_after_one_update(entropy_coef=0.25)
    whole = policy_after_one_update(entropy_coef=0.5)
    np.testing.assert_allclose(per_dimension, whole_halved, rtol=1e-5, atol=1e-7)
    assert np.abs(per_dimension - whole).max() > 0.05 * np.abs(whole).max()
    cartpole = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=2))
    with pytest.raises(ConfigError, match="entropy_per_action_dimension"):
        trpo.make_iteration(trpo.TRPOConfig(entropy_per_action_dimension=True), cartpole,
                            lambda p, o, a, ts: ts.reward)


def test_bad_config_values():
    with pytest.raises(ConfigError, match="gamma"):
        trpo.TRPOConfig(gamma=1.5)
    with pytest.raises(ConfigError, match="max_kl"):
        trpo.TRPOConfig(max_kl=0.0)
    with pytest.raises(ConfigError, match="line_search_decay"):
        trpo.TRPOConfig(line_search_decay=1.0)
    with pytest.raises(ConfigError, match="fisher_subsample"):
        trpo.TRPOConfig(fisher_subsample=0)
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=2))
    with pytest.raises(ConfigError, match="value_minibatches"):
        trpo.make_iteration(trpo.TRPOConfig(batch_size=4, value_minibatches=8), env, lambda p, o, a, ts: ts.reward)


@pytest.mark.slow
def test_the_training_command_runs_trpo(tmp_path):
    from rlhf_jax.cli import main

    run_dir = tmp_path / "run"
    overrides = ["env.num_envs=4", "trpo.batch_size=32", "trpo.total_env_steps=128", "trpo.policy_hidden=[8]",
                 "trpo.value_hidden=[8]", "trpo.value_minibatches=2", "run.chunk_env_steps=64", "run.tensorboard=false",
                 f"run.dir={run_dir}"]
    assert main(["train", str(PENDULUM_CONFIG), *overrides]) == 0
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 and "kl" in rows[0].split(",")
    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0


@pytest.mark.slow
def test_the_networks_read_observations_standardised_by_every_one_seen():
    """``normalize_observations``: an iteration adds its batch's observations to the runner's
    moments (their NumPy mean and variance after one), and the policy acts on the observations
    standardised by them; without the option there are no moments and the networks read the
    observations as they are."""
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=4))
    config = trpo.TRPOConfig(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,),
                             value_minibatches=2, normalize_observations=True)
    runner = trpo.init_runner(jax.random.PRNGKey(5), config, env)
    after = jax.jit(trpo.make_iteration(config, env, lambda p, o, a, ts: ts.reward))(runner)[0]
    _, (obs, _, _) = trpo.make_rollout(config, env)(runner.params, runner.env_state, runner.obs, runner.key)
    rows = np.asarray(obs).reshape(-1, 3)
    np.testing.assert_allclose(after.params["observations"].mean, rows.mean(0), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(after.params["observations"].var, rows.var(0), rtol=1e-3)
    act = trpo.make_policy(config, env.spec)
    policy = trpo.Policy(env.spec, config)
    standardised = ops.standardize(after.params["observations"], obs[0])
    np.testing.assert_allclose(act(after.params, obs[0], None, greedy=True),
                               policy.apply(after.params["policy"], standardised)[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(policy.apply(after.params["policy"], obs[0])[0], policy.apply(after.params["policy"], standardised)[0])
    plain = trpo.init_runner(jax.random.PRNGKey(5), trpo.TRPOConfig(), env)
    assert set(plain.params) == {"policy", "value"}


@pytest.mark.slow
def test_after_update_the_policy_update_reads_the_batch_as_it_was_acted_on():
    """``observation_moments="after_update"``: the first iteration's update reads the batch
    standardised by the runner's first moments (mean 0, variance 1: the observations as they
    are, the clip set out of reach), so its policy and value are those of the same iteration
    without standardisation; the batch joins the moments afterwards all the same. Before the
    update (the default) it reads them by the moments with the batch merged, and ends elsewhere."""
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=4))
    small = dict(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,), value_minibatches=2)
    reward = lambda p, o, a, ts: ts.reward
    key = jax.random.PRNGKey(5)

    def one_iteration(**options):
        config = trpo.TRPOConfig(**small, **options)
        return jax.jit(trpo.make_iteration(config, env, reward))(trpo.init_runner(key, config, env))[0]

    plain = one_iteration()
    after = one_iteration(normalize_observations=True, observation_clip=1e6, observation_moments="after_update")
    before = one_iteration(normalize_observations=True, observation_clip=1e6)
    for part in ("policy", "value"):
        chex.assert_trees_all_close(after.params[part], plain.params[part], rtol=1e-6, atol=1e-7)
    assert not np.allclose(ravel_pytree(before.params["policy"])[0], ravel_pytree(plain.params["policy"])[0])
    chex.assert_trees_all_close(after.params["observations"], before.params["observations"])


@pytest.mark.slow
def test_every_step_the_moments_take_in_each_step_before_the_policy_acts():
    """``observation_moments="every_step"`` (``VecNormalize``'s way): the policy reads step ``t``'s
    observations standardised by the moments of every observation up to and including step
    ``t`` (worked in NumPy), and after the iteration the moments hold each observation once."""
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=4))
    config = trpo.TRPOConfig(batch_size=32, total_env_steps=32, policy_hidden=(8,), value_hidden=(8,),
                             value_minibatches=2, normalize_observations=True, observation_moments="every_step",
                             observation_min_std=1e-4)
    runner = trpo.init_runner(jax.random.PRNGKey(5), config, env)
    rollout = trpo.make_rollout_with_inputs(config, env)
    (params, *_), (obs, inputs, _, _) = rollout(runner.params, runner.env_state, runner.obs, runner.key)
    obs, inputs = np.asarray(obs), np.asarray(inputs)
    for t in range(obs.shape[0]):
        seen = obs[: t + 1].reshape(-1, 3)
        np.testing.assert_allclose(inputs[t], (obs[t] - seen.mean(0)) / seen.std(0), rtol=1e-3, atol=1e-3)
    rows = obs.reshape(-1, 3)
    after = jax.jit(trpo.make_iteration(config, env, lambda p, o, a, ts: ts.reward))(runner)[0]
    for moments in (params["observations"], after.params["observations"]):
        np.testing.assert_allclose(moments.mean, rows.mean(0), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(moments.var, rows.var(0), rtol=1e-3)
        np.testing.assert_allclose(moments.count, len(rows), rtol=1e-5)


def test_the_standardisation_clips_and_floors_the_std_as_configured():
    """``observation_clip`` and ``observation_min_std``: ``clip((x - mean) / max(std, floor))``,
    worked in NumPy: a coordinate that hardly varies is divided by the floor, not by its std."""
    moments = ops.Moments(mean=jnp.array([1.0, 0.0]), var=jnp.array([4.0, 1e-6]), count=jnp.array(10.0))
    obs = jnp.array([[9.0, 0.002], [-3.0, -0.5]])
    params = {"observations": moments}
    for clip, floor, expected in [(5.0, 0.1, [[4.0, 0.02], [-2.0, -5.0]]),
                                  (10.0, 1e-4, [[4.0, 2.0], [-2.0, -10.0]]),
                                  (3.0, 0.1, [[3.0, 0.02], [-2.0, -3.0]])]:
        config = trpo.TRPOConfig(normalize_observations=True, observation_clip=clip, observation_min_std=floor)
        np.testing.assert_allclose(trpo.network_input(config, params, obs), expected, rtol=1e-5)
    assert trpo.network_input(trpo.TRPOConfig(), params, obs) is obs
