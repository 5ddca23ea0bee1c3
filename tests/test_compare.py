"""``rlhf-jax stats``: the IQM of final true returns with its stratified bootstrap
interval across separate runs and sweeps, on hand-made run and sweep directories."""
import csv
import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("rliable", reason="rliable is not installed (the stats extra)")

from rlhf_jax.cli import main as cli  # noqa: E402
from rlhf_jax.compare import compare  # noqa: E402
from rlhf_jax.config import ExperimentConfig, apply_overrides, build, to_dict  # noqa: E402
from rlhf_jax.config_base import dump_yaml  # noqa: E402
from rlhf_jax.statistics import interval_estimate  # noqa: E402


def write_run(directory, overrides, finals, env_steps=2048, column="episode_return"):
    """A run directory as `rlhf-jax train` leaves it: its resolved config and two metrics rows."""
    directory.mkdir(parents=True)
    config = to_dict(build(ExperimentConfig, apply_overrides({"reward": "preferences"}, overrides)))
    (directory / "config.yaml").write_text(dump_yaml(config))
    with (directory / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, ["env_steps", "episodes", column])
        writer.writeheader()
        writer.writerow({"env_steps": env_steps / 2, "episodes": 3, column: 1.0})
        writer.writerow({"env_steps": env_steps, "episodes": 3, column: finals})
    return directory


def write_sweep(directory, swept, seeds, finals):
    """A sweep directory: its sweep.yaml and members.csv (two chunks per member)."""
    directory.mkdir(parents=True)
    (directory / "sweep.yaml").write_text(dump_yaml({"base": {"reward": "preferences"}, "swept": swept,
                                                     "seeds": seeds}))
    rows = []
    for member, final in enumerate(finals):
        for chunk, value in enumerate([1.0, final]):
            rows.append({"group": 0, "chunk": chunk, "member": member, "seed": member % seeds, "label": "x",
                         "env_steps": 1024 * (chunk + 1), "episode_return": value})
    with (directory / "members.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return directory


@pytest.fixture
def runs(tmp_path):
    """4 seeds at 100 labels (one an outlier), 2 at 500 labels, and a run without a final return."""
    dirs = [write_run(tmp_path / f"a{seed}", [f"seed={seed}", "preferences.labels=100", f"run.dir=x{seed}"], final)
            for seed, final in enumerate([10.0, 20.0, 30.0, 1000.0])]
    dirs += [write_run(tmp_path / f"b{seed}", [f"seed={seed}", "preferences.labels=500", "name=other"], final)
             for seed, final in enumerate([5.0, 7.0])]
    dirs.append(write_run(tmp_path / "b_none", ["seed=9", "preferences.labels=500"], math.nan))
    return dirs


def test_runs_are_grouped_by_their_configs_and_each_group_gets_its_iqm(runs):
    groups = {group.label: group for group in compare(runs)}
    assert set(groups) == {"preferences.labels=100", "preferences.labels=500"}  # seed, name, run.* aside
    expected = interval_estimate(np.array([[10.0], [20.0], [30.0], [1000.0]]))
    assert groups["preferences.labels=100"].estimate == expected
    assert groups["preferences.labels=100"].estimate.iqm == pytest.approx(25.0)
    b = groups["preferences.labels=500"]
    assert (len(b.runs), b.unscored) == (2, 1) and b.estimate == interval_estimate(np.array([[5.0], [7.0]]))


def test_a_sweeps_members_pool_with_runs_of_the_same_config(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", {"preferences.labels": [100, 500]}, seeds=2, finals=[1.0, 2.0, 3.0, 4.0])
    run = write_run(tmp_path / "run", ["seed=5", "preferences.labels=500"], 6.0, env_steps=4096)
    groups = {group.label: group for group in compare([sweep, run])}
    assert set(groups) == {"preferences.labels=100", "preferences.labels=500"}
    assert [r.score for r in groups["preferences.labels=500"].runs] == [3.0, 4.0, 6.0]
    assert groups["preferences.labels=100"].estimate == interval_estimate(np.array([[1.0], [2.0]]))


def test_by_groups_by_the_given_keys_alone(runs, tmp_path):
    other = write_run(tmp_path / "c0", ["preferences.labels=100", "a2c.learning_rate=0.01"], 40.0)
    assert {g.label for g in compare([*runs, other])} == {
        "a2c.learning_rate=0.0007, preferences.labels=100", "a2c.learning_rate=0.0007, preferences.labels=500",
        "a2c.learning_rate=0.01, preferences.labels=100"}
    (group,) = [g for g in compare([*runs, other], by=["preferences.labels"]) if "100" in g.label]
    assert len(group.runs) == 5


def test_the_command_prints_a_table_and_mistakes_are_one_line(runs, tmp_path, capsys):
    assert cli(["stats", *map(str, runs)]) == 0
    out = capsys.readouterr().out
    expected = interval_estimate(np.array([[10.0], [20.0], [30.0], [1000.0]]))
    assert (f"| preferences.labels=100 | 4 | 2048 | 265.0 | 25.0 [{expected.iqm_low:.1f}, "
            f"{expected.iqm_high:.1f}] |") in out
    assert "| preferences.labels=500 | 2 (+1 without a score) |" in out
    assert "1 run(s) left out of the statistics" in out
    for words, named in [([str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'} does not exist"),
                         ([str(tmp_path)], f"{tmp_path} is neither a run directory"),
                         ([str(runs[0]), "--by", "preferences.label"], "--by preferences.label: no such config key")]:
        assert cli(["stats", *words]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err


def test_it_runs_as_a_command(runs):
    done = subprocess.run([sys.executable, "-m", "rlhf_jax.cli", "stats", *map(str, runs[:2])], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| all runs | 2 | 2048 | 15.0 |" in done.stdout
