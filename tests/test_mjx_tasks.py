"""The MJX MuJoCo tasks: parity with Gymnasium v5, specs, the appendix-A options, auto-reset.

Compiling an MJX step takes tens of seconds on a CPU, so every compiled function is
built once per module (``hopper_step``, ``hide_rollout``, ``ip_rollout``) and shared by
the tests; the other tasks compile only their reset. With a warm compilation cache
(tests/conftest.py) most of the remaining time is tracing.
"""
import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gymnasium as gym  # the reference; its MuJoCo tasks need imageio (the test extra)

from rlhf_jax.envs.mjx_tasks import MJX_TASKS, make_mjx
from rlhf_jax.envs.options import EnvConfig

N_PARITY = 4  # states per parity task, stepped as one batch
# Absolute tolerance on observations and rewards after one step from the same state,
# MJX vs Gymnasium (MuJoCo's C engine in float64). Hopper and InvertedPendulum meet it
# in float32 (measured <= 6e-6 over 150 Hopper states). HalfCheetah in contact does not:
# float32 rounding of its large contact accelerations leaves up to ~3.3e-4 in a joint
# velocity (150 states), so its parity test runs MJX in float64 (measured ~3e-6).
# Ant is not tested: in contact it differs by ~1e-2 even in float64 because MJX orients
# contact frames differently (see the mjx_tasks docstring).
PARITY_ATOL = 1e-4
IP_STEPS = 40  # length of the InvertedPendulum rollouts


def mjx_config(name, **options):
    return EnvConfig(id=f"mjx/{name}", **{"num_envs": 2, **options})


@contextlib.contextmanager
def quiet_mujoco():
    """Keep MuJoCo's compiler warnings (half_cheetah.xml's deprecated settotalmass) out of
    stdout and out of a MUJOCO_LOG.TXT in the working directory."""
    import mujoco

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: None)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def make_gymnasium(name):
    with quiet_mujoco():
        return gym.make(name)


@functools.lru_cache(maxsize=None)
def gymnasium_env(name):
    return make_gymnasium(name)


def gymnasium_step(name, qpos, qvel, action):
    """Gymnasium's v5 step from ``(qpos, qvel)``: (obs, reward, terminated, info)."""
    env = gymnasium_env(name)
    env.reset(seed=0)
    env.unwrapped.set_state(qpos, qvel)
    obs, reward, terminated, _, info = env.step(np.asarray(action, np.float32))
    return obs, reward, terminated, info


def sample_states(name, n, seed):
    """``n`` states of a seeded Gymnasium rollout with random actions, a few steps apart,
    each with a random action: arrays qpos (n, nq), qvel (n, nv), action (n, nu), ncon (n,)."""
    env = make_gymnasium(name)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        for _ in range(rng.integers(3, 12)):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        data = env.unwrapped.data
        rows.append((data.qpos.copy(), data.qvel.copy(), env.action_space.sample(), data.ncon))
    return [np.stack(column) for column in zip(*rows)]


@pytest.fixture(scope="module")
def hopper_step():
    """Hopper with the default options, ``N_PARITY`` copies: (env, jitted env.step)."""
    env = make_mjx("Hopper-v5", mjx_config("Hopper-v5", num_envs=N_PARITY))
    return env, jax.jit(env.step)


@pytest.fixture(scope="module")
def ip_rollout():
    """InvertedPendulum, default options: (env, jitted lax.scan of IP_STEPS steps from a state)."""
    env = make_mjx("InvertedPendulum-v5", mjx_config("InvertedPendulum-v5", num_envs=N_PARITY))
    return env, jax.jit(lambda state, actions: jax.lax.scan(env.step, state, actions))


# ---------------------------------------------------------------------------------------
# Specs and resets, all eight tasks.
# ---------------------------------------------------------------------------------------

