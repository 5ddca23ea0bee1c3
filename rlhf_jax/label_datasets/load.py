"""Labels from wherever they are kept: a dataset directory, a finished run (its ``labels.npz``,
with who gave each label), or a ``labels.npz`` that ``labels import`` wrote."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np

from rlhf_jax.config import without_local_files
from rlhf_jax.config_base import CONFIG_FILE, build, dump_yaml, read_run_config
from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.labeler import QUERIES_DIR
from rlhf_jax.feedback.store import STORE_FILE, read_answered
from rlhf_jax.label_datasets.check import check_rows
from rlhf_jax.label_datasets.npz import array_names, from_npz, label_rows, read_arrays
from rlhf_jax.label_datasets.parquet import read, read_info
from rlhf_jax.label_datasets.schema import DATA_DIR, LABELS_FILE, DatasetInfo, LabelDataset, LabelRows, Provenance
from rlhf_jax.reward.data import frames_on_host
from rlhf_jax.reward.kinds import feedback_kind


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
        if beside.is_file() and path.name == LABELS_FILE and "dataset_info" not in array_names(path):
            return from_run(path.parent)
        return from_npz(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    raise ConfigError(f"{path} is not a label dataset, a run directory or a {LABELS_FILE}")


def labels_info(path: str | Path) -> tuple[DatasetInfo, LabelDataset | None]:
    """What :func:`load_labels` would read at ``path``, without reading a dataset directory's
    rows: ``(info, the labels if they had to be read for it, else None)``."""
    path = Path(path)
    if path.is_dir() and (path / DATA_DIR).is_dir():
        return read_info(path), None
    dataset = load_labels(path)
    return dataset.info, dataset


def from_run(run_dir: str | Path) -> LabelDataset:
    """The labels of the finished run in ``run_dir``: its ``labels.npz``, with who gave each, then
    the answers its label store holds that the run never trained on (:attr:`DatasetInfo.after_last_fit`)."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)  # a one-line error for a missing or foreign directory
    reward = config.get("reward", "env")
    kind = feedback_kind(reward)
    if kind is None:  # before labels.npz: resuming such a run never writes one
        raise ConfigError(f"{run_dir} learned from the environment's reward (reward: {reward}): it has no labels")
    path = run_dir / LABELS_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {LABELS_FILE}: a run writes it when it finishes "
                          f"(rlhf-jax train --resume {run_dir} finishes it)")
    labels = label_rows(read_arrays(path), kind, path)
    k = labels.restart.shape[2]
    info = DatasetInfo(
        kind=kind.name, env=build(EnvConfig, config.get("env", {}), "env"), rows=labels.frames.shape[0],
        segment_length=k, stack=labels.frames.shape[2] - k + 1, frame_shape=tuple(labels.frames.shape[3:]),
        observation_dtype=str(labels.frames.dtype),
        action_shape=tuple(labels.action.shape[3:]) if labels.action is not None else (),
        action_dtype=str(labels.action.dtype) if labels.action is not None else "",
        members=0 if labels.holdout is None else int(labels.holdout.shape[1]),
        # The run by its name and its config without this machine's paths: a dataset travels.
        labeler=config.get("labeler", "synthetic"), source=run_dir.resolve().name,
        run_config=dump_yaml(without_local_files(config)))
    provenance, late = _run_provenance(run_dir, config, info, labels)
    dataset = LabelDataset(info, labels, provenance)
    if late is not None and late.info.rows:  # a person's answer is never left out
        dataset = _followed_by(dataset, late)
    check_rows(dataset, path)
    return dataset


def _followed_by(dataset: LabelDataset, late: LabelDataset) -> LabelDataset:
    """``dataset`` with the rows of ``late``, answers its run never trained on, after its own (and
    counted: :attr:`DatasetInfo.after_last_fit`); held out of no member's validation, as none saw them."""
    rows, more = dataset.rows, late.rows
    if rows.holdout is not None:
        more = more._replace(holdout=np.zeros((late.info.rows, rows.holdout.shape[1]), bool))
    joined = LabelRows(*(None if first is None else np.concatenate([first, then]) for first, then in zip(rows, more)))
    (who, seconds, query_id), (late_who, late_seconds, late_query_id) = dataset.provenance, late.provenance
    provenance = Provenance(who + late_who, np.concatenate([seconds, late_seconds]),
                            np.concatenate([query_id, late_query_id]))
    info = dataclasses.replace(dataset.info, rows=dataset.info.rows + late.info.rows, after_last_fit=late.info.rows)
    return LabelDataset(info, joined, provenance)


