"""JumanjiEnv: a Jumanji environment keeps the environment contract. Each step is the raw Jumanji
step, its ends read from the step type and the discount (checked against stepping the raw
environment by hand), a copy that ends restarts within the step, and a run learns a reward from
preferences on one. Without Jumanji (the ``jumanji`` extra) the module is skipped."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

jumanji = pytest.importorskip("jumanji", reason="Jumanji is not installed: pip install 'rlhf_jax[jumanji]' "
                                                "(the test extra includes it)")
from jumanji import specs  # noqa: E402
from jumanji.environments import Game2048, Minesweeper, Snake  # noqa: E402
from jumanji.environments.logic.minesweeper.generator import UniformSamplingGenerator  # noqa: E402
from jumanji.types import StepType, TimeStep  # noqa: E402

from rlhf_jax.envs import Box, Discrete, EnvConfig, JumanjiEnv, make, register, unregister  # noqa: E402
from rlhf_jax.errors import ConfigError  # noqa: E402


class WalkState(NamedTuple):
    x: jax.Array
    t: jax.Array
    key: jax.Array


class WalkObservation(NamedTuple):
    position: jax.Array  # float32 [1]
    action_mask: jax.Array  # bool [3]: which moves stay inside [-3, 3]


class Walk(jumanji.Environment):
    """A Jumanji environment written here: a point on a line moved by -1, 0 or +1 (actions 0, 1, 2),
    paid its position. It ends in a terminal state at |x| = 3 (discount 0) and by Jumanji's
    ``truncation`` (discount 1) after ``time_limit`` steps."""

    time_limit = 10

    def reset(self, key):
        x = jax.random.randint(key, (), -1, 2).astype(jnp.float32)
        state = WalkState(x, jnp.zeros((), jnp.int32), key)
        return state, TimeStep(step_type=StepType.FIRST, reward=jnp.zeros(()), discount=jnp.ones(()),
                               observation=self._observe(x), extras={})

    def step(self, state, action):
        x = state.x + self._move(action)
        t = state.t + 1
        terminal, limit = jnp.abs(x) >= 3, t >= self.time_limit
        step_type = jnp.where(terminal | limit, StepType.LAST, StepType.MID)
        timestep = TimeStep(step_type=step_type, reward=self._reward(x), discount=jnp.where(terminal, 0.0, 1.0),
                            observation=self._observe(x), extras={})
        return WalkState(x, t, state.key), timestep

    def _move(self, action):
        return (action - 1).astype(jnp.float32)

    def _reward(self, x):
        return x

    def _observe(self, x):
        return WalkObservation(x[None], jnp.stack([x > -3, jnp.bool_(True), x < 3]))

    @property
    def observation_spec(self):
        return specs.Spec(WalkObservation, "ObservationSpec", position=specs.Array((1,), jnp.float32),
                          action_mask=specs.BoundedArray((3,), bool, False, True))

    @property
    def action_spec(self):
        return specs.DiscreteArray(3)


def flat(observation, batch: int) -> np.ndarray:
    """Jumanji observations with ``batch`` leading axes as the adapter promises them: every leaf
    ravelled in the pytree's order and concatenated, as float32."""
    leaves = [np.asarray(leaf, np.float32) for leaf in jax.tree.leaves(observation)]
    return np.concatenate([leaf.reshape(leaf.shape[:batch] + (-1,)) for leaf in leaves], axis=-1)


def rollout(env, key, steps):
    """``steps`` random steps from a reset, compiled: the actions, the state each step started from
    and the TimeSteps, all ``[steps, N, ...]``."""
    actions = jax.random.randint(jax.random.fold_in(key, 1), (steps, env.num_envs), 0, env.action_space.n)

    def run():
        def body(state, action):
            after, timestep = env.step(state, action)
            return after, (state, timestep)

        return jax.lax.scan(body, env.reset(key)[0], actions)[1]

    before, timesteps = jax.jit(run)()
    return actions, before, timesteps


SMALL_SNAKE = lambda config, members: JumanjiEnv(Snake(num_rows=6, num_cols=6), config)  # noqa: E731
WALK = lambda config, members: JumanjiEnv(Walk(), config, max_episode_steps=50)  # noqa: E731


