"""The Python API: rlhf_jax.train and rlhf_jax.load_run, and what load_run hands back."""
import dataclasses
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlhf_jax
from rlhf_jax.config import ExperimentConfig
from rlhf_jax.errors import ConfigError
from small_runs import SMALL_LEARNERS, SMALL_RUN


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A2C on CartPole from 40 synthetic preferences, 5,632 env steps, trained through the API."""
    directory = tmp_path_factory.mktemp("api") / "run"
    words = [*SMALL_RUN, *SMALL_LEARNERS["preferences"], f"run.dir={directory}", "run.tensorboard=false"]
    assert rlhf_jax.train(None, words, progress=False) == directory
    return directory


@pytest.mark.slow
def test_a_trained_run_loads_with_its_policy_learned_reward_and_metrics(run_dir):
    run = rlhf_jax.load_run(run_dir)
    assert isinstance(run, rlhf_jax.Run) and run.directory == run_dir
    assert run.config.env.id == "gymnax/CartPole-v1" and run.config.preferences.labels == 40
    assert run.env_steps == 5632 and run.chunk == 5  # 5 chunks of 1024 env steps, then one of 512
    # metrics.csv, one row per chunk, by column name.
    assert [row["env_steps"] for row in run.metrics] == [1024, 2048, 3072, 4096, 5120, 5632]
    assert run.metrics[-1]["labels"] == 40
    # The policy acts on a batch of the run's environment's observations, compiled or not.
    env = run.make_env(num_envs=8)
    state, timestep = env.reset(jax.random.PRNGKey(0))
    action = run.policy(timestep.obs, jax.random.PRNGKey(1))
    assert action.shape == (8,) and set(np.asarray(action).tolist()) <= {0, 1}
    assert jnp.array_equal(jax.jit(run.policy)(timestep.obs, jax.random.PRNGKey(1)), action)
    # r-hat of those steps, from the parameters the run learned.
    _, after = env.step(state, action)
    reward = run.learned_reward.fn(run.learned_reward.params, timestep.obs, action, after)
    assert reward.shape == (8,) and bool(jnp.all(jnp.isfinite(reward)))


@pytest.mark.slow
def test_eval_greedy_scores_the_policys_most_likely_action(run_dir):
    """`rlhf-jax eval --greedy` plays the argmax of the policy's logits (read here from the network
    itself) on the episodes the sampled score plays, and eval.json says which it scored."""
    from rlhf_jax.agents.a2c import ActorCritic
    from rlhf_jax.cli import main
    from rlhf_jax.driver import scoring_env_config, scoring_steps
    from rlhf_jax.envs import make
    from rlhf_jax.evaluation import evaluate

    run = rlhf_jax.load_run(run_dir)
    env = make(dataclasses.replace(scoring_env_config(run.config), num_envs=8))
    network = ActorCritic(env.spec, run.config.a2c)
    mode = lambda params, obs, key: jnp.argmax(network.apply(params, obs)[0], -1)
    expected = evaluate(mode, run.policy.params, env, jax.random.PRNGKey(0), scoring_steps(run.config, env.spec))
    scores = {}
    for options in ([], ["--greedy"]):
        assert main(["eval", str(run_dir), "--episodes", "8", *options]) == 0
        result = json.loads((run_dir / "eval.json").read_text())
        assert result["greedy"] == bool(options)
        scores[bool(options)] = result["mean_true_return"]
    assert scores[True] == pytest.approx(expected.mean_return(), rel=1e-6)


@pytest.mark.slow
def test_a_run_on_the_true_reward_has_no_learned_reward(tmp_path, capsys):
    config = ExperimentConfig()  # the dataclass defaults: A2C on CartPole's own reward
    directory = rlhf_jax.train(config, ["a2c.total_env_steps=1024", "run.chunk_env_steps=1024",
                                        f"run.dir={tmp_path / 'rl'}", "run.tensorboard=false"], progress=False)
    # The first chunk's compilation is announced, not waited through in silence, and timed.
    said = capsys.readouterr().out.splitlines()
    assert "compiling the first chunk (this can take a minute) ..." in said
    assert any(re.fullmatch(r"compiled and ran the first chunk in \d+\.\d s", line.strip("\r ")) for line in said), said
    run = rlhf_jax.load_run(directory)
    assert run.config.reward == "env" and run.learned_reward is None
    assert 0 < run.env_steps == run.metrics[-1]["env_steps"] <= 1024  # whole iterations of 5 steps x num_envs


def test_a_config_is_a_dataclass_a_dict_a_file_or_the_default(tmp_path):
    resolve = rlhf_jax.resolve_config
    assert resolve(ExperimentConfig(seed=3)) == ExperimentConfig(seed=3)
    assert resolve(ExperimentConfig(seed=3), ["seed=4"]).seed == 4
    assert resolve({"agent": "dqn", "env": {"num_envs": 2}}).env.num_envs == 2
    (tmp_path / "x.yaml").write_text("agent: trpo\n")
    assert resolve(tmp_path / "x.yaml", ["trpo.gamma=0.9"]).trpo.gamma == 0.9
    assert resolve().name == "rlhf-cartpole" and resolve().reward == "preferences"  # rlhf-jax train's default


@pytest.mark.parametrize("config, overrides, named", [
    (None, ["nosuch.key=1"], "unknown key 'nosuch'"),
    ({"a2c": {"gamma": 2}}, [], "a2c.gamma must be at least 0 and at most 1"),
    ("does/not/exist.yaml", [], "does/not/exist.yaml"),
    (None, "seed=1", "overrides must be a list"),
    (3, [], "a config is an ExperimentConfig"),
])
def test_config_mistakes_are_config_errors_before_anything_runs(tmp_path, monkeypatch, config, overrides, named):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        rlhf_jax.train(config, overrides)
    assert not (tmp_path / "runs").exists()


def test_loading_what_is_not_a_run_says_so_in_one_line_naming_the_path(tmp_path):
    for path, said in [(tmp_path / "missing", "does not exist"), (tmp_path, "is not a run directory")]:
        with pytest.raises(ConfigError) as error:
            rlhf_jax.load_run(path)
        assert str(path) in str(error.value) and said in str(error.value) and "\n" not in str(error.value)
    # A run that started but saved no checkpoint yet.
    (tmp_path / "config.yaml").write_text("name: started\n")
    with pytest.raises(ConfigError, match=f"{tmp_path} has no checkpoint yet"):
        rlhf_jax.load_run(tmp_path)


def test_importing_rlhf_jax_imports_no_jax():
    script = "import sys, rlhf_jax; rlhf_jax.__version__; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
