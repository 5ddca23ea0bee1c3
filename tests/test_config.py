"""Experiment configs: YAML onto frozen dataclasses, key=value overrides, errors before anything runs."""
import dataclasses

import pytest

from rlhf_jax.config import ExperimentConfig, apply_overrides, build, load_config, to_dict
from rlhf_jax.errors import ConfigError


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: pendulum\nenv:\n  id: gymnax/Pendulum-v1\n  num_envs: 4\n")
    config = load_config(ExperimentConfig, path, ["env.num_envs=8", "seed=3", "env.hide_episode_end=true"])
    assert config.name == "pendulum" and config.seed == 3
    assert config.env.id == "gymnax/Pendulum-v1" and config.env.num_envs == 8 and config.env.hide_episode_end
    assert config.env.termination_penalty == 1.0  # untouched fields keep their defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 4


def test_round_trip_through_a_dict():
    config = load_config(ExperimentConfig, None, ["env.id=envpool/Pong-v5", "env.hide_score=true"])
    assert build(ExperimentConfig, to_dict(config)) == config


def test_an_int_is_accepted_for_a_float():
    config = load_config(ExperimentConfig, None, ["env.termination_penalty=2"])
    assert config.env.termination_penalty == 2.0 and isinstance(config.env.termination_penalty, float)


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.num_env=3", "unknown key 'env.num_env'; valid keys of env: id, num_envs"),
        ("sed=1", "unknown key 'sed'; valid keys: name, seed, agent, reward, labeler, env"),
        ("env.num_envs=three", "env.num_envs must be of type int, got 'three'"),
        ("env.hide_score=1", "env.hide_score must be of type bool"),
        ("seed=true", "seed must be of type int"),
        ("env.num_envs=0", "num_envs must be at least 1"),
        ("env.id=gymnax/Nope-v0", "unknown environment id 'gymnax/Nope-v0'; known ids"),
        ("env=3", "env must be a mapping"),
        ("justakey", "must look like key=value"),
    ],
)
def test_bad_configs_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(ExperimentConfig, None, [override])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(ExperimentConfig, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(ExperimentConfig, bad)


def test_overrides_do_not_touch_the_input():
    data = {"env": {"num_envs": 2}}
    apply_overrides(data, ["env.num_envs=5"])
    assert data == {"env": {"num_envs": 2}}


def test_every_shipped_config_loads():
    from pathlib import Path

    # configs/paper/ablations.yaml holds override lists, not an experiment (test_paper_configs reads it).
    configs = [p for p in sorted((Path(__file__).resolve().parent.parent / "configs").rglob("*.yaml"))
               if p.name != "ablations.yaml"]
    assert len(configs) > 40, "configs/ lacks its experiments"
    for path in configs:
        load_config(ExperimentConfig, path)


def test_the_built_in_default_is_the_shipped_cartpole_config():
    from pathlib import Path

    from rlhf_jax.config import DEFAULT_EXPERIMENT, read_yaml

    shipped = read_yaml(Path(__file__).resolve().parent.parent / "configs" / "rlhf_cartpole.yaml")
    assert build(ExperimentConfig, shipped) == build(ExperimentConfig, DEFAULT_EXPERIMENT)


def test_in_state_marks_are_read_by_dotted_key():
    from rlhf_jax.config_base import is_in_state

    assert is_in_state(ExperimentConfig, "a2c.learning_rate") and is_in_state(ExperimentConfig, "ibt.learning_rate")
    assert not is_in_state(ExperimentConfig, "a2c.entropy_coef") and not is_in_state(ExperimentConfig, "seed")
    with pytest.raises(ConfigError, match="unknown key 'a2c.nope'; valid keys of a2c: total_env_steps"):
        is_in_state(ExperimentConfig, "a2c.nope")
    with pytest.raises(ConfigError, match="unknown key 'seed.x': seed is not a section"):
        is_in_state(ExperimentConfig, "seed.x")


def test_a_run_directory_is_checked_before_its_config_is_read(tmp_path):
    from rlhf_jax.config_base import CONFIG_FILE, read_run_config

    with pytest.raises(ConfigError, match="does not exist"):
        read_run_config(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="not a run directory: it has no config.yaml"):
        read_run_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text("labeler: people\npeople:\n  assignment_timeout_s: 60\n")
    assert read_run_config(tmp_path) == {"labeler": "people", "people": {"assignment_timeout_s": 60}}
