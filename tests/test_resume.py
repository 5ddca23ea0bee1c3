"""Runs that survive: a run killed with SIGKILL at any moment and resumed ends exactly like one
never interrupted (DQN with its replay memory; the preference and IBT loops with their reward
models, labels, segments and keys), also a run saved by the clock alone; a kill in the middle of a
checkpoint's write leaves the one before it restorable; Ctrl-C and SIGTERM save the newest state
and exit cleanly; a damaged checkpoint is passed over for the newest intact one, which rotation
keeps; an edited learning rate is applied on resume and other edits are refused; a full disk
(a real one), a diverged loss and a config edited to other shapes each stop with a message that
says what is intact and how to go on."""
import errno
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from compiling import ROOT, child_environment
from rlhf_jax.checkpoints import DAMAGED_SUFFIX, TMP_SUFFIX, Checkpoints, config_changes, os_error
from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, RunConfig, load_config
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.reward.kinds import PREFERENCES
from rlhf_jax.driver import Driver
from rlhf_jax.run_control import SaveSchedule, check_finite
from rlhf_jax.run_dir import load_run_config
from rlhf_jax.trainer import train
from small_runs import SMALL_LEARNERS, SMALL_RUN


# DQN on CartPole with the true reward, tiny: 8 chunks of 200 env steps, each checkpointed.
DQN = [
    str(ROOT / "configs" / "dqn_cartpole.yaml"),
    "env.num_envs=4", "dqn.total_env_steps=1600", "dqn.replay_capacity=1000", "dqn.replay_start=200",
    "dqn.exploration_steps=1000", "dqn.batch_size=32", "dqn.target_update_period=50", "dqn.mlp_hidden=[32,32]",
    "run.chunk_env_steps=200", "run.checkpoint_every_updates=1", "run.tensorboard=false",
]
# The small learned-reward runs of tests/small_runs.py (A2C on CartPole from 40 preferences or
# 40 IBT-marked episodes; 5 chunks of 1024 env steps, then 512), each chunk checkpointed: the
# programs they compile are the loop's tests' own, so one file's compile serves the other.
LEARNED = {learner: [*SMALL_RUN, *words, "run.checkpoint_every_updates=1", "run.tensorboard=false"]
           for learner, words in SMALL_LEARNERS.items()}


