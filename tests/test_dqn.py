"""DQN (Mnih et al. 2015): the config, step counting, learning CartPole, vmap over seeds, target syncs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import replay
from rlhf_jax.agents import dqn
from rlhf_jax.agents.base import env_reward
from rlhf_jax.envs import EnvConfig, make
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


def test_step_counting_with_many_environments():
    c = dqn.DQNConfig(update_period=4)
    # (vector steps, updates) per iteration: always one update per 4 env steps summed over environments.
    assert dqn.iteration_shape(c, 1) == (4, 1)
    assert dqn.iteration_shape(c, 16) == (1, 4)
    assert dqn.iteration_shape(c, 6) == (2, 3)
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=6))
    assert dqn.num_iterations(dataclasses.replace(c, total_env_steps=1200), env) == 100


def test_learns_cartpole():
    """Trained with the overrides above, the epsilon = 0.05 evaluation policy balances the pole to the limit."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=16))
    runner, metrics = jax.jit(dqn.make_train(CARTPOLE, env))(jax.random.PRNGKey(1))
    assert int(metrics["env_steps"][-1]) == CARTPOLE.total_env_steps
    assert int(metrics["updates"][-1]) == (CARTPOLE.total_env_steps - CARTPOLE.replay_start) // CARTPOLE.update_period + 4
    eval_env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=32))
    act = dqn.make_policy(CARTPOLE, env.spec)  # epsilon = eval_epsilon = 0.05
    score = jax.jit(lambda p, k: evaluate(act, p, eval_env, k, 600))(runner.params, jax.random.PRNGKey(1))
    assert int(score["episodes"]) == 32
    assert float(score["episode_return_sum"]) / 32 >= 475


SHORT = dqn.DQNConfig(total_env_steps=1024, replay_capacity=512, replay_start=256, batch_size=16,
                      target_update_period=10, exploration_steps=512, mlp_hidden=(16,))


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


def test_atari_smoke():
    """Pixels: the Nature CNN and a memory of single frames, a few updates on EnvPool Pong."""
    env = make(EnvConfig(id="envpool/Pong-v5", num_envs=2, max_episode_steps=20))
    config = dataclasses.replace(SHORT, replay_capacity=128, replay_start=32, batch_size=4)
    runner = dqn.init_runner(jax.random.PRNGKey(0), config, env)
    assert runner.memory.frames.shape == (64, 2, 84, 84) and runner.memory.frames.dtype == jnp.uint8
    iteration = jax.jit(dqn.make_iteration(config, env, env_reward))
    for _ in range(24):
        runner, metrics, _ = iteration(runner, None)
    assert int(runner.updates) == (96 - 32) // 4 + 1 and np.isfinite(float(metrics["loss"]))
    assert replay.valid_mask(runner.memory).sum() > 0
