"""The checks a dataset passes before anything trusts it, wherever it was read from: arrays of
the shapes and dtypes its :class:`~rlhf_jax.label_datasets.schema.DatasetInfo` says, answers
and marks in their sets, every number finite (NaN only where a value may be unknown: an oracle
return, the seconds an answer took), and actions in the task's action space. A dataset that
fails is refused in one line naming the column and the row: a label out of its range would
otherwise train a reward model on nonsense (a negative loss, or NaN) without a word."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlhf_jax.envs.core import Box, Discrete
from rlhf_jax.errors import ConfigError
from rlhf_jax.label_datasets.schema import CHOICE_NAMES, MARKS, SIDED, LabelDataset

CHUNK_BYTES = 16 * 2**20  # an array is checked this many bytes at a time, so a check takes little memory


def check_rows(dataset: LabelDataset, where) -> None:
    """Refuse ``dataset`` (read from ``where``) unless its rows are what its info says, each
    value in its range."""
    info, rows, provenance = dataset
    for name, (shape, dtype) in info.arrays().items():
        array = getattr(rows, name)
        if array is None or array.shape != shape or array.dtype != np.dtype(dtype):
            held = "nothing" if array is None else f"{array.dtype} {list(array.shape)}"
            raise ConfigError(f"{where}: {name} holds {held}, its metadata says {dtype} {list(shape)}")
    for name, array, dtype in (("seconds", provenance.seconds, "float64"), ("query_id", provenance.query_id, "int64")):
        if array.shape != (info.rows,) or array.dtype != np.dtype(dtype):
            raise ConfigError(f"{where}: {name} holds {array.dtype} {list(array.shape)}, not {dtype} [{info.rows}]")
    if len(provenance.who) != info.rows:
        raise ConfigError(f"{where}: who holds {len(provenance.who)} names for {info.rows} rows")

    def refuse_unless(name: str, values: np.ndarray, ok: Callable, problem: str) -> None:
        # A pair's fields are in a column per segment (<name>_0, <name>_1); a single clip's in one.
        _refuse_unless(values, ok, problem, where, name, sided=info.segments > 1 and name in SIDED)

    # Each field the dataset's kind of answers holds (info.arrays(), checked above), in its range.
    if np.issubdtype(rows.frames.dtype, np.floating):
        refuse_unless("frames", rows.frames, np.isfinite, "not finite")
    if rows.mu is not None:
        refuse_unless("mu", rows.mu, lambda v: np.isin(v, list(CHOICE_NAMES)),
                      "not an answer: 1 (left), 0 (right) or 0.5 (a tie)")
    if rows.oracle_return is not None:
        refuse_unless("oracle_return", rows.oracle_return, lambda v: ~np.isinf(v), "not finite (null if unknown)")
    if rows.action is not None and np.issubdtype(rows.action.dtype, np.floating):
        refuse_unless("action", rows.action, np.isfinite, "not finite")
    elif rows.action is not None and np.issubdtype(rows.action.dtype, np.integer):
        refuse_unless("action", rows.action, lambda v: v >= 0, "outside the action space")
    if rows.marks is not None:
        refuse_unless("marks", rows.marks, lambda v: np.isin(v, MARKS), "not a mark: -1, 0 or 1")
    refuse_unless("seconds", provenance.seconds, lambda v: ~np.isinf(v) & ~(v < 0),
                  "not a time in seconds (null if unknown)")
    refuse_unless("query_id", provenance.query_id, lambda v: v >= -1, "not a query id (null if none)")


def check_actions(dataset: LabelDataset, space: Discrete | Box, where) -> None:
    """Refuse ``dataset`` unless its actions are the task's: integers in ``[0, n)`` for
    ``Discrete(n)``, real numbers for a box (which may lie past its bounds, as a policy draws
    them: ``reward_model.clip_actions`` decides how r̂ reads them)."""
    action = dataset.rows.action
    if action is None:  # IBT keeps no actions
        return
    integers = isinstance(space, Discrete)
    if not np.issubdtype(action.dtype, np.integer if integers else np.floating):
        raise ConfigError(f"{where}: action_0 and action_1 are {action.dtype}, the task's actions ({space}) are "
                          f"{'integers' if integers else 'real numbers'}")
    if integers:
        _refuse_unless(action, lambda v: (v >= 0) & (v < space.n), f"outside the action space {space}", where,
                       "action", sided=True)


def _refuse_unless(values: np.ndarray, ok: Callable, problem: str, where, name: str, sided: bool) -> None:
    """A one-line error at the first element of ``values`` that ``ok`` refuses, naming its
    column (``<name>_<side>`` for a pair's ``sided`` field) and row."""
    step = max(1, CHUNK_BYTES // max(1, values[0].nbytes)) if len(values) else 1
    for start in range(0, len(values), step):
        part = values[start:start + step]
        good = ok(part)
        if not good.all():
            index = np.unravel_index(np.argmin(good), good.shape)
            column = f"{name}_{index[1]}" if sided else name
            raise ConfigError(f"{where}: {column}, row {start + index[0]}: {part[index]} is {problem}")
