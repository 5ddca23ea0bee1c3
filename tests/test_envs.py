"""The environment protocol on the gymnax and EnvPool back ends (MJX has its own file)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.envs import ENV_IDS, Discrete, EnvConfig, make
from rlhf_jax.errors import ConfigError


def random_actions(env, key, steps):
    space = env.action_space
    shape = (steps, env.num_envs) + tuple(space.shape)
    if isinstance(space, Discrete):
        return jax.random.randint(key, shape, 0, space.n)
    return jax.random.uniform(key, shape, minval=space.low, maxval=space.high)


def rollout(env, steps, seed=0):
    """reset + `steps` random steps inside one jit(lax.scan); returns the stacked TimeSteps as NumPy."""

    def run(key):
        reset_key, action_key = jax.random.split(key)
        state, first = env.reset(reset_key)

        def body(state, action):
            state, timestep = env.step(state, action)
            return state, timestep

        _, timesteps = jax.lax.scan(body, state, random_actions(env, action_key, steps))
        return first, timesteps

    first, timesteps = jax.jit(run)(jax.random.PRNGKey(seed))
    return first, jax.tree.map(np.asarray, timesteps)


def first_episode_returns(timesteps):
    """The true return of each copy's first finished episode (NaN where none finished)."""
    done = timesteps.info["true_done"]
    returns = np.full(done.shape[1], np.nan)
    for copy in range(done.shape[1]):
        ends = np.flatnonzero(done[:, copy])
        if len(ends):
            returns[copy] = timesteps.info["episode_return"][ends[0], copy]
    return returns


@pytest.fixture(scope="module")
def cartpole_plain():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    return env, rollout(env, 300)


@pytest.fixture(scope="module")
def cartpole_hidden():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4, hide_episode_end=True, max_episode_steps=100,
                         termination_penalty=2.0))
    return env, rollout(env, 300)


def test_gymnax_hidden_end_reset_restarts_unannounced():
    # The Atari treatment on gymnax: a fall restarts the copy at once, the agent's episode
    # goes on (only a life's time limit ends it), the oracle pays the penalty once.
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4, hide_episode_end=True, hidden_end="reset",
                         termination_penalty=2.0))
    _, ts = rollout(env, 200)
    falls = np.asarray(ts.info["true_done"])
    assert falls.sum() >= 4 * 200 // 60 and not np.asarray(ts.done).any()
    np.testing.assert_allclose(ts.reward, np.where(falls, np.asarray(ts.info["true_reward"]) - 2.0, 1.0))
    assert np.all(np.abs(ts.obs[falls]) <= 0.05)  # the next observation is a fresh start
    # ...while final_obs is the state the copy fell into: the pole past 12 degrees or the cart off the track.
    fallen = (np.abs(ts.final_obs[falls][:, 2]) > 0.2094) | (np.abs(ts.final_obs[falls][:, 0]) > 2.4)
    assert fallen.all()
    np.testing.assert_array_equal(ts.final_obs[~falls], ts.obs[~falls])
    assert not ts.action_ignored.any()


def test_gymnax_shapes_and_auto_reset(cartpole_plain):
    env, (first, ts) = cartpole_plain
    assert env.spec.observation_shape == (4,) and env.spec.action_space == Discrete(2)
    assert first.obs.shape == (4, 4) and first.obs.dtype == jnp.float32
    assert ts.obs.shape == (300, 4, 4) and ts.reward.shape == ts.done.shape == (300, 4)
    # A random policy drops the pole within a few dozen steps, and the copy starts again.
    assert ts.done.sum() >= 4 * 300 // 60
    # A fresh CartPole state lies in [-0.05, 0.05]^4.
    assert np.all(np.abs(ts.obs[ts.done]) <= 0.05)
    # Every end is a fall (no time limit in 300 steps): terminated, and final_obs is the fallen state.
    np.testing.assert_array_equal(ts.terminated, ts.done)
    assert not ts.truncated.any() and not ts.action_ignored.any()
    final = ts.final_obs[ts.done]
    assert np.all((np.abs(final[:, 2]) > 0.2094) | (np.abs(final[:, 0]) > 2.4))
    np.testing.assert_array_equal(ts.final_obs[~ts.done], ts.obs[~ts.done])


def test_episode_return_is_the_sum_of_true_rewards(cartpole_plain):
    _, (_, ts) = cartpole_plain
    for copy in range(4):
        total = 0.0
        for t in range(300):
            total += ts.info["true_reward"][t, copy]
            if ts.info["true_done"][t, copy]:
                assert ts.info["episode_return"][t, copy] == pytest.approx(total)
                assert ts.info["episode_length"][t, copy] == round(total)  # CartPole pays 1 a step
                total = 0.0


