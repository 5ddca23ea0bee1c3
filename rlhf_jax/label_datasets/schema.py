"""What a label dataset is: its description (:class:`DatasetInfo`), its rows, who gave them,
and the columns a dataset directory stores them in."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import NamedTuple

import numpy as np

from rlhf_jax.config_base import build, to_dict
from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.kinds import CHOICE_MU, KINDS, Column, FeedbackKind, kind_named

FORMAT = "rlhf_jax.label_dataset"
VERSION = 1
METADATA_KEY = b"rlhf_jax.label_dataset"  # the Parquet schema metadata key of a DatasetInfo
DATA_DIR = "data"
CARD_FILE = "README.md"
LABELS_FILE = "labels.npz"  # what a run writes when it finishes
CHOICE_NAMES = {mu: choice for choice, mu in CHOICE_MU.items() if mu is not None}  # an answer mu -> its word
MARKS = (-1, 0, 1)  # an IBT mark: regress, none, progress
NUMBER_DTYPES = {np.dtype(code).name for code in "?bhilqBHILQefd"}  # what observations and actions may be
SIDED = ("frames", "restart", "action", "oracle_return")  # a pair's fields, in columns <name>_0 and <name>_1


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds beside its rows (:mod:`rlhf_jax.label_datasets`)."""

    kind: str  # its FeedbackKind's name: "compare", preferences between 2 segments a row; "annotate", IBT marks on 1
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
    source: str  # what the labels were read from, by name: a run's directory or a file
    run_config: str = ""  # the source run's config.yaml, less the keys naming local files ("": unknown)
    # The last rows: answers people gave after the source run's last fit, which it never trained on.
    after_last_fit: int = 0

    @property
    def feedback(self) -> FeedbackKind:
        """The kind of feedback its rows are (:mod:`rlhf_jax.reward.kinds`), which says what a row holds."""
        return kind_named(self.kind)

    @property
    def segments(self) -> int:
        """Segments a row: 2 compared, or 1 annotated."""
        return self.feedback.segments

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (*self.frame_shape, self.stack) if self.stack > 1 else self.frame_shape

    @property
    def frames_per_segment(self) -> int:
        return self.segment_length + self.stack - 1

    def arrays(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The :class:`LabelRows` fields a dataset of this description holds, each as its
        ``(shape, dtype)``; the fields not named are None."""
        n, c, k = self.rows, self.segments, self.segment_length
        return {"frames": ((n, c, self.frames_per_segment, *self.frame_shape), self.observation_dtype),
                "restart": ((n, c, k), "bool"), **self.feedback.answer_arrays(self)}

    def untrained(self) -> str:
        """The sentence that the export prints and the card states of :attr:`after_last_fit` ("" for none)."""
        if not self.after_last_fit:
            return ""
        last = "the last row" if self.after_last_fit == 1 else f"the last {self.after_last_fit} rows"
        return (f"{self.after_last_fit} of the {self.rows} labels arrived after the run's last fit ({last}): "
                f"the run never trained on them; a run started from these labels does.")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's arrays, before compression."""
        return sum(math.prod(shape[1:]) * np.dtype(dtype).itemsize for shape, dtype in self.arrays().values())

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
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - set(fields)
        if missing:
            raise ConfigError(f"{where}: its dataset metadata lacks {', '.join(sorted(missing))}")
        for name in ("frame_shape", "action_shape"):
            if not isinstance(fields[name], list):
                raise ConfigError(f"{where}: its dataset metadata's {name} is not a list of sizes")
            fields[name] = tuple(fields[name])
        fields["env"] = build(EnvConfig, fields["env"], "env")
        info = cls(**fields)
        problem = info._problem()
        if problem:
            raise ConfigError(f"{where}: its dataset metadata's {problem}")
        return info

    def _problem(self) -> str | None:
        """What makes this description one no dataset can have (as a file's metadata may say), or None."""
        try:
            kind_named(self.kind)
        except ValueError:
            return f"kind is {self.kind!r}, not {' or '.join(kind.name for kind in KINDS)}"
        for name, low in (("rows", 0), ("segment_length", 1), ("stack", 1), ("members", 0), ("after_last_fit", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                return f"{name} is {value!r}, not a whole number of at least {low}"
        if self.after_last_fit > self.rows:
            return f"after_last_fit is {self.after_last_fit}, more than its {self.rows} rows"
        for name in ("frame_shape", "action_shape"):
            if not all(type(size) is int and size >= 1 for size in getattr(self, name)):
                return f"{name} is {list(getattr(self, name))}, not sizes of at least 1"
        for name in ("observation_dtype", "action_dtype") if self.feedback.keeps_actions else ("observation_dtype",):
            dtype = getattr(self, name)
            if not isinstance(dtype, str) or dtype not in NUMBER_DTYPES:
                return f"{name} is {dtype!r}, not the name of a NumPy number type (uint8, int32, float32, ...)"
        for name in ("labeler", "source", "run_config"):
            if not isinstance(getattr(self, name), str):
                return f"{name} is not text"
        return None


class LabelRows(NamedTuple):
    """Every label's answer with its segments, row for row (``N`` rows, ``c`` segments a row)."""

    frames: np.ndarray  # [N, c, k + stack - 1, *frame_shape]: each segment's frames, oldest first
    restart: np.ndarray  # [N, c, k] bool: step t's stack does not continue step t-1's
    action: np.ndarray | None  # [N, c, k, *action_shape] (compare)
    mu: np.ndarray | None  # [N] float32: P[segment 0 preferred] (compare)
    oracle_return: np.ndarray | None  # [N, c] float32: summed oracle reward, NaN where unknown (compare)
    holdout: np.ndarray | None  # [N, M] bool: held out of ensemble member m's training (None: not kept)
    marks: np.ndarray | None  # [N, k] int32 in {-1, 0, +1} (annotate)

    @classmethod
    def empty(cls, info: DatasetInfo) -> "LabelRows":
        """Arrays of ``info``'s shapes to fill, their memory not yet touched."""
        arrays = {name: np.empty(shape, dtype) for name, (shape, dtype) in info.arrays().items()}
        return cls(**{name: arrays.get(name) for name in cls._fields})


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


def columns(info: DatasetInfo) -> list[Column]:
    """The columns of a dataset of ``info``, in their order: what the writer writes, the reader
    requires, type for type, and the card shows."""
    frame_word = "stacked frames, each frame once" if info.stack > 1 else "observations"
    common = [Column("label", "int64", (), "the label's row in the run's label database (its order)"),
              Column("env_id", "string", (), "the environment, as rlhf-jax names it"),
              Column("env_options", "string", (), "the environment's options as JSON: everything but its copies "
                                                   "and seed")]
    tail = [Column("who", "string", (), "who answered: a person's name, or the synthetic labeler's; null if unknown"),
            Column("seconds", "float64", (), "seconds from the clips' showing to the answer; null for synthetic "
                                             "labels"),
            Column("query_id", "int64", (), "the query's id in the run's labels.sqlite; null for synthetic labels")]
    return common + info.feedback.columns(info, frame_word) + tail
