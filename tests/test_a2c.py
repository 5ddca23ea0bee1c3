"""A2C: its returns at episode ends by hand, learning CartPole and Pendulum, and vmap over seeds equals separate runs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.agents import a2c
from rlhf_jax.agents.base import env_step, final_values
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.envs.core import TimeStep
from rlhf_jax.evaluation import evaluate


def mean_return(score) -> float:
    assert int(score.episodes) > 0
    return score.mean_return()


def train_and_evaluate(env_id, config, num_envs, seed=0):
    env = make(EnvConfig(id=env_id, num_envs=num_envs))
    runner, _ = jax.jit(a2c.make_train(config, env))(jax.random.PRNGKey(seed))
    eval_env = make(EnvConfig(id=env_id, num_envs=32))
    act = a2c.make_policy(config, env.spec)
    steps = eval_env.spec.max_episode_steps + 1
    return jax.jit(lambda p, k: evaluate(act, p, eval_env, k, steps))(runner.params, jax.random.PRNGKey(100))


def ends(terminated, truncated, action_ignored=None):
    """A stacked [T, N] TimeStep holding only episode ends (what the targets read)."""
    terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
    ignored = np.zeros_like(terminated) if action_ignored is None else np.asarray(action_ignored, bool)
    zeros = jnp.zeros(terminated.shape)
    return TimeStep(zeros, zeros, jnp.asarray(terminated), jnp.asarray(truncated), zeros, jnp.asarray(ignored), {})


def test_n_step_targets_of_a_tiny_episode_by_hand():
    """gamma = 0.5, two copies, three steps, V(s_T) = [70, 80].

    Reset within the step: copy 0 is cut by its time limit at t = 1 with V(final_obs_1) = 8,
    copy 1 terminates at t = 0.

      copy 0: R_2 = 5 + 0.5 * 70 = 40;  R_1 = 3 + 0.5 * 8 = 7 (nothing of R_2 flows back);  R_0 = 1 + 0.5 * 7 = 4.5
      copy 1: R_2 = 6 + 0.5 * 80 = 46;  R_1 = 4 + 0.5 * 46 = 27;  R_0 = 2
    """
    config = a2c.A2CConfig(gamma=0.5)
    rewards = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    bootstrap = jnp.array([70.0, 80.0])
    final_values = jnp.array([[-1.0, -2.0], [8.0, -3.0], [-4.0, -5.0]])  # read only where truncated
    timesteps = ends(terminated=[[0, 1], [0, 0], [0, 0]], truncated=[[0, 0], [1, 0], [0, 0]])
    returns, mask = a2c.n_step_targets(config, rewards, timesteps, final_values, bootstrap)
    np.testing.assert_allclose(returns, [[4.5, 2.0], [7.0, 27.0], [40.0, 46.0]])
    np.testing.assert_array_equal(mask, np.ones((3, 2)))

    # EnvPool's layout: copy 0 is cut at t = 0 (final_obs is the real next observation,
    # V = 30) and EnvPool resets at t = 1 (action ignored, reward 0); copy 1 terminates at
    # t = 1 and resets at t = 2.
    #   copy 0: R_2 = 5 + 0.5 * 70 = 40;  R_0 = 1 + 0.5 * 30 = 16
    #   copy 1: R_1 = 4;  R_0 = 2 + 0.5 * 4 = 4
    rewards = jnp.array([[1.0, 2.0], [0.0, 4.0], [5.0, 0.0]])
    final_values = jnp.array([[30.0, 40.0], [50.0, 60.0], [70.0, 80.0]])
    timesteps = ends(terminated=[[0, 0], [0, 1], [0, 0]], truncated=[[1, 0], [0, 0], [0, 0]],
                     action_ignored=[[0, 0], [1, 0], [0, 1]])
    returns, mask = a2c.n_step_targets(config, rewards, timesteps, final_values, bootstrap)
    np.testing.assert_array_equal(mask, [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    counted = np.asarray(mask) > 0
    np.testing.assert_allclose(np.asarray(returns)[counted], np.array([[16.0, 4.0], [0.0, 4.0], [40.0, 0.0]])[counted])


def test_final_values_runs_the_network_only_for_a_rollout_that_holds_a_time_limit_end():
    """V(final_obs) is what the time-limit rule reads where a step was truncated; a rollout
    with no truncation gets zeros without the network's pass (counted by a host callback)."""
    calls = []

    def value_fn(obs):
        jax.debug.callback(lambda: calls.append(1))
        return obs.sum(-1) * 2.0

    final_obs = jnp.arange(12.0).reshape(3, 2, 2)  # [T, N, obs]
    values = jax.jit(lambda t: final_values(value_fn, t))
    cut = ends(terminated=[[0, 0], [0, 0], [0, 0]], truncated=[[0, 0], [1, 0], [0, 0]])._replace(final_obs=final_obs)
    np.testing.assert_array_equal(values(cut), [[2.0, 10.0], [18.0, 26.0], [34.0, 42.0]])
    assert len(calls) == 1
    uncut = cut._replace(truncated=jnp.zeros((3, 2), bool))
    np.testing.assert_array_equal(values(uncut), np.zeros((3, 2)))
    assert len(calls) == 1  # not run again