# A real SIGKILL at a known moment: the process kills itself as soon as checkpoint {after} is
# complete (a watcher polling from here missed that moment while this process compiled).
KILL_AFTER_CHECKPOINT = """
import os, signal, sys
from rlhf_jax import checkpoints
save = checkpoints.Checkpoints.save
def save_and_die(self, chunk, state, *notes):
    save(self, chunk, state, *notes)
    if chunk >= {after}:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoints.Checkpoints.save = save_and_die
from rlhf_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""

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
    driver = Driver(load_run_config(run_dirs[0]))
    return [driver.restore_latest(run_dir) for run_dir in run_dirs]


def final_state(run_dir):
    return final_states(run_dir)[0]


def saved_chunks(run_dir) -> list[int]:
    """The complete checkpoints: orbax gives one its bare number once it is whole."""
    folder = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def start_training(argv, run_dir: Path, script: str | None = None) -> tuple[subprocess.Popen, Path]:
    """``rlhf-jax train ARGV run.dir=RUN_DIR`` in a process of its own (run by ``script``, if
    given, as ``python -c``); returns it and its log (stdout and stderr)."""
    command = ["-c", script] if script else ["-m", "rlhf_jax.cli"]
    log_path = run_dir.parent / f"{run_dir.name}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, *command, "train", *argv, f"run.dir={run_dir}"],
                                   cwd=ROOT, env=child_environment(), stdout=log, stderr=subprocess.STDOUT)
    return process, log_path


def run_and_kill(argv, run_dir: Path, after_chunk: int, script: str | None = None):
    """Run ``rlhf-jax train ARGV`` in a process of its own, which SIGKILLs itself once
    checkpoint ``after_chunk`` is complete (or is killed by ``script``). Returns the newest
    complete checkpoint left."""
    process, log_path = start_training(argv, run_dir, script or KILL_AFTER_CHECKPOINT.format(after=after_chunk))
    returncode = process.wait(timeout=300)
    assert returncode == -signal.SIGKILL, f"the run was not killed (exit {returncode}):\n{log_path.read_text()[-3000:]}"
    return max(saved_chunks(run_dir), default=-1)


def assert_same_trees(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def dqn_whole(tmp_path_factory):
    return train(config_of([*DQN, f"run.dir={tmp_path_factory.mktemp('dqn') / 'whole'}"]), progress=False)


@pytest.mark.slow
def test_dqn_killed_and_resumed_ends_like_an_uninterrupted_run(dqn_whole, tmp_path):
    run_dir = tmp_path / "killed"
    last = run_and_kill(DQN, run_dir, after_chunk=0)
    assert 0 <= last < 7, "the run ended before it was killed"
    assert main(["train", "--resume", str(run_dir)]) == 0
    (chunk, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert chunk == 7 and int(resumed.env_steps) == int(whole.env_steps) == 1600
    # The whole runner: parameters, target network, optimiser, replay memory, environments, key.
    assert_same_trees(resumed, whole)
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + 8  # no row lost or repeated


@pytest.mark.slow
def test_a_kill_while_a_checkpoint_is_written_leaves_the_one_before(dqn_whole, tmp_path):
    run_dir = tmp_path / "killed"
    assert run_and_kill(DQN, run_dir, after_chunk=2, script=DIE_WRITING_CHECKPOINT_2) == 1
    unfinished = list((run_dir / "checkpoints").glob(f"2{TMP_SUFFIX}*"))
    assert unfinished and any(p.is_file() for p in unfinished[0].rglob("*")), "no half-written checkpoint 2"
    chunk, _ = final_state(run_dir)
    assert chunk == 1
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert not list((run_dir / "checkpoints").glob(f"*{TMP_SUFFIX}*"))  # saving chunk 2 again replaced it
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


@pytest.mark.slow
@pytest.mark.parametrize("learner, labels", [("preferences", "labels"), ("ibt", "annotated")])
def test_a_learned_reward_run_killed_and_resumed_keeps_every_label(learner, labels, tmp_path):
    argv = LEARNED[learner]
    # The uninterrupted run first: the killed one then loads its compiled programs from the cache.
    whole = train(config_of([*argv, f"run.dir={tmp_path / 'whole'}"]), progress=False)
    run_dir = tmp_path / "killed"
    last = run_and_kill(argv, run_dir, after_chunk=1)
    assert 1 <= last < 5, "the run ended before it was killed"
    # Whatever the kill left, a checkpoint that never finished is passed over.
    junk = run_dir / "checkpoints" / f"{last + 1}{TMP_SUFFIX}"
    junk.mkdir(exist_ok=True)
    (junk / "half_written").write_bytes(b"\0" * 100)
    assert Checkpoints(run_dir).latest() == last
    assert main(["train", "--resume", str(run_dir)]) == 0

    (chunk_a, a), (chunk_b, b) = final_states(whole, run_dir)
    assert chunk_a == chunk_b == 5 and int(getattr(a.learner, labels).ring.size) == int(getattr(b.learner, labels).ring.size) > 10
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

    def killed_while_saving(self, chunk, state, *notes):
        if chunk == killed_at_save:
            raise Killed
        save(self, chunk, state, *notes)

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


@pytest.mark.parametrize("cut", ["400.0,3.0,", "400.0,3.0,2", "400.0,3"])
def test_a_metrics_row_cut_anywhere_is_dropped_not_read(cut, tmp_path):
    """A kill while a row is appended can stop it at a comma (every field there, the last one
    empty) or inside a number (every field there, the last one short): both are dropped, as a
    row with fields missing is, and the resume's truncation leaves whole lines only."""
    from rlhf_jax.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, tensorboard=False)
    log.append({"env_steps": 200.0, "episodes": 1.0, "loss": 0.5})
    with log.path.open("a") as f:
        f.write(cut)
    assert log.rows() == [{"env_steps": 200.0, "episodes": 1.0, "loss": 0.5}]
    log.truncate_after(400)
    assert log.path.read_text().splitlines() == ["env_steps,episodes,loss", "200.0,1.0,0.5"]


