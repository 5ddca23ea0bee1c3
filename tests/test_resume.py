"""Runs that survive: a run killed with SIGKILL at any moment and resumed ends exactly like one
never interrupted (DQN with its replay memory; the preference and IBT loops with their reward
models, labels, segments and keys); a kill in the middle of a checkpoint's write leaves the one before it
restorable; a full disk, a diverged loss and a config edited before a resume each stop with
a message that says what is intact and how to go on."""
import errno
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from rlhf_jax.checkpoints import TMP_SUFFIX, Checkpoints, config_changes, os_error
from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, load_config
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.reward.preference_learner import PreferenceLearner
from rlhf_jax.trainer import Training, check_finite, load_run_config, make_training, restore_latest, train

ROOT = Path(__file__).resolve().parent.parent

# DQN on CartPole with the true reward, tiny: 8 chunks of 200 env steps, each checkpointed.
DQN = [
    str(ROOT / "configs" / "dqn_cartpole.yaml"),
    "env.num_envs=4", "dqn.total_env_steps=1600", "dqn.replay_capacity=1000", "dqn.replay_start=200",
    "dqn.exploration_steps=1000", "dqn.batch_size=32", "dqn.target_update_period=50", "dqn.mlp_hidden=[32,32]",
    "run.chunk_env_steps=200", "run.checkpoint_every_updates=1", "run.tensorboard=false",
]
# A2C on CartPole from 40 synthetic preferences (the built-in default experiment), tiny:
# 8 chunks of 512 env steps, each checkpointed.
PREFERENCES = [
    "env.num_envs=32", "a2c.total_env_steps=4096", "a2c.mlp_hidden=[32,32]", "preferences.labels=40",
    "preferences.segment_capacity=64", "preferences.fit_pairs_per_env_step=0.01",
    "run.chunk_env_steps=512", "run.checkpoint_every_updates=1", "run.tensorboard=false",
]
# A2C on CartPole from IBT marks on 40 annotated episodes, tiny: 8 chunks of 512 env steps.
IBT = [
    str(ROOT / "configs" / "ibt_cartpole.yaml"), "a2c.total_env_steps=4096", "a2c.mlp_hidden=[32,32]",
    "ibt.episodes=40", "ibt.episode_capacity=64", "ibt.batch_episodes=8", "ibt.hidden=[32,32]",
    "run.chunk_env_steps=512", "run.checkpoint_every_updates=1", "run.tensorboard=false",
]

# Subprocesses share the compiled programs of this one (tests/conftest.py's cache).
SUBPROCESS_ENV = dict(
    os.environ, PYTHONPATH=str(ROOT),
    JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="1.0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
)

# For the kill during a write: os.rename is the last thing orbax does to a checkpoint (its
# folder `2.orbax-checkpoint-tmp` becomes `2`); die at the first rename inside checkpoint 2.
DIE_WRITING_CHECKPOINT_2 = f"""
import os, signal, sys
rename = os.rename
def rename_or_die(src, dst, *args, **kwargs):
    if "{os.sep}2{TMP_SUFFIX}" in os.fspath(src):
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(src, dst, *args, **kwargs)
os.rename = rename_or_die
from rlhf_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def config_of(argv) -> ExperimentConfig:
    """The config ``rlhf-jax train ARGV`` runs."""
    if argv[0].endswith(".yaml"):
        return load_config(ExperimentConfig, argv[0], argv[1:])
    return load_config(ExperimentConfig, None, argv, default=DEFAULT_EXPERIMENT)


def final_states(*run_dirs):
    """(chunk, state) of each run's newest checkpoint; the runs share one config but their dir."""
    training = make_training(load_run_config(run_dirs[0]))
    return [restore_latest(training, run_dir) for run_dir in run_dirs]


def final_state(run_dir):
    return final_states(run_dir)[0]


def saved_chunks(run_dir) -> list[int]:
    """The complete checkpoints: orbax gives one its bare number once it is whole."""
    folder = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def run_and_kill(argv, run_dir: Path, after_chunk: int, script: str | None = None, meanwhile=None):
    """Start ``rlhf-jax train ARGV`` in a process of its own and SIGKILL it once checkpoint
    ``after_chunk`` is complete (or let ``script`` kill it). ``meanwhile()`` runs here in the
    mean time, on the other core. Returns the newest complete checkpoint left and what
    ``meanwhile`` returned."""
    command = ["-c", script] if script else ["-m", "rlhf_jax.cli"]
    log_path = run_dir.parent / f"{run_dir.name}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, *command, "train", *argv, f"run.dir={run_dir}"],
                                   cwd=ROOT, env=SUBPROCESS_ENV, stdout=log, stderr=subprocess.STDOUT)

    def kill_once_saved():
        deadline = time.monotonic() + 150
        while process.poll() is None and time.monotonic() < deadline:
            if max(saved_chunks(run_dir), default=-1) >= after_chunk:
                process.send_signal(signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once_saved, daemon=True)
    if not script:
        killer.start()
    result = meanwhile() if meanwhile else None
    returncode = process.wait(timeout=150)
    assert returncode == -signal.SIGKILL, f"the run was not killed (exit {returncode}):\n{log_path.read_text()[-3000:]}"
    return max(saved_chunks(run_dir), default=-1), result


