"""Environments of your own: the registry (``env.id`` of a registered factory), and the adapters
of gymnax environment objects, Brax-interface ``Env``s and Gymnasium environments on the host
(Jumanji's: tests/test_jumanji_env.py)."""
from __future__ import annotations

import csv
import importlib.metadata
from typing import Any

import gymnasium
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from compiling import ROOT
from rlhf_jax.config import apply_overrides, read_yaml
from rlhf_jax.envs import BraxEnv, EnvConfig, Environment, GymnasiumEnv, GymnaxEnv, make, register, unregister
from rlhf_jax.envs.registry import ENTRY_POINT_GROUP, factory_of
from rlhf_jax.errors import ConfigError
from rlhf_jax.sweep import Sweep


def catch(config, members):
    """bsuite's Catch, a gymnax environment the library does not list."""
    env, params = gymnax.make("Catch-bsuite")
    return GymnaxEnv(env, params, config, fps=10.0)


def random_actions(env, key, steps):
    space = env.action_space
    if hasattr(space, "n"):
        return jax.random.randint(key, (steps, env.num_envs), 0, space.n)
    return jax.random.uniform(key, (steps, env.num_envs, *space.shape), minval=space.low, maxval=space.high)


def rollout(env, key, steps):
    """``steps`` random steps from a reset, compiled: (first TimeStep, actions, TimeSteps [steps, N])."""
    actions = random_actions(env, jax.random.fold_in(key, 1), steps)

    def run():
        state, first = env.reset(key)
        return first, jax.lax.scan(env.step, state, actions)[1]

    first, timesteps = jax.jit(run)()
    return first, actions, timesteps


# ------------------------------------------------------------------ the registry
def test_a_registered_id_is_an_env_id_until_unregistered(registered):
    registered("test-own/Catch", catch)
    env = make(EnvConfig(id="test-own/Catch", num_envs=3))
    assert isinstance(env, Environment) and env.spec.id == "test-own/Catch" and env.spec.num_envs == 3
    unregister("test-own/Catch")
    with pytest.raises(ConfigError, match="register"):
        EnvConfig(id="test-own/Catch")


@pytest.mark.parametrize("env_id", ["gymnax/Catch-bsuite", "mjx/Mine", "no-slash", "a/b/c", ""])
def test_ids_that_are_not_yours_to_register_are_refused(env_id):
    with pytest.raises(ConfigError):
        register(env_id, catch)


def test_a_factory_must_build_what_its_config_asks(registered):
    registered("test-own/NotAnEnv", lambda config, members: object())
    with pytest.raises(TypeError, match="not an rlhf_jax.envs.Environment"):
        make(EnvConfig(id="test-own/NotAnEnv"))
    registered("test-own/FewerCopies", lambda config, members: catch(EnvConfig(id=config.id, num_envs=1), members))
    with pytest.raises(ValueError, match="env.num_envs=4"):
        make(EnvConfig(id="test-own/FewerCopies", num_envs=4))


def test_an_installed_package_s_entry_point_is_found_by_id(monkeypatch):
    """`rlhf-jax train env.id=...` in a shell: the id is looked up among the entry points."""
    entry = importlib.metadata.EntryPoint(name="test-own/FromEntryPoint", value=f"{__name__}:catch",
                                          group=ENTRY_POINT_GROUP)

    def entry_points(group=None, name=None):
        return [entry] if (group, name) == (ENTRY_POINT_GROUP, entry.name) else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    try:
        assert make(EnvConfig(id="test-own/FromEntryPoint", num_envs=2)).spec.id == "test-own/FromEntryPoint"
        assert factory_of("test-own/FromEntryPoint") is catch
    finally:
        unregister("test-own/FromEntryPoint")


# ------------------------------------------------------------- gymnax objects
def test_any_gymnax_environment_keeps_the_contract(registered):
    registered("test-own/Catch", catch)
    env = make(EnvConfig(id="test-own/Catch", num_envs=4))
    assert env.spec.observation_shape == (10, 5) and env.spec.action_space.n == 3 and env.spec.backend == "gymnax"
    _, _, ts = rollout(env, jax.random.PRNGKey(0), 40)
    # Catch ends after 9 steps, caught (+1) or missed (-1): a terminal state, never a time limit.
    assert ts.terminated.sum() == 4 * 4 and not ts.truncated.any()
    ended = np.asarray(ts.terminated)
    assert np.all(np.abs(np.asarray(ts.reward)[ended]) == 1) and np.all(np.asarray(ts.reward)[~ended] == 0)
    np.testing.assert_array_equal(ts.info["episode_return"][ended], ts.reward[ended])
    # A restarted copy's obs is its new first observation, final_obs the one it reached.
    assert not np.array_equal(np.asarray(ts.final_obs)[ended], np.asarray(ts.obs)[ended])
    np.testing.assert_array_equal(np.asarray(ts.final_obs)[~ended], np.asarray(ts.obs)[~ended])


