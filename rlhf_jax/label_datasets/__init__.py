"""Label datasets: the answers a run learned from, as Apache Parquet files anyone can load.

A run keeps its labels in ``labels.npz`` (and, with people, who answered and how fast in
``labels.sqlite``): right for the run, opaque to anyone else. ``rlhf-jax labels export RUN_DIR
OUT_DIR`` writes them as a dataset directory::

    OUT_DIR/README.md                           the dataset card: what, how made, fields, how to load
    OUT_DIR/data/train-00000-of-00001.parquet   one row per label (more files for large datasets)

which ``datasets.load_dataset("parquet", data_files="OUT_DIR/data/*.parquet")`` loads, as do
pyarrow and pandas; the card's YAML front matter makes the directory a Hugging Face dataset
repository as it stands. :func:`columns` lists the columns, and the card shows them.

* **Frames once.** An Atari observation stacks the 4 newest frames, so a segment's ``k``
  stacks hold ``k + 3`` distinct frames: the dataset stores those and each step's ``restart``
  flag, as the label database does (:mod:`rlhf_jax.reward.data`), and the stacks are rebuilt
  on load (:func:`~rlhf_jax.reward.data.segment_stacks`), bit for bit. Other observations are
  stored whole (a "frame" is then the observation).
* **Bit for bit.** Observations, actions, answers (``mu``: 1 left preferred, 0 right, 0.5
  tie), IBT marks, oracle returns and held-out flags keep their dtypes: ``rlhf-jax labels
  import`` writes back a ``labels.npz`` equal to the run's own.
* **Who answered.** From ``labels.sqlite`` for a run labelled by people (its answers are
  matched to the labels by their segments), else the synthetic labeler's name (``oracle``,
  or the teacher's or annotator's settings) and no seconds. Labels a run was given from
  another dataset (``preferences.labels_from``, ``ibt.marks_from``) keep that dataset's ``who``.
* **What it was made on.** Each Parquet file's schema metadata holds a :class:`DatasetInfo`
  (as JSON under :data:`METADATA_KEY`): the environment's config section, shapes and
  dtypes, the labeler, and the source run's ``config.yaml``. A run or a fit reads it to
  refuse labels made on another environment, naming the key that differs.

:func:`load_labels` reads any of a dataset directory, a finished run's directory, or a
``labels.npz`` (a run's, or one ``labels import`` wrote, which carries its :class:`DatasetInfo`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rlhf_jax.config_base import CONFIG_FILE, build, dump_yaml, parse_yaml, read_run_config, to_dict
from rlhf_jax.envs.options import HOW_RUN, EnvConfig, task_mismatch
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.labeler import QUERIES_DIR
from rlhf_jax.feedback.store import CHOICE_MU, STORE_FILE, read_answered
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.reward.annotators import AnnotatorConfig
from rlhf_jax.reward.data import frames_on_host, stacks_on_host
from rlhf_jax.reward.labelers import TeacherConfig
from rlhf_jax.reward.learner import FEEDBACK, feedback_of

FORMAT = "rlhf_jax.label_dataset"
VERSION = 1
METADATA_KEY = b"rlhf_jax.label_dataset"  # the Parquet schema metadata key of a DatasetInfo
DATA_DIR = "data"
CARD_FILE = "README.md"
LABELS_FILE = "labels.npz"  # what a run writes when it finishes
SHARD_BYTES = 512 * 2**20  # rows per Parquet file: about this many bytes before compression
ROW_GROUP_BYTES = 64 * 2**20  # rows per row group, likewise: what a reader holds at once
# Parquet's zstd level, after dictionary encoding (a frame's pixels take few values): 500 Pong
# labels' frames (188 MiB) take 0.74 MiB at 9, 1.02 at 3, in about the same time (5 s).
ZSTD_LEVEL = 9
KINDS = {feedback.reward: feedback.kind for feedback in FEEDBACK.values()}  # a run's reward -> its labels' kind
CHOICE_NAMES = {1.0: "left", 0.0: "right", 0.5: "tie"}  # mu -> the label store's words


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds beside its rows (module docstring)."""

    kind: str  # "compare": preferences between 2 segments a row; "annotate": IBT marks on 1
    env: EnvConfig  # the environment the segments were played on (its config section)
    rows: int
    segment_length: int  # k: steps per segment
    stack: int  # frames per observation: 4 for Atari's stacked frames, else 1
    frame_shape: tuple[int, ...]  # one frame's; the observation is frame_shape + (stack,) if stack > 1
    observation_dtype: str
    action_shape: tuple[int, ...]  # one step's action: () for a discrete one (compare only)
    action_dtype: str  # "" where there are no actions (annotate)
    members: int  # held-out flags kept per label (the source run's ensemble size; 0: none)
    labeler: str  # "synthetic" or "people"
    source: str  # where the labels were read from
    run_config: str = ""  # the source run's config.yaml, as written ("": unknown)

    @property
    def segments(self) -> int:
        """Segments a row: 2 compared, or 1 annotated."""
        return 2 if self.kind == "compare" else 1

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (*self.frame_shape, self.stack) if self.stack > 1 else self.frame_shape

    @property
    def frames_per_segment(self) -> int:
        return self.segment_length + self.stack - 1

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        fields["env"] = to_dict(self.env)
        return json.dumps({"format": FORMAT, "version": VERSION, **fields})

    @classmethod
    def from_json(cls, text: str, where) -> "DatasetInfo":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where}: its dataset metadata is not JSON ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where} was not written by rlhf-jax labels export")
        if data.get("version") != VERSION:
            raise ConfigError(f"{where} is a label dataset of format version {data.get('version')!r}; this "
                              f"rlhf_jax reads version {VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in names}
        missing = names - set(fields) - {"run_config"}
        if missing:
            raise ConfigError(f"{where}: its dataset metadata lacks {', '.join(sorted(missing))}")
        fields["env"] = build(EnvConfig, fields["env"], "env")
        fields["frame_shape"] = tuple(fields["frame_shape"])
        fields["action_shape"] = tuple(fields["action_shape"])
        return cls(**fields)


class LabelRows(NamedTuple):
    """Every label's answer with its segments, row for row (``N`` rows, ``c`` segments a row)."""

    frames: np.ndarray  # [N, c, k + stack - 1, *frame_shape]: each segment's frames, oldest first
    restart: np.ndarray  # [N, c, k] bool: step t's stack does not continue step t-1's
    action: np.ndarray | None  # [N, c, k, *action_shape] (compare)
    mu: np.ndarray | None  # [N] float32: P[segment 0 preferred] (compare)
    oracle_return: np.ndarray | None  # [N, c] float32: summed oracle reward, NaN where unknown (compare)
    holdout: np.ndarray | None  # [N, M] bool: held out of ensemble member m's training (None: not kept)
    marks: np.ndarray | None  # [N, k] int32 in {-1, 0, +1} (annotate)


class Provenance(NamedTuple):
    """Who gave each label, and how long it took them."""

    who: tuple[str | None, ...]  # a person's name, the synthetic labeler's, or None where unknown
    seconds: np.ndarray  # [N] float64: from the clips' showing to the answer; NaN where unknown
    query_id: np.ndarray  # [N] int64: the query's id in the run's label store; -1 where none

    @classmethod
    def unknown(cls, rows: int, who: str | None = None) -> "Provenance":
        return cls((who,) * rows, np.full(rows, np.nan), np.full(rows, -1, np.int64))


class LabelDataset(NamedTuple):
    info: DatasetInfo
    rows: LabelRows
    provenance: Provenance


class Column(NamedTuple):
    """One column of a dataset, as the card documents it."""

    name: str
    type: str  # the element type and per-row shape
    meaning: str


def columns(info: DatasetInfo) -> list[Column]:
    """The columns of a dataset of ``info``, in their order: what the writer writes and the card shows."""
    k, frames = info.segment_length, [info.frames_per_segment, *info.frame_shape]
    frame_word = "stacked frames, each frame once" if info.stack > 1 else "observations"
    common = [Column("label", "int64", "the label's row in the run's label database (its order)"),
              Column("env_id", "string", "the environment, as rlhf-jax names it"),
              Column("env_options", "string (JSON)", "the environment's options: everything but its copies and seed")]
    tail = [Column("who", "string", "who answered: a person's name, or the synthetic labeler's; null if unknown"),
            Column("seconds", "float64", "seconds from the clips' showing to the answer; null for synthetic labels"),
            Column("query_id", "int64", "the query's id in the run's labels.sqlite; null for synthetic labels")]
    if info.kind == "annotate":
        return common + [
            Column("frames", f"{info.observation_dtype} {frames}", f"the clip's {frame_word}, oldest first"),
            Column("restart", f"bool {[k]}", "step t's observation does not continue step t-1's (a new episode)"),
            Column("marks", f"int32 {[k]}", "+1 progress, -1 regress, 0 no mark, one per step"),
        ] + tail
    action = f"{info.action_dtype} {[k, *info.action_shape]}"
    pair = []
    for side, name in ((0, "left"), (1, "right")):
        pair += [Column(f"frames_{side}", f"{info.observation_dtype} {frames}",
                        f"segment {side}'s {frame_word}, oldest first (shown {name})"),
                 Column(f"restart_{side}", f"bool {[k]}", f"step t of segment {side} does not continue step t-1's")]
    pair += [Column(f"action_{side}", action, f"segment {side}'s actions") for side in (0, 1)]
    answer = [Column("mu", "float32", "the answer: P[segment 0 preferred], 1.0, 0.0 or 0.5 (tie)"),
              Column("choice", "string", "the same in words: left, right or tie")]
    answer += [Column(f"oracle_return_{side}", "float32", f"segment {side}'s summed true reward; null if unknown")
               for side in (0, 1)]
    if info.members:
        answer.append(Column("holdout", f"bool {[info.members]}",
                             "held out of reward-model member m's training, for its validation, in the source run"))
    return common + pair + answer + tail


# --------------------------------------------------------------------------- from a run


def from_run(run_dir: str | Path) -> LabelDataset:
    """The labels of the finished run in ``run_dir``: its ``labels.npz``, with who gave each."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)  # a one-line error for a missing or foreign directory
    path = run_dir / LABELS_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {LABELS_FILE}: a run writes it when it finishes "
                          f"(rlhf-jax train --resume {run_dir} finishes it)")
    return _from_npz(path, config, run_dir)


def _from_npz(path: Path, config: dict | None, run_dir: Path | None) -> LabelDataset:
    """A ``labels.npz``: a run's (``config`` its config, read from ``run_dir``) or one that
    ``labels import`` wrote (its :class:`DatasetInfo` inside; ``config`` None)."""
    arrays = _read_npz(path)
    if config is None:
        if "dataset_info" not in arrays:
            raise ConfigError(f"{path} says nothing of its environment: give the run directory it belongs to, or "
                              f"a {LABELS_FILE} written by rlhf-jax labels import")
        info = DatasetInfo.from_json(str(arrays["dataset_info"]), path)
        info = dataclasses.replace(info, source=str(path))
        kind = info.kind
    else:
        reward = config.get("reward", "env")
        if reward not in KINDS:
            raise ConfigError(f"{run_dir} learned from the environment's reward (reward: {reward}): it has no labels")
        kind = KINDS[reward]
    needed = ("obs", "action", "mu", "oracle_return") if kind == "compare" else ("obs", "marks")
    missing = [key for key in needed if key not in arrays]
    if missing:
        raise ConfigError(f"{path} holds no {', '.join(missing)}: it is not the labels of a "
                          f"{'preferences' if kind == 'compare' else 'ibt'} run")
    obs = arrays["obs"] if kind == "compare" else arrays["obs"][:, None]
    rows = obs.shape[0]
    stack = int(obs.shape[-1]) if is_atari_frames(obs.shape[3:]) else 1
    frames, restart = frames_on_host(obs, stack)
    holdout = arrays.get("holdout")
    if kind == "compare":
        labels = LabelRows(frames, restart, arrays["action"], arrays["mu"], arrays["oracle_return"],
                           holdout, None)
    else:
        labels = LabelRows(frames, restart, None, None, None, holdout, arrays["marks"])
    if config is None:
        return LabelDataset(info, labels, _npz_provenance(arrays, rows))
    env = build(EnvConfig, config.get("env", {}), "env")
    action = arrays.get("action")
    info = DatasetInfo(
        kind=kind, env=env, rows=rows, segment_length=int(obs.shape[2]), stack=stack,
        frame_shape=tuple(frames.shape[3:]), observation_dtype=str(obs.dtype),
        action_shape=tuple(action.shape[3:]) if kind == "compare" else (),
        action_dtype=str(action.dtype) if kind == "compare" else "",
        members=0 if holdout is None else int(holdout.shape[1]),
        labeler=config.get("labeler", "synthetic"), source=str(run_dir),
        run_config=(run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    return LabelDataset(info, labels, _run_provenance(run_dir, config, info, labels))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a NumPy archive of labels ({error})") from None


def _npz_provenance(arrays: dict, rows: int) -> Provenance:
    if "who" not in arrays:
        return Provenance.unknown(rows)
    who = tuple(str(name) or None for name in arrays["who"])
    return Provenance(who, arrays["seconds"].astype(np.float64), arrays["query_id"].astype(np.int64))


def synthetic_labeler(config: dict, kind: str) -> str:
    """The name a synthetic labeler gives its labels: ``oracle`` (the paper's perfect one), or
    ``teacher(...)`` / ``annotator(...)`` with the settings that differ from the defaults."""
    if kind == "compare":
        name, section = "oracle", build(TeacherConfig, config.get("preferences", {}).get("teacher", {}),
                                        "preferences.teacher")
    else:
        name, section = "annotator", build(AnnotatorConfig, config.get("ibt", {}).get("annotator", {}),
                                           "ibt.annotator")
    changed = [f"{f.name}={getattr(section, f.name)}" for f in dataclasses.fields(section)
               if getattr(section, f.name) != f.default]
    if not changed:
        return name
    return f"{'teacher' if kind == 'compare' else name}({', '.join(changed)})"


def _digest(*arrays: np.ndarray) -> bytes:
    """A label's fingerprint: its segments' frames and actions (and answer), byte for byte."""
    hasher = hashlib.blake2b(digest_size=20)
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.digest()


def _row_digest(labels: LabelRows, i: int) -> bytes:
    if labels.mu is not None:
        return _digest(labels.frames[i], labels.action[i], labels.mu[i:i + 1])
    return _digest(labels.frames[i], labels.marks[i])


def _run_provenance(run_dir: Path, config: dict, info: DatasetInfo, labels: LabelRows) -> Provenance:
    """Who gave each of a run's labels: a dataset it started from (``preferences.labels_from``,
    ``ibt.marks_from``) for those it gave, people (``labels.sqlite``) or the synthetic labeler
    for the rest."""
    rows = info.rows
    who: list[str | None] = [None] * rows
    seconds, query_id = np.full(rows, np.nan), np.full(rows, -1, np.int64)
    found = np.zeros(rows, bool)
    given_key = feedback_of(info.kind).answers_from
    section, key = given_key.split(".")
    given = config.get(section, {}).get(key, "")
    sources = []
    if given:
        try:
            sources.append(load_labels(given))
        except ConfigError as error:
            raise ConfigError(f"{run_dir} started from {given_key} {given}, which cannot be read "
                              f"now ({error}), so which labels it gave cannot be told") from None
    if info.labeler == "people" and (run_dir / STORE_FILE).is_file():
        sources.append(_people_labels(run_dir, info))
    for source in sources:
        index: dict[bytes, list[int]] = {}
        for j in range(source.info.rows):
            index.setdefault(_row_digest(source.rows, j), []).append(j)
        for i in np.flatnonzero(~found):
            matches = index.get(_row_digest(labels, i))
            if matches:
                j = matches.pop(0)
                who[i], seconds[i], query_id[i] = (source.provenance.who[j], source.provenance.seconds[j],
                                                   source.provenance.query_id[j])
                found[i] = True
    if info.labeler == "synthetic":
        name = synthetic_labeler(config, info.kind)
        who = [name if not found[i] else who[i] for i in range(rows)]
    return Provenance(tuple(who), seconds, query_id)


def _people_labels(run_dir: Path, info: DatasetInfo) -> LabelDataset:
    """The answers in a run's label store with their queries' segments, as label rows (those
    "can't tell", never stored as labels, left out)."""
    answered = [(query, answer) for query, answer in read_answered(run_dir / STORE_FILE, info.kind)
                if answer.choice != "cant_tell" and (run_dir / QUERIES_DIR / query.segments).is_file()]
    obs, action, mu, marks = [], [], [], []
    for query, answer in answered:
        with np.load(run_dir / QUERIES_DIR / query.segments, allow_pickle=False) as arrays:
            obs.append(arrays["obs"].astype(info.observation_dtype))
            action.append(arrays["action"])
        if info.kind == "compare":
            mu.append(CHOICE_MU[answer.choice])
        else:
            row = np.zeros(query.frames, np.int32)
            for step, sign in answer.marks:
                row[step] = sign
            marks.append(row)
    empty = (0, info.segments, info.segment_length, *info.observation_shape)
    frames, restart = frames_on_host(np.stack(obs) if obs else np.zeros(empty, info.observation_dtype), info.stack)
    if info.kind == "compare":
        labels = LabelRows(frames, restart, np.stack(action).astype(info.action_dtype) if action else None,
                           np.asarray(mu, np.float32), None, None, None)
    else:
        labels = LabelRows(frames, restart, None, None, None, None, np.stack(marks) if marks else None)
    provenance = Provenance(tuple(answer.who for _, answer in answered),
                            np.array([np.nan if a.seconds is None else a.seconds for _, a in answered], np.float64),
                            np.array([query.id for query, _ in answered], np.int64))
    return LabelDataset(dataclasses.replace(info, rows=len(answered)), labels, provenance)


# ------------------------------------------------------------------- Parquet and the card


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


def load_labels(path: str | Path) -> LabelDataset:
    """The labels at ``path``: a dataset directory, a finished run's directory, or a ``labels.npz``
    (``labels import``'s, or a run's with its ``config.yaml`` beside it)."""
    path = Path(path)
    if path.is_dir() and (path / DATA_DIR).is_dir():
        return read(path)
    if path.is_dir() and (path / CONFIG_FILE).is_file():
        return from_run(path)
    if path.is_file() and path.suffix == ".npz":
        beside = path.parent / CONFIG_FILE
        if beside.is_file() and path.name == LABELS_FILE and "dataset_info" not in _npz_keys(path):
            return _from_npz(path, read_run_config(path.parent), path.parent)
        return _from_npz(path, None, None)
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    raise ConfigError(f"{path} is not a label dataset, a run directory or a {LABELS_FILE}")


def _npz_keys(path: Path) -> list[str]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return list(archive.files)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a NumPy archive of labels ({error})") from None


def labels_info(path: str | Path) -> tuple[DatasetInfo, LabelDataset | None]:
    """What :func:`load_labels` would read at ``path``, without reading a dataset directory's
    rows: ``(info, the labels if they had to be read for it, else None)``."""
    path = Path(path)
    if path.is_dir() and (path / DATA_DIR).is_dir():
        return read_info(path), None
    dataset = load_labels(path)
    return dataset.info, dataset


# ------------------------------------------------------------------------ labels.npz


def write_labels_npz(dataset: LabelDataset, path: str | Path) -> Path:
    """``dataset`` as a run's ``labels.npz`` (the same arrays, observations as whole stacks), with
    its :class:`DatasetInfo` and who gave each label beside them, so that nothing is lost."""
    info, labels, provenance = dataset
    obs = stacks_on_host(labels.frames, labels.restart, info.stack)
    if info.kind == "compare":
        arrays = dict(obs=obs, action=labels.action, mu=labels.mu, oracle_return=labels.oracle_return)
        if labels.holdout is not None:
            arrays["holdout"] = labels.holdout
    else:
        arrays = dict(obs=obs[:, 0], marks=labels.marks)
    arrays.update(dataset_info=np.array(info.to_json()), who=np.array([w or "" for w in provenance.who], str),
                  seconds=provenance.seconds, query_id=provenance.query_id)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as file:
            np.savez_compressed(file, **arrays)
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {error}") from None
    return path


def import_labels(dataset_dir: str | Path, target: str | Path) -> Path:
    """``labels import``: the dataset at ``dataset_dir`` as a ``labels.npz``: ``target`` itself
    if it names a ``.npz``, else ``target/labels.npz`` of a run directory whose environment and
    reward agree with the dataset's. Never over an existing file."""
    dataset = read(dataset_dir)
    target = Path(target)
    if target.suffix == ".npz":
        if not target.parent.is_dir():
            raise ConfigError(f"{target.parent} does not exist: the directory for {target.name} must")
        path = target
    else:
        config = read_run_config(target)
        reward = config.get("reward", "env")
        if KINDS.get(reward) != dataset.info.kind:
            raise ConfigError(f"{target} learns from reward: {reward}, but {dataset_dir} holds "
                              f"{'preferences' if dataset.info.kind == 'compare' else 'IBT marks'}")
        mismatch = task_mismatch(dataset.info.env, build(EnvConfig, config.get("env", {}), "env"))
        if mismatch:
            raise ConfigError(f"{dataset_dir} was labelled on another environment than {target}'s: {mismatch}")
        path = target / LABELS_FILE
    if path.exists():
        raise ConfigError(f"{path} already exists: give a new .npz path")
    return write_labels_npz(dataset, path)


# ------------------------------------------------------------------------------ the card


def size_category(rows: int) -> str:
    """The Hugging Face card's ``size_categories`` entry for ``rows`` rows."""
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if rows < limit:
            return name
    return "1M<n<10M"


def card(dataset: LabelDataset, license: str, nbytes: int) -> str:
    """The dataset card (``README.md``): YAML front matter, then what the dataset holds, how it
    was made, its fields and how to load it."""
    info, _, provenance = dataset
    compare = info.kind == "compare"
    what = "preferences between pairs of" if compare else "progress and regress marks on"
    front = {
        "license": license,
        "pretty_name": f"{'Preference' if compare else 'IBT'} labels on {info.env.id} ({info.rows} labels)",
        "task_categories": ["reinforcement-learning"],
        "tags": ["rlhf", "human-feedback", "preference-learning" if compare else "inter-temporal-bradley-terry",
                 "rlhf-jax"],
        "size_categories": [size_category(info.rows)],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": f"{DATA_DIR}/*.parquet"}]}],
    }
    people = sorted({w for w in provenance.who if w})
    seconds = provenance.seconds[~np.isnan(provenance.seconds)]
    env_options = {k: v for k, v in to_dict(info.env).items() if k not in ("id", *HOW_RUN)}
    run = parse_yaml(info.run_config) if info.run_config else {}
    lines = [
        "---", dump_yaml(front).rstrip(), "---", "",
        f"# {front['pretty_name']}", "",
        f"{info.rows} labels: {what} {info.segment_length}-step segments of `{info.env.id}`, "
        f"{'answered' if compare else 'annotated'} by "
        + (f"{len(people)} {'person' if len(people) == 1 else 'people'}" if info.labeler == "people"
           else f"a synthetic labeler ({', '.join(people) or 'unknown'})")
        + f". {nbytes / 2**20:.1f} MiB of Parquet.", "",
        "## How it was made", "",
        f"Exported with `rlhf-jax labels export` from `{info.source}`"
        + (f", where {run.get('agent', '?')} learned from "
           f"{'preferences' if compare else 'IBT marks'} ({run.get('name', 'a run')})" if run else "") + ". "
        + ("Each segment was cut from the agent's recent play; the pairs were chosen as the run's queries "
           "(Christiano et al. 2017, section 2.2) and the answer is the probability that the left segment is "
           "the better one." if compare else
           "Each clip was cut from the agent's recent play and marked step by step (the IBT paper, "
           "DeepMind 2022)."), "",
        f"* Environment: `{info.env.id}` with options `{json.dumps(env_options)}`",
        f"* Labeler: {info.labeler}"
        + (f" ({len(people)} named; {len(seconds)} answers timed, median {np.median(seconds):.1f} s)"
           if info.labeler == "people" and len(seconds) else ""),
        f"* Observations: {info.observation_dtype} {list(info.observation_shape)}"
        + (f", stored as {info.frames_per_segment} frames of {list(info.frame_shape)} per segment "
           f"(each of the {info.stack}-frame stacks' frames once)" if info.stack > 1 else ""),
    ]
    if compare:
        lines.append(f"* Actions: {info.action_dtype} {list(info.action_shape) or 'scalar'} per step")
    if info.run_config:
        lines += ["", "The source run's config:", "", "```yaml", info.run_config.rstrip(), "```"]
    lines += ["", "## Fields", "", "One row per label.", "", "| column | type [shape per row] | meaning |",
              "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.type} | {c.meaning} |" for c in columns(info)]
    if info.stack > 1:
        lines += ["", "Stacked frames are stored once: a segment of k steps keeps its first observation's "
                  f"{info.stack} frames, then each later step's newest frame. Step t's stack is "
                  "`frames[max(t + c, floor(t))]` for channels c = 0 .. stack - 1, where `floor(t)` is the "
                  "newest frame of the last restarted step at or before t (0 if none): "
                  "`rlhf_jax.reward.data.segment_stacks` rebuilds them."]
    lines += ["", "## Loading", "", "```python", "import datasets", "",
              'labels = datasets.load_dataset("parquet", data_files="data/*.parquet", split="train")',
              'row = labels.with_format("numpy")[0]  # integers come back as int64: cast with .astype',
              "```", "", "With rlhf-jax, observations rebuilt and dtypes kept:", "", "```python",
              "from rlhf_jax.label_datasets import read", "",
              "dataset = read(\"PATH/TO/THIS/DIRECTORY\")  # .info, .rows (arrays), .provenance", "```", "",
              "```bash",
              "rlhf-jax labels import THIS_DIR labels.npz              # the run format",
              "rlhf-jax fit-reward THIS_DIR --out reward_model.npz    # a reward model fitted offline",
              f"rlhf-jax train CONFIG {feedback_of(info.kind).answers_from}=THIS_DIR  # a run starting from these "
              f"{'labels' if compare else 'marks'}",
              "```", "", "## Citation", "",
              "Christiano, Leike, Brown, Martic, Legg and Amodei: Deep reinforcement learning from human "
              "preferences. NeurIPS 2017." if compare else
              "DeepMind Interactive Agents Team: Improving multimodal interactive agents with "
              "reinforcement learning from human feedback. 2022.", ""]
    return "\n".join(lines)