# The disk fills up right after checkpoint 0: 32 KiB stay free, room for metrics rows but not
# for checkpoint 1.
FILL_DISK_AFTER_CHECKPOINT_0 = """
import sys
from rlhf_jax import checkpoints
save = checkpoints.Checkpoints.save
def save_then_fill(self, chunk, state, *notes):
    save(self, chunk, state, *notes)
    if chunk == 0:
        with open(self.run_dir.parent / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(bytes(1 << 16))
            except OSError:
                filler.truncate(filler.tell() - (32 << 10))
checkpoints.Checkpoints.save = save_then_fill
from rlhf_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(dqn_whole, small_disks):
    """A real 4 MiB filesystem fills up after checkpoint 0: checkpoint 1 fails, and all the user
    reads is one line (orbax and asyncio used to print 26 tracebacks before it)."""
    disk = small_disks.mount("size=4m")
    run_dir = disk / "run"
    process, log = start_training(DQN, run_dir, FILL_DISK_AFTER_CHECKPOINT_0)
    assert process.wait(timeout=300) == 1, log.read_text()[-3000:]
    output = [line for line in log.read_text().replace("\r", "\n").splitlines()
              if line.strip() and "step/s" not in line
              and not line.startswith(("run directory", "compiling the first chunk", "compiled and ran the first chunk"))]
    assert len(output) == 1, "\n".join(output[:40])
    message = output[0]
    assert message.startswith(f"rlhf-jax train: stopped: cannot write checkpoint 1 in {run_dir / 'checkpoints'}")
    assert "No space left on device: the disk is full" in message
    assert f"The last checkpoint, 0 ({run_dir / 'checkpoints' / '0'}), is intact" in message
    assert f"free some space, then resume from it with  rlhf-jax train --resume {run_dir}" in message
    assert saved_chunks(run_dir) == [0] and not list((run_dir / "checkpoints").glob(f"*{TMP_SUFFIX}*"))
    assert final_state(run_dir)[0] == 0
    (disk / "filler").unlink()
    assert main(["train", "--resume", str(run_dir)]) == 0  # once there is space again
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


def test_a_diverged_loss_stops_before_its_state_is_saved(tmp_path, monkeypatch, capsys):
    run_chunk = Driver.run_chunk

    def inf_in_chunk_3(self, state, chunk):
        state, metrics, learned = run_chunk(self, state, chunk)
        if chunk == 3:
            metrics["loss"] = metrics["loss"].at[-1].set(np.inf)
        return state, metrics, learned

    monkeypatch.setattr(Driver, "run_chunk", inf_in_chunk_3)
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
    unmeasured = PREFERENCES.unmeasured  # which NaNs the preference learner's metrics call "nothing to measure"
    check_finite(good, 0, unmeasured(good))  # no episode ended, no label yet, none held out: nothing diverged
    row = {**good, "labels": 12.0, "reward_train_loss": 0.6}
    check_finite(row, 1, unmeasured(row))
    for name, value, labels in [("loss", math.nan, 0.0), ("value_loss", -math.inf, 0.0),
                                ("reward_train_loss", math.nan, 12.0), ("reward_val_loss", math.inf, 12.0)]:
        with pytest.raises(RunError, match=f"{name} is {value} in chunk 4"):
            row = {**good, "labels": labels, "reward_train_loss": 0.6, name: value}
            check_finite(row, 4, unmeasured(row))


def test_a_run_that_fits_nothing_is_not_taken_for_a_diverged_one(tmp_path):
    """``preferences.fit_pairs_per_env_step=0`` (the reward model as it starts, or as
    ``reward_model.init_from`` gives it) fits no step, so every chunk's fitting loss is NaN: that
    stopped the run after its first chunk as "training diverged"."""
    from tests.small_runs import SMALL_LEARNERS, SMALL_RUN

    learner = [*SMALL_LEARNERS["preferences"], "preferences.fit_pairs_per_env_step=0"]
    run_dir = tmp_path / "unfitted"
    assert main(["train", *SMALL_RUN, *learner, f"run.dir={run_dir}", "run.tensorboard=false"]) == 0
    assert saved_chunks(run_dir)[-1] == 5  # all six chunks


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


# ------------------------------------------------------------------ saved by the clock
def test_checkpoints_come_every_few_updates_every_few_minutes_and_at_the_end():
    now = [0.0]
    run = RunConfig(checkpoint_every_updates=400, checkpoint_every_minutes=2.0)
    schedule = SaveSchedule(run, chunk_iterations=200, num_chunks=20, clock=lambda: now[0])
    assert [chunk for chunk in range(20) if schedule.due(chunk)] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    run = RunConfig(checkpoint_every_updates=10_000, checkpoint_every_minutes=2.0)
    schedule = SaveSchedule(run, chunk_iterations=200, num_chunks=20, clock=lambda: now[0])
    assert not schedule.due(0)
    now[0] = 119.0
    assert not schedule.due(5)
    now[0] = 120.0
    assert schedule.due(6)
    now[0] = 130.0  # a save that took 10 s: the next timed one waits 19 x 10 s, saving 5% of the time
    schedule.saved(started=120.0)
    now[0] = 130.0 + 189.0
    assert not schedule.due(8) and schedule.due(19)  # the end is always saved
    now[0] = 130.0 + 190.0
    assert schedule.due(9)
    # The built-in default run (4,000 updates, 10,000 between checkpoints) is saved by the clock.
    default = load_config(ExperimentConfig, None, [], default=DEFAULT_EXPERIMENT).run
    assert 0 < default.checkpoint_every_minutes <= 5
    never = SaveSchedule(RunConfig(checkpoint_every_minutes=0), 200, 20, clock=lambda: 1e9)
    assert not never.due(0)


@pytest.mark.slow
def test_a_run_saved_by_the_clock_alone_resumes_after_sigkill(dqn_whole, tmp_path):
    """No checkpoint by updates before the end; the clock saves chunk 0, then the kill comes."""
    run_dir = tmp_path / "killed"
    by_clock = [*DQN, "run.checkpoint_every_updates=1000000", "run.checkpoint_every_minutes=0.00001"]
    assert run_and_kill(by_clock, run_dir, after_chunk=0) == 0
    assert main(["train", "--resume", str(run_dir)]) == 0
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


# ----------------------------------------------------------------- damaged checkpoints
def train_killed_in_chunk_3(run_dir: Path, monkeypatch) -> None:
    """The DQN run in ``run_dir``, killed while it runs chunk 3 (checkpoints 1 and 2 saved)."""
    run_chunk = Driver.run_chunk

    def killed_in_chunk_3(self, state, chunk):
        if chunk == 3:
            raise Killed
        return run_chunk(self, state, chunk)

    monkeypatch.setattr(Driver, "run_chunk", killed_in_chunk_3)
    with pytest.raises(Killed):
        train(config_of([*DQN, f"run.dir={run_dir}"]), progress=False)
    monkeypatch.setattr(Driver, "run_chunk", run_chunk)


def damage(checkpoint: Path, how: str) -> None:
    """Flip one byte of the checkpoint's largest data file that changes what orbax reads back,
    cut that file short, or swap in the arrays of the checkpoint before it (files that read back
    whole but are not the ones its checksums were written for)."""
    if how == "swapped":
        earlier = checkpoint.parent / str(int(checkpoint.name) - 1)
        shutil.rmtree(checkpoint / "default")
        shutil.copytree(earlier / "default", checkpoint / "default")
        return
    data = max((p for p in (checkpoint / "default").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    content = bytearray(data.read_bytes())
    if how == "byte":
        content[telling_byte(checkpoint, data.relative_to(checkpoint))] ^= 0x10
    else:
        content = content[:len(content) // 2]
    data.write_bytes(bytes(content))


def telling_byte(checkpoint: Path, data: Path) -> int:
    """The offset nearest the middle of ``checkpoint``'s file ``data`` whose bit 0x10, flipped,
    changes the arrays orbax reads (or stops it reading them). Not every byte is read: zstd skips
    a bit of each frame's header, and the B-tree nodes orbax's per-process store wrote before
    merging them into the checkpoint's own are never read again. Tried on copies in a scratch
    folder, so that the checkpoint itself is read for the first time by the code under test."""
    scratch = Path(tempfile.mkdtemp())
    def read_back(offset):
        copy = scratch / str(offset)
        shutil.copytree(checkpoint, copy)
        if offset is not None:
            content = bytearray((copy / data).read_bytes())
            content[offset] ^= 0x10
            (copy / data).write_bytes(bytes(content))
        try:
            return [np.asarray(leaf) for leaf in jax.tree.leaves(ocp.PyTreeCheckpointer().restore(copy / "default"))]
        except Exception:
            return None
    try:
        intact = read_back(None)
        assert intact is not None, f"{checkpoint} cannot be read before it is damaged"
        middle = (checkpoint / data).stat().st_size // 2
        for offset in sorted(range(2 * middle), key=lambda offset: abs(offset - middle)):
            changed = read_back(offset)
            if changed is None or any(not np.array_equal(a, b) for a, b in zip(changed, intact)):
                return offset
        raise AssertionError(f"no byte of {checkpoint / data} changes what is read from it")
    finally:
        shutil.rmtree(scratch)


# What each damage is reported as. A flipped byte lands in a compressed stream whose layout
# follows the saved values (which differ in the last bits from one CPU to another), so it may
# break the stream or only change values: either reason is right.
DAMAGE_REASONS = {
    "swapped": ("its arrays differ from the checksums written with them",),
    "cut": ("it cannot be read",),
    "byte": ("its arrays differ from the checksums written with them", "it cannot be read"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["byte", "swapped", "cut"])
def test_a_damaged_checkpoint_is_passed_over_for_the_newest_intact_one(how, dqn_whole, tmp_path, monkeypatch):
    """Checkpoints 1 and 2 saved, 2 then damaged: the resume says so, restores 1, keeps it while
    it saves 3 to 7 (rotation never deletes the checkpoint a restore verified), and ends exactly
    like a run never interrupted. Nothing else is printed: no traceback of the arrays orbax left
    unread in the damaged one."""
    run_dir = tmp_path / "damaged"
    train_killed_in_chunk_3(run_dir, monkeypatch)
    assert saved_chunks(run_dir) == [1, 2]
    damage(run_dir / "checkpoints" / "2", how)
    # In a process of its own: what the user's terminal shows, and no other test's leftovers.
    process = subprocess.run([sys.executable, "-m", "rlhf_jax.cli", "train", "--resume", str(run_dir)],
                             cwd=ROOT, env=child_environment(), capture_output=True, text=True, timeout=300)
    out, err = process.stdout, process.stderr
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    said = f"checkpoint 2 ({run_dir.resolve() / 'checkpoints' / '2'}) is damaged: "
    assert any(said + why in out for why in DAMAGE_REASONS[how]), out
    assert "Restored checkpoint 1, the newest intact one" in out
    assert saved_chunks(run_dir) == [1, 6, 7]
    assert (run_dir / "checkpoints" / f"2{DAMAGED_SUFFIX}").is_dir()  # set aside, never restored
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


UNAWAITED_WRITE = """
import gc, sys
from rlhf_jax import checkpoints
if sys.argv[1] == "after a failed write":
    checkpoints._drop_late_reports_of_failed_writes()