EXPECTED_OBS_DIM = {
    "Hopper-v5": 11, "Walker2d-v5": 17, "Swimmer-v5": 8, "HalfCheetah-v5": 17,
    "Ant-v5": 105, "Reacher-v5": 10, "InvertedPendulum-v5": 4, "InvertedDoublePendulum-v5": 9,
}


def test_task_list():
    assert set(MJX_TASKS) == set(EXPECTED_OBS_DIM)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_OBS_DIM))
def test_spec_and_reset_match_gymnasium(name):
    env = make_mjx(f"mjx/{name}", mjx_config(name, num_envs=2))
    reference = gymnasium_env(name)
    spec = env.spec
    assert spec.id == f"mjx/{name}" and spec.backend == "mjx" and spec.num_envs == 2
    assert spec.observation_shape == reference.observation_space.shape == (EXPECTED_OBS_DIM[name],)
    assert spec.observation_dtype == "float32"
    space = reference.action_space
    assert spec.action_space.shape == space.shape
    assert np.all(space.low == spec.action_space.low) and np.all(space.high == spec.action_space.high)
    assert spec.max_episode_steps == reference.spec.max_episode_steps
    assert round(spec.fps) == reference.unwrapped.metadata["render_fps"]

    state, ts = jax.jit(env.reset)(jax.random.PRNGKey(1))
    assert ts.obs.shape == (2, EXPECTED_OBS_DIM[name]) and ts.obs.dtype == jnp.float32
    assert np.all(np.isfinite(ts.obs))
    assert not np.allclose(ts.obs[0], ts.obs[1]), "copies should get different reset noise"
    for key in ("true_reward", "true_done", "episode_return", "episode_length"):
        assert ts.info[key].shape == (2,)
    assert ts.reward.shape == ts.done.shape == ts.truncated.shape == ts.action_ignored.shape == (2,)
    np.testing.assert_array_equal(ts.final_obs, ts.obs)

    # The first observation (a reset computes only what it needs) equals Gymnasium's
    # after set_state (a full mj_forward) for the same (qpos, qvel).
    data = state.inner.data
    for i in range(2):
        reference.reset(seed=0)
        reference.unwrapped.set_state(np.asarray(data.qpos[i], np.float64), np.asarray(data.qvel[i], np.float64))
        np.testing.assert_allclose(ts.obs[i], reference.unwrapped._get_obs(), atol=1e-5)
    if name == "Reacher-v5":
        assert np.all(np.linalg.norm(data.qpos[:, -2:], axis=1) < 0.2)


def test_time_limit_override_and_rejected_options():
    assert make_mjx("Reacher-v5", mjx_config("Reacher-v5", max_episode_steps=7)).spec.max_episode_steps == 7
    with pytest.raises(ValueError, match="hide_score"):
        make_mjx("Hopper-v5", mjx_config("Hopper-v5", hide_score=True))
    with pytest.raises(ValueError, match="episodic_life"):
        make_mjx("Hopper-v5", mjx_config("Hopper-v5", episodic_life=True))
    with pytest.raises(ValueError, match="unknown MJX task"):
        make_mjx("Humanoid-v5", mjx_config("Hopper-v5"))


# ---------------------------------------------------------------------------------------
# Parity with Gymnasium: one step from the same state and action.
# ---------------------------------------------------------------------------------------


def check_parity(name, ts, qpos, qvel, action, atol):
    """``ts`` (one step from ``(qpos, qvel)`` with ``action``, one copy per row) against Gymnasium."""
    for i in range(len(qpos)):
        obs, reward, terminated, _ = gymnasium_step(name, qpos[i], qvel[i], action[i])
        np.testing.assert_allclose(ts.final_obs[i], obs, atol=atol, rtol=0)
        np.testing.assert_allclose(ts.info["true_reward"][i], reward, atol=atol, rtol=0)
        np.testing.assert_allclose(ts.reward[i], reward, atol=atol, rtol=0)  # no modifications
        assert bool(ts.terminated[i]) == terminated == bool(ts.done[i]) == bool(ts.info["unhealthy"][i])


