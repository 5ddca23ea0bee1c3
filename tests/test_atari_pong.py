"""experiments/atari_pong.py: the Pong design's plan, its final scores and its targets, on
hand-made ledgers (no training here)."""
import math
import shutil
import signal
import tarfile
import time
from pathlib import Path

import pytest

from experiments import atari_pong, records
from experiments.atari_pong import LINES, final_score, hours_of, plan, report
from experiments.carry import unpack_unfinished
from experiments.records import duration
from experiments.reproduce import fingerprint_of, run_config, runs_to_do
from rlhf_jax.errors import ConfigError


def test_the_final_score_is_the_mean_of_the_last_100_episodes_by_whole_chunks():
    # From the end: 60 episodes at 20, then 50 at 10: 110 episodes, weighted 1,700 / 110.
    assert final_score([30, 50, 60], [-21.0, 10.0, 20.0]) == pytest.approx((50 * 10 + 60 * 20) / 110)
    # A chunk where none ended (None, 0 episodes) is passed over; fewer than 100: all of them.
    assert final_score([10, 0, 20], [0.0, None, 3.0]) == pytest.approx(60 / 30)
    assert final_score([0], [None]) is None


def test_hours_add_each_chunks_steps_over_its_rate():
    record = {"env_steps": [50_000.0, 100_000.0, 150_000.0], "steps_per_second": [1_000.0, None, 500.0]}
    assert hours_of(record) == pytest.approx([50 / 3600, 50 / 3600, 150 / 3600])


def test_the_plan_takes_every_lines_first_seed_before_any_second():
    runs = plan(list(LINES))
    assert [(r.line, r.seed) for r in runs[:4]] == [(line.title, line.seeds[0]) for line in LINES]
    assert len(runs) == sum(len(line.seeds) for line in LINES) == 7
    assert all(r.seed >= 100 for r in runs)  # fresh seeds
    assert {r.line for r in runs if "preferences.labels=3300" in r.overrides} == {"A2C from 3,300 synthetic labels"}


def _record(line, seed, first, last, episodes=120):
    return {"line": line, "seed": seed, "env_steps": [50_000.0, 100_000.0], "episodes": [40.0, episodes],
            "episode_return": [first, last], "steps_per_second": [1_000.0, 1_000.0], "commit": "abc"}


def test_the_report_reads_the_targets_as_registered():
    titles = {line.name: line.title for line in LINES}
    runs = {f"{name}/{seed}": _record(titles[name], seed, -21.0, score)
            for name, seed, score in [("a2c", 100, 19.0), ("a2c", 101, 19.0), ("a2c", 102, 17.0),
                                      ("preferences", 100, 12.0), ("preferences", 101, 13.0),
                                      ("acer", 100, 20.0)]}
    result = report({"runs": runs})
    targets = result["targets"]
    assert targets["a2c"] == {"rule": "final score >= 18 on every seed", "finished": True, "met": False}
    assert targets["acer"]["met"] and not targets["dqn"]["finished"] and not targets["dqn"]["met"]
    # Gain from the untrained -21: A2C's mean 18.33 gains 39.33; preferences' 12.5 gains 33.5.
    assert targets["preferences"]["untrained_score"] == -21.0
    assert targets["preferences"]["gain_ratio"] == pytest.approx(33.5 / (39 + 1 / 3))
    assert targets["preferences"]["met"]  # 0.85 >= 0.8
    low, high = targets["preferences"]["gain_ratio_interval"]
    assert low <= targets["preferences"]["gain_ratio"] <= high
    assert result["lines"]["a2c"]["final_score"] == [19.0, 19.0, 17.0]
    assert result["lines"]["dqn"]["mean_final_score"] is None


def test_the_report_names_every_host_a_seed_ran_on():
    """A run carried to another machine names both: the one that finished it and each attempt's.
    Hosts and commits are per seed, in the order of the seeds, whatever the ledger's order."""
    avx2 = {"cpu": "AMD EPYC", "vector_extensions": ["avx2"], "xla_flags": ""}
    avx512 = {"cpu": "AMD EPYC", "vector_extensions": ["avx2", "avx512f"], "xla_flags": ""}
    carried = {**_record(LINES[0].title, 100, -21.0, 19.0), **avx2, "attempts": [avx512, avx2], "commit": "bbb"}
    alone = {**_record(LINES[0].title, 101, -21.0, 19.0), **avx2, "commit": "aaa"}
    line = report({"runs": {"a/101": alone, "a/100": carried}})["lines"]["a2c"]
    assert line["seeds"] == [100, 101]
    assert line["hosts"] == [[("AMD EPYC", "avx2", ""), ("AMD EPYC", "avx2 avx512f", "")], [("AMD EPYC", "avx2", "")]]
    assert line["commits"] == ["bbb", "aaa"]