async def write_fragment():
    pass
pending = write_fragment()  # an orbax write the failed save never ran
del pending
gc.collect()
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after a failed write", "otherwise"])
def test_a_write_coroutine_left_unrun_by_a_failed_save_is_not_reported(when):
    """The full-disk run's one line once came with Python's warning about an orbax write coroutine
    that never ran; after a failed write it is dropped, otherwise it still shows."""
    stderr = subprocess.run([sys.executable, "-c", UNAWAITED_WRITE, when], capture_output=True, text=True,
                            check=True).stderr
    reported = "coroutine 'write_fragment' was never awaited" in stderr
    assert reported == (when == "otherwise"), stderr


def test_a_failed_save_leaves_no_unfinished_checkpoint_though_a_writer_thread_outlives_it(tmp_path):
    """Orbax's writer threads can outlive a failed save and recreate its unfinished directory after
    the first removal (the fresh-clone suite's full-disk run once kept one): the space is still
    given back."""
    checkpoints = Checkpoints(tmp_path / "run")
    unfinished = checkpoints.directory / f"1{TMP_SUFFIX}"

    def late_writer():  # still writing 0.05 s after the save has failed
        time.sleep(0.05)
        (unfinished / "array").mkdir(parents=True, exist_ok=True)

    def failing_save(*args, **kwargs):
        unfinished.mkdir(parents=True)
        threading.Thread(target=late_writer).start()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    checkpoints._manager.save = failing_save
    with pytest.raises(RunError, match="the disk is full"):
        checkpoints.save(1, {"params": np.zeros(3, np.float32)})
    time.sleep(0.2)  # long after the writer
    assert not list(checkpoints.directory.glob(f"*{TMP_SUFFIX}*"))


