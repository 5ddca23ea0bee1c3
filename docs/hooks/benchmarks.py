"""MkDocs hook: the benchmarks page's results table, generated at build time.

Every ``benchmarks/results/*.json`` that carries headline rows (the ``"headline"`` list
each benchmark script writes beside its results) becomes rows of one table, dated by the
``machine.written`` field the script recorded, or else by the commit that last changed the
file. The page holds the marker ``<!-- benchmark-results -->`` where the table goes, so no
number on it is copied by hand.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

MARKER = "<!-- benchmark-results -->"
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _number(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x != 0 and abs(x) < 1e-3 else f"{x:.4g}"


def _date(path: Path, result: dict) -> str:
    written = (result.get("machine") or {}).get("written")
    if written:
        return str(written)
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path.relative_to(ROOT))],
                             cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{out} (committed)" if out else "not recorded"


def _target(row: dict) -> str:
    target = row.get("target")
    if not target:
        return ""
    value, threshold, comparison = target.get("value"), target.get("threshold"), target.get("comparison", ">=")
    met = ""
    if isinstance(value, (int, float)) and isinstance(threshold, (int, float)):
        met = " met" if (value >= threshold if comparison == ">=" else value <= threshold) else " **not met**"
    return f"`{target.get('key', '')}` {comparison} {_number(threshold)}{met}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_table(results: Path = RESULTS) -> str:
    """The headline rows of every result file, as one Markdown table."""
    lines = ["| file | mode | date | what | ours | reference | ratio | target |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
    for path in sorted(results.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(result, dict) or not result.get("headline"):
            continue
        mode = {True: "quick", False: "full"}.get(result.get("quick"), "")
        date = _date(path, result)
        for row in result["headline"]:
            lines.append("| " + " | ".join(_cell(c) for c in (
                f"`{path.name}`", mode, date, row.get("what", ""), _number(row.get("ours")),
                _number(row.get("peer")), _number(row.get("ratio")), _target(row))) + " |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, results_table())
    return markdown