def _digest(*arrays: np.ndarray) -> bytes:
    """A label's fingerprint: its segments' frames and actions (and answer), byte for byte."""
    hasher = hashlib.blake2b(digest_size=20)
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.digest()


def _row_digest(labels: LabelRows, i: int) -> bytes:
    # Each step's own frame, not the frames before the clip: a run that keeps none
    # (preferences.frames_before_clip) rebuilds its first stacks, which its queries hold as played.
    shown = labels.frames[i][:, -labels.restart.shape[2]:]
    if labels.mu is not None:
        return _digest(shown, labels.action[i], labels.mu[i:i + 1])
    return _digest(shown, labels.marks[i])


def _run_provenance(run_dir: Path, config: dict, info: DatasetInfo,
                    labels: LabelRows) -> tuple[Provenance, LabelDataset | None]:
    """Who gave each of a run's labels: a dataset it started from (``preferences.labels_from``,
    ``ibt.marks_from``) for those it gave, people (``labels.sqlite``) or the synthetic labeler
    for the rest. And, for a people run, the answers in its store that none of its labels is:
    those that arrived after its last fit (None for another run)."""
    rows = info.rows
    who: list[str | None] = [None] * rows
    seconds, query_id = np.full(rows, np.nan), np.full(rows, -1, np.int64)
    found = np.zeros(rows, bool)
    given_key = info.feedback.answers_key
    section, key = given_key.split(".")
    given = config.get(section, {}).get(key, "")
    sources, people = [], None
    if given:
        try:
            sources.append(load_labels(given))
        except ConfigError as error:
            raise ConfigError(f"{run_dir} started from {given_key} {given}, which cannot be read "
                              f"now ({error}), so which labels it gave cannot be told") from None
    if info.labeler == "people" and (run_dir / STORE_FILE).is_file():
        people = _people_labels(run_dir, info)
        sources.append(people)
    late = None
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
        if source is people:  # the answers no label matched, in the order they were given
            late = _subset(people, sorted(j for unmatched in index.values() for j in unmatched))
    if info.labeler == "synthetic":
        name = info.feedback.synthetic_labeler(config)
        who = [name if not found[i] else who[i] for i in range(rows)]
    return Provenance(tuple(who), seconds, query_id), late


def _subset(dataset: LabelDataset, rows: list[int]) -> LabelDataset:
    """The rows ``rows`` of ``dataset``, in that order."""
    labels = LabelRows(*(None if array is None else array[rows] for array in dataset.rows))
    who, seconds, query_id = dataset.provenance
    provenance = Provenance(tuple(who[j] for j in rows), seconds[rows], query_id[rows])
    return LabelDataset(dataclasses.replace(dataset.info, rows=len(rows)), labels, provenance)


def _people_labels(run_dir: Path, info: DatasetInfo) -> LabelDataset:
    """The answers in a run's label store with their queries' segments, as label rows in the
    order given (those "can't tell", never stored as labels, left out)."""
    answered = [(query, answer) for query, answer in read_answered(run_dir / STORE_FILE, info.kind)
                if answer.choice != "cant_tell" and (run_dir / QUERIES_DIR / query.segments).is_file()]
    kind, rows = info.feedback, len(answered)
    obs, values = [], {"action": [], "mu": [], "oracle_return": [], "marks": []}
    for query, answer in answered:
        with np.load(run_dir / QUERIES_DIR / query.segments, allow_pickle=False) as arrays:
            obs.append(arrays["obs"].astype(info.observation_dtype))
            values["action"].append(arrays["action"])
            values["oracle_return"].append(arrays["oracle_reward"].sum(-1))  # as the run stores a pair's
        mu, marks = kind.answer_of(answer.choice, answer.marks, query.frames)
        values["mu"].append(mu)
        values["marks"].append(marks)
    empty = (0, info.segments, info.segment_length, *info.observation_shape)
    frames, restart = frames_on_host(np.stack(obs) if obs else np.zeros(empty, info.observation_dtype), info.stack)
    # The kind's answer fields, of the shapes and dtypes its dataset holds them in (LabelRows.empty's).
    shapes = dataclasses.replace(info, rows=rows).arrays()
    labels = LabelRows(**{**dict.fromkeys(LabelRows._fields), "frames": frames, "restart": restart,
                          **{name: np.asarray(values[name], shapes[name][1]).reshape(shapes[name][0])
                             for name in kind.answer_fields}})
    provenance = Provenance(tuple(answer.who for _, answer in answered),
                            np.array([np.nan if a.seconds is None else a.seconds for _, a in answered], np.float64),
                            np.array([query.id for query, _ in answered], np.int64))
    return LabelDataset(dataclasses.replace(info, rows=len(answered)), labels, provenance)
