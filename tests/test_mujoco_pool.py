"""EnvPool's C MuJoCo, the CPU back end, against Gymnasium's own v5 environments, state for state.

Each task: our environment (``envpool/<Task>-v5``, one copy), plain and with appendix A's
modifications (``hide_episode_end``, ``control_cost=False``), steps a fixed sequence of
random actions; Gymnasium's environment is put in the same first state (``set_state`` from the
pool's float64 observation) and steps the same actions. Gymnasium's unwrapped environment
simulates on after its episode ends, which is what the modification asks of ours:

* plain: obs, reward and terminated are Gymnasium's, up to its first end (EnvPool then resets);
* modified: obs are Gymnasium's at every step, the agent never sees an end, the oracle's
  reward is Gymnasium's without the control cost, less ``termination_penalty`` on every step
  Gymnasium calls terminated, and the true reward is Gymnasium's until its first end, then 0.

The first states are drawn alike too: the pool's first observations and Gymnasium's, over many
resets, have the same distribution in every coordinate.
"""
import envpool
import gymnasium
import jax
import mujoco
import numpy as np
import pytest
from scipy.stats import ks_2samp

from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.envs.options import MUJOCO_NAMES
from rlhf_jax.errors import ConfigError

SEED = 3
PENALTY = 1.0


def _planar(x_coordinates):
    """qpos leaves out the first ``x_coordinates`` (the position, which no observation or
    force depends on: we put 0), then qpos[k:], then qvel."""
    def state(obs, nq, nv):
        k = x_coordinates
        return np.r_[np.zeros(k), obs[: nq - k]], obs[nq - k: nq - k + nv]
    return state


def _reacher(obs, nq, nv):  # cos(q[:2]), sin(q[:2]), target, qvel[:2], ...; the target does not move
    return np.r_[np.arctan2(obs[2:4], obs[0:2]), obs[4:6]], np.r_[obs[6:8], 0.0, 0.0]


def _double_pendulum(obs, nq, nv):  # cart, sin(q[1:]), cos(q[1:]), qvel, ...
    return np.r_[obs[0], np.arctan2(obs[1:3], obs[3:5])], obs[5:8]


# The first state, from the first observation (whose velocities are small enough not to be clipped).
FIRST_STATE = {
    "Hopper-v5": _planar(1), "Walker2d-v5": _planar(1), "HalfCheetah-v5": _planar(1),
    "Swimmer-v5": _planar(2), "Ant-v5": _planar(2), "Reacher-v5": _reacher,
    "InvertedPendulum-v5": _planar(0), "InvertedDoublePendulum-v5": _double_pendulum,
}
# Enough random steps to see each terminating task fail, few enough that chaos (HalfCheetah's
# and Ant's contacts) has not yet amplified float32 rounding of the actions; Reacher stops at 50.
STEPS = {"Walker2d-v5": 70, "Reacher-v5": 45}


# What rl-teacher's smooth oracle (env.oracle=smooth) pays on each step besides the task's
# reward without its healthy bonus, read from Gymnasium's simulation, not the observation:
# the torso's height qpos[1] (Ant: qpos[2]), the pole's angle, the double pendulum's tip height.
def _tip_height(model, data):
    """The tip site's height in the state the step ended in (``data.site_xpos`` after ``mj_step``
    still holds the kinematics of the step's last substep's start)."""
    now = mujoco.MjData(model)
    now.qpos[:] = data.qpos
    mujoco.mj_kinematics(model, now)
    return now.site_xpos[0][2]


HEIGHT = {
    "Hopper-v5": lambda model, data: data.qpos[1], "Walker2d-v5": lambda model, data: data.qpos[1],
    "Ant-v5": lambda model, data: data.qpos[2], "InvertedPendulum-v5": lambda model, data: data.qpos[1],
    "InvertedDoublePendulum-v5": _tip_height,
}
SMOOTH_BONUS = {"Hopper-v5": lambda h: h - 1.0, "Walker2d-v5": lambda h: h - 2.0, "Ant-v5": lambda h: h - 1.2,
                "InvertedPendulum-v5": lambda angle: -angle**2,
                "InvertedDoublePendulum-v5": lambda y: 10.0 * (y - 1.0)}
