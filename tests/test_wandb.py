"""Weights & Biases logging (``run.wandb``), offline: what a run and a sweep write is read
back from the W&B run files on disk, record by record, and checked against metrics.csv,
members.csv and the resolved config."""
import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

import pytest

wandb_internal = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="wandb is not installed")

from rlhf_jax.cli import main  # noqa: E402
from rlhf_jax.config import ExperimentConfig, apply_overrides, build, read_yaml, to_dict  # noqa: E402
from rlhf_jax.errors import ConfigError  # noqa: E402
from rlhf_jax.feedback.store import LabelStore  # noqa: E402
from rlhf_jax.metrics_log import MetricsLog  # noqa: E402
from rlhf_jax.sweep import Sweep  # noqa: E402
from rlhf_jax.run_dir import load_run_config  # noqa: E402
from rlhf_jax.wandb_log import ID_FILE, logging_to_wandb  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "a2c_cartpole.yaml"
# A2C on CartPole, 2 chunks of 1024 env steps.
SMALL = ["env.num_envs=8", "a2c.total_env_steps=2048", "a2c.num_steps=8", "run.chunk_env_steps=1024",
         "run.tensorboard=false", "run.wandb=true"]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """W&B offline and quiet, its own files (settings, cache) in a temporary directory."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            patch.setenv(name, str(home / name.lower()))
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        patch.delenv("WANDB_API_KEY", raising=False)
        yield


# ------------------------------------------------------- reading the run files back
def read_records(path: Path) -> list:
    """The records of a ``.wandb`` file: after a 7-byte header, a LevelDB-style log (32 KiB
    blocks of chunks, each a CRC-32, a length and a type: whole, first, middle or last part)
    whose records are ``wandb_internal_pb2.Record`` protobufs."""
    data, block = path.read_bytes(), 32 * 1024
    assert data[:7] == b":W&B" + struct.pack("<HB", 0xBEE1, 0), "not a W&B run file"
    offset, pieces, records = 7, b"", []
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a chunk header is padding
            offset += block - offset % block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        payload = data[offset + 7:offset + 7 + length]
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == checksum, f"corrupt chunk at byte {offset}"
        offset += 7 + length
        pieces += payload
        if kind in (1, 4):  # whole, or the last part of one
            record = wandb_internal.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


class LoggedRun:
    """One W&B run as its file holds it."""

    def __init__(self, path: Path):
        self.path = path
        records = read_records(path)
        kinds = lambda kind: [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]
        (self.run,) = kinds("run")
        self.history = [values(h.item) for h in kinds("history")]
        # The config as the run started with it, and any update after.
        self.config = values([*self.run.config.update, *(item for c in kinds("config") for item in c.update)])
        self.summary = values(item for s in kinds("summary") for item in s.update)
        (self.exit,) = kinds("exit")

    def rows(self) -> list[dict]:
        """The logged rows of metrics (W&B's own keys, ``_step`` and the like, left out)."""
        return [{k: v for k, v in h.items() if not k.startswith("_")} for h in self.history
                if "learning_curve" not in h]


def values(items) -> dict:
    """Logged items as a dict: an item names its key, or the path to it (``nested_key``)."""
    found = {}
    for item in items:
        *parents, leaf = [item.key] if item.key else list(item.nested_key)
        node = found
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = json.loads(item.value_json)
    return found


def logged_runs(directory: Path) -> dict[str, list[LoggedRun]]:
    """Every W&B run file under ``directory/wandb``, by run id (a resumed run has one per start)."""
    import wandb

    # A finished run's last records reach the file after finish() returns (W&B's service
    # writes them); shutting the service down waits for them, as the end of a process does.
    wandb.teardown()
    runs = {}
    for path in sorted((directory / "wandb").glob("offline-run-*/run-*.wandb")):
        run = LoggedRun(path)
        runs.setdefault(run.run.run_id, []).append(run)
    return runs


# ------------------------------------------------------------------------ a run
@pytest.fixture(scope="module")
def trained(offline, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "small"
    assert main(["train", str(CONFIG), *SMALL, "run.wandb_tags=[smoke, cartpole]", "run.checkpoint_every_updates=1",
                 f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.mark.slow
def test_a_run_logs_its_metrics_config_and_curve(trained):
    (runs,) = logged_runs(trained).values()
    (logged,) = runs
    assert logged.run.run_id == (trained / ID_FILE).read_text().strip()
    assert (logged.run.project, logged.run.display_name, list(logged.run.tags)) == ("rlhf-jax", "small",
                                                                                     ["smoke", "cartpole"])
    # Every row of metrics.csv, in order, with the same keys and values.
    csv_rows = MetricsLog(trained, tensorboard=False).rows()
    assert len(csv_rows) == 2
    assert logged.rows() == [pytest.approx(row, nan_ok=True) for row in csv_rows]
    # The resolved config, as config.yaml holds it.
    expected = to_dict(load_run_config(trained))
    assert {key: value for key, value in logged.config.items() if key != "_wandb"} == expected
    assert logged.config["a2c"]["total_env_steps"] == 2048
    # The learning curve, a PNG image stored with the run.
    (curve,) = [h["learning_curve"] for h in logged.history if "learning_curve" in h]
    assert curve["_type"] == "image-file" and curve["format"] == "png"
    assert (logged.path.parent / "files" / curve["path"]).read_bytes()[:4] == b"\x89PNG"
    assert logged.exit.exit_code == 0


def test_a_resumed_run_goes_on_in_the_same_wandb_run(trained, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    shutil.rmtree(copy / "checkpoints" / "1")  # as if killed after its first chunk's checkpoint
    assert main(["train", "--resume", str(copy)]) == 0
    (runs,) = logged_runs(copy).values()
    assert len(runs) == 2 and runs[0].run.run_id == runs[1].run.run_id == (copy / ID_FILE).read_text().strip()
    assert [row["env_steps"] for row in runs[1].rows()] == [2048]  # the second chunk, once


def test_resuming_a_finished_run_logs_nothing(trained, tmp_path, capsys):
    """It logged a W&B row with env_steps=0 (its learning curve, drawn again)."""
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    assert main(["train", "--resume", str(copy)]) == 0
    assert f"{copy} is finished" in capsys.readouterr().out
    (runs,) = logged_runs(copy).values()
    assert len(runs) == 1


def test_asking_for_wandb_without_it_installed_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    run_dir = tmp_path / "run"
    assert main(["train", str(CONFIG), *SMALL, f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "run.wandb is true, but wandb is not installed: pip install 'rlhf_jax[wandb]'" in err
    assert not run_dir.exists()  # refused before anything was written
    base = apply_overrides(read_yaml(CONFIG), SMALL)
    with pytest.raises(ConfigError, match="run.wandb is true"):
        Sweep.create(tmp_path / "sweep", base, {}, seeds=1)


def test_a_wandb_run_that_cannot_start_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    """Online without a login: one line, but the run directory stayed, so the advice it gave
    (run.wandb_mode=offline) then met "already holds a run"."""
    for name in ("HOME", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "home" / name.lower()))  # no login, no netrc
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert main(["train", str(CONFIG), *SMALL, "run.wandb_mode=online", f"run.dir={run_dir}"]) == 1
    err = capsys.readouterr().err
    assert not run_dir.exists()
    assert err.count("\n") == 1 and "cannot start the W&B run (run.wandb_mode=online)" in err
    assert "run.wandb_mode=offline" in err and ".." not in err


def test_a_people_runs_label_counts_go_to_its_summary(offline, tmp_path):
    store = LabelStore(tmp_path / "labels.sqlite")
    for query_id in range(3):
        store.add_query(query_id, "compare", [], "", frames=5, fps=50.0)
    store.answer(0, "left", who="tester")
    config = build(ExperimentConfig, apply_overrides(read_yaml(CONFIG), SMALL))
    with logging_to_wandb(config, tmp_path, "people") as wandb_run:
        wandb_run.log_label_counts(store.counts("compare"))
    (runs,) = logged_runs(tmp_path).values()
    assert runs[0].summary["people/answered"] == 1 and runs[0].summary["people/waiting"] == 2


# ---------------------------------------------------------------------- a sweep
@pytest.mark.slow
def test_a_sweep_logs_one_run_per_member_grouped_under_the_sweep(offline, tmp_path):
    directory = tmp_path / "lr-sweep"
    base = apply_overrides(read_yaml(CONFIG), [*SMALL, "a2c.total_env_steps=512", "run.chunk_env_steps=256"])
    Sweep.create(directory, base, {}, seeds=2).run(progress=False)
    runs = logged_runs(directory)
    sweep_id = (directory / ID_FILE).read_text().strip()
    assert sorted(runs) == [f"{sweep_id}-0", f"{sweep_id}-1"]
    member_rows = Sweep.load(directory).rows()
    for member in (0, 1):
        (logged,) = runs[f"{sweep_id}-{member}"]
        assert logged.run.run_group == "lr-sweep" and logged.run.display_name == f"base, seed {member}"
        assert logged.config["seed"] == member
        mine = [{k: v for k, v in row.items() if k != "label"} for row in member_rows if row["member"] == member]
        assert len(mine) == 2 and logged.rows() == [pytest.approx(row, nan_ok=True) for row in mine]