@pytest.mark.slow
def test_hopper_step_matches_gymnasium(hopper_step):
    name = "Hopper-v5"
    env, step = hopper_step
    qpos, qvel, action, ncon = sample_states(name, N_PARITY, seed=3)
    assert np.any(ncon > 0), "want states in contact with the floor"
    _, ts = step(env.state_from_qpos_qvel(qpos, qvel), jnp.asarray(action, jnp.float32))
    check_parity(name, ts, qpos, qvel, action, PARITY_ATOL)


@pytest.mark.slow
def test_inverted_pendulum_step_matches_gymnasium(ip_rollout):
    # The first step of a rollout, to share ip_rollout's compiled program.
    env, rollout = ip_rollout
    name = "InvertedPendulum-v5"
    qpos, qvel, action, _ = sample_states(name, N_PARITY, seed=3)
    actions = np.zeros((IP_STEPS, N_PARITY, 1), np.float32)
    actions[0] = action
    _, ts = rollout(env.state_from_qpos_qvel(qpos, qvel), jnp.asarray(actions))
    check_parity(name, jax.tree.map(lambda x: x[0], ts), qpos, qvel, action, PARITY_ATOL)


@pytest.mark.slow
def test_halfcheetah_step_matches_gymnasium_in_float64():
    """HalfCheetah in float64 (float32 agrees only to ~3e-4 in contact; see PARITY_ATOL)."""
    name = "HalfCheetah-v5"
    qpos, qvel, action, ncon = sample_states(name, N_PARITY, seed=3)
    assert np.any(ncon > 0)
    with jax.enable_x64(True):
        env = make_mjx(name, mjx_config(name, num_envs=N_PARITY))
        assert env.model.opt.timestep.dtype == jnp.float64
        _, ts = jax.jit(env.step)(env.state_from_qpos_qvel(qpos, qvel), jnp.asarray(action, jnp.float64))
        ts = jax.tree.map(np.asarray, ts)
    check_parity(name, ts, qpos, qvel, action, PARITY_ATOL)


# ---------------------------------------------------------------------------------------
# Options (appendix A), on Hopper: fixed-length episodes and no control cost.
# ---------------------------------------------------------------------------------------

HIDE_LIMIT = 8  # short fixed-length episodes
HIDE_STEPS = 12  # one full episode and the start of the next


@pytest.fixture(scope="module")
def hide_rollout():
    """Hopper with hide_episode_end and control_cost=False: copy 0 starts upright, copy 1
    tilted past the healthy angle; both run HIDE_STEPS steps under one jitted lax.scan."""
    env = make_mjx("Hopper-v5", mjx_config(
        "Hopper-v5", num_envs=2, hide_episode_end=True, control_cost=False, max_episode_steps=HIDE_LIMIT))
    assert env.spec.max_episode_steps == HIDE_LIMIT
    qpos0 = np.array(env.mj_model.qpos0)
    qpos = np.stack([qpos0, qpos0])
    qpos[0, 2] = 0.02  # healthy: |angle| < 0.2
    qpos[1, 2] = 0.4  # unhealthy from the first step on
    qvel = np.zeros((2, env.mj_model.nv))
    actions = np.random.default_rng(0).uniform(-1, 1, (HIDE_STEPS, 2, 3)).astype(np.float32)
    rollout = jax.jit(lambda state, actions: jax.lax.scan(env.step, state, actions))
    start = env.state_from_qpos_qvel(qpos, qvel)
    _, ts = rollout(start, jnp.asarray(actions))
    return env, qpos, qvel, actions, jax.tree.map(np.asarray, ts)