HEALTHY_REWARD = {"Hopper-v5": 1.0, "Walker2d-v5": 1.0, "Ant-v5": 1.0, "InvertedPendulum-v5": 1.0,
                  "InvertedDoublePendulum-v5": 10.0}


def rollout(env, actions):
    """reset, then ``actions`` [T, 1, ...] in one jit(lax.scan): (first TimeStep, stacked TimeSteps) as NumPy."""
    def run(actions):
        state, first = env.reset(jax.random.PRNGKey(0))
        _, timesteps = jax.lax.scan(env.step, state, actions)
        return first, timesteps
    return jax.tree.map(np.asarray, jax.jit(run)(actions))


@pytest.fixture(scope="module", params=MUJOCO_NAMES)
def reference(request):
    """A task's actions and Gymnasium's answers to them from the pool's first state."""
    name = request.param
    first_obs, _ = envpool.make(name, env_type="gymnasium", num_envs=1, seed=SEED).reset()  # float64
    gym = gymnasium.make(name).unwrapped
    gym.reset(seed=0)
    gym.set_state(*FIRST_STATE[name](first_obs[0], gym.model.nq, gym.model.nv))
    np.testing.assert_allclose(gym._get_obs(), first_obs[0], atol=1e-12)
    space = gym.action_space
    steps = STEPS.get(name, 40)
    actions = np.random.default_rng(0).uniform(space.low, space.high, (steps, 1, *space.shape)).astype(np.float32)
    rows, heights = [], []
    for a in actions:
        rows.append(gym.step(a[0].astype(np.float64)))
        heights.append(HEIGHT[name](gym.model, gym.data) if name in HEIGHT else np.nan)
    obs, reward, terminated = (np.array([row[i] for row in rows]) for i in range(3))
    ctrl_cost = np.array([-row[4].get("reward_ctrl", 0.0) for row in rows])
    return name, first_obs, actions, obs, reward, terminated, ctrl_cost, np.array(heights)


def test_the_pool_steps_as_gymnasium_does(reference):
    name, first_obs, actions, obs, reward, terminated, ctrl_cost, _ = reference
    tolerance = dict(rtol=1e-4, atol=1e-4)
    plain_first, plain = rollout(make(EnvConfig(id=f"envpool/{name}", num_envs=1, seed=SEED)), actions)
    np.testing.assert_allclose(plain_first.obs[0], first_obs[0], rtol=1e-6)
    # Plain: Gymnasium's episode, to its end.
    ends = np.flatnonzero(terminated)
    last = ends[0] + 1 if len(ends) else len(actions)
    np.testing.assert_allclose(plain.obs[:last, 0], obs[:last], **tolerance)
    np.testing.assert_allclose(plain.reward[:last, 0], reward[:last], **tolerance)
    np.testing.assert_allclose(plain.info["true_reward"][:last, 0], reward[:last], **tolerance)
    np.testing.assert_array_equal(plain.terminated[:last, 0], terminated[:last])
    assert not plain.truncated.any()

    modified_env = make(EnvConfig(id=f"envpool/{name}", num_envs=1, seed=SEED, hide_episode_end=True,
                                  control_cost=False, termination_penalty=PENALTY))
    _, modified = rollout(modified_env, actions)
    # Modified: the same simulation on past the end, which the agent never sees.
    np.testing.assert_allclose(modified.obs[:, 0], obs, **tolerance)
    assert not (modified.terminated.any() or modified.truncated.any())
    np.testing.assert_allclose(modified.reward[:, 0], reward + ctrl_cost - PENALTY * terminated, **tolerance)
    counted = np.arange(len(actions)) < last  # the unmodified episode, its last step included
    # The task's reward, which has no torque cost either (appendix A), up to the unmodified end.
    np.testing.assert_allclose(modified.info["true_reward"][:, 0], np.where(counted, reward + ctrl_cost, 0.0),
                               **tolerance)
    np.testing.assert_array_equal(modified.info["unhealthy"][:, 0], terminated)


