"""ACER: its pure pieces against plain NumPy loops, the agent's memory and replay, the targets at
episode ends in both back ends' layouts, rewards recomputed on replay (IBT's too), and learning
CartPole (discrete) and Pendulum (continuous) with the shipped configs."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from control_flow import convolutions_by_control_flow
from rlhf_jax import ops, replay
from rlhf_jax.agents import acer
from rlhf_jax.agents.base import env_reward
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.envs.core import Discrete, EnvSpec, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.evaluation import evaluate

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------------ pure pieces


def test_retrace_matches_a_numpy_loop_on_off_policy_data_with_episode_ends():
    rng = np.random.default_rng(0)
    T, B, A, gamma = 9, 4, 3, 0.9
    pi, mu = softmax(rng.normal(size=(T, B, A))), softmax(rng.normal(size=(T, B, A)))
    actions = rng.integers(0, A, size=(T, B))
    q = rng.normal(size=(T, B, A))
    rewards = rng.normal(size=(T, B))
    done = rng.random((T, B)) < 0.2
    bootstrap = rng.normal(size=B)
    values = (pi * q).sum(-1)
    q_taken = np.take_along_axis(q, actions[..., None], -1)[..., 0]
    rho = np.take_along_axis(pi / mu, actions[..., None], -1)[..., 0]

    expected = np.zeros((T, B))
    for b in range(B):
        q_ret = bootstrap[b]
        for t in reversed(range(T)):
            q_ret = rewards[t, b] + (0.0 if done[t, b] else gamma) * q_ret
            expected[t, b] = q_ret
            q_ret = min(1.0, rho[t, b]) * (q_ret - q_taken[t, b]) + values[t, b]

    discounts = gamma * (1.0 - done)
    traces = ops.retrace_traces(jnp.log(rho))
    got = jax.jit(ops.retrace_targets)(rewards, discounts, q_taken, values, traces, bootstrap)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert (rho > 1).any() and (rho < 1).any()  # both sides of the truncation are exercised
    # An episode end leaves the reward alone as the target.
    np.testing.assert_allclose(np.asarray(got)[done], rewards[done], rtol=1e-6)
    # Zero traces give one-step targets r_t + gamma_t V(x_{t+1}), whatever follows.
    one_step = ops.retrace_targets(rewards, discounts, q_taken, values, np.zeros((T, B)), bootstrap)
    next_values = np.concatenate([values[1:], bootstrap[None]])
    np.testing.assert_allclose(one_step, rewards + discounts * next_values, rtol=1e-5, atol=1e-6)


def test_continuous_traces_take_the_dth_root():
    log_rho = jnp.log(jnp.array([0.25, 1.0, 8.0]))
    np.testing.assert_allclose(ops.retrace_traces(log_rho, action_dim=2), [0.5, 1.0, 1.0], rtol=1e-6)


def grad_log_softmax(pi, b):
    """d log pi(b) / d logits = e_b - pi."""
    e = np.zeros_like(pi)
    e[b] = 1.0
    return e - pi


def test_truncated_importance_sampling_gradient_matches_a_numpy_loop():
    rng = np.random.default_rng(1)
    N, A, c = 64, 4, 1.5  # a small c, so that many weights are truncated
    logits = rng.normal(size=(N, A))
    mu = softmax(rng.normal(size=(N, A)) * 2.0)
    actions = rng.integers(0, A, size=N)
    q = rng.normal(size=(N, A))
    q_ret = rng.normal(size=N)

    def objective(logits):
        log_pi = jax.nn.log_softmax(logits)
        log_rho = jax.lax.stop_gradient(log_pi - jnp.log(mu))
        values = jax.lax.stop_gradient((jnp.exp(log_pi) * q).sum(-1))
        take = lambda x: jnp.take_along_axis(x, actions[:, None], -1)[:, 0]
        return ops.truncated_is_policy_objective(take(log_pi), take(log_rho), q_ret - values, log_pi, log_rho,
                                                 q - values[:, None], jnp.exp(log_pi), c)

    got = jax.jit(jax.grad(lambda l: objective(l).sum()))(logits)

    pi = softmax(logits)
    expected = np.zeros((N, A))
    truncated = corrected = 0
    for i in range(N):
        v = (pi[i] * q[i]).sum()
        rho = pi[i] / mu[i]
        a = actions[i]
        expected[i] += min(c, rho[a]) * (q_ret[i] - v) * grad_log_softmax(pi[i], a)
        truncated += rho[a] > c
        for b in range(A):
            weight = max(0.0, 1.0 - c / rho[b])
            corrected += weight > 0
            expected[i] += weight * pi[i, b] * (q[i, b] - v) * grad_log_softmax(pi[i], b)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert truncated > 0 and corrected > 0


def test_bias_correction_makes_the_truncated_gradient_unbiased():
    """Averaged over a_t ~ mu, with Q(x, a_t) in place of Q_ret, the truncated term plus the
    correction is the on-policy gradient sum_a pi(a) grad log pi(a) (Q(a) - V) (the paper's eq. 7)."""
    rng = np.random.default_rng(2)
    A, c = 5, 1.2
    logits = rng.normal(size=A)
    mu = softmax(rng.normal(size=A) * 2.0)
    q = rng.normal(size=A)
    pi = softmax(logits)
    v = (pi * q).sum()

    def objective(logits, a):
        log_pi = jax.nn.log_softmax(logits)
        log_rho = jnp.log(pi) - jnp.log(mu)
        return ops.truncated_is_policy_objective(log_pi[a], log_rho[a], q[a] - v, log_pi, log_rho, q - v, pi, c)

    grad = jax.grad(objective)
    off_policy = sum(mu[a] * np.asarray(grad(logits, a)) for a in range(A))
    on_policy = sum(pi[a] * (q[a] - v) * grad_log_softmax(pi, a) for a in range(A))
    np.testing.assert_allclose(off_policy, on_policy, rtol=1e-4, atol=1e-6)
    # Truncation alone (no correction) would be biased here.
    assert (pi / mu > c).any()


def test_trust_region_projection_respects_the_kl_bound():
    rng = np.random.default_rng(3)
    g = rng.normal(size=(200, 6)) * 3.0
    k = rng.normal(size=(200, 6))
    k[0] = 0.0  # no divergence from the average policy: nothing to correct
    delta = 1.0
    z = np.asarray(jax.jit(ops.trust_region_projection)(g, k, delta))

    for i in range(len(g)):
        k_dot_g, k_norm2 = k[i] @ g[i], k[i] @ k[i]
        scale = max(0.0, (k_dot_g - delta) / k_norm2) if k_norm2 > 0 else 0.0
        np.testing.assert_allclose(z[i], g[i] - scale * k[i], rtol=1e-5, atol=1e-5)
    k_dot_z = (k * z).sum(-1)
    active = (k * g).sum(-1) > delta
    assert active.sum() > 20 and (~active).sum() > 20
    assert np.all(k_dot_z <= delta + 1e-4)
    np.testing.assert_allclose(k_dot_z[active], delta, rtol=1e-4)  # on the boundary, not inside it
    np.testing.assert_allclose(z[~active], g[~active], rtol=1e-6)
    # The correction is along k only (what minimising ||g - z|| under one linear bound allows).
    step = g[active] - z[active]
    cosine = (step * k[active]).sum(-1) / np.linalg.norm(step, axis=-1) / np.linalg.norm(k[active], axis=-1)
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-5)


