"""Label datasets under careless or hostile hands: every dataset is checked before anything
trusts it. Values out of their range or not finite, shapes or types other than the dataset's
own metadata, a damaged file, a config inside the dataset that names local files: each is
refused in one line naming the column, row or file. Nothing a command writes replaces what a
user has, and a fitted model that is not finite is never written.

The datasets here are made by hand (6 CartPole-shaped preference labels or 4 IBT clips) and
damaged with pyarrow, their checksums rewritten where the damage is meant to pass them."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_jax import label_datasets
from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT
from rlhf_jax.config_base import build, dump_yaml
from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.reward import saved_model

ROWS, CLIPS, K = 6, 4, 5  # preference labels, IBT clips, steps per segment
METADATA_KEY = b"rlhf_jax.label_dataset"
SUMS = "SHA256SUMS"
# The source run's config: the default experiment with 5-step segments, as a fit reads it.
RUN_CONFIG = {**DEFAULT_EXPERIMENT, "preferences": {**DEFAULT_EXPERIMENT["preferences"], "segment_length": K}}


def hand_made(kind: str = "compare", run_config: dict | None = None) -> label_datasets.LabelDataset:
    rng = np.random.default_rng(0)
    rows = ROWS if kind == "compare" else CLIPS
    sides = 2 if kind == "compare" else 1
    info = label_datasets.DatasetInfo(
        kind=kind, env=build(EnvConfig, DEFAULT_EXPERIMENT["env"], "env"), rows=rows, segment_length=K, stack=1,
        frame_shape=(4,), observation_dtype="float32", action_shape=(), action_dtype="int32" if sides == 2 else "",
        members=3 if sides == 2 else 0, labeler="synthetic", source="hand-made",
        run_config=dump_yaml(run_config or (RUN_CONFIG if kind == "compare" else {
            **DEFAULT_EXPERIMENT, "reward": "ibt", "ibt": {"episode_length": K, "batch_episodes": 4}})))
    frames = rng.normal(size=(rows, sides, K, 4)).astype(np.float32)
    restart = np.zeros((rows, sides, K), bool)
    if kind == "compare":
        labels = label_datasets.LabelRows(
            frames, restart, rng.integers(0, 2, (rows, 2, K)).astype(np.int32),
            np.float32([1, 0, 0.5, 1, 0, 1]), rng.normal(size=(rows, 2)).astype(np.float32),
            rng.random((rows, 3)) < 0.37, None)
    else:
        labels = label_datasets.LabelRows(frames, restart, None, None, None, None,
                                          rng.integers(-1, 2, (rows, K)).astype(np.int32))
    return label_datasets.LabelDataset(info, labels, label_datasets.Provenance.unknown(rows, "oracle"))


@pytest.fixture
def dataset(tmp_path):
    return label_datasets.write(hand_made(), tmp_path / "labels")


@pytest.fixture
def marks(tmp_path):
    return label_datasets.write(hand_made("annotate"), tmp_path / "marks")


def error_line(capsys) -> str:
    """What the command printed: exactly one line, no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_sums(dataset_dir) -> None:
    """The checksums of the dataset's files as they are now (``sha256sum data/*.parquet``)."""
    files = sorted((dataset_dir / "data").glob("*.parquet"))
    (dataset_dir / SUMS).write_text("".join(f"{sha256(f)}  data/{f.name}\n" for f in files))


def rewrite(dataset_dir, change) -> None:
    """Rewrite the dataset's one Parquet file as ``change(table)``, its checksums with it."""
    (path,) = (dataset_dir / "data").glob("*.parquet")
    pq.write_table(change(pq.read_table(path)), path)
    write_sums(dataset_dir)


def nested(values: np.ndarray) -> pa.Array:
    array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def with_column(name: str, values: np.ndarray):
    def change(table):
        return table.set_column(table.column_names.index(name), name, nested(values))
    return change


def column(dataset_dir, name: str) -> np.ndarray:
    (path,) = (dataset_dir / "data").glob("*.parquet")
    values = pq.read_table(path).column(name).to_pylist()
    return np.array(values, dtype=np.float64 if name in ("mu", "frames_0", "frames_1", "frames", "oracle_return_0")
                    else np.int64)