def test_an_unknown_line_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit, match="--lines: no line 'ppo'; the lines are a2c, preferences, acer, dqn"):
        atari_pong.main(["--lines", "a2c,ppo", "--dry-run"])


def test_the_plot_draws_both_axes_of_every_line(tmp_path):
    runs = {"a/100": _record(LINES[0].title, 100, -21.0, 5.0), "a/101": _record(LINES[0].title, 101, -20.0, 7.0)}
    atari_pong.plot({"runs": runs}, tmp_path / "pong.png")
    assert (tmp_path / "pong.png").stat().st_size > 10_000
    assert not math.isnan(hours_of(runs["a/100"])[-1])


def _begun_run(run_dir, chunks):
    """A run directory as a stopped run leaves it: its files and numbered checkpoints."""
    for chunk in chunks:
        (run_dir / "checkpoints" / str(chunk) / "default").mkdir(parents=True)
        (run_dir / "checkpoints" / str(chunk) / "default" / "array").write_text(f"chunk {chunk}")
    (run_dir / "checkpoints" / "9.orbax-checkpoint-tmp").mkdir()  # a save cut short: never carried
    (run_dir / "config.yaml").write_text("agent: a2c\n")
    (run_dir / "wall_seconds.txt").write_text("3600.0\n")


def test_pack_carries_each_unfinished_run_with_only_its_newest_checkpoint(tmp_path, monkeypatch, capsys):
    archive, runs_dir = tmp_path / "unfinished.tar.gz", tmp_path / "runs"
    monkeypatch.setattr(atari_pong, "UNFINISHED", archive)
    monkeypatch.setattr(atari_pong, "LEDGER", tmp_path / "ledger.json")  # not the repository's finished runs
    # A2C's and the label line's seed 100, where the design's command trains them: every line's run is carried.
    run_dir, labels_dir = (Path(run_config(run, atari_pong.ENV_STEPS, 0, runs_dir).run.dir)
                           for run in plan(list(LINES))[:2])
    _begun_run(run_dir, [2, 10, 3])
    _begun_run(labels_dir, [1])
    atari_pong.main(["--lines", "a2c", "--runs-dir", str(runs_dir), "--pack"])  # --lines: not what is carried
    assert "2 unfinished runs" in capsys.readouterr().out
    shutil.rmtree(labels_dir)

    elsewhere = tmp_path / "elsewhere"
    carried_runs = sorted(elsewhere / d.relative_to(runs_dir) for d in (run_dir, labels_dir))
    assert unpack_unfinished(archive, elsewhere) == carried_runs
    carried = elsewhere / run_dir.relative_to(runs_dir)
    assert sorted(p.name for p in (carried / "checkpoints").iterdir()) == ["10"]
    assert (carried / "checkpoints" / "10" / "default" / "array").read_text() == "chunk 10"
    assert (carried / "wall_seconds.txt").read_text() == "3600.0\n"
    # A run the machine holds as new as the archive's, or newer, is left as it is.
    (carried / "wall_seconds.txt").write_text("7200.0\n")
    assert unpack_unfinished(archive, elsewhere) == []
    assert (carried / "wall_seconds.txt").read_text() == "7200.0\n"
    (carried / "checkpoints" / "11").mkdir()
    assert unpack_unfinished(archive, elsewhere) == []
    # A machine that ran it before another took it further: the archive's newer checkpoint and
    # files replace what it holds, its older checkpoints stay beside them.
    shutil.rmtree(carried / "checkpoints" / "11")
    shutil.rmtree(carried / "checkpoints" / "10")
    _begun_run(carried, [4])
    assert unpack_unfinished(archive, elsewhere) == [carried]
    assert sorted(p.name for p in (carried / "checkpoints").iterdir() if p.name.isdigit()) == ["10", "4"]
    assert (carried / "wall_seconds.txt").read_text() == "3600.0\n"
    # --pack on a machine that lacks the run (another runs folder) carries it on, not drops it.
    atari_pong.main(["--runs-dir", str(tmp_path / "fresh"), "--pack"])
    third = tmp_path / "third"
    assert unpack_unfinished(archive, third) == sorted(third / d.relative_to(runs_dir) for d in (run_dir, labels_dir))
    # Nothing unfinished (no checkpoint yet): the archive goes rather than staying stale.
    shutil.rmtree(run_dir / "checkpoints")
    labels_dir.mkdir(parents=True)
    (labels_dir / "config.yaml").write_text("agent: a2c\n")
    with tarfile.open(archive, "w:gz"):  # an archive of runs no longer begun anywhere
        pass
    atari_pong.main(["--runs-dir", str(runs_dir), "--pack"])
    assert not archive.exists()


