"""A dataset directory's Parquet files: writing them (``labels export``) and reading them back,
dtypes and order as written."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from rlhf_jax.config_base import to_dict
from rlhf_jax.envs.options import HOW_RUN
from rlhf_jax.errors import ConfigError
from rlhf_jax.label_datasets.card import card
from rlhf_jax.label_datasets.schema import (CARD_FILE, DATA_DIR, METADATA_KEY, DatasetInfo, LabelDataset, LabelRows,
                                            Provenance, columns)

SHARD_BYTES = 512 * 2**20  # rows per Parquet file: about this many bytes before compression
ROW_GROUP_BYTES = 64 * 2**20  # rows per row group, likewise: what a reader holds at once
# Parquet's zstd level, after dictionary encoding (a frame's pixels take few values): 500 Pong
# labels' frames (188 MiB) take 0.74 MiB at 9, 1.02 at 3, in about the same time (5 s).
ZSTD_LEVEL = 9
CHOICE_NAMES = {1.0: "left", 0.0: "right", 0.5: "tie"}  # mu -> the label store's words


def _arrow():
    """``(pyarrow, pyarrow.parquet)``: Parquet needs the ``labels`` extra, which training does not."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ConfigError("label datasets are Parquet files, which need pyarrow: pip install 'rlhf_jax[labels]'") from None
    return pyarrow, pyarrow.parquet