THREAD_LOGS_WRITE_ERROR = """
import logging, sys, threading
from rlhf_jax import checkpoints
if sys.argv[1] == "after a failed write":
    checkpoints._drop_late_reports_of_failed_writes()
def signalling_thread():  # orbax's thread, logging the error its write raised after the save returned
    try:
        raise ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device [os_error_code='28']")
    except ValueError:
        logging.getLogger("absl").exception("_SignalingThread.run() raised an exception")
    logging.getLogger("absl").error("another error, not a write")
thread = threading.Thread(target=signalling_thread)
thread.start()
thread.join()
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after a failed write", "otherwise"])
def test_a_write_error_logged_late_by_orbaxs_thread_is_not_reported(when):
    """The full-disk run's one line once came with orbax's thread logging the same failure with its
    traceback (36 lines); after a failed write that is dropped and other errors still show."""
    stderr = subprocess.run([sys.executable, "-c", THREAD_LOGS_WRITE_ERROR, when], capture_output=True, text=True,
                            check=True).stderr
    assert ("raised an exception" in stderr) == (when == "otherwise"), stderr
    assert "another error, not a write" in stderr


def test_checkpoints_of_another_state_structure_point_at_another_version(tmp_path):
    """Every checkpoint readable as bytes but not as the state asked for (a field the state
    gained since, as TRPO's runner did): the error says another version likely wrote them."""
    checkpoints = Checkpoints(tmp_path / "run")
    for chunk in (0, 1):
        checkpoints.save(chunk, {"params": np.zeros(3, np.float32)})
    checkpoints.close()
    like = {"params": np.zeros(3, np.float32), "value_scale": np.zeros((), np.float32)}
    with pytest.raises(ConfigError, match="likely written by another version of rlhf_jax"):
        Checkpoints(tmp_path / "run").restore(like)


@pytest.mark.parametrize("how", ["deleted", "cut"])
def test_a_checkpoint_without_its_checksums_is_damaged_and_never_restored(how, tmp_path, caplog):
    """Its _CHECKPOINT_METADATA (which holds the checksums) deleted or cut short, and a data byte
    changed: it was restored, a value off by 6.4e17, with only absl's warnings. Now it is passed
    over in one line, like any damaged checkpoint, and the one before it restored."""
    checkpoints = Checkpoints(tmp_path / "run")
    for chunk in (0, 1):
        checkpoints.save(chunk, {"w": np.full(1000, chunk + 1.0, np.float32)})
    checkpoints.close()
    # Only the restore must stay silent: a slow save under load may log orbax's wait, which is true.
    caplog.clear()
    metadata = checkpoints.directory / "1" / "_CHECKPOINT_METADATA"
    if how == "deleted":
        metadata.unlink()
    else:
        metadata.write_bytes(metadata.read_bytes()[:100])
    said = []
    chunk, state = Checkpoints(tmp_path / "run", say=lambda line, **_: said.append(line)).restore({"w": np.zeros(1000, np.float32)})
    assert chunk == 0 and (state["w"] == 1.0).all()
    assert len(said) == 1 and "checkpoint 1" in said[0] and "is damaged: its checksums are missing" in said[0]
    assert "Restored checkpoint 0" in said[0]
    assert not [r for r in caplog.records if r.name == "absl"]  # orbax's warnings would say it again, less clearly
    # The only checkpoint: nothing to restore.
    shutil.rmtree(checkpoints.directory / "0")
    with pytest.raises(ConfigError, match="no checkpoint in .* is intact: 1 is damaged: its checksums are missing"):
        Checkpoints(tmp_path / "run").restore({"w": np.zeros(1000, np.float32)})


def test_a_run_whose_every_checkpoint_is_damaged_says_so(dqn_whole, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(dqn_whole, run_dir)
    for chunk in (6, 7):
        damage(run_dir / "checkpoints" / str(chunk), "byte")
    assert main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    # Either reason a flipped byte can give (DAMAGE_REASONS): where it lands follows the saved values.
    intact = f"no checkpoint in {run_dir.resolve() / 'checkpoints'} is intact: "
    assert any(f"{intact}7 is damaged: {why}" in err for why in DAMAGE_REASONS["byte"]), err
    assert any(f"; 6 is damaged: {why}" in err for why in DAMAGE_REASONS["byte"]), err
    assert "Traceback" not in err


# ----------------------------------------------------------------- an edited config
@pytest.mark.slow
def test_an_edited_learning_rate_is_applied_on_resume_and_other_edits_are_refused(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "edited"
    train_killed_in_chunk_3(run_dir, monkeypatch)
    config_file = run_dir / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["dqn"]["gamma"] = 0.9  # compiled into the loss: a resume cannot apply it
    config["dqn"]["learning_rate"] = 0.0005
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir.resolve() / 'config.yaml'} was changed since checkpoint 2 was written, in keys a resume " \
           "cannot apply (they are compiled into the run or shape its state): dqn.gamma: 0.99 when saved, 0.9 now. " \
           "Put those values back to resume, or start a new run with them. Nothing was overwritten" in err
    assert "dqn.learning_rate" not in err and "Traceback" not in err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()} == before

    config["dqn"]["gamma"] = 0.99
    config["run"]["checkpoint_every_updates"] = 2  # how the run is saved: free to change
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert "dqn.learning_rate: 0.001 when saved, 0.0005 now: the resumed run uses 0.0005" in capsys.readouterr().out
    _, state = final_state(run_dir)
    rates = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
             if "hyperparams" in jax.tree_util.keystr(path)]
    assert rates == [np.float32(0.0005)]


