"""What the experiments share beyond the benchmarks' helpers: their results of record go to
``experiments/results/``, not beside the benchmarks' figures."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from benchmarks import common
from benchmarks.common import Headline

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, result: dict, headline: Callable[[dict], list[Headline]] | None = None,
                 merge: bool = False) -> Path:
    """:func:`benchmarks.common.write_result`, into ``experiments/results/<name>.json``."""
    return common.write_result(name, result, headline, merge, results=RESULTS)