def _nested(array: np.ndarray) -> pa.Array:
    """``[N, *shape]`` as ``N`` nested fixed-size lists (numbers not copied)."""
    pa = _arrow()[0]
    values = pa.array(np.ascontiguousarray(array).reshape(-1))
    for size in reversed(array.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _unnested(column: pa.ChunkedArray, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The inverse of :func:`_nested`: ``[N, *shape]`` of ``dtype``."""
    pa = _arrow()[0]
    array = column.combine_chunks()
    rows = len(array)
    while pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
        array = array.flatten()
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype).reshape(rows, *shape)


def _nullable(values: np.ndarray, type_: pa.DataType, missing: np.ndarray) -> pa.Array:
    pa = _arrow()[0]
    return pa.array(values, type_, mask=missing)


def _table(dataset: LabelDataset, start: int, stop: int) -> pa.Table:
    pa = _arrow()[0]
    info, labels, provenance = dataset
    part = slice(start, stop)
    env_options = json.dumps({k: v for k, v in to_dict(info.env).items() if k not in ("id", *HOW_RUN)})
    count = stop - start
    data = {"label": pa.array(np.arange(start, stop), pa.int64()),
            "env_id": pa.array([info.env.id] * count, pa.string()),
            "env_options": pa.array([env_options] * count, pa.string())}
    if info.kind == "annotate":
        data.update(frames=_nested(labels.frames[part, 0]), restart=_nested(labels.restart[part, 0]),
                    marks=_nested(labels.marks[part].astype(np.int32)))
    else:
        for side in (0, 1):
            data[f"frames_{side}"] = _nested(labels.frames[part, side])
            data[f"restart_{side}"] = _nested(labels.restart[part, side])
        for side in (0, 1):
            data[f"action_{side}"] = _nested(labels.action[part, side])
        mu = labels.mu[part].astype(np.float32)
        data["mu"] = pa.array(mu, pa.float32())
        data["choice"] = pa.array([CHOICE_NAMES.get(float(m)) for m in mu], pa.string())
        for side in (0, 1):
            values = labels.oracle_return[part, side].astype(np.float32)
            data[f"oracle_return_{side}"] = _nullable(values, pa.float32(), np.isnan(values))
        if info.members:
            data["holdout"] = _nested(labels.holdout[part])
    data["who"] = pa.array(list(provenance.who[part]), pa.string())
    seconds = provenance.seconds[part]
    data["seconds"] = _nullable(seconds, pa.float64(), np.isnan(seconds))
    query_id = provenance.query_id[part]
    data["query_id"] = _nullable(query_id, pa.int64(), query_id < 0)
    assert list(data) == [column.name for column in columns(info)], "the columns and their documentation differ"
    table = pa.table(data)
    return table.replace_schema_metadata({METADATA_KEY: info.to_json().encode()})


def _encodings(schema: pa.Schema) -> tuple[list[str], list[str]]:
    """The Parquet leaf columns (a nested list's values: ``name.list.element...``) to write
    byte-stream-split, and those to dictionary-encode. Arrays of floats (vector observations,
    continuous actions) split into their bytes' streams compress with zstd (500 CartPole labels
    to 0.64 of their bytes; dictionary-encoded, to 1.15), and everything else, pixels included
    (a frame takes few values), is dictionary-encoded."""
    pa = _arrow()[0]
    arrays, others = [], []
    for field in schema:
        path, type_ = field.name, field.type
        while pa.types.is_fixed_size_list(type_) or pa.types.is_list(type_):
            path, type_ = path + ".list.element", type_.value_type
        (arrays if path != field.name and pa.types.is_floating(type_) else others).append(path)
    return arrays, others


def shard_files(dataset_dir: Path) -> list[Path]:
    return sorted((dataset_dir / DATA_DIR).glob("*.parquet"))


def write(dataset: LabelDataset, out_dir: str | Path, license: str = "cc-by-4.0") -> Path:
    """Write ``dataset`` as the directory ``out_dir`` (new, or empty): Parquet files and the card.
    Written under a temporary name first: ``out_dir`` holds a whole dataset or nothing."""
    pq = _arrow()[1]
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists{' and is not empty' if out.is_dir() else ''}: choose a new OUT_DIR")
    info = dataset.info
    row_bytes = max(1, sum(a[0].nbytes for a in dataset.rows if a is not None and len(a)))
    per_file = max(1, SHARD_BYTES // row_bytes)
    files = max(1, math.ceil(info.rows / per_file))
    partial = out.with_name(out.name + ".partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        (partial / DATA_DIR).mkdir(parents=True)
        for index in range(files):
            start, stop = index * per_file, min(info.rows, (index + 1) * per_file)
            table = _table(dataset, start, stop)
            arrays, others = _encodings(table.schema)
            pq.write_table(table, partial / DATA_DIR / f"train-{index:05d}-of-{files:05d}.parquet",
                           row_group_size=max(1, ROW_GROUP_BYTES // row_bytes), use_dictionary=others,
                           use_byte_stream_split=arrays or False, compression="zstd", compression_level=ZSTD_LEVEL)
        (partial / CARD_FILE).write_text(card(dataset, license, parquet_bytes(partial)), encoding="utf-8")
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError(f"cannot write the dataset {out}: {error}") from None
    return out


def parquet_bytes(dataset_dir: Path) -> int:
    """Bytes of the dataset's Parquet files on disk."""
    return sum(path.stat().st_size for path in shard_files(Path(dataset_dir)))


def read_info(dataset_dir: str | Path) -> DatasetInfo:
    """The :class:`DatasetInfo` of the dataset directory ``dataset_dir`` (its first file's), or a
    one-line error saying why it is not one."""
    path = Path(dataset_dir)
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"{path} is not a label dataset: not a directory")
    files = shard_files(path)
    if not files:
        raise ConfigError(f"{path} is not a label dataset: it has no {DATA_DIR}/*.parquet "
                          f"(rlhf-jax labels export RUN_DIR {path} writes one)")
    return _file_info(files[0])


def _file_info(path: Path) -> DatasetInfo:
    pa, pq = _arrow()
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as error:
        raise ConfigError(f"{path} is not a Parquet file ({' '.join(str(error).split())})") from None
    metadata = (schema.metadata or {}).get(METADATA_KEY)
    if metadata is None:
        raise ConfigError(f"{path} was not written by rlhf-jax labels export: its schema has no "
                          f"{METADATA_KEY.decode()} metadata")
    return DatasetInfo.from_json(metadata.decode(), path)


def read(dataset_dir: str | Path) -> LabelDataset:
    """Every label of the dataset directory ``dataset_dir``, dtypes and order as written."""
    pa, pq = _arrow()
    info = read_info(dataset_dir)
    tables = []
    for path in shard_files(Path(dataset_dir)):
        if _file_info(path) != info:
            raise ConfigError(f"{path} belongs to another dataset than the other files in {dataset_dir}")
        try:
            tables.append(pq.read_table(path))
        except (OSError, pa.ArrowException) as error:
            raise ConfigError(f"{path} cannot be read ({' '.join(str(error).split())})") from None
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowException as error:
        raise ConfigError(f"the files of {dataset_dir} do not agree on their columns ({error})") from None
    wanted = [column.name for column in columns(info)]
    missing = [name for name in wanted if name not in table.column_names]
    if missing:
        raise ConfigError(f"{dataset_dir} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    if table.num_rows != info.rows:
        raise ConfigError(f"{dataset_dir} holds {table.num_rows} rows, its metadata says {info.rows}")
    table = table.sort_by("label")
    if not np.array_equal(table.column("label").to_numpy(), np.arange(info.rows)):
        raise ConfigError(f"{dataset_dir}: its label column is not 0 .. {info.rows - 1}, each once")
    c, k, frames = info.segments, info.segment_length, (info.frames_per_segment, *info.frame_shape)

    def stacked(names, shape, dtype):
        return np.stack([_unnested(table.column(name), shape, dtype) for name in names], axis=1)

    def nullable(name, dtype, fill):
        return table.column(name).fill_null(fill).to_numpy().astype(dtype)

    if info.kind == "compare":
        labels = LabelRows(
            frames=stacked(["frames_0", "frames_1"], frames, info.observation_dtype),
            restart=stacked(["restart_0", "restart_1"], (k,), bool),
            action=stacked(["action_0", "action_1"], (k, *info.action_shape), info.action_dtype),
            mu=table.column("mu").to_numpy().astype(np.float32),
            oracle_return=np.stack([nullable(f"oracle_return_{s}", np.float32, np.nan) for s in (0, 1)], axis=1),
            holdout=_unnested(table.column("holdout"), (info.members,), bool) if info.members else None,
            marks=None)
    else:
        labels = LabelRows(frames=stacked(["frames"], frames, info.observation_dtype),
                           restart=stacked(["restart"], (k,), bool), action=None, mu=None, oracle_return=None,
                           holdout=None, marks=_unnested(table.column("marks"), (k,), np.int32))
    assert labels.frames.shape[:2] == (info.rows, c)
    provenance = Provenance(tuple(table.column("who").to_pylist()), nullable("seconds", np.float64, np.nan),
                            nullable("query_id", np.int64, -1))
    return LabelDataset(info, labels, provenance)