@pytest.mark.slow
def test_a2c_solves_cartpole():
    # No entropy bonus: once every episode runs to the time limit, which the returns bootstrap
    # through (ops.episode_ends), the advantages carry little signal and a bonus of 0.01 alone
    # pulls a solved policy back toward random late in training (2 seeds of 7 ended below 475).
    config = a2c.A2CConfig(total_env_steps=1_000_000, num_steps=8, learning_rate=3e-3, entropy_coef=0.0)
    assert mean_return(train_and_evaluate("gymnax/CartPole-v1", config, num_envs=32)) >= 475


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_gaussian_actions_are_clipped_for_the_env_but_not_for_the_loss_or_the_reward():
    env = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=2))
    config = a2c.A2CConfig(total_env_steps=10, log_std_init=3.0)  # std 20: most samples fall outside [-2, 2]
    runner = a2c.init_runner(jax.random.PRNGKey(0), config, env)
    act = a2c.make_policy(config, env.spec)
    actions = jax.vmap(lambda k: act(runner.params, runner.obs, k))(jax.random.split(jax.random.PRNGKey(1), 50))
    assert float(jnp.abs(actions).max()) > 2.0  # the policy itself is unbounded
    handed = []  # what the reward function was handed (eager: the rewards are asked for after the rollout)
    reward_fn = lambda p, o, a, ts: handed.append(a) or jnp.abs(a[:, 0])
    runner, _, transitions = a2c.make_iteration(config, env, reward_fn)(runner)
    assert np.isfinite(np.asarray(jax.tree.leaves(runner.params)[0])).all()
    # The transitions, and the reward, get the actions as sampled: a learned reward clips them
    # or not as its config says (RewardModelConfig.clip_actions).
    assert transitions.action.shape == (config.num_steps, 2, 1)
    assert float(jnp.abs(transitions.action).max()) > 2.0
    np.testing.assert_array_equal(handed[-1], transitions.action.reshape(-1, 1))
    # The environment takes them clipped into its bounds.
    recorder = type("Recorder", (), {"spec": env.spec, "step": lambda self, state, action: (state, action)})()
    _, taken = env_step(recorder, None, jnp.array([[3.0], [-0.5], [-7.0]]))
    np.testing.assert_array_equal(taken, [[2.0], [-0.5], [-2.0]])


def test_bad_config_values():
    from rlhf_jax.errors import ConfigError

    with pytest.raises(ConfigError, match="gamma"):
        a2c.A2CConfig(gamma=1.5)


def test_a_step_whose_action_was_ignored_earns_no_reward_whatever_the_reward_function_says():
    from rlhf_jax.agents.base import rollout_rewards

    obs = jnp.arange(6.0).reshape(3, 2, 1)  # [T=3, N=2, 1]
    timestep = ends([[0, 0], [0, 0], [0, 0]], [[0, 0], [0, 0], [0, 0]], action_ignored=[[0, 1], [0, 0], [1, 0]])
    learned = lambda params, obs, action, timestep: params * obs[:, 0]  # r̂ = params x obs, by hand
    reward = rollout_rewards(learned, 2.0, obs, jnp.zeros((3, 2), jnp.int32), timestep, reward_scale=0.5,
                             reward_clip=4.0)
    np.testing.assert_allclose(reward, [[0.0, 0.0], [2.0, 3.0], [0.0, 4.0]])  # 0.5 x 2 x obs, clipped at 4