def with_metadata(**changes):
    def change(table):
        info = json.loads(table.schema.metadata[METADATA_KEY])
        info.update(changes)
        return table.replace_schema_metadata({METADATA_KEY: json.dumps(info).encode()})
    return change


# ------------------------------------------------------- 1. values out of range, not finite


@pytest.mark.parametrize("kind, name, row, value, said", [
    ("compare", "mu", 2, 7.0, "not an answer"),
    ("compare", "mu", 3, -3.0, "not an answer"),
    ("compare", "mu", 1, np.nan, "not an answer"),
    ("compare", "action_0", 4, 99, "outside the action space"),
    ("compare", "action_1", 0, -4, "outside the action space"),
    ("compare", "frames_1", 5, np.inf, "not finite"),
    ("compare", "frames_0", 2, np.nan, "not finite"),
    ("compare", "oracle_return_0", 1, np.inf, "not finite"),
    ("annotate", "marks", 1, 7, "not a mark"),
    ("annotate", "marks", 3, -3, "not a mark"),
    ("annotate", "frames", 0, np.nan, "not finite"),
])
def test_values_out_of_range_or_not_finite_are_refused_on_import(kind, name, row, value, said, tmp_path, capsys):
    directory = label_datasets.write(hand_made(kind), tmp_path / "dataset")
    values = column(directory, name)
    values.reshape(len(values), -1)[row, 0] = value  # the row's first value
    dtype = np.float32 if values.dtype == np.float64 else np.int32
    rewrite(directory, with_column(name, values.astype(dtype)))
    assert main(["labels", "import", str(directory), str(tmp_path / "labels.npz")]) == 2
    line = error_line(capsys)
    assert f"{name}, row {row}" in line and said in line, line
    assert not (tmp_path / "labels.npz").exists()


@pytest.mark.parametrize("name, value", [("mu", np.nan), ("action_0", 99)])
def test_values_out_of_range_are_refused_before_fitting(name, value, dataset, tmp_path, capsys):
    values = column(dataset, name)
    values.reshape(len(values), -1)[2, 0] = value
    rewrite(dataset, with_column(name, values.astype(np.float32 if name == "mu" else np.int32)))
    assert main(["fit-reward", str(dataset), "--steps", "1", "--out", str(tmp_path / "model.npz")]) == 2
    assert f"{name}, row 2" in error_line(capsys)
    assert not (tmp_path / "model.npz").exists()


@pytest.mark.slow
def test_a_fit_that_is_not_finite_writes_no_model(tmp_path, capsys):
    """Observations near float32's largest overflow the input standardisation: the fitted model
    is not finite, and is not written."""
    huge = hand_made()
    frames = np.where(np.arange(K)[None, None, :, None] % 2, 3e38, -3e38).astype(np.float32)
    huge = huge._replace(rows=huge.rows._replace(frames=np.broadcast_to(frames, huge.rows.frames.shape).copy()))
    directory = label_datasets.write(huge, tmp_path / "huge")
    out = tmp_path / "model.npz"
    assert main(["fit-reward", str(directory), "--steps", "1", "--out", str(out)]) == 1
    assert "not finite" in error_line(capsys)
    assert not out.exists()


# --------------------------------------------------- 2. and 3. shapes and types: the metadata's


@pytest.mark.parametrize("change, named", [
    (with_metadata(frame_shape=[5]), "frames_0"),
    (with_metadata(segment_length=K + 1), "frames_0"),
    (with_metadata(action_shape=[2]), "action_0"),
    (with_metadata(members=4), "holdout"),
])
def test_shapes_other_than_the_metadata_says_are_refused_in_one_line(change, named, dataset, tmp_path, capsys):
    rewrite(dataset, change)
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    assert named in error_line(capsys)


@pytest.mark.parametrize("name, values", [
    ("action_0", np.full((ROWS, K), 0.7)),  # floats where the metadata says int32: never cast to 0
    ("mu", np.ones(ROWS, np.float64)),
    ("frames_1", np.zeros((ROWS, K, 4), np.float64)),
    ("restart_0", np.zeros((ROWS, K), np.int8)),
])
def test_columns_of_another_type_are_refused_not_cast(name, values, dataset, tmp_path, capsys):
    rewrite(dataset, with_column(name, values))
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    line = error_line(capsys)
    assert f"column {name} is" in line, line
    assert not (tmp_path / "labels.npz").exists()


