"""DQN (Mnih et al. 2015): the config, step counting, learning CartPole, vmap over seeds, target syncs,
the targets at episode ends in both back ends' layouts, and rewards recomputed on replay."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from control_flow import convolutions_by_control_flow
from rlhf_jax import replay
from rlhf_jax.agents import dqn
from rlhf_jax.agents.base import env_reward
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.envs.core import Discrete, EnvSpec, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.evaluation import evaluate

# Small-problem overrides of the paper's Atari settings, its centred RMSProp kept: a smaller
# memory, learning and annealing from earlier, a faster target sync, a larger minibatch and
# rate, and a Huber threshold of 10 (CartPole pays 1 a step, unclipped values reach ~100).
CARTPOLE = dqn.DQNConfig(
    total_env_steps=200_000, replay_capacity=200_000, replay_start=2_000, exploration_steps=20_000,
    epsilon_end=0.05, target_update_period=250, learning_rate=1e-3, batch_size=128, huber_delta=10.0,
)


def test_defaults_are_the_papers():
    c = dqn.DQNConfig()
    assert (c.replay_capacity, c.batch_size, c.target_update_period, c.gamma) == (1_000_000, 32, 10_000, 0.99)
    assert (c.learning_rate, c.rms_decay, c.rms_eps) == (0.00025, 0.95, 0.01)
    assert (c.epsilon_start, c.epsilon_end, c.exploration_steps, c.eval_epsilon) == (1.0, 0.1, 1_000_000, 0.05)
    assert (c.replay_start, c.update_period, c.reward_clip, c.huber_delta, c.double_q) == (50_000, 4, 1.0, 1.0, False)


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("gamma", 1.5), ("epsilon_end", -0.1),
                                          ("replay_start", -1), ("learning_rate", 0.0)])
def test_bad_values_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        dqn.DQNConfig(**{field: value})


def test_the_greedy_policy_takes_q_s_argmax_whatever_epsilon_and_key():
    """``greedy=True`` (what ``rlhf-jax eval --greedy`` asks of every agent) is epsilon 0: Q's
    argmax on every key, where the policy at ``eval_epsilon=1`` acts at random."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=64))
    config = dqn.DQNConfig(eval_epsilon=1.0)
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)
    act = dqn.make_policy(config, env.spec)
    argmax = jnp.argmax(dqn.QNetwork(env.spec, config).apply(runner.params, runner.obs), -1)
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        assert jnp.array_equal(act(runner.params, runner.obs, key, greedy=True), argmax)
    assert not jnp.array_equal(act(runner.params, runner.obs, jax.random.PRNGKey(0)), argmax)


def test_step_counting_with_many_environments():
    c = dqn.DQNConfig(update_period=4)
    # (vector steps, updates) per iteration: always one update per 4 env steps summed over environments.
    assert dqn.iteration_shape(c, 1) == (4, 1)
    assert dqn.iteration_shape(c, 16) == (1, 4)
    assert dqn.iteration_shape(c, 6) == (2, 3)
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=6))
    assert dqn.num_iterations(dataclasses.replace(c, total_env_steps=1200), env) == 100