def assert_same_trees(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def dqn_whole(tmp_path_factory):
    return train(config_of([*DQN, f"run.dir={tmp_path_factory.mktemp('dqn') / 'whole'}"]), progress=False)


def test_dqn_killed_and_resumed_ends_like_an_uninterrupted_run(dqn_whole, tmp_path):
    run_dir = tmp_path / "killed"
    last, _ = run_and_kill(DQN, run_dir, after_chunk=0)
    assert 0 <= last < 7, "the run ended before it was killed"
    assert main(["train", "--resume", str(run_dir)]) == 0
    (chunk, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert chunk == 7 and int(resumed.env_steps) == int(whole.env_steps) == 1600
    # The whole runner: parameters, target network, optimiser, replay memory, environments, key.
    assert_same_trees(resumed, whole)
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + 8  # no row lost or repeated


def test_a_kill_while_a_checkpoint_is_written_leaves_the_one_before(dqn_whole, tmp_path):
    run_dir = tmp_path / "killed"
    assert run_and_kill(DQN, run_dir, after_chunk=2, script=DIE_WRITING_CHECKPOINT_2)[0] == 1
    unfinished = list((run_dir / "checkpoints").glob(f"2{TMP_SUFFIX}*"))
    assert unfinished and any(p.is_file() for p in unfinished[0].rglob("*")), "no half-written checkpoint 2"
    chunk, _ = final_state(run_dir)
    assert chunk == 1
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert not list((run_dir / "checkpoints").glob(f"*{TMP_SUFFIX}*"))  # saving chunk 2 again replaced it
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


@pytest.mark.parametrize("argv, labels", [(PREFERENCES, "labels"), (IBT, "annotated")], ids=["preferences", "ibt"])
def test_a_learned_reward_run_killed_and_resumed_keeps_every_label(argv, labels, tmp_path):
    run_dir = tmp_path / "killed"
    uninterrupted = lambda: train(config_of([*argv, f"run.dir={tmp_path / 'whole'}"]), progress=False)
    last, whole = run_and_kill(argv, run_dir, after_chunk=1, meanwhile=uninterrupted)
    assert 1 <= last < 7, "the run ended before it was killed"
    # Whatever the kill left, a checkpoint that never finished is passed over.
    junk = run_dir / "checkpoints" / f"{last + 1}{TMP_SUFFIX}"
    junk.mkdir(exist_ok=True)
    (junk / "half_written").write_bytes(b"\0" * 100)
    assert Checkpoints(run_dir).latest() == last
    assert main(["train", "--resume", str(run_dir)]) == 0

    (chunk_a, a), (chunk_b, b) = final_states(whole, run_dir)
    assert chunk_a == chunk_b == 7 and int(getattr(a.learner, labels).count) == int(getattr(b.learner, labels).count) > 10
    # Agent, reward model, labels (marked episodes), clip buffers, recent steps, keys: all of it.
    assert_same_trees(a, b)
    labels_a, labels_b = np.load(whole / "labels.npz"), np.load(run_dir / "labels.npz")
    assert sorted(labels_a.files) == sorted(labels_b.files)
    for name in labels_a.files:  # no label lost or asked twice
        np.testing.assert_array_equal(labels_a[name], labels_b[name])


class Killed(BaseException):
    """Stands for SIGKILL in-process: nothing after it runs but ``finally`` clauses."""


@pytest.mark.parametrize("killed_at_save", [0, 1])
def test_a_kill_in_the_middle_of_a_metrics_row_does_not_stop_the_resume(killed_at_save, tmp_path, monkeypatch):
    """Killed while checkpoint 0 (then 1) is written, with the next row half-written: the
    resume starts from the beginning (from checkpoint 0) and logs every row once."""
    save = Checkpoints.save

    def killed_while_saving(self, chunk, state):
        if chunk == killed_at_save:
            raise Killed
        save(self, chunk, state)

    monkeypatch.setattr(Checkpoints, "save", killed_while_saving)
    run_dir = tmp_path / "killed"
    with pytest.raises(Killed):
        train(config_of([*DQN, "dqn.total_env_steps=600", f"run.dir={run_dir}"]), progress=False)
    monkeypatch.setattr(Checkpoints, "save", save)
    with (run_dir / "metrics.csv").open("a") as f:
        f.write(f"{200 * (killed_at_save + 2)}.0,3.0,2")  # a row cut short
    assert main(["train", "--resume", str(run_dir)]) == 0
    steps = [float(line.split(",")[0]) for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [200.0, 400.0, 600.0]


def test_a_full_disk_stops_the_run_and_keeps_the_last_checkpoint(dqn_whole, tmp_path, monkeypatch):
    save = ocp.CheckpointManager.save
    calls = []

    def full_on_second_save(self, *args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            (Path(self.directory) / f"{args[0]}{TMP_SUFFIX}").mkdir()  # as orbax leaves it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(self, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_on_second_save)
    run_dir = tmp_path / "full"
    with pytest.raises(RunError) as stopped:
        train(config_of([*DQN, f"run.dir={run_dir}"]), progress=False)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    message = str(stopped.value)
    assert f"cannot write checkpoint 1 in {run_dir.resolve() / 'checkpoints'}" in message
    assert "No space left on device: the disk is full" in message
    assert f"The last checkpoint, 0 ({run_dir.resolve() / 'checkpoints' / '0'}), is intact" in message
    assert f"free some space, then resume from it with  rlhf-jax train --resume {run_dir.resolve()}" in message
    assert saved_chunks(run_dir) == [0] and not list((run_dir / "checkpoints").glob(f"*{TMP_SUFFIX}*"))
    assert final_state(run_dir)[0] == 0
    assert main(["train", "--resume", str(run_dir)]) == 0  # once there is space again
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


def test_a_diverged_loss_stops_before_its_state_is_saved(tmp_path, monkeypatch, capsys):
    run_chunk = Training.run_chunk

    def inf_in_chunk_3(self, runner, chunk):
        runner, metrics = run_chunk(self, runner, chunk)
        if chunk == 3:
            metrics["loss"] = metrics["loss"].at[-1].set(np.inf)
        return runner, metrics

    monkeypatch.setattr(Training, "run_chunk", inf_in_chunk_3)
    run_dir = tmp_path / "diverged"
    assert main(["train", *DQN, f"run.dir={run_dir}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "rlhf-jax train: stopped: training diverged: loss is inf in chunk 3 (env steps up to 800), " \
           f"so its state was not saved. The last good checkpoint, 2 ({run_dir.resolve() / 'checkpoints' / '2'}), " \
           "is intact, but resumed it would diverge again the same way: start a new run with a smaller learning " \
           f"rate, say (rlhf-jax eval {run_dir.resolve()} scores the checkpoint's policy)." in err
    assert saved_chunks(run_dir) == [1, 2]


def test_check_finite_tells_divergence_from_nothing_to_measure():
    good = {"env_steps": 512.0, "episode_return": math.nan, "loss": 0.5, "labels": 0.0,
            "reward_train_loss": math.nan, "reward_val_loss": math.nan}
    unmeasured = PreferenceLearner.unmeasured  # which NaNs the preference learner calls "nothing to measure"
    check_finite(good, 0, unmeasured(good))  # no episode ended, no label yet, none held out: nothing diverged
    row = {**good, "labels": 12.0, "reward_train_loss": 0.6}
    check_finite(row, 1, unmeasured(row))
    for name, value, labels in [("loss", math.nan, 0.0), ("value_loss", -math.inf, 0.0),
                                ("reward_train_loss", math.nan, 12.0), ("reward_val_loss", math.inf, 12.0)]:
        with pytest.raises(RunError, match=f"{name} is {value} in chunk 4"):
            row = {**good, "labels": labels, "reward_train_loss": 0.6, name: value}
            check_finite(row, 4, unmeasured(row))


def test_a_config_changed_before_resume_is_named_and_nothing_is_overwritten(tmp_path, capsys):
    run_dir = tmp_path / "edited"
    train(config_of([*DQN, "dqn.total_env_steps=400", f"run.dir={run_dir}"]), progress=False)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["env"]["num_envs"] = 8
    config["dqn"]["learning_rate"] = 0.0005  # changes no shape, but is a change all the same
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}

    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {run_dir.resolve() / 'checkpoints' / '1'} cannot be restored" in err
    assert "was changed since it was written, the likely cause: dqn.learning_rate: 0.001 when saved, 0.0005 now; " \
           "env.num_envs: 4 when saved, 8 now. Put those values back to resume." in err
    assert "Nothing was overwritten: the run directory is as it was." in err and "Traceback" not in err
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_operating_system_errors_are_found_behind_orbax_and_tensorstore():
    # TensorStore, which writes the arrays, reports a full disk as a ValueError (seen with
    # RLIMIT_FSIZE, errno 27, in orbax-checkpoint 0.12.8).
    tensorstore = ValueError("OUT_OF_RANGE: Error writing local file \"x/_sharding\": Failed to write 155 bytes "
                             "to file 15: No space left on device [os_error_code='28']")
    assert os_error(tensorstore).errno == errno.ENOSPC
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError:
            raise RuntimeError("save failed")
    except RuntimeError as wrapped:
        assert os_error(wrapped).errno == errno.EDQUOT
    assert os_error(KeyError("params")) is None
    assert config_changes({"env": {"num_envs": 4}, "a": [1, 2]}, {"env": {"num_envs": 4}, "a": (1, 2)}) == []


def test_an_old_checkpoint_without_its_config_still_gets_a_hint(tmp_path):
    """Checkpoints written before configs were saved with them."""
    checkpoints = Checkpoints(tmp_path, config=None)
    checkpoints.save(0, {"w": np.zeros((4, 2), np.float32)})
    checkpoints.close()
    with pytest.raises(ConfigError, match="written by a config with other shapes"):
        Checkpoints(tmp_path, config={"env": {"num_envs": 8}}).restore({"w": np.zeros((8, 2), np.float32)})