def test_stochastic_dueling_q_and_value_target():
    rng = np.random.default_rng(4)
    value, advantage, sampled = rng.normal(size=5), rng.normal(size=5), rng.normal(size=(5, 3))
    q = ops.stochastic_dueling_q(value, advantage, sampled)
    for i in range(5):
        assert np.isclose(q[i], value[i] + advantage[i] - sum(sampled[i]) / 3, atol=1e-6)
    q_ret, log_rho = rng.normal(size=5), np.log(np.array([0.2, 0.5, 1.0, 3.0, 40.0]))
    target = ops.truncated_value_target(q_ret, np.asarray(q), value, log_rho)
    expected = [min(1.0, np.exp(l)) * (r - qq) + v for l, r, qq, v in zip(log_rho, q_ret, np.asarray(q), value)]
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ the agent


def test_bad_config_values():
    with pytest.raises(ConfigError, match="gamma"):
        acer.ACERConfig(gamma=1.5)
    with pytest.raises(ConfigError, match="truncation"):
        acer.ACERConfig(truncation=0.0)
    with pytest.raises(ConfigError, match="acer.lr_decay_env_steps=1000 ends before acer.total_env_steps=2000"):
        acer.ACERConfig(total_env_steps=2000, lr_decay_env_steps=1000)
    acer.ACERConfig(total_env_steps=2000, lr_decay_env_steps=2000)  # decaying to zero at the last step is fine
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    with pytest.raises(ConfigError, match="holds no trajectory"):
        acer.init_runner(jax.random.PRNGKey(0), acer.ACERConfig(replay_capacity=79), env)
    with pytest.raises(ConfigError, match="never start"):
        acer.init_runner(jax.random.PRNGKey(0), acer.ACERConfig(replay_capacity=800, replay_start=1000), env)


