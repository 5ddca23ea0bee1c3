"""`rlhf-jax train` and `eval`: run directories, checkpoints, resume after SIGKILL, user errors,
run directories that cannot be written (a real full or read-only filesystem)."""
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from compiling import child_environment
from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.cli import main
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.errors import ConfigError
from rlhf_jax.driver import Driver
from rlhf_jax.run_dir import load_run_config

# The A2C CartPole example on the true reward, made small.
SMALL = [
    str(Path(__file__).resolve().parent.parent / "configs" / "a2c_cartpole.yaml"),
    "env.num_envs=8", "a2c.total_env_steps=40960", "a2c.num_steps=8", "a2c.learning_rate=0.003",
    "run.chunk_env_steps=1024", "run.checkpoint_every_updates=16", "run.tensorboard=false",
]


def experiment(overrides):
    return load_config(ExperimentConfig, SMALL[0], overrides)


def final_params(run_dir):
    _, runner = Driver(load_run_config(run_dir)).restore_latest(run_dir)
    return runner


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "whole"
    assert main(["train", *SMALL, f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.slow
def test_a_run_directory_has_everything(finished_run):
    files = {p.name for p in finished_run.iterdir()}
    assert {"config.yaml", "metrics.csv", "checkpoints", "learning_curve.png"} <= files
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert config["a2c"]["total_env_steps"] == 40960 and config["env"]["num_envs"] == 8
    rows = (finished_run / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("env_steps,episodes,episode_return")
    assert len(rows) == 1 + 40960 // 1024
    assert (finished_run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_scores_the_saved_policy(finished_run, capsys):
    assert main(["eval", str(finished_run), "--episodes", "8"]) == 0
    result = json.loads((finished_run / "eval.json").read_text())
    assert result["episodes"] == 8 and result["env_steps"] == 40960
    assert result["mean_true_return"] > 60  # random play scores about 22; this run scores about 100


def test_eval_shows_its_score_before_writing_and_a_failed_write_says_so(finished_run, small_disks, capsys):
    """On a read-only run directory the score was computed, then lost in a traceback from
    writing eval.json."""
    disk = small_disks.mount("size=16m")
    shutil.copytree(finished_run, disk / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    assert main(["eval", str(disk / "run"), "--episodes", "8"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["episodes"] == 8  # the score, shown first
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"rlhf-jax eval: stopped: cannot write to {disk / 'run'}: [Errno 30] Read-only file system")
    assert "the score above is not saved" in err


@pytest.mark.slow
def test_resume_after_sigkill_ends_with_the_same_parameters(finished_run, tmp_path):
    run_dir = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhf_jax.cli", "train", *SMALL, f"run.dir={run_dir}"],
        env=child_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    # Kill it once it has saved at least two checkpoints, well before the end.
    while time.time() < deadline:
        saved = [p for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()] if (run_dir / "checkpoints").exists() else []
        if len(saved) >= 2 or process.poll() is not None:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    latest = Checkpoints(run_dir).latest()
    assert latest is not None and latest < 40960 // 1024 - 1, "the run ended before it could be killed"

    assert main(["train", "--resume", str(run_dir)]) == 0
    resumed, whole = final_params(run_dir), final_params(finished_run)
    assert int(resumed.env_steps) == int(whole.env_steps) == 40960
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(a, b)
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 40960 // 1024  # no row lost or repeated


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "a2c.gama=0.9"], "unknown key 'a2c.gama'"),
        (["train", "missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["eval", "no/such/run"], "run directory 'no/such/run' does not exist"),
        (["train", "--resume", "no/such/run"], "does not exist"),
    ],
)
def test_user_errors_end_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_corrupt_checkpoint_is_reported(finished_run, tmp_path, capsys):
    broken = tmp_path / "broken"
    (broken / "checkpoints" / "7").mkdir(parents=True)
    (broken / "config.yaml").write_text((finished_run / "config.yaml").read_text())
    (broken / "checkpoints" / "7" / "junk").write_text("not a checkpoint")
    assert main(["eval", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "is intact: 7 is damaged: its checksums are missing" in err and "Traceback" not in err


def test_resuming_a_finished_run_says_so_and_writes_nothing(finished_run, tmp_path, capsys):
    """It ran no chunk, drew the curve again and logged a row with env_steps=0 to W&B."""
    copy = tmp_path / "copy"
    shutil.copytree(finished_run, copy)
    before = {path: path.stat().st_mtime_ns for path in copy.rglob("*")}
    assert main(["train", "--resume", str(copy)]) == 0
    out = capsys.readouterr().out
    assert f"{copy} is finished: all 40 chunks (40960 env steps) were run; nothing to resume" in out, out
    assert {path: path.stat().st_mtime_ns for path in copy.rglob("*")} == before


def test_an_existing_run_is_not_overwritten(finished_run, capsys):
    assert main(["train", *SMALL, f"run.dir={finished_run}"]) == 2
    assert "already holds a run" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("agent", [
    ["a2c.total_env_steps=320"],
    # ACER's drawn count of updates: read first and run written out from Python, a loop in the scan.
    ["agent=acer", "acer.total_env_steps=640", "acer.num_steps=8", "acer.replay_start=64",
      "acer.replay_capacity=640", "acer.replay_ratio=2"],
])
def test_python_loop_runs_the_same_iterations_as_the_scan(agent):
    # run.loop=python exists for CNNs on the CPU (jax-ml/jax#12868); it must change speed only.
    small = ["env.num_envs=4", *agent, "run.chunk_env_steps=160"]
    results = {}
    for loop in ("scan", "python"):
        driver = Driver(experiment([*small, f"run.loop={loop}"]))
        assert driver.compiled.dispatch == loop
        runner = driver.init(jax.random.PRNGKey(0))
        for chunk in range(driver.num_chunks):
            runner, metrics, _ = driver.run_chunk(runner, chunk)
        results[loop] = (runner.params, metrics["loss"])
    assert results["python"][1].shape == results["scan"][1].shape == (160 // (4 * 8),)  # a chunk of iterations of 4 envs x 8 steps
    for a, b in zip(jax.tree.leaves(results["scan"]), jax.tree.leaves(results["python"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides, life_episodes", [
    (["agent=dqn"], True),
    (["agent=dqn", "dqn.life_loss_ends_episode=false"], False),
    (["agent=dqn", "env.hide_episode_end=true"], False),
    (["agent=a2c"], False),
])
def test_dqn_on_atari_ends_episodes_at_life_loss_on_the_true_reward(overrides, life_episodes):
    from rlhf_jax.driver import true_reward_env_config

    config = experiment(["env.id=envpool/Breakout-v5", *overrides])
    assert true_reward_env_config(config).episodic_life is life_episodes
    assert true_reward_env_config(experiment(["agent=dqn"])).episodic_life is False


@pytest.mark.parametrize("where", ["/proc", "read-only disk", "full disk"])
def test_a_run_that_cannot_write_its_directory_stops_in_one_line_leaving_nothing(where, small_disks, capsys):
    if where == "/proc":
        run_dir, reason = Path("/proc/x"), "[Errno 2] No such file or directory"
    elif where == "read-only disk":
        run_dir, reason = small_disks.mount("ro,size=1m") / "run", "[Errno 30] Read-only file system"
    else:
        disk = small_disks.mount("size=1m")
        small_disks.fill(disk)
        run_dir, reason = disk / "run", "[Errno 28] No space left on device: the disk is full"
    assert main(["train", *SMALL, f"run.dir={run_dir}"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines[:20]
    assert lines[0].startswith(f"rlhf-jax train: stopped: cannot start a run in {run_dir}: {reason}")
    assert lines[0].endswith("choose another run.dir, and start it again")
    assert not run_dir.exists()  # no half-written config.yaml for a resume to mistake for a run
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_run_config_that_cannot_be_read_is_an_error_never_the_defaults(finished_run, tmp_path, capsys):
    run_dir = tmp_path / "empty"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "config.yaml").write_text("")  # what a full disk left before config.yaml was written whole
    with pytest.raises(ConfigError, match="empty"):
        load_run_config(run_dir)
    assert main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert str(run_dir / "config.yaml") in err and "empty" in err