@pytest.mark.slow
def test_hide_episode_end_fixed_length(hide_rollout):
    env, qpos, qvel, actions, ts = hide_rollout
    at_limit = np.arange(HIDE_STEPS) == HIDE_LIMIT - 1
    for copy in range(2):
        np.testing.assert_array_equal(ts.done[:, copy], at_limit)
        np.testing.assert_array_equal(ts.truncated[:, copy], at_limit)
        assert not ts.terminated[:, copy].any()  # hidden: the agent never sees a terminal state
        np.testing.assert_array_equal(ts.info["true_done"][:, copy], at_limit)
    np.testing.assert_array_equal(ts.info["episode_length"][HIDE_LIMIT - 1], [HIDE_LIMIT, HIDE_LIMIT])


def test_hide_episode_end_unhealthy_hopper_keeps_running(hide_rollout):
    env, qpos, qvel, actions, ts = hide_rollout
    info = ts.info
    episode = slice(0, HIDE_LIMIT)
    # Copy 1 is unhealthy at every step of its first episode: the simulation runs on
    # (positions move continuously, nothing resets) instead of ending the episode.
    assert info["unhealthy"][episode, 1].all() and info["failed"][episode, 1].all()
    assert not ts.done[: HIDE_LIMIT - 1, 1].any()
    assert np.all(np.abs(np.diff(info["x_position"][episode, 1])) < 0.1)
    assert np.all(np.abs(np.diff(ts.final_obs[episode, 1], axis=0)).max(axis=1) > 0)
    # The oracle's reward: forward reward, no healthy bonus, no control cost, minus the penalty.
    np.testing.assert_allclose(ts.reward[episode, 1], info["x_velocity"][episode, 1] - 1.0, atol=1e-5)
    # The unmodified evaluation: Gymnasium's episode ends after one step with reward r (less
    # its control cost: the task has none); true_reward is r and then 0, so the true episode
    # return is r.
    _, r, terminated, _ = gymnasium_step("Hopper-v5", qpos[1], qvel[1], actions[0, 1])
    r = r + info["ctrl_cost"][0, 1]
    assert terminated
    np.testing.assert_allclose(info["true_reward"][0, 1], r, atol=1e-4)
    np.testing.assert_array_equal(info["true_reward"][1:HIDE_LIMIT, 1], 0.0)
    np.testing.assert_allclose(info["episode_return"][HIDE_LIMIT - 1, 1], r, atol=1e-4)
    # After the time limit the copy starts afresh: healthy again, the flag cleared.
    after = slice(HIDE_LIMIT, HIDE_STEPS)
    assert not info["unhealthy"][after, 1].any() and not info["failed"][after, 1].any()
    assert np.all(info["true_reward"][after, 1] != 0.0)
    np.testing.assert_allclose(ts.final_obs[HIDE_LIMIT, 1, 0], 1.25, atol=0.05)  # z of a fresh hopper


def first_steps_with(hide_rollout, **option):
    """The first 3 steps of ``hide_rollout``'s two copies and actions, with one more env option."""
    _, qpos, qvel, actions, _ = hide_rollout
    env = make_mjx("Hopper-v5", mjx_config("Hopper-v5", num_envs=2, hide_episode_end=True, control_cost=False,
                                           max_episode_steps=HIDE_LIMIT, **option))
    _, ts = jax.jit(lambda s, a: jax.lax.scan(env.step, s, a))(env.state_from_qpos_qvel(qpos, qvel),
                                                                jnp.asarray(actions[:3]))
    return jax.tree.map(np.asarray, ts)


@pytest.mark.slow
def test_hidden_end_reset_restarts_a_failed_copy_unannounced(hide_rollout):
    """env.hidden_end=reset on the same two copies: copy 1 fails on its first step, the oracle
    pays the penalty once, the true episode ends there, and the copy restarts at once; the agent
    is told nothing."""
    ts = first_steps_with(hide_rollout, hidden_end="reset")
    assert not (ts.terminated.any() or ts.truncated.any())
    assert ts.info["unhealthy"][0, 1] and ts.info["true_done"][0, 1]
    np.testing.assert_allclose(ts.reward[0, 1], ts.info["x_velocity"][0, 1] - 1.0, atol=1e-5)
    assert abs(ts.final_obs[0, 1, 1]) > 0.2 and abs(ts.obs[0, 1, 1]) < 0.01  # tilted, then a fresh hopper
    assert not ts.info["unhealthy"][1:, 1].any() and not ts.info["true_done"][1:, 1].any()
    assert not ts.info["true_done"][:, 0].any()


