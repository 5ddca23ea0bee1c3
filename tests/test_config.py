"""Experiment configs: YAML onto frozen dataclasses, key=value overrides, errors before anything runs."""
import dataclasses

import pytest

from rlhf_jax.config import ExperimentConfig, apply_overrides, build, load_config, to_dict
from rlhf_jax.config_base import dump_yaml, parse_yaml
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


def test_config_yaml_reads_back_what_was_written():
    """A name such as 1e5 was written unquoted and read back as the number 100000.0."""
    config = load_config(ExperimentConfig, None, ["name='1e5'", "a2c.learning_rate=3e-4"])
    assert config.name == "1e5"
    assert build(ExperimentConfig, parse_yaml(dump_yaml(to_dict(config)))) == config


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
        ("env.id=gymnax/Nope-v0", "unknown environment id 'gymnax/Nope-v0'; `rlhf-jax envs` lists every known id"),
        ("env=3", "env must be a mapping"),
        ("justakey", "must look like key=value"),
    ],
)
def test_bad_configs_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(ExperimentConfig, None, [override])


@pytest.mark.parametrize(
    "env_id, suggested",
    [
        ("gymnax/CartPol-v1", " (did you mean 'gymnax/CartPole-v1'?)"),  # a typo
        ("envpool/CartPole-v1", " (did you mean 'gymnax/CartPole-v1'?)"),  # the name under another back end
        ("mjx/hopper-v5", " (did you mean 'mjx/Hopper-v5' or 'envpool/Hopper-v5'?)"),  # its own back end first
        ("Pong", " (did you mean 'envpool/Pong-v5'?)"),
        ("gymnax/Nope-v0", ""),  # nothing near: no guess
    ],
)
def test_an_unknown_environment_id_is_one_line_with_the_nearest_known_ids(env_id, suggested):
    with pytest.raises(ConfigError) as error:
        load_config(ExperimentConfig, None, [f"env.id={env_id}"])
    message = str(error.value)
    assert "\n" not in message
    assert f"unknown environment id {env_id!r}{suggested};" in message


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