def test_the_dry_run_says_how_far_a_begun_run_has_come_at_its_own_rate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(atari_pong, "UNFINISHED", tmp_path / "none.tar.gz")
    monkeypatch.setattr(atari_pong, "LEDGER", tmp_path / "ledger.json")
    runs_dir = tmp_path / "runs"
    run_dir = Path(run_config(plan(list(LINES))[0], atari_pong.ENV_STEPS, 0, runs_dir).run.dir)
    _begun_run(run_dir, [49])
    (run_dir / "metrics.csv").write_text("env_steps,episodes,steps_per_second\n2450000.0,30,400\n2500000.0,31,600\n")
    atari_pong.main(["--lines", "a2c", "--runs-dir", str(runs_dir), "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    rate = 2_500_000 / (2_450_000 / 400 + 50_000 / 600)  # 402.7: each chunk's steps at its own rate
    assert out[0] == (f"# A2C on the score, seed 100: begun, 2.50M of 10M env steps; about "
                      f"{duration(7_500_000 / rate)} left at 403 env steps/s (its own rate so far)")
    assert out[2] == "# A2C on the score, seed 101: about 2.3 h left at 1,200 env steps/s (the design's rate)"


def test_the_dry_run_expects_a_run_not_begun_to_go_at_its_lines_finished_seeds_rate(tmp_path, monkeypatch, capsys):
    ledger = tmp_path / "ledger.json"
    monkeypatch.setattr(atari_pong, "UNFINISHED", tmp_path / "none.tar.gz")
    monkeypatch.setattr(atari_pong, "LEDGER", ledger)
    runs_dir = tmp_path / "runs"
    first, config = runs_to_do(plan([LINES[0]]), {"runs": {}}, runs_dir, atari_pong.ENV_STEPS)[0]
    records.save_json(ledger, {"runs": {first.key: {
        "line": first.line, "fingerprint": fingerprint_of(config),
        "env_steps": [5e6, 1e7], "steps_per_second": [400.0, None]}}})  # a chunk without a rate is left out
    atari_pong.main(["--lines", "a2c", "--runs-dir", str(runs_dir), "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# A2C on the score, seed 101: about 6.9 h left at 400 env steps/s (its line's finished seeds' rate)"
    assert len(out) == 4  # seed 100 is finished


def test_a_stretch_of_so_many_hours_stops_then_packs_its_runs(tmp_path, monkeypatch, capsys):
    """``--hours``: SIGTERM once the hours have passed (here half a second), which stops the run
    in flight as Ctrl-C would (here a stand-in waiting for it), then the runs go into the archive."""
    archive, runs_dir = tmp_path / "unfinished.tar.gz", tmp_path / "runs"
    monkeypatch.setattr(atari_pong, "UNFINISHED", archive)
    monkeypatch.setattr(atari_pong, "LEDGER", tmp_path / "ledger.json")  # not the repository's finished runs
    run_dir = Path(run_config(plan(list(LINES))[0], atari_pong.ENV_STEPS, 0, runs_dir).run.dir)
    _begun_run(run_dir, [4])

    def training(*args, **kwargs):  # stands in for execute: trains until a signal stops it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.01)
        pytest.fail("--hours sent no signal")

    monkeypatch.setattr(atari_pong, "execute", training)
    before = signal.getsignal(signal.SIGTERM)
    atari_pong.main(["--lines", "a2c", "--runs-dir", str(runs_dir), "--hours", str(0.5 / 3600)])
    out = capsys.readouterr().out
    assert "stopped: the same command goes on" in out and "1 unfinished runs" in out
    assert signal.getsignal(signal.SIGTERM) is before  # this process's handler as it was
    assert unpack_unfinished(archive, tmp_path / "elsewhere") == [tmp_path / "elsewhere" / run_dir.relative_to(runs_dir)]


def test_an_archive_member_outside_the_runs_folder_is_refused_and_nothing_unpacked(tmp_path):
    archive, runs_dir = tmp_path / "unfinished.tar.gz", tmp_path / "runs"
    good = tmp_path / "good.yaml"
    good.write_text("agent: a2c\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(good, "pong/a2c/seed100/config.yaml")
        tar.add(good, "../escaped.yaml")
    with pytest.raises(ConfigError, match=r"unfinished.tar.gz: .*escaped.yaml.*; nothing of it is used"):
        unpack_unfinished(archive, runs_dir)
    assert not (tmp_path / "escaped.yaml").exists() and not runs_dir.exists()