def test_hidden_episode_end_keeps_the_unmodified_return(cartpole_plain, cartpole_hidden):
    """Appendix A: fixed-length episodes, a penalty instead of termination, true return unchanged."""
    _, (_, plain) = cartpole_plain
    env, (_, hidden) = cartpole_hidden
    # The agent sees an episode end only at the fixed time limit.
    assert np.array_equal(np.flatnonzero(hidden.done[:, 0]), np.arange(99, 300, 100))
    assert np.all(hidden.truncated == hidden.done) and not hidden.terminated.any()
    # Same key, same actions: the first episode is the same game until the pole falls,
    # so its unmodified return is the same in both versions.
    np.testing.assert_allclose(first_episode_returns(hidden), first_episode_returns(plain))
    # The oracle's reward: 1 while up, 1 - penalty on the step the pole falls, then -penalty.
    failed = hidden.reward[:100, 0] < 1
    first_fail = np.argmax(failed)
    assert hidden.reward[first_fail, 0] == pytest.approx(1 - 2.0)
    np.testing.assert_allclose(hidden.reward[first_fail + 1:100, 0], -2.0)
    np.testing.assert_allclose(hidden.info["true_reward"][first_fail + 1:100, 0], 0.0)


def test_gymnax_continuous_and_minatar_specs():
    pendulum = make(EnvConfig(id="gymnax/Pendulum-v1", num_envs=2)).spec
    assert pendulum.action_space.shape == (1,) and pendulum.action_space.high == 2.0
    breakout = make(EnvConfig(id="gymnax/Breakout-MinAtar", num_envs=2)).spec
    assert breakout.observation_shape == (10, 10, 4) and breakout.action_space == Discrete(3)


def test_gymnax_reset_vmaps_over_seeds():
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=3))
    _, timestep = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 5))
    assert timestep.obs.shape == (5, 3, 4)
    assert len(np.unique(np.asarray(timestep.obs[:, 0, 0]))) == 5


@pytest.mark.parametrize("env_id", ["gymnax/Pendulum-v1", "gymnax/CartPole-v1", "gymnax/Breakout-MinAtar"])
def test_a_step_returns_the_state_types_reset_gave(env_id):
    """Same shapes, dtypes and weak types after a step, or every jitted chunk compiles twice
    (gymnax's Pendulum resets a weakly typed torque)."""
    env = make(EnvConfig(id=env_id, num_envs=2))
    state, _ = env.reset(jax.random.PRNGKey(0))
    action = random_actions(env, jax.random.PRNGKey(1), 1)[0]
    stepped = jax.eval_shape(env.step, state, action)[0]
    assert jax.tree.map(jax.typeof, state) == jax.tree.map(jax.typeof, stepped)


def test_an_unknown_id_names_the_nearest_known_one_and_where_the_rest_are():
    with pytest.raises(ConfigError) as error:
        make("gymnax/CartPole-v9")
    assert str(error.value).startswith("unknown environment id 'gymnax/CartPole-v9' (did you mean "
                                       "'gymnax/CartPole-v1'?); `rlhf-jax envs` lists every known id")


@pytest.mark.parametrize(
    "action, expected",
    [
        (jnp.zeros((3,), jnp.int32), r"shape \(4,\)"),
        (jnp.zeros((4,), jnp.float32), "integer dtype"),
        (jnp.zeros((4, 1), jnp.int32), r"got shape \(4, 1\)"),
    ],
)
def test_bad_action_fails_at_trace_time(action, expected):
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=4))
    state, _ = env.reset(jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=expected):
        jax.eval_shape(env.step, state, action)


def test_options_of_another_back_end_are_refused():
    with pytest.raises(ConfigError, match="hide_score"):
        make(EnvConfig(id="gymnax/CartPole-v1", hide_score=True))
    with pytest.raises(ConfigError, match="control_cost"):
        make(EnvConfig(id="envpool/Pong-v5", control_cost=False))


# ---- EnvPool: Atari through the XLA interface ------------------------------------------

@pytest.fixture(scope="module")
def breakout_runs():
    """The same seeded game three ways: plain, without episode ends, and with life loss as episode end."""
    runs = {}
    for mode, options in {
        "plain": {},
        "hidden": {"hide_episode_end": True},
        "lives": {"episodic_life": True},
    }.items():
        env = make(EnvConfig(id="envpool/Breakout-v5", num_envs=2, seed=3, **options))
        runs[mode] = (env, rollout(env, 400, seed=1)[1])
    return runs


@pytest.mark.slow
def test_atari_observations_are_stacked_uint8_frames(breakout_runs):
    env, ts = breakout_runs["plain"]
    assert env.spec.observation_shape == (84, 84, 4) and env.spec.observation_dtype == "uint8"
    assert ts.obs.shape == (400, 2, 84, 84, 4) and ts.obs.dtype == np.uint8
    # Frame stacking: the newest frame of step t is the second newest at step t + 1.
    np.testing.assert_array_equal(ts.obs[10, :, :, :, 3], ts.obs[11, :, :, :, 2])


def test_atari_games_end_and_restart(breakout_runs):
    _, ts = breakout_runs["plain"]
    assert ts.info["true_done"].sum() >= 2
    np.testing.assert_array_equal(ts.done, ts.info["true_done"])
    # EnvPool resets on the step after a game ends: that step's action is ignored.
    ends = np.argwhere(ts.info["true_done"][:-1])
    assert all(ts.action_ignored[t + 1, c] for t, c in ends)
    # Nothing is replaced within a step: final_obs is obs, a lost game is terminated.
    np.testing.assert_array_equal(ts.final_obs, ts.obs)
    np.testing.assert_array_equal(ts.terminated, ts.done)


