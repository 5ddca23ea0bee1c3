"""The documentation site builds with ``mkdocs build --strict``: no warning, no broken link
or anchor, no reference to a function the API pages do not render.

The build goes to a temporary directory, so the test leaves the tree as it was. Without
MkDocs (the ``docs`` extra; the ``test`` extra includes it) the test is skipped with a reason.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason='MkDocs is not installed: python3 -m pip install -e ".[docs]" (the test extra includes it)',
)


def build(config_dir: Path, site_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config_dir / "mkdocs.yml"),
         "--site-dir", str(site_dir)],
        cwd=config_dir, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_mkdocs
def test_docs_build_strict(tmp_path):
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    site = tmp_path / "site"
    for page in ("index.html", "getting-started/index.html", "api/ops/index.html", "api/reward/index.html",
                 "api/agents/index.html", "api/envs/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    # The API pages are generated from the docstrings, and the benchmarks page from the JSON.
    assert 'id="rlhf_jax.ops.gae_advantages"' in (site / "api/ops/index.html").read_text()
    assert "agent_throughput.json" in (site / "benchmarks/index.html").read_text()


@pytest.mark.slow
@needs_mkdocs
def test_docs_build_fails_on_a_broken_link(tmp_path):
    """The strict build is a real check: a page linking to a page that does not exist fails it."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "rlhf_jax").symlink_to(ROOT / "rlhf_jax")
    (copy / "benchmarks").symlink_to(ROOT / "benchmarks")
    page = copy / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_readme_is_short_and_its_links_resolve():
    """The README stays a front page (at most 200 lines) whose relative links all exist in the
    repository; the manual and the notes live in docs/."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target = (ROOT / link.split("#")[0]).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), link


def test_no_page_of_the_site_is_over_400_lines():
    """The site is the manual: a dated research log belongs with the experiments (experiments/log/)."""
    long = {str(page.relative_to(ROOT)): lines for page in (ROOT / "docs").rglob("*.md")
            if (lines := len(page.read_text().splitlines())) > 400}
    assert not long, long