@pytest.mark.parametrize("factory, limit, own_limit, obs_size", [
    (SMALL_SNAKE, 12, False, 6 * 6 * 5 + 1 + 4),  # grid, step_count, action_mask; the adapter's time limit
    (WALK, 0, True, 1 + 3),  # position, action_mask; Jumanji's truncation at step 10
], ids=["Snake", "Walk"])
def test_each_step_is_the_raw_jumanji_step_with_its_ends(registered, factory, limit, own_limit, obs_size):
    registered("test-jumanji/Env", factory)
    env = make(EnvConfig(id="test-jumanji/Env", num_envs=8, max_episode_steps=limit))
    assert env.spec.observation_shape == (obs_size,) and env.spec.action_space == Discrete(4 if limit else 3)
    assert env.spec.backend == "jumanji" and env.spec.max_episode_steps == (limit or 10)
    actions, before, ts = rollout(env, jax.random.PRNGKey(0), 60)

    # Step the raw environment by hand from the state each step started from, with the same action.
    raw = env._env
    raw_after, raw_ts = jax.jit(jax.vmap(jax.vmap(raw.step)))(before.inner.state, actions)
    np.testing.assert_array_equal(ts.final_obs, flat(raw_ts.observation, 2))
    np.testing.assert_array_equal(ts.reward, raw_ts.reward)
    np.testing.assert_array_equal(ts.info["true_reward"], raw_ts.reward)
    last, discount = np.asarray(raw_ts.step_type) == StepType.LAST, np.asarray(raw_ts.discount)
    terminated, truncated = np.asarray(ts.terminated), np.asarray(ts.truncated)
    np.testing.assert_array_equal(terminated, last & (discount == 0))
    lengths = np.asarray(ts.info["episode_length"])
    limited = (lengths == limit) if limit else np.zeros_like(last)
    np.testing.assert_array_equal(truncated, (last & (discount != 0) | limited) & ~terminated)
    assert terminated.any() and truncated.any()
    if own_limit:  # Jumanji's own truncation, a LAST step with discount 1, is a truncation
        assert np.all(discount[truncated] == 1) and np.all(lengths[truncated] == 10)
    else:  # this adapter's time limit; Snake itself never reached its own
        assert not (last & (discount != 0)).any() and np.all(lengths[truncated] == limit)

    # Where no copy ended, the next step starts from the raw step's state; where one did, from a
    # fresh reset (a new key each time): obs is the new episode's first observation.
    done = np.asarray(ts.done)
    starts = jax.tree.map(lambda x: np.asarray(x)[1:], before.inner.state)
    for fresh, reached in zip(jax.tree.leaves(starts), jax.tree.leaves(raw_after)):
        np.testing.assert_array_equal(fresh[~done[:-1]], np.asarray(reached)[:-1][~done[:-1]])
    np.testing.assert_array_equal(np.asarray(before.inner.obs)[1:], np.asarray(ts.obs)[:-1])
    assert not np.array_equal(np.asarray(ts.obs)[done], np.asarray(ts.final_obs)[done])
    np.testing.assert_array_equal(np.asarray(ts.obs)[~done], np.asarray(ts.final_obs)[~done])
    step_count = np.asarray(starts.step_count if hasattr(starts, "step_count") else starts.t)
    assert np.all(step_count[done[:-1]] == 0)
    assert len({tuple(obs) for obs in np.asarray(ts.obs)[done]}) > 1
    # The true episode's totals: its length counts the steps since the copy's last end.
    since = np.zeros(8, int)
    for t in range(60):
        since += 1
        np.testing.assert_array_equal(lengths[t], since)
        since[done[t]] = 0


def test_a_walk_that_runs_past_its_end_is_refused_and_the_hidden_reset_applies(registered):
    registered("test-jumanji/Walk", WALK)
    with pytest.raises(ConfigError, match="hidden_end=reset"):
        make(EnvConfig(id="test-jumanji/Walk", hide_episode_end=True))
    env = make(EnvConfig(id="test-jumanji/Walk", num_envs=8, hide_episode_end=True, hidden_end="reset",
                         termination_penalty=5.0))
    _, _, ts = rollout(env, jax.random.PRNGKey(0), 60)
    failed = np.abs(np.asarray(ts.final_obs)[..., 0]) >= 3
    assert failed.any() and not ts.terminated.any()
    np.testing.assert_array_equal(np.asarray(ts.info["true_done"])[failed], True)
    np.testing.assert_allclose(ts.reward, np.asarray(ts.info["true_reward"]) - 5.0 * failed)