def test_the_oracle_replaces_the_reward_the_labeler_and_the_score_read(registered):
    """oracle(obs, action, next_obs, reward): o_t, a_t, the observation reached, the env's reward."""
    def oracle(obs, action, next_obs, reward):
        return 10.0 * reward + action + (next_obs.sum() - obs.sum())

    registered("test-own/CatchOracle", lambda config, members: GymnaxEnv(*gymnax.make("Catch-bsuite"), config,
                                                                         oracle=oracle))
    env = make(EnvConfig(id="test-own/CatchOracle", num_envs=4))
    first, actions, ts = rollout(env, jax.random.PRNGKey(0), 30)
    before = np.concatenate([np.asarray(first.obs)[None], np.asarray(ts.obs)[:-1]])
    env_reward = np.asarray(ts.info["env_reward"])
    expected = 10 * env_reward + np.asarray(actions) + (np.asarray(ts.final_obs).sum((2, 3)) - before.sum((2, 3)))
    np.testing.assert_allclose(ts.reward, expected, rtol=1e-6)
    np.testing.assert_allclose(ts.info["true_reward"], ts.reward)  # the true return is the oracle's
    assert set(np.unique(env_reward)) <= {-1.0, 0.0, 1.0}


def test_gymnax_episode_end_options_apply_to_your_env(registered):
    registered("test-own/Catch", catch)
    env = make(EnvConfig(id="test-own/Catch", num_envs=4, hide_episode_end=True, hidden_end="reset",
                         termination_penalty=3.0))
    _, _, ts = rollout(env, jax.random.PRNGKey(0), 40)
    assert not ts.terminated.any() and ts.info["true_done"].sum() == 16
    assert set(np.unique(np.asarray(ts.reward))) <= {-4.0, -2.0, 0.0}  # +-1 minus the penalty at each end
    with pytest.raises(ConfigError, match="hide_score"):
        make(EnvConfig(id="test-own/Catch", hide_score=True))


# ------------------------------------------------------- the Brax interface
@struct.dataclass
class State:
    """brax.envs.base.State's fields."""

    pipeline_state: Any
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    metrics: dict = struct.field(default_factory=dict)
    info: dict = struct.field(default_factory=dict)


class Slide:
    """A stand-in for a Brax ``Env``: a point pushed along a line, done once ``|x| > 1``."""

    dt = 0.05
    action_size = 1

    def reset(self, rng):
        q = jnp.stack([jax.random.uniform(rng, (), minval=-0.5, maxval=0.5), 0.0])
        return State(q, q, jnp.zeros(()), jnp.zeros(()), {"x": q[0]}, {"rng": rng})

    def step(self, state, action):
        x, v = state.pipeline_state
        v = v + 0.1 * action[0]
        q = jnp.stack([x + v, v])
        done = (jnp.abs(q[0]) > 1.0).astype(jnp.float32)
        return state.replace(pipeline_state=q, obs=q, reward=-jnp.abs(q[0]), done=done, metrics={"x": q[0]})


def test_a_brax_env_keeps_the_contract(registered):
    registered("test-own/Slide", lambda config, members: BraxEnv(Slide(), config, max_episode_steps=30))
    env = make(EnvConfig(id="test-own/Slide", num_envs=8))
    assert env.spec.fps == 20.0 and env.spec.max_episode_steps == 30 and env.spec.action_space.shape == (1,)
    first, actions, ts = rollout(env, jax.random.PRNGKey(0), 100)
    terminated, truncated = np.asarray(ts.terminated), np.asarray(ts.truncated)
    assert terminated.any() and truncated.any() and not (terminated & truncated).any()
    final_x = np.asarray(ts.final_obs)[..., 0]
    assert np.all(np.abs(final_x[terminated]) > 1.0) and np.all(np.abs(final_x[~terminated]) <= 1.0)
    # The reward is the step's, of the state reached; a copy restarts from a fresh reset. The two
    # are computed apart, and XLA may round x + v in them an ulp of x and v apart (jaxlib 0.12:
    # 1.5e-8), which near x = 0 is far over rtol: hence atol, well under a step's change of x.
    np.testing.assert_allclose(ts.reward, -np.abs(final_x), rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(np.asarray(ts.obs)[..., 0][terminated | truncated]) <= 0.5)
    # The time limit: every episode that lasts 30 steps is truncated at its 30th.
    lengths = np.asarray(ts.info["episode_length"])
    assert np.all(lengths[truncated] == 30) and np.all(lengths[terminated] < 30)
    # Pure JAX: vmapped over seeds as it is.
    many = jax.jit(jax.vmap(lambda key: env.step(env.reset(key)[0], actions[0])[1].reward))(
        jax.random.split(jax.random.PRNGKey(1), 3))
    assert many.shape == (3, 8) and len({tuple(np.asarray(row)) for row in many}) == 3


