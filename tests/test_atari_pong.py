"""experiments/atari_pong.py: the Pong design's plan, its final scores and its targets, on
hand-made ledgers (no training here)."""
import math

import pytest

from experiments import atari_pong
from experiments.atari_pong import LINES, final_score, hours_of, plan, report


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


def test_an_unknown_line_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit, match="--lines: no line 'ppo'; the lines are a2c, preferences, acer, dqn"):
        atari_pong.main(["--lines", "a2c,ppo", "--dry-run"])


def test_the_plot_draws_both_axes_of_every_line(tmp_path):
    runs = {"a/100": _record(LINES[0].title, 100, -21.0, 5.0), "a/101": _record(LINES[0].title, 101, -20.0, 7.0)}
    atari_pong.plot({"runs": runs}, tmp_path / "pong.png")
    assert (tmp_path / "pong.png").stat().st_size > 10_000
    assert not math.isnan(hours_of(runs["a/100"])[-1])