@pytest.mark.slow
def test_learns_cartpole():
    """Trained with the overrides above, the epsilon = 0.05 evaluation policy balances the pole to
    the limit: the median of three seeds. One seed alone can end in one of DQN's dips (444 on
    one host's digits, 500 on another's); three keep the test about learning, not rounding."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=16))
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    runner, metrics = jax.jit(jax.vmap(dqn.make_train(CARTPOLE, env)))(keys)
    assert (np.asarray(metrics["env_steps"][:, -1]) == CARTPOLE.total_env_steps).all()
    updates = (CARTPOLE.total_env_steps - CARTPOLE.replay_start) // CARTPOLE.update_period + 4
    assert (np.asarray(metrics["updates"][:, -1]) == updates).all()
    eval_env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=32))
    act = dqn.make_policy(CARTPOLE, env.spec)  # epsilon = eval_epsilon = 0.05
    score = jax.jit(jax.vmap(lambda p, k: evaluate(act, p, eval_env, k, 600), in_axes=(0, None)))(
        runner.params, jax.random.PRNGKey(1))
    assert (np.asarray(score.episodes) == 32).all()
    assert np.median(np.asarray(score.return_sum) / 32) >= 475


SHORT = dqn.DQNConfig(total_env_steps=1024, replay_capacity=512, replay_start=256, batch_size=16,
                      target_update_period=10, exploration_steps=512, mlp_hidden=(16,))


@pytest.mark.slow
def test_vmap_over_seeds_matches_separate_runs():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=8))
    train = dqn.make_train(SHORT, env)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    together, metrics = jax.jit(jax.vmap(train))(keys)
    assert int(metrics["updates"][0, -1]) > 0
    single = jax.jit(train)
    for i in range(len(keys)):
        alone, _ = single(keys[i])
        for a, b in zip(jax.tree.leaves(alone.params), jax.tree.leaves(together.params)):
            np.testing.assert_allclose(a, b[i], rtol=1e-5, atol=1e-5)


def test_target_network_synced_every_c_updates():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))  # 4 envs, update_period 4: one update per iteration
    config = dataclasses.replace(SHORT, target_update_period=3, replay_start=64)
    iteration = jax.jit(dqn.make_iteration(config, env, env_reward))
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    synced = []
    for _ in range(40):
        runner, _, _ = iteration(runner, None)
        synced.append((int(runner.updates), same(runner.params, runner.target_params)))
    updates = [u for u, _ in synced]
    assert updates[-1] == 40 - 64 // 4 + 1
    for u, equal in synced:
        assert equal == (u % 3 == 0), (u, equal)  # updates = 0: both still the initial parameters


@pytest.mark.slow
def test_atari_smoke():
    """Pixels: the Nature CNN and a memory of single frames, a few updates on EnvPool Pong."""
    env = make(EnvConfig(id="envpool/Pong-v5", num_envs=2, max_episode_steps=20))
    config = dataclasses.replace(SHORT, replay_capacity=128, replay_start=32, batch_size=4)
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)
    assert runner.memory.frames.shape == (64, 2, 84, 84) and runner.memory.frames.dtype == jnp.uint8
    assert runner.memory.final_obs is None  # EnvPool's final observation is the next frame stack
    iteration = jax.jit(dqn.make_iteration(config, env, env_reward))
    for _ in range(24):
        runner, metrics, _ = iteration(runner, None)
    assert int(runner.updates) == (96 - 32) // 4 + 1 and np.isfinite(float(metrics["loss"]))
    assert replay.valid_mask(runner.memory).sum() > 0


def test_no_convolution_inside_a_loop_or_conditional_on_atari():
    """XLA:CPU runs a CNN's gradient about six times slower inside a loop or a conditional than in
    straight-line code (jax-ml/jax#12868): an Atari iteration, learning or not, has none there."""
    env = make(EnvConfig(id="envpool/Pong-v5", num_envs=16, max_episode_steps=20))
    config = dataclasses.replace(SHORT, replay_capacity=256, replay_start=64, batch_size=4)
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)
    jaxpr = jax.make_jaxpr(dqn.make_iteration(config, env, env_reward))(runner, None).jaxpr
    contexts = convolutions_by_control_flow(jaxpr)
    assert len(contexts) > 0  # the Nature CNN's, acting and learning
    assert set(contexts) == {()}


# ------------------------------------------------------------------ episode ends


def tiny_spec(backend: str) -> EnvSpec:
    return EnvSpec(id="test", backend=backend, num_envs=1, observation_shape=(1,), observation_dtype="float32",
                   action_space=Discrete(2), fps=50.0, max_episode_steps=10)


# One environment, observations are numbers. Three episodes: the first terminates (its terminal
# state 3), the second hits the time limit (its last observation 12), the third goes on.
# gymnax restarts a copy within the step: o_{t+1} is the next episode's first, final_obs the end.
GYMNAX = dict(obs=[1, 2, 10, 11, 20, 21], reward=[1, 2, 3, 4, 5, 6], terminated=[0, 1, 0, 0, 0, 0],
              truncated=[0, 0, 0, 1, 0, 0], ignored=[0, 0, 0, 0, 0, 0], final_obs=[2, 3, 11, 12, 21, 22])