@pytest.mark.slow
def test_the_memory_stores_trajectories_with_the_behaviour_policy():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=3, max_episode_steps=15))
    config = acer.ACERConfig(num_steps=20, replay_capacity=3 * 20 * 4, replay_start=0, replay_ratio=0.0)
    runner = acer.init_runner(jax.random.PRNGKey(0), config, env)
    iteration = jax.jit(acer.make_iteration(config, env, env_reward))
    new, metrics, transitions = iteration(runner)
    data = jax.tree.map(lambda x: np.asarray(x[0]), new.memory.data)  # the first slot
    assert int(new.memory.ring.size) == 1 and int(new.memory.ring.next) == 1
    # x_0 .. x_{k-1} are the steps' observations, and x_k the one to bootstrap from.
    np.testing.assert_array_equal(data.obs[:-1], transitions.obs)
    np.testing.assert_array_equal(data.obs[-1], new.obs)
    np.testing.assert_array_equal(data.action, transitions.action)
    np.testing.assert_array_equal(data.reward, transitions.oracle_reward)  # the environment's reward
    # mu(.|x_t) is what the acting parameters gave at each step.
    logits, _ = acer.make_network(config, env.spec).apply(runner.params, transitions.obs)
    np.testing.assert_allclose(data.behaviour, jax.nn.log_softmax(logits), rtol=1e-5, atol=1e-6)
    # Episodes of 15 steps end inside a 20-step trajectory; CartPole may fail earlier.
    # A time-limit end is truncated, a failure terminal, and every step ends at most once.
    assert (data.terminated | data.truncated).any(axis=0).all()  # every copy's episode ended
    np.testing.assert_array_equal(data.terminated | data.truncated, np.asarray(transitions.done))
    assert not (data.terminated & data.truncated).any()
    assert not data.action_ignored.any()
    # gymnax restarts a copy within the step: at an end x_{t+1} is the next episode's first
    # observation and final_obs the one the step reached; elsewhere they are the same.
    ended = data.terminated | data.truncated
    np.testing.assert_array_equal(data.final_obs[~ended], data.obs[1:][~ended])
    assert (data.final_obs[ended] != data.obs[1:][ended]).any(-1).all()
    # No replay yet: one (on-policy) update.
    assert int(metrics["replay_updates"]) == 0 and int(new.updates) == 1


def test_a_time_limit_end_bootstraps_from_the_final_observation():
    """A truncated step's target is r_t + gamma V(final_obs_t) and cuts the return; a terminal one is r_t."""
    config = acer.ACERConfig(gamma=0.5)
    batch = acer.Trajectories(obs=None, action=None, reward=jnp.array([1.0, 2.0, 3.0, 4.0]),
                              terminated=jnp.array([False, True, False, False]),
                              truncated=jnp.array([False, False, True, False]), action_ignored=None, final_obs=None,
                              behaviour=None)
    q_taken = jnp.array([10.0, 20.0, 30.0, 40.0])
    values = jnp.array([7.0, 8.0, 9.0, 11.0])
    final_values = jnp.array([jnp.nan, jnp.nan, 70.0, jnp.nan])  # V(final_obs) is read only where truncated
    q_ret = acer.critic_targets(config, batch, q_taken, values, final_values, jnp.ones(4), jnp.array(100.0))
    # Step 1 ends the episode (target r = 2); step 2 hits the time limit (target 3 + 0.5 * 70 = 38);
    # step 0 bootstraps through step 1 only: 1 + 0.5 * (2 - 20 + 8) = -4; step 3: 4 + 0.5 * 100.
    np.testing.assert_allclose(q_ret, [-4.0, 2.0, 38.0, 54.0])


def tiny_spec(backend: str) -> EnvSpec:
    return EnvSpec(id="test", backend=backend, num_envs=1, observation_shape=(1,), observation_dtype="float32",
                   action_space=Discrete(2), fps=50.0, max_episode_steps=10)


