"""The run format, ``labels.npz``: the label database's arrays with whole observations. A run
writes one when it finishes; ``labels import`` writes one from a dataset, with the dataset's
:class:`DatasetInfo` and who gave each label beside the arrays, so that nothing is lost."""
from __future__ import annotations

import dataclasses
import math
import os
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rlhf_jax.config_base import build, read_run_config
from rlhf_jax.envs import make
from rlhf_jax.envs.options import EnvConfig, task_mismatch
from rlhf_jax.errors import ConfigError
from rlhf_jax.files import refuse_to_overwrite
from rlhf_jax.label_datasets.check import check_actions, check_rows
from rlhf_jax.label_datasets.parquet import read
from rlhf_jax.label_datasets.schema import LABELS_FILE, DatasetInfo, LabelDataset, LabelRows, Provenance
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.reward.data import frames_on_host, stacks_on_host
from rlhf_jax.reward.kinds import FeedbackKind, feedback_kind

OBS_BYTES = 8 * 2**20  # whole-stack observations are written this many bytes at a time


@contextmanager
def _archive(path: Path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            yield archive
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a NumPy archive of labels ({error})") from None


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    with _archive(path) as archive:
        return {key: archive[key] for key in archive.files}


def array_names(path: Path) -> list[str]:
    with _archive(path) as archive:
        return list(archive.files)


def label_rows(arrays: dict[str, np.ndarray], kind: FeedbackKind, path: Path) -> LabelRows:
    """The rows of a ``labels.npz``'s ``arrays`` holding labels of ``kind``, stacked frames
    stored once (:func:`~rlhf_jax.reward.data.frames_on_host`). The archive holds ``obs`` and
    the kind's answer fields (:attr:`~rlhf_jax.reward.kinds.FeedbackKind.answer_fields`) by
    their names, and ``holdout`` where it kept one."""
    missing = [key for key in ("obs", *kind.answer_fields) if key not in arrays]
    if missing:
        raise ConfigError(f"{path} holds no {', '.join(missing)}: it is not the labels of a {kind.reward} run")
    obs = kind.from_npz_obs(arrays["obs"])
    if obs is None:
        raise ConfigError(f"{path}: its obs are {arrays['obs'].dtype} {list(arrays['obs'].shape)}, not "
                          f"{kind.npz_obs}")
    stack = int(obs.shape[-1]) if is_atari_frames(obs.shape[3:]) else 1
    frames, restart = frames_on_host(obs, stack)
    rows = dict.fromkeys(LabelRows._fields)  # the other kind's fields: None
    rows.update({name: arrays[name] for name in kind.answer_fields}, frames=frames, restart=restart,
                holdout=arrays.get("holdout"))
    return LabelRows(**rows)


def from_npz(path: Path) -> LabelDataset:
    """A ``labels.npz`` that ``labels import`` wrote: its :class:`DatasetInfo` is inside."""
    arrays = read_arrays(path)
    if "dataset_info" not in arrays:
        raise ConfigError(f"{path} says nothing of its environment: give the run directory it belongs to, or "
                          f"a {LABELS_FILE} written by rlhf-jax labels import")
    info = DatasetInfo.from_json(str(arrays["dataset_info"]), path)
    info = dataclasses.replace(info, source=path.name)
    labels = label_rows(arrays, info.feedback, path)
    if "who" not in arrays:
        provenance = Provenance.unknown(info.rows)
    else:
        provenance = Provenance(tuple(str(name) or None for name in arrays["who"]), arrays["seconds"],
                                arrays["query_id"])
    dataset = LabelDataset(info, labels, provenance)
    check_rows(dataset, path)
    return dataset


def write_labels_npz(dataset: LabelDataset, path: str | Path) -> Path:
    """``dataset`` as a run's ``labels.npz`` (the same arrays, observations as whole stacks), with
    its :class:`DatasetInfo` and who gave each label beside them, so that nothing is lost."""
    info, labels, provenance = dataset
    arrays = {name: getattr(labels, name) for name in info.feedback.answer_fields}
    if labels.holdout is not None:
        arrays["holdout"] = labels.holdout
    arrays.update(dataset_info=np.array(info.to_json()), who=np.array([w or "" for w in provenance.who], str),
                  seconds=provenance.seconds, query_id=provenance.query_id)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    refuse_to_overwrite(partial, "a write that stopped left it, or it is someone's: remove it, or give a new path")
    try:
        # What np.savez_compressed writes, but the observations a few rows at a time.
        with open(partial, "wb") as file, zipfile.ZipFile(file, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as npz:
            _write_observations(npz, info, labels)
            for name, array in arrays.items():
                with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {error}") from None
    return path


def _write_observations(npz: zipfile.ZipFile, info: DatasetInfo, labels: LabelRows) -> None:
    """``obs.npy``: every observation as a whole stack (:func:`~rlhf_jax.reward.data.stacks_on_host`),
    rebuilt and written :data:`OBS_BYTES` at a time: Atari's are 4 times the frames, which a
    dataset of zeros holds in a few kilobytes."""
    kind = info.feedback
    every = (info.rows, info.segments, info.segment_length, *info.observation_shape)
    shape = kind.to_npz_obs(np.broadcast_to(np.zeros((), np.uint8), every)).shape  # as labels.npz keeps them
    dtype = np.dtype(info.observation_dtype)
    step = max(1, OBS_BYTES // max(1, math.prod(shape[1:]) * dtype.itemsize))
    with npz.open("obs.npy", "w", force_zip64=True) as member:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(member, header)
        for start in range(0, info.rows, step):
            part = stacks_on_host(labels.frames[start:start + step], labels.restart[start:start + step], info.stack)
            member.write(kind.to_npz_obs(part).tobytes())


def import_labels(dataset_dir: str | Path, target: str | Path) -> Path:
    """``labels import``: the dataset at ``dataset_dir`` as a ``labels.npz``: ``target`` itself
    if it names a ``.npz``, else ``target/labels.npz`` of a run directory whose environment and
    reward agree with the dataset's. Never over an existing file."""
    dataset = read(dataset_dir)
    check_actions(dataset, make(dataclasses.replace(dataset.info.env, num_envs=1)).spec.action_space, dataset_dir)
    target = Path(target)
    if target.suffix == ".npz":
        if not target.parent.is_dir():
            raise ConfigError(f"{target.parent} does not exist: the directory for {target.name} must")
        path = target
    else:
        config = read_run_config(target)
        reward = config.get("reward", "env")
        if feedback_kind(reward) is not dataset.info.feedback:
            raise ConfigError(f"{target} learns from reward: {reward}, but {dataset_dir} holds "
                              f"{dataset.info.feedback.learns_from}")
        mismatch = task_mismatch(dataset.info.env, build(EnvConfig, config.get("env", {}), "env"))
        if mismatch:
            raise ConfigError(f"{dataset_dir} was labelled on another environment than {target}'s: {mismatch}")
        path = target / LABELS_FILE
    refuse_to_overwrite(path, "give a new .npz path")
    return write_labels_npz(dataset, path)
