"""What a label dataset is: its description (:class:`DatasetInfo`), its rows, who gave them,
and the columns a dataset directory stores them in."""
from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import numpy as np

from rlhf_jax.config_base import build, to_dict
from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.learner import FEEDBACK

FORMAT = "rlhf_jax.label_dataset"
VERSION = 1
METADATA_KEY = b"rlhf_jax.label_dataset"  # the Parquet schema metadata key of a DatasetInfo
DATA_DIR = "data"
CARD_FILE = "README.md"
LABELS_FILE = "labels.npz"  # what a run writes when it finishes
KINDS = {feedback.reward: feedback.kind for feedback in FEEDBACK.values()}  # a run's reward -> its labels' kind


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds beside its rows (:mod:`rlhf_jax.label_datasets`)."""

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