# One environment, observations are numbers x_0 .. x_k. Three episodes: the first terminates (its
# terminal state 3), the second hits the time limit (its last observation 12), the third goes on.
# gymnax restarts a copy within the step: x_{t+1} is the next episode's first, final_obs the end.
GYMNAX = dict(obs=[1, 2, 10, 11, 20, 21, 22], reward=[1, 2, 3, 4, 5, 6], terminated=[0, 1, 0, 0, 0, 0],
              truncated=[0, 0, 0, 1, 0, 0], ignored=[0, 0, 0, 0, 0, 0], final_obs=[2, 3, 11, 12, 21, 22])
# EnvPool reaches the end's observation (real), then spends a reset step on the new episode's first.
ENVPOOL = dict(obs=[1, 2, 3, 10, 11, 12, 20, 21, 22], reward=[1, 2, 0, 3, 4, 0, 5, 6],
               terminated=[0, 1, 0, 0, 0, 0, 0, 0], truncated=[0, 0, 0, 0, 1, 0, 0, 0],
               ignored=[0, 0, 1, 0, 0, 1, 0, 0], final_obs=None)
LAYOUTS = {"gymnax": GYMNAX, "envpool-atari": ENVPOOL}


def tiny_trajectory(backend: str, behaviour=None) -> acer.Trajectories:
    """The episode above as the memory keeps it for ``backend`` (batch of 1)."""
    steps = LAYOUTS[backend]
    column = lambda name, dtype: jnp.array(steps[name], dtype)[:, None]
    k = len(steps["reward"])
    final_obs = None if steps["final_obs"] is None else column("final_obs", jnp.float32)[..., None]
    assert (final_obs is None) == (not replay.keeps_final_obs(tiny_spec(backend)))
    return acer.Trajectories(column("obs", jnp.float32)[..., None], jnp.arange(k)[:, None] % 2,
                             column("reward", jnp.float32), column("terminated", bool), column("truncated", bool),
                             column("ignored", bool), final_obs,
                             jnp.log(jnp.full((k, 1, 2), 0.5)) if behaviour is None else behaviour)


@pytest.mark.parametrize("backend", ["gymnax", "envpool-atari"])
def test_targets_at_a_terminal_a_time_limit_and_a_reset_step(backend):
    """V(x) = 2x and Q(x_t, a_t) = 2 x_t + 1, gamma = 0.5. With c_t = 1 Retrace carries
    Q_ret - Q + V = Q_ret - 1 back; with c_t = 0 the targets are one-step. The steps that carry a
    loss are the same six in both layouts (EnvPool's reset steps carry none):

        x_t  r  end         Q_ret (c = 1)                 one-step (c = 0)
        1    1  -           1 + 0.5 * (2 - 1)    = 1.5    1 + 0.5 * 4  = 3
        2    2  terminated  2                             2
        10   3  -           3 + 0.5 * (16 - 1)   = 10.5   3 + 0.5 * 22 = 14
        11   4  time limit  4 + 0.5 * V(12)      = 16     16            (V(12), not the next episode's V(20))
        20   5  -           5 + 0.5 * (28 - 1)   = 18.5   5 + 0.5 * 42 = 26
        21   6  -           6 + 0.5 * V(22)      = 28     28
    """
    batch = tiny_trajectory(backend)
    timestep = batch.timestep
    value = lambda x: 2.0 * x[..., 0]
    values, final_values = value(batch.obs[:-1]), value(timestep.final_obs)
    mask = np.asarray(ops.loss_mask(batch.action_ignored))[:, 0] > 0
    assert mask.sum() == 6
    config = acer.ACERConfig(gamma=0.5)
    for traces, expected in ((1.0, [1.5, 2.0, 10.5, 16.0, 18.5, 28.0]), (0.0, [3.0, 2.0, 14.0, 16.0, 26.0, 28.0])):
        q_ret = acer.critic_targets(config, batch, values + 1.0, values, final_values,
                                    jnp.full_like(values, traces), value(batch.obs[-1]))
        np.testing.assert_allclose(np.asarray(q_ret)[mask, 0], expected, rtol=1e-6)


