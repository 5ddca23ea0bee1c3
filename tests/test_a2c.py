"""A2C learns CartPole and Pendulum, and vmap over seeds equals separate runs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.agents import a2c
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.evaluation import evaluate


def mean_return(score) -> float:
    assert int(score["episodes"]) > 0
    return float(score["episode_return_sum"] / score["episodes"])


def train_and_evaluate(env_id, config, num_envs, seed=0):
    env = make(EnvConfig(id=env_id, num_envs=num_envs))
    runner, _ = jax.jit(a2c.make_train(config, env))(jax.random.PRNGKey(seed))
    eval_env = make(EnvConfig(id=env_id, num_envs=32))
    act = a2c.make_policy(config, env.spec)
    steps = eval_env.spec.max_episode_steps + 1
    return jax.jit(lambda p, k: evaluate(act, p, eval_env, k, steps))(runner.params, jax.random.PRNGKey(100))


def test_a2c_solves_cartpole():
    config = a2c.A2CConfig(total_env_steps=1_000_000, num_steps=8, learning_rate=3e-3)
    assert mean_return(train_and_evaluate("gymnax/CartPole-v1", config, num_envs=32)) >= 475


def test_a2c_gaussian_improves_pendulum_by_half_the_gap_to_minus_200():
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=32))
    uniform = lambda params, obs, key: jax.random.uniform(key, (32, 1), minval=-2.0, maxval=2.0)
    random_return = mean_return(jax.jit(lambda k: evaluate(uniform, None, env, k, 201))(jax.random.PRNGKey(100)))
    # Separate actor and critic torsos (an option; the paper's Atari agent shares one).
    config = a2c.A2CConfig(total_env_steps=1_000_000, num_steps=8, learning_rate=1e-3, gamma=0.95,
                           reward_scale=0.1, shared_torso=False)
    trained = mean_return(train_and_evaluate("gymnax/Pendulum-v1", config, num_envs=32))
    assert random_return < -1000
    assert trained >= random_return + 0.5 * (-200.0 - random_return)


def test_vmap_over_seeds_equals_separate_runs():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    train = a2c.make_train(a2c.A2CConfig(total_env_steps=4 * 5 * 30), env)
    keys = jax.random.split(jax.random.PRNGKey(7), 8)
    batched, batched_metrics = jax.jit(jax.vmap(train))(keys)
    single = jax.jit(train)
    for seed in range(8):
        runner, metrics = single(keys[seed])
        for a, b in zip(jax.tree.leaves(runner.params), jax.tree.leaves(batched.params)):
            np.testing.assert_allclose(a, b[seed], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(metrics["loss"], batched_metrics["loss"][seed], rtol=2e-5, atol=1e-6)
    # Different seeds really are different runs.
    first = jax.tree.leaves(batched.params)[0]
    assert not np.allclose(first[0], first[1])


def test_gaussian_actions_are_clipped_for_the_env_but_not_the_loss():
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=2))
    config = a2c.A2CConfig(total_env_steps=10, log_std_init=3.0)  # std 20: most samples fall outside [-2, 2]
    runner = a2c.init_runner(jax.random.PRNGKey(0), config, env)
    act = a2c.make_policy(config, env.spec)
    actions = jax.vmap(lambda k: act(runner.params, runner.obs, k))(jax.random.split(jax.random.PRNGKey(1), 50))
    assert float(jnp.abs(actions).max()) > 2.0  # the policy itself is unbounded
    runner, _, transitions = jax.jit(a2c.make_iteration(config, env, lambda p, o, a, ts: jnp.abs(a[:, 0])))(runner)
    assert np.isfinite(np.asarray(jax.tree.leaves(runner.params)[0])).all()
    # The transitions hold the actions the environment received: inside its bounds.
    assert transitions.action.shape == (config.num_steps, 2, 1)
    assert float(jnp.abs(transitions.action).max()) <= 2.0


def test_bad_config_values():
    from rlhf_jax.errors import ConfigError

    with pytest.raises(ConfigError, match="gamma"):
        a2c.A2CConfig(gamma=1.5)
