"""A dataset directory's Parquet files: writing them (``labels export``) and reading them back,
dtypes and order as written. A reader trusts nothing in them: the files' checksums, then each
column's type, exactly as the metadata says (nothing is cast), then every value
(:mod:`~rlhf_jax.label_datasets.check`) are checked before a label is returned."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from rlhf_jax.config_base import CONFIG_FILE, to_dict
from rlhf_jax.envs.options import HOW_RUN
from rlhf_jax.errors import ConfigError
from rlhf_jax.files import refuse_to_overwrite
from rlhf_jax.label_datasets.card import card
from rlhf_jax.label_datasets.check import check_rows
from rlhf_jax.label_datasets.checksums import check_sums, write_sums
from rlhf_jax.label_datasets.schema import (CARD_FILE, CHOICE_NAMES, DATA_DIR, METADATA_KEY, Column, DatasetInfo,
                                            LabelDataset, LabelRows, Provenance, columns)

SHARD_BYTES = 512 * 2**20  # rows per Parquet file: about this many bytes before compression
ROW_GROUP_BYTES = 64 * 2**20  # rows per row group, likewise
# Rows a reader decodes at once, likewise. Beside each value of a nested list, Parquet's reader
# holds about 10 bytes of levels and offsets: a whole file of Pong frames took 6 times its
# decoded size to read at once, a batch of 2 MiB takes about 20 MiB.
BATCH_BYTES = 2 * 2**20
# Parquet's zstd level, after dictionary encoding (a frame's pixels take few values): 500 Pong
# labels' frames (188 MiB) take 0.74 MiB at 9, 1.02 at 3, in about the same time (5 s).
ZSTD_LEVEL = 9
NULLS = {"oracle_return_0": np.nan, "oracle_return_1": np.nan, "seconds": np.nan, "query_id": -1}  # null -> this


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


def _nullable(values: np.ndarray, type_: pa.DataType, missing: np.ndarray) -> pa.Array:
    pa = _arrow()[0]
    return pa.array(values, type_, mask=missing)


def _table(dataset: LabelDataset, start: int, stop: int) -> pa.Table:
    """Rows ``start`` to ``stop`` of ``dataset``, column by column as :func:`columns` lists them:
    a column of a :class:`LabelRows` field from that field (one segment's: ``field[:, side]``),
    the others from the rows' label number, environment, answer (``choice``) and provenance."""
    pa = _arrow()[0]
    info, labels, provenance = dataset
    part = slice(start, stop)
    env_options = json.dumps({k: v for k, v in to_dict(info.env).items() if k not in ("id", *HOW_RUN)})
    count = stop - start
    seconds, query_id = provenance.seconds[part], provenance.query_id[part]
    others = {"label": lambda: pa.array(np.arange(start, stop), pa.int64()),
              "env_id": lambda: pa.array([info.env.id] * count, pa.string()),
              "env_options": lambda: pa.array([env_options] * count, pa.string()),
              "choice": lambda: pa.array([CHOICE_NAMES.get(float(m)) for m in labels.mu[part].astype(np.float32)],
                                         pa.string()),
              "who": lambda: pa.array(list(provenance.who[part]), pa.string()),
              "seconds": lambda: _nullable(seconds, pa.float64(), np.isnan(seconds)),
              "query_id": lambda: _nullable(query_id, pa.int64(), query_id < 0)}
    data = {}
    for column in columns(info):
        if not column.field:
            data[column.name] = others[column.name]()
            continue
        values = _field_of(labels, column)[part].astype(column.dtype, copy=False)
        if column.shape:
            data[column.name] = _nested(values)
        elif column.name in NULLS:  # a float that may be unknown: NaN is null
            data[column.name] = _nullable(values, arrow_type(column), np.isnan(values))
        else:
            data[column.name] = pa.array(values, arrow_type(column))
    table = pa.table(data)
    assert table.schema.equals(schema(info)), "the columns and their documentation differ"
    return table.replace_schema_metadata({METADATA_KEY: info.to_json().encode()})


def _field_of(rows: LabelRows, column: Column) -> np.ndarray:
    """The :class:`LabelRows` array that ``column`` holds: its field, or one segment's of it."""
    array = getattr(rows, column.field)
    return array if column.side is None else array[:, column.side]


def arrow_type(column: Column) -> pa.DataType:
    """The Parquet (Arrow) type of ``column``: its element type in fixed-size lists of its shape."""
    pa = _arrow()[0]
    type_ = pa.string() if column.dtype == "string" else pa.from_numpy_dtype(np.dtype(column.dtype))
    for size in reversed(column.shape):
        type_ = pa.list_(type_, size)
    return type_


def schema(info: DatasetInfo) -> pa.Schema:
    """The columns of a dataset of ``info`` as Arrow types: what is written, and all a reader accepts."""
    pa = _arrow()[0]
    return pa.schema([pa.field(column.name, arrow_type(column)) for column in columns(info)])


def _described(type_: pa.DataType) -> str:
    """An Arrow type as :attr:`Column.type` writes one (``float64 [5, 4]``)."""
    pa = _arrow()[0]
    shape = []
    while pa.types.is_fixed_size_list(type_) or pa.types.is_list(type_) or pa.types.is_large_list(type_):
        shape.append(type_.list_size if pa.types.is_fixed_size_list(type_) else "any")
        type_ = type_.value_type
    numeric = pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    name = np.dtype(type_.to_pandas_dtype()).name if numeric else str(type_)
    return f"{name} {shape}" if shape else name


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
    refuse_to_overwrite(out, "choose a new OUT_DIR")
    partial = out.with_name(out.name + ".partial")
    refuse_to_overwrite(partial, "an export that stopped left it, or it is someone's: remove it, or choose a new "
                                 "OUT_DIR")
    info = dataset.info
    per_file = max(1, SHARD_BYTES // info.row_bytes)
    files = max(1, math.ceil(info.rows / per_file))
    try:
        (partial / DATA_DIR).mkdir(parents=True, exist_ok=True)  # partial: new, or an empty directory
        for index in range(files):
            start, stop = index * per_file, min(info.rows, (index + 1) * per_file)
            table = _table(dataset, start, stop)
            arrays, others = _encodings(table.schema)
            pq.write_table(table, partial / DATA_DIR / f"train-{index:05d}-of-{files:05d}.parquet",
                           row_group_size=max(1, ROW_GROUP_BYTES // info.row_bytes), use_dictionary=others,
                           use_byte_stream_split=arrays or False, compression="zstd", compression_level=ZSTD_LEVEL)
        write_sums(partial, shard_files(partial))
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
    if not files and (path / CONFIG_FILE).is_file():
        raise ConfigError(f"{path} is a run directory, not a label dataset: rlhf-jax labels export {path} OUT_DIR "
                          f"writes its labels as one, to be read from OUT_DIR")
    if not files:
        raise ConfigError(f"{path} is not a label dataset: it has no {DATA_DIR}/*.parquet "
                          f"(rlhf-jax labels export RUN_DIR {path} writes one)")
    return _file_info(files[0])


def _file_info(path: Path) -> DatasetInfo:
    pa, pq = _arrow()
    try:
        found = pq.read_schema(path)
    except (OSError, pa.ArrowException) as error:
        raise ConfigError(f"{path} is not a Parquet file ({' '.join(str(error).split())})") from None
    metadata = (found.metadata or {}).get(METADATA_KEY)
    if metadata is None:
        raise ConfigError(f"{path} was not written by rlhf-jax labels export: its schema has no "
                          f"{METADATA_KEY.decode()} metadata")
    return DatasetInfo.from_json(metadata.decode(), path)


def read(dataset_dir: str | Path) -> LabelDataset:
    """Every label of the dataset directory ``dataset_dir``, dtypes and order as written, each
    checked (module docstring). Read a batch of rows at a time into arrays of the metadata's
    shapes, so that reading takes little memory beside the labels."""
    dataset_dir = Path(dataset_dir)
    info = read_info(dataset_dir)
    files = shard_files(dataset_dir)
    check_sums(dataset_dir, files)
    parquets = [_open(path, info) for path in files]
    held = sum(parquet.metadata.num_rows for parquet in parquets)
    if held != info.rows:
        raise ConfigError(f"{dataset_dir} holds {held} rows, its metadata says {info.rows}")
    rows = LabelRows.empty(info)
    who, seconds, query_id = [None] * info.rows, np.full(info.rows, np.nan), np.full(info.rows, -1, np.int64)
    described = {column.name: column for column in columns(info)}
    # Column -> the rows it fills: its LabelRows field (one segment's of it), or a provenance array.
    places = {column.name: _field_of(rows, column) for column in described.values() if column.field}
    places.update(seconds=seconds, query_id=query_id)
    seen = np.zeros(info.rows, bool)
    for path, parquet in zip(files, parquets):
        try:
            for batch in parquet.iter_batches(batch_size=max(1, BATCH_BYTES // info.row_bytes)):
                label = _values(batch.column("label"), described["label"], path)
                if (label < 0).any() or (label >= info.rows).any() or seen[label].any() or len(set(label)) < len(label):
                    raise ConfigError(f"{dataset_dir}: its label column is not 0 .. {info.rows - 1}, each once")
                seen[label] = True
                for name, place in places.items():
                    place[label] = _values(batch.column(name), described[name], path)
                for row, name in zip(label, batch.column("who").to_pylist()):
                    who[row] = name
        except (OSError, _arrow()[0].ArrowException) as error:
            raise ConfigError(f"{path} cannot be read ({' '.join(str(error).split())})") from None
    dataset = LabelDataset(info, rows, Provenance(tuple(who), seconds, query_id))
    check_rows(dataset, dataset_dir)
    return dataset


def _open(path: Path, info: DatasetInfo):
    """The Parquet file at ``path``, refused unless it belongs to the dataset of ``info`` and
    its columns are of the types ``info`` says, exactly: a value is never cast (an action of
    0.7 read as an integer would be 0)."""
    pa, pq = _arrow()
    if _file_info(path) != info:
        raise ConfigError(f"{path} belongs to another dataset than the other files in {path.parent.parent}")
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        raise ConfigError(f"{path} cannot be read ({' '.join(str(error).split())})") from None
    found = parquet.schema_arrow
    missing = [column.name for column in columns(info) if found.get_field_index(column.name) < 0]
    if missing:
        raise ConfigError(f"{path} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)} (or "
                          f"holds {'them' if len(missing) > 1 else 'it'} twice)")
    for column in columns(info):
        type_ = found.field(column.name).type
        if type_ != arrow_type(column):
            raise ConfigError(f"{path}: column {column.name} is {_described(type_)}, its metadata says {column.type}")
    return parquet


def _values(array: pa.Array, column: Column, path: Path) -> np.ndarray:
    """A batch's ``column`` as ``[rows, *column.shape]`` (its type checked: nothing is cast); a
    null is refused unless the column has a value for it (:data:`NULLS`)."""
    pa = _arrow()[0]
    rows = len(array)
    if column.name in NULLS:
        array = array.fill_null(NULLS[column.name])
    while True:
        if array.null_count:
            raise ConfigError(f"{path}: column {column.name} has empty (null) values")
        if not pa.types.is_fixed_size_list(array.type):
            return array.to_numpy(zero_copy_only=False).reshape(rows, *column.shape)
        array = array.flatten()