def test_a_multi_discrete_action_is_one_discrete_of_every_combination():
    """Minesweeper's action is (row, col): the adapter's integer i is the cell (i // cols, i % cols)."""
    register("test-jumanji/Mines", lambda config, members: None)
    try:
        mines = Minesweeper(generator=UniformSamplingGenerator(num_rows=4, num_cols=4, num_mines=2))
        with pytest.raises(ConfigError, match="no time limit"):
            JumanjiEnv(mines, EnvConfig(id="test-jumanji/Mines"))
        env = JumanjiEnv(mines, EnvConfig(id="test-jumanji/Mines", num_envs=16), max_episode_steps=16)
    finally:
        unregister("test-jumanji/Mines")
    assert env.spec.action_space == Discrete(16) and env.spec.max_episode_steps == 16
    state, _ = env.reset(jax.random.PRNGKey(0))
    cells = jnp.arange(16, dtype=jnp.int32)
    _, ts = jax.jit(env.step)(state, cells)
    _, raw_ts = jax.vmap(mines.step)(state.inner.state, jnp.stack([cells // 4, cells % 4], axis=1))
    np.testing.assert_array_equal(ts.final_obs, flat(raw_ts.observation, 1))
    np.testing.assert_array_equal(ts.reward, raw_ts.reward)
    revealed = np.asarray(raw_ts.observation.board).reshape(16, 16) >= 0  # -1: a cell not yet revealed
    assert np.all(revealed[np.arange(16), np.arange(16)])


class WalkOnAxes(Walk):
    """Walk with a continuous move in [-1, 1]."""

    def _move(self, action):
        return action[0]

    @property
    def action_spec(self):
        return specs.BoundedArray((1,), jnp.float32, -1.0, 1.0)


class WalkOfTwo(Walk):
    """Walk paying two agents."""

    def _reward(self, x):
        return jnp.stack([x, -x])


class WalkOnAGrid(Walk):
    """Walk whose action spec is a bounded integer array, neither discrete kind."""

    @property
    def action_spec(self):
        return specs.BoundedArray((2,), jnp.int32, 0, 2)


def test_action_specs_and_rewards_it_takes_and_those_it_refuses(registered):
    registered("test-jumanji/Walk", lambda config, members: None)
    config = EnvConfig(id="test-jumanji/Walk", num_envs=2)
    env = JumanjiEnv(WalkOnAxes(), config)
    assert env.spec.action_space == Box(-1.0, 1.0, (1,))
    state, first = env.reset(jax.random.PRNGKey(0))
    _, ts = env.step(state, jnp.array([[5.0], [-0.5]]))  # clipped into the spec's bounds
    np.testing.assert_allclose(ts.final_obs[:, 0] - first.obs[:, 0], [1.0, -0.5])
    with pytest.raises(TypeError, match="BoundedArray action spec is not supported"):
        JumanjiEnv(WalkOnAGrid(), config)
    with pytest.raises(TypeError, match=r"one number a step; this env's has shape \(2,\)"):
        JumanjiEnv(WalkOfTwo(), config)
    with pytest.raises(ConfigError, match="hide_score"):
        JumanjiEnv(Walk(), EnvConfig(id="test-jumanji/Walk", hide_score=True))


def test_a_jumanji_id_and_observe_pick_what_the_agent_sees(registered):
    registered("test-jumanji/Snake", lambda config, members: None)
    env = JumanjiEnv("Snake-v1", EnvConfig(id="test-jumanji/Snake", num_envs=2))
    assert env.spec.observation_shape == (12 * 12 * 5 + 1 + 4,) and env.spec.max_episode_steps == 4000
    grid_only = JumanjiEnv("Snake-v1", EnvConfig(id="test-jumanji/Snake", num_envs=2),
                           observe=lambda observation: observation.grid)
    assert grid_only.spec.observation_shape == (12, 12, 5)  # one array keeps its shape
    _, first = grid_only.reset(jax.random.PRNGKey(0))
    assert first.obs.shape == (2, 12, 12, 5) and first.obs.dtype == jnp.float32


@pytest.mark.slow
def test_a_run_learns_a_reward_from_preferences_on_a_jumanji_game(registered, tmp_path):
    """The RLHF loop through the documented API on 2048 (a 3x3 board, 40-step episodes): the
    synthetic labeler judges by the game's reward (the merged tiles), and the reward model fitted
    to its first 20 answers ranks fresh pairs of segments better than chance (0.5): 0.66 to 0.75
    after the first chunk on seeds 0-4, measured before the threshold was set."""
    import rlhf_jax

    registered("test-jumanji/2048", lambda config, members: JumanjiEnv(Game2048(board_size=3), config,
                                                                       max_episode_steps=40))
    run_dir = rlhf_jax.train({"reward": "preferences", "env": {"id": "test-jumanji/2048", "num_envs": 8},
                              "a2c": {"total_env_steps": 4096, "num_steps": 8},
                              "preferences": {"labels": 40, "initial_labels": 20, "pretrain_epochs": 100,
                                              "segment_capacity": 64, "fit_pairs_per_env_step": 0.5},
                              "run": {"chunk_env_steps": 1024, "tensorboard": False, "dir": str(tmp_path / "run")}},
                             progress=False)
    run = rlhf_jax.load_run(run_dir)
    last = run.metrics[-1]
    assert run.env_steps == 4096 and last["labels"] == 40 and last["episodes"] > 0
    assert last["episode_return"] > 0  # 2048 pays for every merge
    assert run.metrics[0]["reward_accuracy"] >= 0.6, [m["reward_accuracy"] for m in run.metrics]
