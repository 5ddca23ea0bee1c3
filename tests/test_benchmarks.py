"""Helpers of the benchmark scripts, checked on values worked out by hand."""
from types import SimpleNamespace

import numpy as np

from benchmarks.labels_vs_return import chunk_curves, hides_episode_ends, merge_cells, table


def test_chunk_curves_average_the_episodes_that_ended_in_each_chunk():
    # 5 iterations of 10 env steps in chunks of 2: the last chunk is one iteration long.
    training = SimpleNamespace(chunk_iterations=2, total_iterations=5, steps_per_iteration=10)
    metrics = {"episodes": np.array([[1, 0, 0, 0, 2]]), "episode_return_sum": np.array([[5.0, 0, 0, 0, 8.0]])}
    learned = {"labels": np.array([[1, 2, 3]]), "reward_accuracy": np.array([[0.5, np.nan, 0.7]]),
               "reward_correlation": np.array([[0.1, 0.2, 0.3]])}
    curves = chunk_curves(training, metrics, learned)
    assert curves["env_steps"] == [20, 40, 50]
    assert curves["true_return"] == [[5.0, None, 4.0]]  # no episode ended in the second chunk
    assert curves["reward_accuracy"] == [[0.5, None, 0.7]]  # NaN written as JSON's null
    assert curves["labels"] == [[1, 2, 3]]


def test_merge_keeps_cells_another_run_wrote_meanwhile():
    # Another process wrote Breakout's 250 cell after this (CartPole) run started.
    latest = {"benchmark": "labels_vs_return", "machine": {"written": "old"}, "seeds": 3,
              "tasks": {"breakout": {"true_reward": {"mean": 6.6}, "labels": {"125": 4.9, "250": 4.0}},
                        "cartpole": {"true_reward": {"mean": 500}, "labels": {"125": 100, "500": 400}}},
              "ablations": {"target": 58, "no ensemble": 499}}
    mine = {"seeds": 3, "eval_episodes": 32, "ablations": {"target": 60},
            "tasks": {"cartpole": {"true_reward": {"mean": 499}, "labels": {"125": 200}}}}
    merged = merge_cells(latest, mine)
    assert merged["tasks"]["breakout"] == latest["tasks"]["breakout"]
    assert merged["tasks"]["cartpole"] == {"true_reward": {"mean": 499}, "labels": {"125": 200, "500": 400}}
    assert merged["ablations"] == {"target": 60, "no ensemble": 499}
    assert "machine" not in merged and "benchmark" not in merged  # write_result adds fresh ones


def test_table_puts_both_references_beside_the_budgets():
    result = {"ablations": {}, "tasks": {
        "breakout": {"labels": {"125": {"mean": 4.625}}, "oracle_reward": {"mean": 5.46}, "true_reward": {"mean": 6.6}},
        "pendulum": {"labels": {"125": {"mean": -348.1}}, "true_reward": {"mean": -173.3}}}}
    lines = table(result).splitlines()
    assert lines[0] == "| task | 125 labels | oracle's reward, ends hidden | true reward |"
    assert lines[2] == "| breakout | 4.6 | 5.5 | 6.6 |"
    assert lines[3] == "| pendulum | -348.1 |  | -173.3 |"  # its episode ends are not hidden
    assert not hides_episode_ends("pendulum") and hides_episode_ends("breakout")


def test_report_dates_an_undated_result_by_its_commit_not_its_file_time(tmp_path):
    """A checkout resets file times: a result committed as it stands is dated by its commit;
    one changed since, or outside git, by nothing (the report then falls back to the file time)."""
    import subprocess

    from benchmarks.run import last_commit_time

    result = tmp_path / "old.json"
    assert last_commit_time(result) is None  # no git repository here
    git = lambda *args, **env: subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True,
                                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})
    git("init", "-q")
    result.write_text("{}")
    assert last_commit_time(result) is None  # untracked
    stamp = "2020-01-02T03:04:05+00:00"
    git("add", "old.json")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "r",
        GIT_COMMITTER_DATE=stamp, GIT_AUTHOR_DATE=stamp)
    assert last_commit_time(result).isoformat() == stamp
    result.write_text('{"changed": 1}')
    assert last_commit_time(result) is None