def test_empty_values_are_refused_in_one_line(dataset, tmp_path, capsys):
    def change(table):
        mu = pa.array([1.0, None, 0.5, 1.0, 0.0, 1.0], pa.float32())
        return table.set_column(table.column_names.index("mu"), "mu", mu)

    rewrite(dataset, change)
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    assert "column mu" in error_line(capsys)


# ----------------------------------------------------------------------------- 4. checksums


def test_the_export_writes_each_files_checksum_in_sha256sum_format(dataset):
    lines = (dataset / SUMS).read_text().splitlines()
    (path,) = (dataset / "data").glob("*.parquet")
    assert lines == [f"{sha256(path)}  data/{path.name}"]


@pytest.mark.slow
def test_a_flipped_byte_is_refused_by_its_checksum(dataset, tmp_path, capsys):
    """One byte that pyarrow reads without complaint, as other answers, is refused by the checksum."""
    (path,) = (dataset / "data").glob("*.parquet")
    original = path.read_bytes()
    before = pq.read_table(path)
    for position in range(4, len(original)):  # the first byte that changes a value silently
        damaged = bytearray(original)
        damaged[position] ^= 0x01
        try:
            after = pq.read_table(pa.BufferReader(bytes(damaged)))
        except (pa.ArrowException, OSError):
            continue
        changed = [name for name in before.column_names if not after.column(name).equals(before.column(name))]
        if after.schema.equals(before.schema, check_metadata=True) and changed == ["mu"]:
            break
    else:
        pytest.fail("no byte of the file changes the answers silently")
    path.write_bytes(bytes(damaged))
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    line = error_line(capsys)
    assert str(path) in line and "SHA-256" in line, line
    assert not (tmp_path / "labels.npz").exists()


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / SUMS).unlink(), "has no SHA256SUMS"),
    (lambda d: (d / SUMS).write_text(""), "is not in {dataset}/SHA256SUMS"),
    (lambda d: (d / SUMS).write_text("not a checksum\n"), "SHA256SUMS: line 1"),
])
def test_missing_checksums_are_refused(damage, named, dataset, tmp_path, capsys):
    damage(dataset)
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    assert named.format(dataset=dataset) in error_line(capsys)


# ----------------------------------------------------------- 5. the config inside a dataset


def test_a_duplicate_key_in_the_datasets_config_is_a_one_line_error(dataset, tmp_path, capsys):
    def change(table):
        info = json.loads(table.schema.metadata[METADATA_KEY])
        info["run_config"] = "seed: 1\nseed: 2\n"
        return table.replace_schema_metadata({METADATA_KEY: json.dumps(info).encode()})

    rewrite(dataset, change)
    assert main(["fit-reward", str(dataset), "--steps", "1", "--out", str(tmp_path / "model.npz")]) == 2
    line = error_line(capsys)
    assert str(dataset) in line and "'seed' is given twice" in line, line


@pytest.mark.parametrize("key", ["reward_model.init_from", "ibt.marks_from", "preferences.labels_from"])
def test_the_dataset_never_chooses_a_local_file_to_load(key, tmp_path, capsys):
    """A dataset's config naming a file on this machine: the fit reads the dataset and nothing else."""
    section, name = key.split(".")
    bait = tmp_path / "bait.npz"
    bait.write_bytes(b"not a model")
    run_config = {**RUN_CONFIG, section: {**RUN_CONFIG.get(section, {}), name: str(bait)}}
    directory = label_datasets.write(hand_made(run_config=run_config), tmp_path / "labels")
    out = tmp_path / "model.npz"
    assert main(["fit-reward", str(directory), "--steps", "1", "--out", str(out)]) == 0, capsys.readouterr().err
    assert saved_model.read_info(out).labels == ROWS


# --------------------------------------------------------------------------------- 6. memory