# ------------------------------------------------------------------- Ctrl-C and SIGTERM
# The run signals itself once its first chunk's row is written, so no timing between two
# processes decides whether chunks are left when the signal lands. It first sets how it takes
# Ctrl-C ({sigint_at_start}), as a terminal's foreground job (SIG_DFL) or a script's background
# job (SIG_IGN) would: a suite started with & by a non-interactive shell hands its children
# SIGINT ignored, so the tests say which they mean.
SIGNAL_AFTER_FIRST_ROW = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.{sigint_at_start})
from rlhf_jax import metrics_log
append = metrics_log.MetricsLog.append
def append_then_signal(self, row):
    append(self, row)
    if not getattr(append_then_signal, "sent", False):
        append_then_signal.sent = True
        os.kill(os.getpid(), {number})
metrics_log.MetricsLog.append = append_then_signal
from rlhf_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""
# A DQN run that saves only at its end, so the one checkpoint a stop leaves is the stop's.
DQN_SAVED_AT_END = [*DQN, "run.checkpoint_every_updates=1000000", "run.checkpoint_every_minutes=0"]


@pytest.mark.parametrize("number, name", [(signal.SIGINT, "Ctrl-C (SIGINT)"), (signal.SIGTERM, "SIGTERM")],
                         ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
def test_ctrl_c_and_sigterm_save_the_newest_state_and_exit_cleanly(number, name, dqn_whole, tmp_path):
    """A real signal to a real run that saves only at its end, sent once its first chunk is
    done: it stops after the chunk in flight, saves it, says so and exits with 128 + the
    signal's number; resumed, it ends exactly like a run never interrupted."""
    run_dir = tmp_path / "stopped"
    process, log = start_training(DQN_SAVED_AT_END, run_dir,
                                  SIGNAL_AFTER_FIRST_ROW.format(number=int(number), sigint_at_start="SIG_DFL"))
    assert process.wait(timeout=120) == 128 + number, log.read_text()[-3000:]
    text = log.read_text()
    (chunk,) = saved_chunks(run_dir)
    assert 0 <= chunk < 7, "the run ended before the signal came"
    assert f"rlhf-jax train: stopped: interrupted by {name} after {chunk + 1} of its 8 chunks. The last " \
           f"checkpoint, {chunk} ({run_dir.resolve() / 'checkpoints' / str(chunk)}), is intact" in text
    assert "Traceback" not in text
    assert main(["train", "--resume", str(run_dir)]) == 0
    (_, resumed), (_, whole) = final_states(run_dir, dqn_whole)
    assert_same_trees(resumed, whole)


@pytest.mark.slow
def test_a_run_started_ignoring_ctrl_c_keeps_ignoring_it(tmp_path):
    """A background job of a script starts with SIGINT ignored; as nohup expects, the run does
    not take it up: a Ctrl-C after its first chunk changes nothing, and it runs to its end."""
    run_dir = tmp_path / "background"
    process, log = start_training(DQN_SAVED_AT_END, run_dir,
                                  SIGNAL_AFTER_FIRST_ROW.format(number=int(signal.SIGINT), sigint_at_start="SIG_IGN"))
    assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    assert saved_chunks(run_dir) == [7]
    assert "Ctrl-C" not in log.read_text()