def test_control_cost_removed(hide_rollout, hopper_step):
    env, qpos, qvel, actions, ts = hide_rollout
    info = ts.info
    healthy = ~info["unhealthy"][:, 0]
    assert healthy[:3].all()
    # While healthy the oracle's reward is the task's true reward, neither paying the control cost.
    expected_cost = 1e-3 * np.sum(np.square(actions[:, 0]), axis=-1)
    np.testing.assert_allclose(info["ctrl_cost"][:, 0], expected_cost, rtol=1e-6)
    np.testing.assert_allclose(ts.reward[healthy, 0], info["true_reward"][healthy, 0], atol=1e-6)
    # And the same step under the default options pays the cost.
    default_env, step = hopper_step
    n = default_env.num_envs
    _, default_ts = step(default_env.state_from_qpos_qvel(qpos[0], qvel[0]),
                         jnp.broadcast_to(jnp.asarray(actions[0, 0]), (n, 3)))
    np.testing.assert_allclose(default_ts.reward, ts.reward[0, 0] - expected_cost[0], atol=1e-5)
    np.testing.assert_allclose(default_ts.info["true_reward"], info["true_reward"][0, 0] - expected_cost[0], atol=1e-5)


@pytest.mark.slow
def test_smooth_oracle_pays_height_not_health(hide_rollout):
    """env.oracle=smooth on the same two copies (one upright, one unhealthy throughout): no
    healthy bonus, no penalty, the torso's height less 1 on every step (rl-teacher's Hopper)."""
    ts = first_steps_with(hide_rollout, oracle="smooth")
    assert not ts.info["unhealthy"][:, 0].any() and ts.info["unhealthy"][:, 1].all()
    z = ts.obs[..., 0]
    np.testing.assert_allclose(ts.reward, ts.info["x_velocity"] + z - 1.0, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Auto-reset on termination, unmodified options, under jax.jit(lax.scan).
# ---------------------------------------------------------------------------------------

def test_scan_auto_resets_terminated_copies(ip_rollout):
    env, rollout = ip_rollout
    actions = jax.random.uniform(jax.random.PRNGKey(0), (IP_STEPS, env.num_envs, 1), minval=-3.0, maxval=3.0)
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(0))
    _, ts = rollout(state, actions)
    ts = jax.tree.map(np.asarray, ts)
    done = ts.done
    assert done.any(), "random actions should topple the pendulum within 40 steps"
    np.testing.assert_array_equal(done, ts.terminated)  # no time limit within 40 steps
    np.testing.assert_array_equal(done, ts.info["true_done"])
    assert not ts.truncated.any() and not ts.action_ignored.any()
    # A finished copy: reward 0 on the terminal step, 1 on every other, so return = length - 1.
    np.testing.assert_array_equal(ts.reward[done], 0.0)
    np.testing.assert_array_equal(ts.info["episode_return"][done], ts.info["episode_length"][done] - 1)
    assert np.all(np.abs(ts.final_obs[done][:, 1]) > 0.2)
    np.testing.assert_array_equal(ts.final_obs[~done], ts.obs[~done])
    # ... and its next observation is a fresh reset: within the reset noise of 0.01.
    assert np.all(np.abs(ts.obs[done]) <= 0.01)
    # Episode counters restart after each end.
    t, copy = np.nonzero(done)
    for t_i, c_i in zip(t, copy):
        if t_i + 1 < IP_STEPS:
            assert ts.info["episode_length"][t_i + 1, c_i] == 1