@pytest.mark.slow
def test_importing_takes_memory_near_the_datasets_decoded_size(tmp_path):
    """A Parquet file of zeros is small on disk and large decoded: importing it takes a small
    multiple of its decoded size. Measured in a process of its own as the peak of what NumPy and
    Python allocate (tracemalloc) and of what Arrow allocates (its memory pool)."""
    rows, k = 400, 25
    info = label_datasets.DatasetInfo(
        kind="compare", env=build(EnvConfig, {"id": "envpool/Pong-v5"}, "env"), rows=rows, segment_length=k, stack=4,
        frame_shape=(84, 84), observation_dtype="uint8", action_shape=(), action_dtype="int32", members=3,
        labeler="synthetic", source="zeros")
    labels = label_datasets.LabelRows(
        np.zeros((rows, 2, k + 3, 84, 84), np.uint8), np.zeros((rows, 2, k), bool), np.zeros((rows, 2, k), np.int32),
        np.zeros(rows, np.float32), np.zeros((rows, 2), np.float32), np.zeros((rows, 3), bool), None)
    decoded = sum(array.nbytes for array in labels if array is not None)
    directory = label_datasets.write(label_datasets.LabelDataset(
        info, labels, label_datasets.Provenance.unknown(rows, "oracle")), tmp_path / "zeros")
    del labels
    assert label_datasets.parquet_bytes(directory) < decoded / 1000
    script = textwrap.dedent(f"""
        import tracemalloc
        import pyarrow
        from rlhf_jax import label_datasets
        tracemalloc.start()
        label_datasets.import_labels({str(directory)!r}, {str(tmp_path / "labels.npz")!r})
        print(tracemalloc.get_traced_memory()[1] + pyarrow.default_memory_pool().max_memory())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    peak = int(result.stdout.split()[-1])
    assert peak < 2.5 * decoded, f"importing {decoded / 2**20:.0f} MiB took {peak / 2**20:.0f} MiB"


# ------------------------------------------------------------- 14. nothing replaced or deleted


def test_an_export_never_deletes_a_partial_folder_that_is_there(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(dump_yaml(RUN_CONFIG))
    label_datasets.write_labels_npz(hand_made(), run_dir / "labels.npz")
    partial = tmp_path / "out.partial"
    partial.mkdir()
    (partial / "notes.txt").write_text("mine")
    assert main(["labels", "export", str(run_dir), str(tmp_path / "out")]) == 2
    assert str(partial) in error_line(capsys)
    assert (partial / "notes.txt").read_text() == "mine" and not (tmp_path / "out").exists()


def test_fit_reward_never_writes_over_a_file(dataset, tmp_path, capsys):
    out = tmp_path / "model.npz"
    out.write_text("mine")
    assert main(["fit-reward", str(dataset), "--steps", "1", "--out", str(out)]) == 2
    assert f"{out} already exists" in error_line(capsys)
    assert out.read_text() == "mine"


def test_an_import_never_writes_over_its_partial_file(dataset, tmp_path, capsys):
    partial = tmp_path / "labels.npz.partial"
    partial.write_text("mine")
    assert main(["labels", "import", str(dataset), str(tmp_path / "labels.npz")]) == 2
    assert f"{partial} already exists" in error_line(capsys)
    assert partial.read_text() == "mine"


def test_the_card_and_metadata_name_no_local_path(tmp_path):
    """An export records the run by its name, and its config without the keys that name local
    files (the run's directory, the dataset or model it started from)."""
    run_dir = tmp_path / "runs" / "cartpole"
    run_dir.mkdir(parents=True)
    config = {**RUN_CONFIG, "run": {"dir": str(run_dir)},
              "reward_model": {"normalized_std": 0.1, "init_from": str(tmp_path / "model.npz")}}
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    label_datasets.write_labels_npz(hand_made(), run_dir / "labels.npz")
    out = label_datasets.write(label_datasets.from_run(run_dir), tmp_path / "out")
    (path,) = (out / "data").glob("*.parquet")
    assert str(tmp_path) not in (out / "README.md").read_text()
    assert str(tmp_path).encode() not in pq.read_schema(path).metadata[METADATA_KEY]
    assert "`cartpole`" in (out / "README.md").read_text()