def test_a_brax_env_under_appendix_a_episode_ends(registered):
    registered("test-own/Slide", lambda config, members: BraxEnv(Slide(), config, max_episode_steps=30))
    env = make(EnvConfig(id="test-own/Slide", num_envs=8, hide_episode_end=True, termination_penalty=2.0))
    _, _, ts = rollout(env, jax.random.PRNGKey(0), 100)
    assert not ts.terminated.any() and np.all(np.asarray(ts.info["episode_length"])[np.asarray(ts.truncated)] == 30)
    failed = np.abs(np.asarray(ts.final_obs)[..., 0]) > 1.0
    np.testing.assert_allclose(ts.reward, -np.abs(np.asarray(ts.final_obs)[..., 0]) - 2.0 * failed, rtol=1e-6)


# ------------------------------------------------------- Gymnasium on the host
def host_cartpole(config, members):
    return GymnasiumEnv("CartPole-v1", config, members)


def test_a_gymnasium_env_steps_as_gymnasium_does(registered):
    """The same seed and actions give what Gymnasium's own vector env gives, step for step."""
    registered("test-own/HostCartPole", host_cartpole)
    env = make(EnvConfig(id="test-own/HostCartPole", num_envs=4))
    assert env.spec.fps == 50.0 and env.spec.max_episode_steps == 500 and env.spec.backend == "gymnasium"
    key = jax.random.PRNGKey(0)
    first, actions, ts = rollout(env, key, 120)

    reference = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4,
                                               autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    obs, _ = reference.reset(seed=int(jax.random.randint(key, (), 0, 2**31 - 1, dtype=jnp.int32)))
    np.testing.assert_array_equal(first.obs, obs)
    for t in range(120):
        obs, reward, terminated, truncated, info = reference.step(np.asarray(actions[t]))
        np.testing.assert_array_equal(ts.obs[t], obs)
        np.testing.assert_array_equal(ts.reward[t], reward)
        np.testing.assert_array_equal(ts.terminated[t], terminated)
        np.testing.assert_array_equal(ts.truncated[t], truncated)
        for i in np.flatnonzero(info.get("_final_obs", [])):
            np.testing.assert_array_equal(ts.final_obs[t, i], info["final_obs"][i])
    assert ts.terminated.sum() > 4 and not ts.action_ignored.any()


def test_a_gymnasium_env_shared_by_a_sweep_s_members_and_resumed(registered):
    registered("test-own/HostCartPole", host_cartpole)
    env = make(EnvConfig(id="test-own/HostCartPole", num_envs=3), members=2)
    assert env.envs.num_envs == 6

    def two_steps(key):
        state, first = env.reset(key)
        state, ts = env.step(state, jnp.zeros((3,), jnp.int32))
        return first.obs, ts.obs

    first, obs = jax.jit(jax.vmap(two_steps))(jax.random.split(jax.random.PRNGKey(0), 2))
    assert first.shape == (2, 3, 4) and not np.array_equal(first[0], first[1])  # each member its own copies
    # A new process finds copies never reset: its first step resets them, the action ignored.
    alone = make(EnvConfig(id="test-own/HostCartPole", num_envs=3))
    state, _ = jax.jit(alone.reset)(jax.random.PRNGKey(0))
    alone._last_obs = None
    _, ts = jax.jit(alone.step)(state, jnp.ones((3,), jnp.int32))
    assert ts.action_ignored.all() and not ts.reward.any() and not ts.done.any()


@pytest.mark.parametrize("seeds", [2, 1])
def test_a_sweep_on_a_gymnasium_env_steps_its_members_on_shared_copies(registered, tmp_path, seeds):
    """``rlhf-jax sweep`` on an environment stepped on the host: vmapping its host call failed
    ("Cannot vmap ordered IO callback"); the members now share one vector env, of one seed too."""
    registered("test-own/HostCartPole", host_cartpole)
    base = apply_overrides(read_yaml(ROOT / "configs" / "a2c_cartpole.yaml"),
                           ["env.id=test-own/HostCartPole", "env.num_envs=2", "a2c.total_env_steps=40",
                            "run.chunk_env_steps=20", "run.tensorboard=false"])
    directory = Sweep.create(tmp_path / "host", base, {}, seeds=seeds).run(progress=False)
    rows = list(csv.DictReader((directory / "members.csv").open()))
    assert [(r["chunk"], r["seed"]) for r in rows] == [(str(c), str(s)) for c in range(2) for s in range(seeds)]


