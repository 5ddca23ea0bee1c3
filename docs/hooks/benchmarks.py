"""MkDocs hook: the benchmarks page's results table, generated at build time.

The table is the benchmark report's own (``benchmarks/run.py``: every benchmark's headline
rows, each stored in its JSON by the benchmark script), followed by when each file was
written, then the rows of the results measured on an accelerator. The page holds the marker
``<!-- benchmark-results -->`` where they go, so no number on it is copied by hand.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # MkDocs loads a hook by its path: the repository is not on sys.path

from benchmarks.run import BENCHMARKS, accelerator_figures, accelerator_sources, load_source, table  # noqa: E402

MARKER = "<!-- benchmark-results -->"


def results_table() -> str:
    """The report's results table, then each source file with the date it was written."""
    sources = {b.name: s for b in BENCHMARKS if (s := load_source(b, set())) is not None}
    dates = ["| file | mode | written |", "| --- | --- | --- |"]
    dates += [f"| `{s.path.name}` | {s.mode} | {s.written} |" for s in sources.values()]
    on_device = accelerator_sources()
    measured = ["", "### Measured on an accelerator", "",
                "Each file's `machine` names the device, its host CPU and cores:", "",
                *accelerator_figures(on_device)] if on_device else []
    return "\n".join([*table(sources), "", *dates, *measured])


def on_page_markdown(markdown: str, **_) -> str:
    return markdown.replace(MARKER, results_table()) if MARKER in markdown else markdown
