"""The command line: listing environments, and user errors without tracebacks."""
from pathlib import Path

import pytest

from rlhf_jax.cli import main
from rlhf_jax.envs import ENV_IDS


@pytest.mark.slow
def test_envs_lists_every_id_with_its_spaces(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == set(ENV_IDS)
    assert "uint8[84, 84, 4]" in lines["envpool/Pong-v5"] and "Discrete(6)" in lines["envpool/Pong-v5"]
    assert "float32[4]" in lines["gymnax/CartPole-v1"] and "Discrete(2)" in lines["gymnax/CartPole-v1"]
    assert "mjx" in lines["mjx/Hopper-v5"] and "float32[11]" in lines["mjx/Hopper-v5"]
    assert "Box(-1, 1, (3,))" in lines["mjx/Hopper-v5"]


def test_envs_filters_by_back_end(capsys):
    assert main(["envs", "--backend", "gymnax"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert ids == [i for i in ENV_IDS if i.startswith("gymnax/")]


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        main(["fly"])
    assert exit_.value.code == 2


CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SHORT = ["a2c.total_env_steps=1024", "run.chunk_env_steps=1024", "run.tensorboard=false"]


def error_line(capsys) -> str:
    """What the command printed: exactly one line, no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# What users met (a traceback, a 40 GB allocation after the run started, or a run that trained
# silently): one line naming the key, before anything runs.
@pytest.mark.parametrize(
    "words, named",
    [
        (["preferences.segment_length=100000"], "preferences.segment_length must be at least 0 and at most 1000"),
        (["a2c.num_steps=100000"], "a2c.num_steps must be at least 1 and at most 4096"),
        (["preferences.labels=1000000000000"], "preferences.labels must be at least 1 and at most 1000000"),
        (["a2c.mlp_hidden=[-5]"], "a2c.mlp_hidden[0] must be at least 1"),
        (["seed=123456789012345678901234567890"], "seed must fit in a signed 64-bit integer"),
        (["a2c.learning_rate=-0.001"], "a2c.learning_rate must be a positive number"),
        (["a2c.learning_rate=0"], "a2c.learning_rate must be a positive number"),
        (["a2c.entropy_coef=-5"], "a2c.entropy_coef must be at least 0"),
        (["a2c.max_grad_norm=-1"], "a2c.max_grad_norm must be a positive number"),
        (["env.termination_penalty=.nan"], "env.termination_penalty must be a finite number"),
        (["name=../../x"], "name must be a plain file name"),
        # The default's rate decays to zero at 1,638,400 env steps: a longer run would idle at zero.
        (["a2c.total_env_steps=2048000"], "a2c.lr_decay_env_steps=1638400 ends before a2c.total_env_steps=2048000"),
        # Checked where the run is built, still before anything is written.
        ([str(CONFIGS / "a2c_cartpole.yaml"), "a2c.total_env_steps=10"],
         "a2c.total_env_steps=10 is less than one iteration: at least 256 env steps here (env.num_envs=32)"),
        (["preferences.segment_length=600"],
         "preferences.segment_length=600 is longer than an episode of gymnax/CartPole-v1 (500 steps)"),
        ([str(CONFIGS / "ibt_cartpole.yaml"), "ibt.episode_length=501"],
         "ibt.episode_length=501 is longer than an episode of gymnax/CartPole-v1 (500 steps)"),
        (["a2c.num_steps=4096", "a2c.total_env_steps=131072"],
         "one iteration of 131072 env steps (env.num_envs=32) cuts 1748 clips of 75 steps, more than the 1000"),
    ],
)
def test_train_refuses_bad_values_in_one_line_naming_the_key(tmp_path, capsys, words, named):
    run_dir = tmp_path / "run"
    # A short run, so that a regression fails fast instead of training on.
    short = [word for word in SHORT if word.split("=")[0] not in {w.split("=")[0] for w in words}]
    assert main(["train", *words, *short, f"run.dir={run_dir}"]) == 2
    line = error_line(capsys)
    assert line.startswith("rlhf-jax train: error: ") and named in line
    assert not run_dir.exists()


# Past what a file system or Python takes: one line, and nothing written, not even an empty runs/.
@pytest.mark.parametrize(
    "words, named",
    [
        (["name=" + "a" * 300], "name must be at most 233 bytes"),
        (["run.dir=" + "d" * 10_000], "run.dir is too long for a file system"),
        ([f"run.dir={'d' * 300}/run"], "run.dir is too long for a file system"),
        ([f"seed={'[' * 5000}{']' * 5000}"], "it is nested too deeply"),
        (["seed=" + "9" * 5000], "an integer of 5000 digits"),
        (["seed=1:30"], "seed must be of type int, got '1:30'"),  # YAML 1.1 read it as 90
    ],
    ids=["name-300", "dir-10000", "dir-part-300", "nested-5000", "digits-5000", "base-60"],
)
def test_train_refuses_what_a_file_system_or_python_cannot_take_in_one_line(tmp_path, capsys, monkeypatch,
                                                                            words, named):
    monkeypatch.chdir(tmp_path)  # where runs/ would go
    assert main(["train", *words, *SHORT]) == 2
    line = error_line(capsys)
    assert line.startswith("rlhf-jax train: error: ") and named in line and len(line) < 300, line[:500]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text, named",
    [
        (b"seed: 1\nname: caf\xe9\n", "not UTF-8 text"),
        (b"", "the file is empty (or only comments)"),
        (b"# seed: 3\n", "the file is empty (or only comments)"),
        (b"a2c:\n  num_steps: 8\na2c:\n  gamma: 0.9\n", "line 3, column 1: 'a2c' is given twice (first on line 1)"),
        (("seed: [&a [x,x,x,x,x,x,x,x,x], " + ", ".join(f"&{b} [{', '.join([f'*{a}'] * 9)}]"
                                                         for a, b in zip("abcdef", "bcdefg")) + "]\n").encode(),
         "its aliases expand it to more than 100000 values"),
    ],
    ids=["non-utf8", "empty", "comments", "section-twice", "alias-bomb"],
)
def test_train_refuses_bad_config_files_in_one_line_naming_the_file(tmp_path, capsys, text, named):
    path = tmp_path / "exp.yaml"
    path.write_bytes(text)
    assert main(["train", str(path), *SHORT, f"run.dir={tmp_path / 'run'}"]) == 2
    line = error_line(capsys)
    assert line.startswith(f"rlhf-jax train: error: {path}: ") and named in line and len(line) < 200


@pytest.mark.parametrize("episodes", ["0", "-3"])
def test_eval_episodes_must_be_at_least_one(tmp_path, capsys, episodes):
    # Refused as the command line is read, naming the option (not env.num_envs, not the default 32).
    with pytest.raises(SystemExit) as exit_:
        main(["eval", str(tmp_path), "--episodes", episodes])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --episodes: the number of episodes must be at least 1 and at most 65536, got {episodes}" in err


@pytest.mark.parametrize("seed, named", [(str(2**70), "the seed must fit in a signed 64-bit integer"),
                                         (str(-2**63 - 1), "the seed must fit in a signed 64-bit integer"),
                                         ("9" * 5000, "must be a whole number, got '99999")])
def test_eval_seed_must_be_a_seed_a_config_may_have(tmp_path, capsys, seed, named):
    """--seed 2**70 scored the run and then failed with an OverflowError."""
    with pytest.raises(SystemExit) as exit_:
        main(["eval", str(tmp_path), "--seed", seed])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --seed: {named}" in err and len(err.splitlines()[-1]) < 200