def test_the_built_in_default_is_the_package_data_file_and_a_wheel_ships_it():
    """DEFAULT_EXPERIMENT is read from its one copy, rlhf_jax/configs/default.yaml, and is the
    documented run (A2C on CartPole from 500 preferences); pyproject's package-data covers the
    file, so a non-editable install has it too (a wheel built without that line lacks it)."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from rlhf_jax.config import DEFAULT_EXPERIMENT, DEFAULT_EXPERIMENT_FILE, read_yaml

    package = Path(__file__).resolve().parent.parent / "rlhf_jax"
    assert Path(DEFAULT_EXPERIMENT_FILE) == package / "configs" / "default.yaml"
    assert DEFAULT_EXPERIMENT == read_yaml(DEFAULT_EXPERIMENT_FILE)
    config = build(ExperimentConfig, DEFAULT_EXPERIMENT)
    assert (config.agent, config.reward, config.env.id, config.preferences.labels) == (
        "a2c", "preferences", "gymnax/CartPole-v1", 500)
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"].get("rlhf_jax", [])
    assert any(fnmatch.fnmatch("configs/default.yaml", pattern) for pattern in shipped), shipped


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


# Each a value that once crashed a run (a traceback, or a 40 GB allocation after it started) or
# trained silently; every one now stops before anything runs, naming its key.
@pytest.mark.parametrize(
    "override, message",
    [
        ("preferences.segment_length=100000", "preferences.segment_length must be at least 0 and at most 1000, got 100000"),
        ("a2c.num_steps=100000", "a2c.num_steps must be at least 1 and at most 4096, got 100000"),
        ("preferences.labels=1000000000000", "preferences.labels must be at least 1 and at most 1000000"),
        ("a2c.mlp_hidden=[64, -5]", "a2c.mlp_hidden[1] must be at least 1 and at most 8192, got -5"),
        (f"seed={2**64}", f"seed must fit in a signed 64-bit integer, got {2**64}"),
        ("a2c.learning_rate=0", "a2c.learning_rate must be a positive number, got 0.0"),
        ("a2c.learning_rate=-3e-4", "a2c.learning_rate must be a positive number, got -0.0003"),
        ("a2c.entropy_coef=-5", "a2c.entropy_coef must be at least 0, got -5.0"),
        ("a2c.max_grad_norm=-1", "a2c.max_grad_norm must be a positive number, got -1.0"),
        ("env.termination_penalty=.nan", "env.termination_penalty must be a finite number, got nan"),
        ("env.termination_penalty=-.inf", "env.termination_penalty must be a finite number, got -inf"),
        ("name=../../x", "name must be a plain file name (no '/', '\\' or '..'), got '../../x'"),
        ("name=..", "name must be a plain file name"),
        ("a2c.num_steps=2.5", "a2c.num_steps must be of type int, got 2.5 (float)"),
        # One of every section: each declares its ranges on its fields.
        ("env.num_envs=1000000", "env.num_envs must be at least 1 and at most 65536"),
        ("dqn.replay_capacity=1e12", "dqn.replay_capacity must be at least 1 and at most 100000000"),
        ("acer.replay_ratio=1e6", "acer.replay_ratio must be at least 0 and at most 100"),
        ("trpo.line_search_decay=1", "trpo.line_search_decay must be more than 0 and less than 1, got 1.0"),
        ("reward_model.validation_fraction=1", "reward_model.validation_fraction must be at least 0 and less than 1"),
        ("preferences.teacher.mistake_prob=2", "preferences.teacher.mistake_prob must be at least 0 and at most 1"),
        ("ibt.episodes=1e9", "ibt.episodes must be at least 1 and at most 100000"),
        ("ibt.annotator.noise=-0.5", "ibt.annotator.noise must be at least 0 and at most 1"),
        ("run.eval_episodes=0", "run.eval_episodes must be at least 1"),
    ],
)
def test_values_out_of_their_declared_range_name_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(ExperimentConfig, None, [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_section_made_in_python_is_checked_by_the_same_ranges():
    from rlhf_jax.agents.a2c import A2CConfig
    from rlhf_jax.reward.labelers import TeacherConfig

    with pytest.raises(ConfigError, match=r"^num_steps must be at least 1 and at most 4096, got 0$"):
        A2CConfig(num_steps=0)
    with pytest.raises(ConfigError, match=r"^skip_below must be a finite number, got nan$"):
        TeacherConfig(skip_below=float("nan"))
    assert TeacherConfig(skip_below=None).skip_below is None


def test_cross_field_checks_stay_with_their_section():
    with pytest.raises(ConfigError, match=r"initial_labels \(20\) exceeds the budget \(10\)"):
        load_config(ExperimentConfig, None, ["preferences.labels=10", "preferences.initial_labels=20"])
    with pytest.raises(ConfigError, match="need l2_low < l2_high"):
        load_config(ExperimentConfig, None, ["reward_model.l2_low=2.0"])


def _sections():
    seen, todo = [], [ExperimentConfig]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += [f.default.__class__ for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default)]
    return seen


def test_every_count_declares_an_upper_bound():
    # A count sizes something (an array, a loop): an absurd one must stop before it is allocated.
    from rlhf_jax.config_base import _RANGE

    unbounded = [f"{cls.__name__}.{f.name}" for cls in _sections() for f in dataclasses.fields(cls)
                 if f.type in ("int", "tuple[int, ...]") and (f.metadata.get(_RANGE) or (None, None))[1] is None]
    assert unbounded == ["ExperimentConfig.seed"]  # any 64-bit seed is fine


def test_numbers_written_as_the_readme_writes_them_parse():
    import re
    from pathlib import Path

    from rlhf_jax.config_base import parse_yaml

    # The README and the documentation pages it links to (docs/), where the settings live now.
    root = Path(__file__).resolve().parent.parent
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    written = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?e[-+]?\d+\b", readme))
    assert {"7e-4", "3e-4", "2.5e-4", "1e-5", "2e6", "5e6"} <= written
    for text in written:
        assert parse_yaml(text) == float(text), text
    config = load_config(ExperimentConfig, None, ["a2c.learning_rate=3e-4", "a2c.rms_eps=1e-5",
                                                  "a2c.total_env_steps=1e9", "a2c.lr_decay_env_steps=2e9",
                                                  "preferences.label_decay_steps=2e6"])
    assert config.a2c.learning_rate == 3e-4 and config.a2c.rms_eps == 1e-5
    assert config.a2c.total_env_steps == 10**9 and isinstance(config.a2c.total_env_steps, int)
    assert config.a2c.lr_decay_env_steps == 2 * 10**9
    assert config.preferences.label_decay_steps == 2_000_000
    # Still YAML: integers stay ints, and what is no number stays a string.
    assert parse_yaml("100") == 100 and isinstance(parse_yaml("100"), int)
    assert parse_yaml("1.2.3") == "1.2.3" and parse_yaml("v1e3") == "v1e3"


# A YAML alias bomb: 9 x 9 x ... aliases, 9^7 = 4.8M values once expanded, from one short line.
ALIAS_BOMB = "seed: [&a [x,x,x,x,x,x,x,x,x], " + ", ".join(
    f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdef", "bcdefg")) + "]\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (b"name: x\nseed: \xff\xfe\n", "not UTF-8 text (byte 14"),
        (b"", "the file is empty (or only comments)"),
        (b"# all commented out\n# seed: 3\n", "the file is empty (or only comments)"),
        (b"a2c:\n  num_steps: 5\nenv:\n  num_envs: 4\na2c:\n  gamma: 0.9\n",
         "not valid YAML: line 5, column 1: 'a2c' is given twice (first on line 1)"),
        (b"env:\n  num_envs: 4\n  num_envs: 8\n", "line 3, column 3: 'num_envs' is given twice (first on line 2)"),
        (ALIAS_BOMB.encode(), "its aliases expand it to more than 100000 values"),
        (b"env: &e {num_envs: [*e]}\n", "its aliases expand it"),  # an alias inside itself
        (b"env: [unclosed\n", "not valid YAML: line 2, column 1: while parsing a flow sequence"),
        # A RecursionError of 2,998 lines: the parser recurses once for each level.
        pytest.param(b"seed: " + b"[" * 5000 + b"]" * 5000 + b"\n", "not valid YAML: it is nested too deeply",
                     id="nested-5000-deep"),
        pytest.param(b"seed: " + b"9" * 5000 + b"\n", "an integer of 5000 digits",  # past what int() reads
                     id="5000-digits"),
    ],
)
def test_bad_config_files_are_refused_in_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "exp.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as error:
        load_config(ExperimentConfig, path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) < 200


def test_a_yaml_merge_may_restate_what_it_brings_in(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("a2c: &a {num_steps: 8, gamma: 0.9}\nacer:\n  <<: *a\n  num_steps: 10\n")
    config = load_config(ExperimentConfig, path)
    assert (config.acer.num_steps, config.acer.gamma, config.a2c.num_steps) == (10, 0.9, 8)


def test_a_value_of_the_wrong_type_is_shown_short():
    with pytest.raises(ConfigError) as error:
        load_config(ExperimentConfig, None, ["seed=" + str(list(range(10_000)))])
    assert len(str(error.value)) < 120 and str(error.value).startswith("seed must be of type int, got [0, 1, 2, 3, ...]")


@pytest.mark.parametrize("text, value", [
    ("010", 10), ("-007", -7), ("+5", 5), ("0o17", 15), ("0x1F", 31),
    ("1:30", "1:30"), ("1:30.5", "1:30.5"), ("1_000", "1_000"), ("0b101", "0b101"),
    ("1e9", 1e9), ("-.5", -0.5), (".inf", float("inf")),
])
def test_numbers_are_read_as_yaml_1_2_reads_them(text, value):
    """YAML 1.1's integers are gone: seed=010 was 8 (octal), seed=1:30 was 90 (base 60)."""
    read = parse_yaml(text)
    assert read == value and type(read) is type(value)
    assert parse_yaml(dump_yaml(read)) == read  # written back as it was read


def test_an_override_reads_its_integer_as_yaml_1_2_does():
    assert load_config(ExperimentConfig, None, ["seed=010"]).seed == 10
    with pytest.raises(ConfigError, match="seed must be of type int, got '1:30'"):
        load_config(ExperimentConfig, None, ["seed=1:30"])