def numpy_retrace(reward, terminated, truncated, q_taken, values, final_values, traces, bootstrap, gamma):
    """Q_ret by the rule, one step at a time (module docstring of rlhf_jax.ops.episode_ends)."""
    targets, carry = np.zeros(len(reward)), bootstrap
    for t in reversed(range(len(reward))):
        if terminated[t]:
            targets[t] = reward[t]
        elif truncated[t]:
            targets[t] = reward[t] + gamma * final_values[t]
        else:
            targets[t] = reward[t] + gamma * carry
        carry = traces[t] * (targets[t] - q_taken[t]) + values[t]
    return targets


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gymnax", "envpool-atari"])
def test_the_discrete_critic_loss_bootstraps_a_time_limit_from_the_final_observation(backend):
    """The whole discrete loss on the tiny episode with a real network: its critic loss is
    mean over the steps that carry one of (Q_ret - Q(x_t, a_t))^2 / 2, Q_ret worked out in NumPy
    from the network's own Q and pi at x_0 .. x_k and at the final observations."""
    spec = tiny_spec(backend)
    config = acer.ACERConfig(gamma=0.9, mlp_hidden=(8,))
    network = acer.make_network(config, spec)
    params = network.init(jax.random.PRNGKey(3), jnp.zeros((1, 1)))
    batch = tiny_trajectory(backend)
    mu = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(4), batch.behaviour.shape))
    batch = batch._replace(behaviour=mu)
    _, metrics = acer.make_loss(config, spec)(params, params, batch, jax.random.PRNGKey(0))

    logits, q = jax.tree.map(np.asarray, network.apply(params, batch.obs[:, 0]))  # [k + 1, A]
    final_logits, final_q = jax.tree.map(np.asarray, network.apply(params, batch.timestep.final_obs[:, 0]))
    pi = softmax(logits)
    values = (pi * q).sum(-1)
    final_values = (softmax(final_logits) * final_q).sum(-1)
    if batch.final_obs is None:  # EnvPool: the step's final observation is the next one
        np.testing.assert_allclose(final_values, values[1:], rtol=1e-6)
    actions = np.asarray(batch.action[:, 0])
    k = len(actions)
    q_taken = q[np.arange(k), actions]
    rho = pi[np.arange(k), actions] / np.exp(np.asarray(mu[:, 0]))[np.arange(k), actions]
    q_ret = numpy_retrace(np.asarray(batch.reward[:, 0]), np.asarray(batch.terminated[:, 0]),
                          np.asarray(batch.truncated[:, 0]), q_taken, values[:-1], final_values,
                          np.minimum(1.0, rho), values[-1], config.gamma)
    carries_loss = ~np.asarray(batch.action_ignored[:, 0])
    expected = 0.5 * np.mean((q_ret - q_taken)[carries_loss] ** 2)
    np.testing.assert_allclose(metrics["value_loss"], expected, rtol=1e-5)


# A few iterations of 4 CartPoles, replay from the third on.
SMALL_RUN = dict(total_env_steps=4 * 20 * 12, replay_capacity=4 * 20 * 6, replay_start=160, learning_rate=3e-3)


@pytest.mark.slow
def test_vmap_over_seeds_equals_separate_runs():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    config = acer.ACERConfig(**SMALL_RUN)
    train = acer.make_train(config, env)
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    batched, batched_metrics = jax.jit(jax.vmap(train))(keys)
    single = jax.jit(train)
    for seed in range(3):
        runner, metrics = single(keys[seed])
        start = acer.init_runner(keys[seed], config, env).params
        for a, b, a0 in zip(*(jax.tree.leaves(p) for p in (runner.params, batched.params, start))):
            # Equal to rounding, and a rounding that tips a clip or a ReLU (seen under the
            # suite's XLA flags on an AVX-512 host: 8e-5 in one weight) still leaves them
            # within a thousandth of how far training moved the weights.
            moved = float(np.abs(np.asarray(a) - np.asarray(a0)).max())
            np.testing.assert_allclose(a, b[seed], rtol=0, atol=max(1e-3 * moved, 2e-5))
        np.testing.assert_array_equal(metrics["replay_updates"], batched_metrics["replay_updates"][seed])
    # The seeds drew different numbers of replays (the loop ran to their maximum under vmap).
    counts = np.asarray(batched_metrics["replay_updates"])
    assert not (counts == counts[0]).all()
    assert (counts[:, :1] == 0).all() and counts[:, 2:].sum() > 0  # replay starts at 160 env steps


