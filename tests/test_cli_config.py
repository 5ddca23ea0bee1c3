"""The command line's config work needs no JAX: a mistake is said at once, ``config show`` and
``config keys`` answer at once, and every argument has its help."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlhf_jax.cli import main, make_parser
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, flat_keys, load_config, to_dict

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# Runs the command line in a fresh interpreter, then says what it returned and whether JAX was imported.
DRIVER = ("import json, sys\n"
          "from rlhf_jax.cli import main\n"
          "code = main(sys.argv[1:])\n"
          "print(json.dumps({'code': code, 'jax': 'jax' in sys.modules}))")


def command(*argv: str, cwd=None):
    """``rlhf-jax argv`` in a child process: (its exit code, whether it imported JAX, stdout before
    the verdict, stderr)."""
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, cwd=cwd)
    *out, verdict = done.stdout.splitlines()
    result = json.loads(verdict)
    return result["code"], result["jax"], "\n".join(out), done.stderr


@pytest.mark.parametrize("argv, named", [
    (["train", "nosuch.key=1"], "unknown key 'nosuch'"),
    (["train", "a2c.gamma=2"], "a2c.gamma must be at least 0 and at most 1"),
    (["train", "missing.yaml", "seed=1"], "config file 'missing.yaml' does not exist"),
    (["train", ".", "seed=1"], "'.' is a directory; give a config file"),
    (["train", "--resume", "no_run_here"], "run directory 'no_run_here' does not exist"),
    (["sweep", "a2c.learning_rate=0.001,0.003", "nosuch=1,2"], "unknown key 'nosuch'"),
    (["sweep", "a2c.gamma=7,0.9"], "a2c.gamma must be at least 0 and at most 1"),
])
def test_a_config_mistake_is_said_in_one_line_before_jax_is_imported(tmp_path, argv, named):
    code, jax_imported, out, err = command(*argv, cwd=tmp_path)
    assert code == 2
    assert err.count("\n") == 1 and named in err and "Traceback" not in err, err
    assert not jax_imported
    assert not any(tmp_path.iterdir())  # nothing written


def test_config_show_prints_the_resolved_config_without_jax(tmp_path):
    code, jax_imported, out, _ = command("config", "show", "a2c.gamma=0.9", "seed=7", cwd=tmp_path)
    assert code == 0 and not jax_imported
    expected = load_config(ExperimentConfig, None, ["a2c.gamma=0.9", "seed=7"], default=DEFAULT_EXPERIMENT)
    assert yaml.safe_load(out) == to_dict(expected)
    assert not any(tmp_path.iterdir())  # no run started


def test_a_printed_config_is_a_config_file_that_builds_the_same_config(tmp_path, capsys):
    assert main(["config", "show", str(CONFIGS / "a2c_cartpole.yaml"), "env.num_envs=4"]) == 0
    (tmp_path / "printed.yaml").write_text(capsys.readouterr().out)
    assert (load_config(ExperimentConfig, tmp_path / "printed.yaml")
            == load_config(ExperimentConfig, CONFIGS / "a2c_cartpole.yaml", ["env.num_envs=4"]))


def test_config_show_of_a_run_prints_the_runs_config(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("seed: 3\nagent: dqn\n")
    assert main(["config", "show", "--run", str(tmp_path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == to_dict(ExperimentConfig(seed=3, agent="dqn"))
    assert main(["config", "show", "--run", str(tmp_path), "seed=4"]) == 2
    assert "--run RUN_DIR shows the config a run was started with" in capsys.readouterr().err


def test_config_keys_lists_every_key_with_its_default_type_and_comment_without_jax(tmp_path):
    code, jax_imported, out, _ = command("config", "keys", cwd=tmp_path)
    assert code == 0 and not jax_imported
    listed = {line.split(" = ")[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert set(listed) == set(flat_keys(to_dict(ExperimentConfig())))
    assert listed["a2c.num_steps"] == "a2c.num_steps = 5  (int)"
    assert listed["agent"] == "agent = a2c  (one of a2c|acer|dqn|trpo)"
    assert listed["a2c.mlp_hidden"] == "a2c.mlp_hidden = [64, 64]  (list of int)"
    assert listed["preferences.labels_from"].startswith('preferences.labels_from = ""  (str)')
    # The field's comments follow its line, indented.
    lines = out.splitlines()
    after = lines[lines.index(listed["a2c.num_steps"]) + 1]
    assert after.startswith("    ") and "steps per environment between updates" in after


def test_config_keys_takes_nothing_else(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["config", "keys", "seed=1"])
    assert refused.value.code == 2 and "unrecognized arguments: seed=1" in capsys.readouterr().err


def test_every_argument_of_every_command_has_its_help():
    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(make_parser(), "rlhf-jax")
    assert not missing, missing


def test_the_config_is_read_without_jax():
    script = "import sys, rlhf_jax.config, rlhf_jax.reward; rlhf_jax.reward.RewardModelConfig; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`rlhf-jax config keys | head`: the pipe closes before the keys are written."""
    child = subprocess.Popen([sys.executable, "-m", "rlhf_jax.cli", "config", "keys"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    child.stdout.close()  # the reader is gone before the first line
    err = child.stderr.read()
    assert child.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
