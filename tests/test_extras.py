"""The core install runs gymnax alone; each part that needs an extra (EnvPool, MuJoCo and MJX,
clips and videos, the labeling web page) stops in one line naming the extra to install, before
anything is written. Each package is hidden here as if it were not installed."""
import sys

import pytest

from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT
from rlhf_jax.config_base import dump_yaml

SMALL = ["a2c.total_env_steps=2048", "run.chunk_env_steps=1024", "run.tensorboard=false"]


def hide(monkeypatch, *modules):
    """As if ``modules`` were not installed (and every module of ours that imported them were
    still to be imported)."""
    for module in modules:
        # Its submodules too: one an earlier test imported (mujoco.mjx) would be found through sys.modules.
        for loaded in [name for name in sys.modules if name.startswith(module + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, module, None)
    for ours in ("rlhf_jax.envs.mjx_tasks", "rlhf_jax.feedback.webapp"):
        monkeypatch.delitem(sys.modules, ours, raising=False)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("hidden, words, named", [
    (["envpool"], ["env.id=envpool/Hopper-v5", "agent=trpo"],
     "envpool/Hopper-v5 needs envpool, not installed here: pip install 'rlhf_jax[mujoco]'"),
    (["envpool"], ["env.id=envpool/Pong-v5", "reward=env", "env.hidden_end=continue"],
     "envpool/Pong-v5 needs envpool, not installed here: pip install 'rlhf_jax[atari]'"),
    (["mujoco"], ["env.id=mjx/Hopper-v5", "agent=trpo"],
     "an mjx/ environment needs mujoco and mujoco.mjx, not installed here: pip install 'rlhf_jax[mujoco]'"),
    (["pygame"], ["labeler=people"],
     "drawing gymnax/CartPole-v1 needs pygame, not installed here: pip install 'rlhf_jax[people]'"),
    (["starlette"], ["labeler=people"],
     "labeler=people (its page: rlhf-jax label) needs starlette, not installed here: pip install 'rlhf_jax[people]'"),
])
def test_a_run_that_needs_an_extra_names_it_and_writes_nothing(hidden, words, named, monkeypatch, tmp_path, capsys):
    hide(monkeypatch, *hidden)
    assert main(["train", *SMALL, *words, f"run.dir={tmp_path / 'run'}"]) == 2
    assert named in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_the_labeling_page_and_videos_name_their_extras(monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(dump_yaml({**DEFAULT_EXPERIMENT, "labeler": "people"}))
    hide(monkeypatch, "uvicorn", "imageio_ffmpeg")
    assert main(["label", str(run_dir)]) == 2
    assert ("the labeling web page (rlhf-jax label) needs uvicorn, not installed here: "
            "pip install 'rlhf_jax[people]'") in one_line(capsys)
    assert main(["eval", str(run_dir), "--video"]) == 2
    assert ("--video: drawing gymnax/CartPole-v1 needs imageio_ffmpeg, not installed here: "
            "pip install 'rlhf_jax[video]'") in one_line(capsys)


def test_the_default_run_imports_no_extra():
    """What the core install leaves out is never imported by a CartPole run from preferences."""
    import subprocess

    script = ("import sys; from rlhf_jax.cli import main; import rlhf_jax.trainer, rlhf_jax.sweep; "
              "from rlhf_jax.envs import make, EnvConfig; make(EnvConfig(id='gymnax/CartPole-v1', num_envs=2)); "
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'envpool', 'mujoco', 'pygame', 'starlette', "
              "'uvicorn', 'h11', 'imageio_ffmpeg', 'wandb', 'rliable', 'datasets'}))")  # pandas imports pyarrow
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_dependency_is_bounded_and_the_constraints_satisfy_them():
    """The core leaves out what gymnax runs need not; every runtime range stops before a next
    release that may break it; constraints.txt, the versions known to work, lies inside them all."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    core = [Requirement(r) for r in project["dependencies"]]
    assert not {canonicalize_name(r.name) for r in core} & {"envpool", "mujoco", "mujoco-mjx", "pygame", "starlette",
                                                            "uvicorn", "h11", "imageio-ffmpeg"}
    extras = project["optional-dependencies"]
    runtime = core + [Requirement(r) for name, items in extras.items() if name not in ("test", "peers", "docs")
                      for r in items]
    assert [str(r) for r in runtime if not any(s.operator in ("<", "<=", "==") for s in r.specifier)
            and canonicalize_name(r.name) != "pandas"] == []  # pandas: only its upper bound
    pins = {}  # name: {python_version: version}, a pin without a marker holding for both Pythons tested
    for line in (root / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            pin = Requirement(line)
            for python in ("3.11", "3.13"):
                if pin.marker is None or pin.marker.evaluate({"python_version": python}):
                    pins.setdefault(canonicalize_name(pin.name), {})[python] = str(pin.specifier).removeprefix("==")
    assert pins["jax"]["3.11"] == "0.10.2"  # the experiments' jax: their runs record it as part of the host
    for requirement in [*runtime, *(Requirement(r) for r in extras["test"] + extras["docs"])]:
        for python, version in pins[canonicalize_name(requirement.name)].items():
            assert requirement.specifier.contains(version, prereleases=True), (requirement, python, version)


def test_the_list_of_environments_names_the_extras_it_cannot_show(monkeypatch, capsys):
    """The lean install lists its gymnax ids and names the extra each EnvPool id needs."""
    hide(monkeypatch, "envpool")
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    needs = {line.split("'")[1]: line.split(": ", 1)[1].split(", ") for line in lines if "more need pip install" in line}
    assert "envpool/Hopper-v5" in needs["rlhf_jax[mujoco]"] and "envpool/Pong-v5" in needs["rlhf_jax[atari]"]
    assert any(line.startswith("gymnax/CartPole-v1 ") for line in lines)