@pytest.mark.slow
def test_a_tight_trust_region_keeps_the_policy_near_its_average():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    kl, active = {}, {}
    for delta in (1e-2, 1.0):  # 1 is the paper's (and SMALL_RUN's: one compiled program less)
        config = acer.ACERConfig(**dict(SMALL_RUN, trust_region_delta=delta))
        _, metrics = jax.jit(acer.make_train(config, env))(jax.random.PRNGKey(7))
        kl[delta] = float(metrics["kl_to_average"][4:].mean())
        active[delta] = float(metrics["trust_region_active"][4:].mean())
    # A tight bound shortens about half of the steps and keeps the divergence 5x smaller.
    assert active[1e-2] > 0.3 and active[1.0] < 0.5 * active[1e-2]
    assert kl[1e-2] < 0.2 * kl[1.0]


# ------------------------------------------------------------------------ learning


def mean_return(score) -> float:
    assert int(score.episodes) > 0
    return score.mean_return()


def train_shipped_config(name, seed=0):
    """Train with configs/<name>.yaml; return (runner, metrics, the policy's mean true return)."""
    experiment = load_config(ExperimentConfig, CONFIGS / f"{name}.yaml")
    assert experiment.agent == "acer"
    config = experiment.acer
    env = make(experiment.env)
    runner, metrics = jax.jit(acer.make_train(config, env))(jax.random.PRNGKey(seed))
    eval_env = make(EnvConfig(id=experiment.env.id, num_envs=32))
    act = acer.make_policy(config, env.spec)
    steps = eval_env.spec.max_episode_steps + 1
    score = jax.jit(lambda p, k: evaluate(act, p, eval_env, k, steps))(runner.params, jax.random.PRNGKey(100))
    return config, env, runner, jax.tree.map(np.asarray, metrics), mean_return(score)


@pytest.fixture(scope="module")
def cartpole():
    return train_shipped_config("acer_cartpole")


@pytest.mark.slow
def test_acer_solves_cartpole(cartpole):
    *_, score = cartpole
    assert score >= 475


def test_replays_follow_a_poisson_count_once_the_memory_is_warm(cartpole):
    config, env, runner, metrics, _ = cartpole
    replays = metrics["replay_updates"]
    stored = (np.arange(len(replays)) + 1) * acer.env_steps_per_iteration(config, env)
    warm = stored >= config.replay_start
    assert (replays[~warm] == 0).all() and warm.sum() > 300
    # Poisson(r): mean r and variance r (standard error of the mean about 0.1 here).
    assert abs(replays[warm].mean() - config.replay_ratio) < 0.4
    assert abs(replays[warm].var() - config.replay_ratio) < 1.5
    assert int(runner.updates) == len(replays) + replays.sum()


def test_updates_written_out_compute_what_the_drawn_loop_does():
    """A host that dispatches iterations one at a time (``run.loop=python``) reads the drawn count
    first and runs the iteration with that many updates written out: the same updates, keys and
    results as the loop, up to rounding."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    config = acer.ACERConfig(num_steps=8, replay_capacity=4 * 8 * 16, replay_start=64, replay_ratio=4.0)
    iteration = acer.make_iteration(config, env, env_reward)
    step, count = jax.jit(iteration), jax.jit(iteration.count)
    runner = acer.init_runner(jax.random.PRNGKey(0), config, env)
    assert int(count(runner)) == 1  # 32 env steps stored after it: before replay_start, no replay
    counts = []
    while len(counts) < 4 or counts[-1] < 3:  # warm, then on to an iteration that replays at least twice
        counts.append(int(count(runner)))
        drawn, drawn_metrics, _ = step(runner)
        assert int(drawn.updates - runner.updates) == counts[-1] == 1 + int(drawn_metrics["replay_updates"])
        if counts[-1] < 3:
            runner = drawn
    written, written_metrics, _ = jax.jit(iteration.with_count(counts[-1]))(runner)
    for a, b in zip(jax.tree.leaves((drawn, drawn_metrics)), jax.tree.leaves((written, written_metrics))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_updates_written_out_keep_the_convolutions_out_of_loops_on_atari():
    """XLA:CPU runs a CNN's gradient about six times slower inside a loop (jax-ml/jax#12868): with
    its updates written out, an Atari iteration keeps only the rollout's acting in one."""
    env = make(EnvConfig(id="envpool/Pong-v5", num_envs=2, max_episode_steps=20))
    config = acer.ACERConfig(num_steps=4, replay_capacity=64, replay_start=0)
    runner = acer.init_runner(jax.random.PRNGKey(0), config, env)
    iteration = acer.make_iteration(config, env, env_reward)
    contexts = lambda fn: convolutions_by_control_flow(jax.make_jaxpr(fn)(runner).jaxpr)
    acting = contexts(iteration).count(("scan",))
    assert acting == 2  # the A3C network's two convolutions (its default torso), once a step
    assert set(contexts(iteration)) == {("scan",), ("while",)}  # the drawn loop's updates
    written = contexts(iteration.with_count(3))
    assert set(written) == {("scan",), ()} and written.count(("scan",)) == acting
    one_update = contexts(iteration.with_count(1)).count(())
    assert one_update > 0 and written.count(()) == 3 * one_update  # each update's, once