def test_a_hidden_end_that_resets_restarts_the_copy_untold_and_charges_the_oracle_once(reference):
    """env.hidden_end=reset: Gymnasium's steps up to its first end; on that step the agent is
    told nothing, the oracle pays the reward less the penalty once and the true episode ends;
    the next step is EnvPool's reset step (its action ignored, reward 0) into a fresh episode."""
    name, _, actions, obs, reward, terminated, ctrl_cost, _ = reference
    tolerance = dict(rtol=1e-4, atol=1e-4)
    env = make(EnvConfig(id=f"envpool/{name}", num_envs=1, seed=SEED, hide_episode_end=True, hidden_end="reset",
                         control_cost=False, termination_penalty=PENALTY))
    _, restarted = rollout(env, actions)
    assert not (restarted.terminated.any() or restarted.truncated.any())
    ends = np.flatnonzero(terminated)
    last = ends[0] + 1 if len(ends) else len(actions)
    np.testing.assert_allclose(restarted.obs[:last, 0], obs[:last], **tolerance)
    np.testing.assert_allclose(restarted.reward[:last, 0], (reward + ctrl_cost - PENALTY * terminated)[:last],
                               **tolerance)
    np.testing.assert_allclose(restarted.info["true_reward"][:last, 0], (reward + ctrl_cost)[:last], **tolerance)
    np.testing.assert_array_equal(restarted.info["true_done"][:last, 0], terminated[:last])
    assert not restarted.action_ignored[:last, 0].any()
    if len(ends):  # every task that can end does, within its steps (test_terminating_tasks_fail_...)
        assert restarted.action_ignored[last, 0] and restarted.reward[last, 0] == 0.0
        assert not np.allclose(restarted.obs[last, 0], obs[last], **tolerance)  # a new episode, not the fallen one


def test_a_penalty_on_the_restart_step_falls_where_the_failed_state_is_observed(reference):
    """env.penalty_step=restart: up to the first end the oracle pays Gymnasium's reward without
    the penalty; the next step (EnvPool's restart, whose observation is the failed state) pays
    minus the penalty and is an ordinary step to the agent (not marked as ignoring its action)."""
    name, _, actions, obs, reward, terminated, ctrl_cost, _ = reference
    tolerance = dict(rtol=1e-4, atol=1e-4)
    config = EnvConfig(id=f"envpool/{name}", num_envs=1, seed=SEED, hide_episode_end=True, hidden_end="reset",
                       control_cost=False, termination_penalty=PENALTY, penalty_step="restart")
    _, restarted = rollout(make(config), actions)
    ends = np.flatnonzero(terminated)
    last = ends[0] + 1 if len(ends) else len(actions)
    np.testing.assert_allclose(restarted.reward[:last, 0], (reward + ctrl_cost)[:last], **tolerance)
    np.testing.assert_array_equal(restarted.info["unhealthy"][:last, 0], terminated[:last])
    assert not restarted.action_ignored[:last + 1, 0].any()
    if len(ends):
        np.testing.assert_allclose(restarted.obs[last - 1, 0], obs[last - 1], **tolerance)  # the failed state
        assert restarted.reward[last, 0] == -PENALTY and restarted.info["true_reward"][last, 0] == 0.0


@pytest.mark.parametrize("options", [
    dict(id="envpool/Hopper-v5", hide_episode_end=True),  # hidden_end=continue
    dict(id="envpool/Hopper-v5", hidden_end="reset"),  # ends not hidden
    dict(id="envpool/Hopper-v5", hide_episode_end=True, hidden_end="reset", oracle="smooth"),
    dict(id="mjx/Hopper-v5", hide_episode_end=True, hidden_end="reset"),
    dict(id="gymnax/CartPole-v1", hide_episode_end=True, hidden_end="reset"),
])
def test_a_penalty_on_the_restart_step_is_refused_where_there_is_no_restart_step(options):
    with pytest.raises(ConfigError, match="env.penalty_step='restart' applies only to EnvPool MuJoCo"):
        EnvConfig(**options, penalty_step="restart")