# EnvPool reaches the end's observation (real), then spends a reset step on the new episode's first.
ENVPOOL = dict(obs=[1, 2, 3, 10, 11, 12, 20, 21], reward=[1, 2, 0, 3, 4, 0, 5, 6],
               terminated=[0, 1, 0, 0, 0, 0, 0, 0], truncated=[0, 0, 0, 0, 1, 0, 0, 0],
               ignored=[0, 0, 1, 0, 0, 1, 0, 0], final_obs=[2, 3, 10, 11, 12, 20, 21, 22])
LAYOUTS = {"gymnax": GYMNAX, "envpool-atari": ENVPOOL}


def tiny_memory(backend: str):
    """The episode above added step by step, as ``make_iteration`` adds them; every transition that may
    be sampled, in order."""
    steps = LAYOUTS[backend]
    spec = tiny_spec(backend)
    memory = replay.init(16, 1, (1,), jnp.float32, keep_final_obs=replay.keeps_final_obs(spec))
    for t in range(len(steps["obs"])):
        column = lambda name, dtype: jnp.array([steps[name][t]], dtype)
        timestep = TimeStep(None, column("reward", jnp.float32), column("terminated", bool), column("truncated", bool),
                            column("final_obs", jnp.float32)[:, None], column("ignored", bool), {})
        memory = replay.add(memory, column("obs", jnp.float32)[:, None], jnp.array([t % 2]), timestep)
    rows = np.nonzero(np.asarray(replay.valid_mask(memory))[:, 0])[0]
    return spec, memory, replay.gather(memory, jnp.asarray(rows), jnp.zeros_like(rows))


TINY = dqn.DQNConfig(gamma=0.5, mlp_hidden=(), huber_delta=1e3)


def linear_q(spec, kernel):
    """Parameters of a Q-network without hidden layers: Q(o, a) = kernel[a] * o."""
    params = dqn.QNetwork(spec, TINY).init(jax.random.PRNGKey(0), jnp.zeros((1, 1)))
    head = {"kernel": jnp.array([kernel], jnp.float32), "bias": jnp.zeros(2)}
    return jax.tree.map(lambda x: x, {"params": {**params["params"], "QHead_0": {"Dense_0": head}}})


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gymnax", "envpool-atari"])
def test_targets_at_a_terminal_a_time_limit_and_a_reset_step(backend):
    """Q(o, .; theta^-) = (o, 2o), so max_a Q = 2o; gamma = 0.5. The transitions that may be sampled are
    the same five in both layouts (EnvPool's reset steps never are):

        o_t  r  end          y
        1    1  -            1 + 0.5 * 2 * 2  = 3
        2    2  terminated   2
        10   3  -            3 + 0.5 * 2 * 11 = 14
        11   4  time limit   4 + 0.5 * 2 * 12 = 16   (its last observation 12, not the next episode's 20)
        20   5  -            5 + 0.5 * 2 * 21 = 26

    With double_q the online network Q(o, .; theta) = (3o, o) picks action 0, valued o by theta^-:
    y = 1 + 0.5 * 2, 2, 3 + 0.5 * 11, 4 + 0.5 * 12, 5 + 0.5 * 21.
    """
    spec, memory, batch = tiny_memory(backend)
    np.testing.assert_array_equal(batch.obs[:, 0], [1, 2, 10, 11, 20])
    assert batch.mask.all() and not batch.action_ignored.any()
    target_params, online_params = linear_q(spec, [1.0, 2.0]), linear_q(spec, [3.0, 1.0])
    y = dqn.make_targets(TINY, spec)(online_params, target_params, batch, batch.reward)
    np.testing.assert_allclose(y, [3.0, 2.0, 14.0, 16.0, 26.0], rtol=1e-6)
    double = dataclasses.replace(TINY, double_q=True)
    y = dqn.make_targets(double, spec)(online_params, target_params, batch, batch.reward)
    np.testing.assert_allclose(y, [2.0, 2.0, 8.5, 10.0, 15.5], rtol=1e-6)
    # The loss is the mean of (y - Q(o_t, a_t; theta))^2 / 2 (no Huber clipping below 1000): actions 0, 1 alternate.
    actions = np.asarray(batch.action)
    q_taken = np.where(actions == 0, 3.0, 1.0) * np.array([1, 2, 10, 11, 20])
    loss, _ = dqn.make_loss(TINY, spec)(online_params, target_params, batch, batch.reward)
    np.testing.assert_allclose(loss, np.mean(0.5 * (np.array([3.0, 2.0, 14.0, 16.0, 26.0]) - q_taken) ** 2), rtol=1e-6)