@pytest.mark.slow
def test_acer_continuous_solves_pendulum():
    *_, score = train_shipped_config("acer_pendulum")
    assert score >= -300


# ------------------------------------------------------------------------ relabelled rewards


def stored_batch(action, reward, k=3, n=2, obs_dim=4):
    """Trajectories of k steps of n envs, as the memory gives them to an update (EnvPool's layout:
    no final observations kept)."""
    obs = jnp.arange((k + 1) * n * obs_dim, dtype=jnp.float32).reshape(k + 1, n, obs_dim) / 10.0 - 1.0
    flags = jnp.zeros((k, n), bool)
    return acer.Trajectories(obs, action, reward, flags, flags, flags, None, jnp.zeros((k, n, 2)))


def test_relabel_rewards_recomputes_a_learned_discrete_reward_under_the_current_params():
    seen = []

    def reward_fn(params, obs, action, timestep):
        seen.append(timestep)
        return params * obs[..., 0] + action

    config = acer.ACERConfig(reward_scale=2.0, reward_clip=3.0)
    action = jnp.array([[0, 1], [1, 0], [1, 1]])
    obs = stored_batch(action, jnp.zeros((3, 2))).obs
    stale = jnp.clip(2.0 * (0.5 * obs[:-1, :, 0] + action), -3.0, 3.0)  # as under params a = 0.5
    batch = stored_batch(action, stale)
    new = acer.relabel_rewards(config, reward_fn, batch, 1.5)  # read under params b = 1.5
    expected = np.clip(2.0 * (1.5 * np.asarray(obs[:-1, :, 0]) + np.asarray(action)), -3.0, 3.0)
    np.testing.assert_allclose(new.reward, expected, rtol=1e-6)
    assert (np.abs(expected) == 3.0).any() and (np.abs(expected) < 3.0).any()  # the clip is exercised
    # The reward function got the TimeStep rebuilt from what the memory keeps, one row per step
    # (flattened like obs): x_{t+1}, which is also the final observation in EnvPool's layout.
    timestep = seen[-1]
    assert isinstance(timestep, TimeStep) and timestep.info == {}
    np.testing.assert_array_equal(timestep.obs, obs[1:].reshape(6, 4))
    np.testing.assert_array_equal(timestep.final_obs, obs[1:].reshape(6, 4))
    np.testing.assert_array_equal(timestep.reward, stale.reshape(6))
    assert not np.allclose(new.reward, stale)
    for name in ("obs", "action", "terminated", "truncated", "action_ignored", "behaviour"):
        np.testing.assert_array_equal(getattr(new, name), getattr(batch, name))
    # A reset step earns nothing, whatever the reward function says.
    ignored = batch._replace(action_ignored=batch.action_ignored.at[1, 0].set(True))
    assert float(acer.relabel_rewards(config, reward_fn, ignored, 1.5).reward[1, 0]) == 0.0
    # Under jit, with the params traced, it is the same.
    jitted = jax.jit(lambda b, p: acer.relabel_rewards(config, reward_fn, b, p))(batch, 1.5)
    np.testing.assert_allclose(jitted.reward, expected, rtol=1e-6)


def test_relabel_rewards_hands_the_reward_the_action_as_sampled():
    """As a rollout does: the reward function (the learned reward's config) decides whether an
    action out of the bounds is read clipped; the memory and the losses keep it as sampled."""
    reward_fn = lambda params, obs, action, timestep: params * action[..., 0]
    action = jnp.array([[[-5.0], [-1.0]], [[0.5], [3.0]], [[2.0], [-2.5]]])  # Pendulum's bounds are +-2
    batch = stored_batch(action, jnp.zeros((3, 2)))
    new = acer.relabel_rewards(acer.ACERConfig(reward_scale=0.1), reward_fn, batch, -3.0)
    np.testing.assert_allclose(new.reward, 0.1 * -3.0 * np.asarray(action[..., 0]), rtol=1e-6)
    np.testing.assert_array_equal(new.action, action)