def test_the_smooth_oracle_pays_gymnasiums_reward_without_health_and_with_the_height(reference):
    """env.oracle=smooth: Gymnasium's reward without the control cost and without the healthy
    bonus it pays while not terminated, plus the task's smooth bonus, on every step."""
    name, _, actions, obs, reward, terminated, ctrl_cost, heights = reference
    config = dict(id=f"envpool/{name}", num_envs=1, seed=SEED, hide_episode_end=True, control_cost=False,
                  oracle="smooth")
    if name not in SMOOTH_BONUS:
        with pytest.raises(ConfigError, match=f"env.oracle=smooth applies only to the tasks that end when unhealthy.*{name}"):
            make(EnvConfig(**config))
        return
    _, smooth = rollout(make(EnvConfig(**config)), actions)
    expected = reward + ctrl_cost - HEALTHY_REWARD[name] * ~terminated + SMOOTH_BONUS[name](heights)
    np.testing.assert_allclose(smooth.reward[:, 0], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(smooth.obs[:, 0], obs, rtol=1e-4, atol=1e-4)
    # The true reward is the task's whatever the oracle: Gymnasium's until its first end, then 0.
    ends = np.flatnonzero(terminated)
    counted = np.arange(len(actions)) <= (ends[0] if len(ends) else len(actions))
    np.testing.assert_allclose(smooth.info["true_reward"][:, 0], np.where(counted, reward + ctrl_cost, 0.0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options, error", [
    (dict(id="envpool/InvertedDoublePendulum-v5"), "set env.hide_episode_end=true too"),
    (dict(id="gymnax/CartPole-v1", hide_episode_end=True), "env.oracle='smooth' does not apply to the gymnax"),
    (dict(id="envpool/Pong-v5", hide_episode_end=True),
     r"env.oracle='smooth' does not apply to the EnvPool Atari back end \(envpool/Pong-v5\); set env.oracle=penalty$"),
])
def test_the_smooth_oracle_is_refused_where_it_means_nothing(options, error):
    with pytest.raises(ConfigError, match=error):
        make(EnvConfig(num_envs=1, oracle="smooth", **options))


def test_an_option_a_back_end_refuses_says_what_to_write():
    """The built-in default restarts a failing copy; moved to Pong, the refusal names the value to set,
    since the user never typed the one it refuses."""
    with pytest.raises(ConfigError, match=r"env.hidden_end='reset' does not apply to the EnvPool Atari back end "
                                          r"\(envpool/Pong-v5\); set env.hidden_end=continue$"):
        make(EnvConfig(id="envpool/Pong-v5", num_envs=1, hidden_end="reset"))


@pytest.mark.parametrize("name", MUJOCO_NAMES)
def test_the_pool_draws_first_states_as_gymnasium_does(name):
    """Stepping alike from one state is half of "the same task"; the other half is the draw of
    that state. 400 first observations of each, every coordinate compared by a two-sample
    Kolmogorov-Smirnov test (Bonferroni over the coordinates, at 0.001): a reset noise of
    0.15 instead of 0.1 on the pendulums fails it."""
    resets = 400
    pool_first, _ = envpool.make(name, env_type="gymnasium", num_envs=resets, seed=SEED).reset()
    gym = gymnasium.make(name)
    gym_first = np.array([gym.reset(seed=i)[0] for i in range(resets)])
    assert pool_first.shape == gym_first.shape
    p_values = [ks_2samp(pool_first[:, j], gym_first[:, j]).pvalue for j in range(gym_first.shape[1])]
    assert min(p_values) * len(p_values) > 1e-3, (name, int(np.argmin(p_values)), min(p_values))


def test_terminating_tasks_fail_within_their_parity_test():
    """Each task that can end does end inside its parity test, so the penalty is checked."""
    for name in ("Hopper-v5", "Walker2d-v5", "Ant-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5"):
        gym = gymnasium.make(name).unwrapped
        first_obs, _ = envpool.make(name, env_type="gymnasium", num_envs=1, seed=SEED).reset()
        gym.reset(seed=0)
        gym.set_state(*FIRST_STATE[name](first_obs[0], gym.model.nq, gym.model.nv))
        space = gym.action_space
        actions = np.random.default_rng(0).uniform(space.low, space.high, (STEPS.get(name, 40), *space.shape))
        assert any(gym.step(a.astype(np.float32).astype(np.float64))[2] for a in actions), name


def test_members_share_one_pool():
    """Two runs of a sweep, vmapped through one pool of 2 x 2 copies, see what a plain pool of 4 sees."""
    config = EnvConfig(id="envpool/Hopper-v5", num_envs=2, seed=1, hide_episode_end=True)
    shared = make(config, members=2)
    plain = make(EnvConfig(id="envpool/Hopper-v5", num_envs=4, seed=1, hide_episode_end=True))
    actions = np.random.default_rng(1).uniform(-1, 1, (30, 4, 3)).astype(np.float32)

    def run(key, actions):  # one member: actions [T, N, 3]
        state, first = shared.reset(key)
        return first, jax.lax.scan(shared.step, state, actions)[1]

    members = jax.jit(jax.vmap(run, in_axes=(0, 1), out_axes=(0, 1)))
    first, steps = jax.tree.map(np.asarray, members(jax.random.split(jax.random.PRNGKey(0), 2),
                                                     actions.reshape(30, 2, 2, 3)))
    plain_first, plain_steps = rollout(plain, actions)
    np.testing.assert_array_equal(first.obs.reshape(4, -1), plain_first.obs)
    np.testing.assert_array_equal(steps.obs.reshape(30, 4, -1), plain_steps.obs)
    np.testing.assert_array_equal(steps.reward.reshape(30, 4), plain_steps.reward)
    np.testing.assert_array_equal(steps.info["true_reward"].reshape(30, 4), plain_steps.info["true_reward"])


def test_the_pool_hands_back_32_bits_and_leaves_64_bit_types_off():
    """EnvPool's float64 buffers are read under a scoped ``jax.enable_x64``; nothing 64-bit leaves
    the pool's calls, and the switch is off again for the rest of the program."""
    env = make(EnvConfig(id="envpool/Hopper-v5", num_envs=2, seed=1, hide_episode_end=True, control_cost=False))
    actions = np.random.default_rng(2).uniform(-1, 1, (3, 2, 3)).astype(np.float32)
    first, steps = rollout(env, actions)
    assert not jax.config.jax_enable_x64
    for leaf in jax.tree.leaves((first, steps)):
        assert leaf.dtype.itemsize <= 4, leaf.dtype
    assert steps.obs.dtype == np.float32 and steps.reward.dtype == np.float32


def test_a_pool_built_from_pool_options_replays_our_environment_step_for_step():
    """``pool_options`` with the config's name and seed build a second pool that, fed the same
    actions, goes through the same states: what the throughput benchmark's raw side relies on
    to step the very trajectories TRPO stepped. Hopper with its end hidden runs on past a fall
    (``terminate_when_unhealthy=False``), which a pool built without the options would not."""
    config = EnvConfig(id="envpool/Hopper-v5", num_envs=2, seed=4, hide_episode_end=True, control_cost=False)
    env = make(config)
    actions = np.random.default_rng(3).uniform(-1, 1, (60, 2, 3)).astype(np.float32)
    first, steps = rollout(env, actions)
    twin = envpool.make(config.name, env_type="gymnasium", num_envs=2, seed=config.seed, **env.pool_options)
    twin_first, _ = twin.reset()
    replayed = np.array([twin.step(a.astype(np.float64))[0] for a in actions])
    np.testing.assert_allclose(twin_first, first.obs, atol=1e-6)
    assert steps.info["unhealthy"].any()  # a fall, past which only the options keep the twin with us
    np.testing.assert_allclose(replayed, steps.obs, atol=1e-5)