def test_atari_reset_step_follows_every_game_end_even_without_lives():
    # Pong has no lives; a short time limit makes games end within the rollout.
    env = make(EnvConfig(id="envpool/Pong-v5", num_envs=2, seed=0, max_episode_steps=30))
    _, ts = rollout(env, 70)
    ends = np.argwhere(ts.info["true_done"][:-1])
    assert len(ends) >= 2 and ts.truncated[tuple(ends.T)].all() and not ts.terminated.any()
    following = np.zeros_like(ts.action_ignored)
    following[1:] = ts.info["true_done"][:-1]
    np.testing.assert_array_equal(ts.action_ignored, following)
    np.testing.assert_array_equal(ts.final_obs, ts.obs)  # the time-limit step's observation is real


def test_atari_hidden_episode_end(breakout_runs):
    _, plain = breakout_runs["plain"]
    _, hidden = breakout_runs["hidden"]
    assert not hidden.done.any()  # one continuous game for the agent
    np.testing.assert_array_equal(hidden.action_ignored, plain.action_ignored)  # EnvPool still resets a step late
    np.testing.assert_array_equal(hidden.info["true_done"], plain.info["true_done"])
    np.testing.assert_array_equal(hidden.info["true_reward"], plain.info["true_reward"])
    # The oracle pays a penalty of 1 for each life lost (Breakout is not Pong).
    lives_lost = -np.minimum(np.diff(hidden.info["lives"], axis=0), 0).sum()
    assert lives_lost > 0
    assert hidden.reward.sum() == pytest.approx(plain.reward.sum() - lives_lost, abs=1e-3)


def test_atari_life_loss_as_episode_end(breakout_runs):
    _, plain = breakout_runs["plain"]
    _, lives = breakout_runs["lives"]
    lost = np.diff(lives.info["lives"], axis=0) < 0
    np.testing.assert_array_equal(lives.done[1:], lost | plain.done[1:])
    # ...but the game goes on: true episodes are still whole games.
    np.testing.assert_array_equal(lives.info["true_done"], plain.info["true_done"])


# ---- EnvPool: C MuJoCo, the CPU back end -----------------------------------------------

def test_envpool_mujoco_hidden_episode_end_keeps_the_unmodified_return():
    plain_env = make(EnvConfig(id="envpool/Hopper-v5", num_envs=3, seed=5))
    hidden_env = make(EnvConfig(id="envpool/Hopper-v5", num_envs=3, seed=5, hide_episode_end=True,
                                max_episode_steps=200))
    _, plain = rollout(plain_env, 250, seed=2)
    _, hidden = rollout(hidden_env, 250, seed=2)
    assert plain_env.spec.observation_shape == (11,) and plain_env.spec.fps == pytest.approx(125)
    assert hidden.done[:, 0].sum() == 1 and hidden.done[199, 0]
    np.testing.assert_array_equal(hidden.truncated, hidden.done)
    assert not hidden.terminated.any()
    # Unmodified, the Hopper falls (terminated) and EnvPool resets on the next step, ignoring its action.
    assert plain.terminated.any() and not (plain.terminated & plain.truncated).any()
    following = np.zeros_like(plain.action_ignored)
    following[1:] = plain.done[:-1]
    np.testing.assert_array_equal(plain.action_ignored, following)
    np.testing.assert_array_equal(plain.final_obs, plain.obs)
    # Random actions topple the Hopper quickly; the first episode's unmodified return is the same.
    np.testing.assert_allclose(first_episode_returns(hidden), first_episode_returns(plain), rtol=1e-5)
    # Once fallen, the oracle pays the penalty (no healthy bonus, minus 1) on top of the
    # motion, and the unmodified return has stopped counting.
    assert hidden.reward[150:199, 0].mean() < -0.5
    np.testing.assert_array_equal(hidden.info["true_reward"][150:199, 0], 0.0)


def test_envpool_mujoco_without_control_cost():
    with_cost = make(EnvConfig(id="envpool/HalfCheetah-v5", num_envs=2, seed=1))
    without = make(EnvConfig(id="envpool/HalfCheetah-v5", num_envs=2, seed=1, control_cost=False))
    _, a = rollout(with_cost, 20, seed=4)
    _, b = rollout(without, 20, seed=4)
    actions = np.asarray(random_actions(with_cost, jax.random.split(jax.random.PRNGKey(4))[1], 20))
    ctrl_cost = 0.1 * np.sum(actions**2, axis=-1)
    np.testing.assert_allclose(b.reward - a.reward, ctrl_cost, rtol=1e-4, atol=1e-5)
    # The task itself has no torque cost (appendix A): its true reward, which scores a run, neither.
    np.testing.assert_allclose(b.info["true_reward"], b.reward, rtol=1e-6)
    np.testing.assert_allclose(a.info["true_reward"], a.reward, rtol=1e-6)


def test_every_listed_id_has_a_back_end():
    assert len(ENV_IDS) == len(set(ENV_IDS)) == 9 + 7 + 8 + 8