def test_relabel_rewards_gives_the_true_reward_as_stored_scaled_and_clipped_as_a_rollout_does():
    stored = jnp.array([[1.0, -1.0], [0.1, 2.0], [0.0, 7.0]])  # the environment's reward, as the memory keeps it
    batch = stored_batch(jnp.zeros((3, 2), jnp.int32), stored)
    config = acer.ACERConfig(reward_scale=3.0, reward_clip=1.0)
    new = acer.relabel_rewards(config, env_reward, batch, None)
    np.testing.assert_allclose(new.reward, [[1.0, -1.0], [0.3, 1.0], [0.0, 1.0]], rtol=1e-6)
    np.testing.assert_array_equal(new.obs, batch.obs)


def test_a_reward_of_the_next_observation_reads_the_final_one_on_replay():
    """Equation 2's kind of reward, params * (x_{t+1} - x_t), on the tiny episode: on replay it reads
    the observation each step reached (the terminal state 3, the time limit's 12), not the next
    episode's first, and earns nothing on a reset step; it follows the current params."""
    rise = lambda params, obs, action, timestep: params * (timestep.final_obs - obs)[..., 0]
    for backend, expected in (("gymnax", [1, 1, 1, 1, 1, 1]), ("envpool-atari", [1, 1, 0, 1, 1, 0, 1, 1])):
        batch = tiny_trajectory(backend)
        for params in (1.0, -2.0):
            new = acer.relabel_rewards(acer.ACERConfig(), rise, batch, params)
            np.testing.assert_allclose(new.reward[:, 0], params * np.array(expected, np.float32))


@pytest.mark.slow
def test_replayed_updates_use_the_current_reward_params_not_the_stored_rewards():
    """Two memories alike but for their stored rewards give the same update under a learned
    reward: every update (replayed ones included) recomputes r-hat under the current params."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=2))
    config = acer.ACERConfig(num_steps=4, mlp_hidden=(8,), replay_capacity=2 * 4 * 3, replay_start=0,
                             replay_ratio=20.0, reward_scale=0.5)
    reward_fn = lambda params, obs, action, timestep: params * obs[..., 0] - action
    iteration = jax.jit(acer.make_iteration(config, env, reward_fn))
    runner, *_ = iteration(acer.init_runner(jax.random.PRNGKey(0), config, env), 1.0)  # rewards under a = 1
    stale = runner._replace(memory=runner.memory._replace(
        data=runner.memory.data._replace(reward=jnp.full_like(runner.memory.data.reward, 1e3))))
    fresh, metrics, _ = iteration(runner, 2.0)  # params b = 2
    garbled, garbled_metrics, _ = iteration(stale, 2.0)
    assert int(metrics["replay_updates"]) > 0
    for a, b in zip(jax.tree.leaves(fresh.params), jax.tree.leaves(garbled.params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(metrics["value_loss"], garbled_metrics["value_loss"], rtol=1e-6)


@pytest.mark.slow
def test_ibt_reward_drives_acer_on_cartpole():
    """IBT's reward (equation 2, ibt.utility=mlp), which reads timestep.final_obs, through a few ACER
    iterations on CartPole, replay included: no error, finite losses, and the utility's params change
    the updates."""
    from rlhf_jax.reward import ibt

    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4, max_episode_steps=30))
    ibt_config = ibt.IBTConfig(utility="mlp", hidden=(16,))
    state = ibt.init_ibt(jax.random.PRNGKey(1), ibt_config, env.spec)
    reward_fn = ibt.make_reward_fn(ibt_config, env.spec)
    config = acer.ACERConfig(num_steps=10, mlp_hidden=(16,), replay_capacity=4 * 10 * 4, replay_start=80)
    iteration = jax.jit(acer.make_iteration(config, env, reward_fn))
    runner = acer.init_runner(jax.random.PRNGKey(0), config, env)
    replays = 0
    for _ in range(6):
        runner, metrics, _ = iteration(runner, state)
        assert all(np.isfinite(float(metrics[name])) for name in acer.METRICS), metrics
        replays += int(metrics["replay_updates"])
    assert replays > 0 and np.asarray(runner.memory.data.truncated).any()
    other = state._replace(params=jax.tree.map(lambda p: -p, state.params))
    _, a, _ = iteration(runner, state)
    _, b, _ = iteration(runner, other)
    assert float(a["value_loss"]) != float(b["value_loss"])