def test_gymnasium_options_that_cannot_apply_are_refused(registered):
    registered("test-own/HostCartPole", host_cartpole)
    with pytest.raises(ConfigError, match="hidden_end=reset"):
        make(EnvConfig(id="test-own/HostCartPole", hide_episode_end=True))
    registered("test-own/Endless", lambda config, members: GymnasiumEnv(
        lambda: gymnasium.make("CartPole-v1").unwrapped, config, members))
    with pytest.raises(ConfigError, match="no time limit"):
        make(EnvConfig(id="test-own/Endless"))
    assert make(EnvConfig(id="test-own/Endless", max_episode_steps=50)).spec.max_episode_steps == 50


# ------------------------------------------------------------------- Jumanji
def test_the_jumanji_adapter_without_jumanji_names_its_extra(registered, monkeypatch):
    """The adapter is tested on Jumanji itself in tests/test_jumanji_env.py; without it, one line."""
    import sys

    from rlhf_jax.envs import JumanjiEnv
    from rlhf_jax.extras import MissingExtra

    for module in [name for name in sys.modules if name.startswith("jumanji.")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "jumanji", None)
    registered("test-own/Snake", lambda config, members: JumanjiEnv("Snake-v1", config))
    with pytest.raises(MissingExtra, match=r"^JumanjiEnv needs jumanji, not installed here: "
                                           r"pip install 'rlhf_jax\[jumanji\]'$") as missing:
        make(EnvConfig(id="test-own/Snake"))
    assert missing.value.extra == "jumanji"


@pytest.mark.slow
def test_real_brax_agrees_with_its_own_training_wrappers(registered):
    """Where brax is installed: up to each copy's first end, the adapter steps an unwrapped Brax env
    as Brax's own EpisodeWrapper + AutoResetWrapper + VmapWrapper do."""
    brax_envs = pytest.importorskip("brax.envs")
    from brax.envs import training

    base = brax_envs.get_environment("inverted_pendulum", backend="positional")
    registered("test-own/BraxPendulum", lambda config, members: BraxEnv(base, config, max_episode_steps=50))
    env = make(EnvConfig(id="test-own/BraxPendulum", num_envs=4))
    key = jax.random.PRNGKey(0)
    actions = jax.random.uniform(jax.random.PRNGKey(1), (80, 4, 1), minval=-1, maxval=1)
    ts = jax.jit(lambda: jax.lax.scan(env.step, env.reset(key)[0], actions)[1])()
    wrapped = training.wrap(base, episode_length=50)
    _, reset_key = jax.random.split(key)

    def theirs():
        def body(state, action):
            state = wrapped.step(state, action)
            return state, (state.obs, state.reward, state.done)
        return jax.lax.scan(body, wrapped.reset(jax.random.split(reset_key, 4)), actions)[1]

    obs, reward, done = jax.jit(theirs)()
    for i, end in enumerate(np.argmax(np.asarray(done) > 0, axis=0)):
        np.testing.assert_allclose(ts.final_obs[:end, i], obs[:end, i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ts.reward[:end + 1, i], reward[:end + 1, i], rtol=1e-5)
        assert np.array_equal(np.asarray(ts.done[:end + 1, i]), np.asarray(done[:end + 1, i]) > 0)


@pytest.mark.slow
def test_a_run_on_a_host_env_trains_saves_loads_and_scores(registered, tmp_path):
    """The whole RLHF loop on a Gymnasium env: the host steps inside every compiled chunk, the run
    is saved and loaded back by its registered id, and `rlhf-jax eval` scores it."""
    import json

    import rlhf_jax
    from rlhf_jax.cli import main

    registered("test-own/HostCartPole", host_cartpole)
    run_dir = rlhf_jax.train({"reward": "preferences", "env": {"id": "test-own/HostCartPole", "num_envs": 8},
                              "a2c": {"total_env_steps": 4096, "num_steps": 8},
                              "preferences": {"labels": 20, "segment_capacity": 64, "fit_pairs_per_env_step": 0.05},
                              "run": {"chunk_env_steps": 1024, "tensorboard": False, "dir": str(tmp_path / "run")}},
                             progress=False)
    run = rlhf_jax.load_run(run_dir)
    assert run.env_steps == 4096 and run.metrics[-1]["labels"] == 20 and run.metrics[-1]["episodes"] > 0
    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0
    assert json.loads((run_dir / "eval.json").read_text())["episodes"] == 4