def test_a_draw_that_cannot_be_sampled_carries_no_loss():
    spec, memory, batch = tiny_memory("envpool-atari")
    # The reset step (row 2) and the newest row (7), forced into a batch: mask False.
    bad = replay.gather(memory, jnp.array([2, 7]), jnp.zeros(2, jnp.int32))
    assert not bad.mask.any() and bool(bad.action_ignored[0])
    both = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), batch, bad)
    params = linear_q(spec, [1.0, 2.0])
    loss = dqn.make_loss(TINY, spec)
    np.testing.assert_allclose(loss(params, params, both, both.reward)[0], loss(params, params, batch, batch.reward)[0],
                               rtol=1e-6)


# ------------------------------------------------------------------ rewards never go stale


@pytest.mark.parametrize("backend", ["gymnax", "envpool-atari"])
def test_replayed_rewards_follow_the_current_reward_params(backend):
    """The memory keeps the environment's reward; a learned reward is computed when a batch is drawn,
    under the reward params of that moment, on the rebuilt TimeStep."""
    spec, memory, batch = tiny_memory(backend)
    np.testing.assert_array_equal(batch.reward, [1, 2, 3, 4, 5])  # the environment's, as stored
    config = dataclasses.replace(TINY, reward_clip=30.0)
    learned = lambda params, obs, action, timestep: params * obs[..., 0]
    np.testing.assert_allclose(dqn.replay_rewards(config, learned, 1.0, batch), [1, 2, 10, 11, 20])
    np.testing.assert_allclose(dqn.replay_rewards(config, learned, 2.0, batch), [2, 4, 20, 22, 30])  # 40 clipped
    # Equation 2's kind of reward reads the observation the step reached, also at episode ends
    # (the terminal state 3, the time limit's 12): the rise is 1 everywhere.
    rise = lambda params, obs, action, timestep: params * (timestep.final_obs - obs)[..., 0]
    np.testing.assert_allclose(dqn.replay_rewards(config, rise, 3.0, batch), [3, 3, 3, 3, 3])
    assert dqn.replay_rewards(config, env_reward, None, batch) is not None
    np.testing.assert_allclose(dqn.replay_rewards(config, env_reward, None, batch), [1, 2, 3, 4, 5])


def test_the_memory_keeps_the_environments_reward_and_updates_read_the_current_params():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4, max_episode_steps=10))
    config = dataclasses.replace(SHORT, replay_start=32, batch_size=32, reward_clip=0.0)
    learned = lambda params, obs, action, timestep: params * obs[..., 0] + 100.0
    iteration = jax.jit(dqn.make_iteration(config, env, learned))
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)
    for _ in range(24):  # 24 vector steps
        runner, _, _ = iteration(runner, 1.0)
    stored = np.asarray(runner.memory.reward)[: int(runner.memory.ring.size)]
    np.testing.assert_array_equal(stored, 1.0)  # CartPole pays 1 a step; r-hat (about 100) is never stored
    assert np.asarray(runner.memory.truncated).any()  # the time limit of 10 was reached
    # The same memory and learner under other reward params: another update.
    _, a, _ = iteration(runner, 1.0)
    _, b, _ = iteration(runner, -1.0)
    assert int(a["updates"]) > 0 and float(a["loss"]) != float(b["loss"])
