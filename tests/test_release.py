"""What a release is cited and pinned by: one version (pyproject.toml's) everywhere it is shown,
a CITATION.cff that citation tools read, the license pyproject names, and a changelog entry."""
import datetime
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import rlhf_jax
from rlhf_jax.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_version_is_pyprojects(capsys):
    assert rlhf_jax.__version__ == PROJECT["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"rlhf-jax {PROJECT['version']}\n"


def test_version_from_a_source_tree_that_was_never_installed(tmp_path):
    """Without the distribution's metadata the version is still pyproject.toml's."""
    script = ("import importlib.metadata as m, sys\n"
              "def missing(name): raise m.PackageNotFoundError(name)\n"
              "m.version = missing\n"
              "import rlhf_jax; print(rlhf_jax.__version__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == PROJECT["version"]


def test_citation_cff_parses_with_the_keys_citation_tools_need():
    # YAML 1.1's reader would turn an unquoted date into a date object: CFF wants the string.
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for key in ("cff-version", "message", "title", "authors", "version", "date-released", "license", "references"):
        assert key in cff, key
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == PROJECT["version"]
    assert cff["license"] == PROJECT["license"]
    datetime.date.fromisoformat(cff["date-released"])
    assert cff["authors"] and all("name" in a or "family-names" in a for a in cff["authors"])
    titles = " | ".join(ref["title"] for ref in cff["references"])
    for paper in ("Deep Reinforcement Learning from Human Preferences", "Improving Multimodal Interactive Agents",
                  "Human-level control through deep reinforcement learning",
                  "Asynchronous Methods for Deep Reinforcement Learning",
                  "Sample Efficient Actor-Critic with Experience Replay"):
        assert paper in titles, paper
    for ref in cff["references"]:
        assert ref["type"] and ref["authors"] and isinstance(ref["year"], int), ref["title"]


def test_the_license_file_is_the_one_pyproject_names():
    assert PROJECT["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a pointer to it


def test_the_changelog_has_an_entry_for_this_version():
    """The newest release's heading is this version's; changes since sit above it, under Unreleased."""
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("## ") and line != "## Unreleased"]
    assert headings and headings[0].startswith(f"## {PROJECT['version']} ")


@pytest.mark.slow
def test_the_wheel_and_the_sdist_build_and_pass_twine_check(tmp_path):
    """``python -m build`` makes both from the tracked files (in its own environment, with the
    setuptools pyproject.toml asks for), ``twine check`` passes them, and the wheel carries the
    package data a run reads. The tree is copied first: an editable install's ``*.egg-info``
    lists every file it once packaged, and would put them in the sdist whatever pyproject says."""
    pytest.importorskip("build", reason="python -m build comes with the test extra")
    pytest.importorskip("twine", reason="twine comes with the test extra")
    import shutil
    import zipfile

    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("the tracked files are git's to list: this is not a git checkout")
    source = tmp_path / "source"
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted in the working tree is not packaged
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    version = PROJECT["version"]
    wheel, sdist = out / f"rlhf_jax-{version}-py3-none-any.whl", out / f"rlhf_jax-{version}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in out.iterdir())
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"rlhf_jax/configs/default.yaml", "rlhf_jax/cli.py"} <= names
    assert any(name.startswith("rlhf_jax/feedback/static/") for name in names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE") for name in names)
    assert not any(name.startswith(("tests/", "experiments/", "benchmarks/")) for name in names)
