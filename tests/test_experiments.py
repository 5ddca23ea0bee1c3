"""Helpers of the experiments (the papers' figures and their diagnostics), checked on values worked
out by hand."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.labels_vs_return import (PROFILE_THRESHOLDS, chunk_curves, hides_episode_ends, label_statistics,
                                          merge_cells, plot, random_policy_cell, statistics_json, statistics_table,
                                          table, uniform_random_policy)
from rlhf_jax.envs import Box, Discrete
from rlhf_jax.statistics import interval_estimate


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
    latest = {"benchmark": "labels_vs_return", "machine": {"written": "old"}, "headline": [], "seeds": 3,
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
    assert "headline" not in merged  # ... and the rows made from the merged result


def test_table_puts_both_references_beside_the_budgets():
    result = {"ablations": {}, "tasks": {
        "breakout": {"labels": {"125": {"mean": 4.625}}, "oracle_reward": {"mean": 5.46}, "true_reward": {"mean": 6.6}},
        "pendulum": {"labels": {"125": {"mean": -348.1}}, "true_reward": {"mean": -173.3}}}}
    lines = table(result).splitlines()
    assert lines[0] == "| task | 125 labels | oracle's reward, ends hidden | true reward |"
    assert lines[2] == "| breakout | 4.6 | 5.5 | 6.6 |"
    assert lines[3] == "| pendulum | -348.1 |  | -173.3 |"  # its episode ends are not hidden
    assert not hides_episode_ends("pendulum") and hides_episode_ends("breakout")


# Two tasks of 3 seeds with both references (a random policy's return: 0 of 1 normalised),
# and one without the random policy's, which the aggregate leaves out.
def seeds(*returns: float) -> dict:
    return {"returns": list(returns), "mean": float(np.mean(returns))}


STATISTICS_RESULT = {"ablations": {}, "tasks": {
    "cartpole": {"random_policy": {"mean": 20.0}, "true_reward": {"mean": 500.0},
                 "labels": {"125": seeds(20.0, 260.0, 500.0), "500": seeds(500.0, 500.0, 500.0)}},
    "acrobot": {"random_policy": {"mean": -500.0}, "true_reward": {"mean": -100.0},
                "labels": {"125": seeds(-500.0, -300.0, -100.0)}},
    "pendulum": {"true_reward": {"mean": -170.0}, "labels": {"125": seeds(-600.0, -200.0, -180.0)}}}}
REPLICATIONS = 200  # bootstrap replications: enough to check, quick to draw


@pytest.fixture(scope="module")
def stats():
    return label_statistics(STATISTICS_RESULT, replications=REPLICATIONS)


def test_statistics_pool_each_tasks_normalised_returns_and_keep_each_task_apart(stats):
    assert stats.normalized_tasks == ("cartpole", "acrobot")  # pendulum has no random policy's return
    assert list(stats.normalized) == [125]  # 500 labels: cartpole only, so no aggregate
    # Normalised: cartpole 0, 0.5, 1 and acrobot 0, 0.5, 1; the middle half of the 6 pooled scores.
    normalized = np.array([[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]])
    expected = interval_estimate(normalized, REPLICATIONS)
    assert stats.normalized[125] == expected and expected.iqm == 0.5 and (expected.runs, expected.tasks) == (3, 2)
    assert stats.profiles[125].fraction[np.searchsorted(PROFILE_THRESHOLDS, 0.25)] == 4 / 6
    # Per task, over its seeds (3 seeds: scipy's quarter-trim cuts none, so the IQM is the mean).
    assert stats.per_task["pendulum"][125] == interval_estimate(np.array([[-600.0], [-200.0], [-180.0]]), REPLICATIONS)
    assert stats.per_task["cartpole"][500].iqm_low == stats.per_task["cartpole"][500].iqm_high == 500.0
    saved = statistics_json(stats)
    assert saved["normalized"]["budgets"]["125"]["iqm"] == 0.5 and saved["normalized"]["zero"] == "random_policy"
    lines = statistics_table(stats).splitlines()
    assert lines[0] == "| IQM [95% interval] | 125 labels | 500 labels |"
    assert lines[-1].startswith("| all tasks, normalised (cartpole, acrobot) | 0.50 [") and lines[-1].endswith(" |  |")


def test_the_plot_draws_the_intervals_and_profiles(stats, tmp_path):
    plot(STATISTICS_RESULT, stats, tmp_path / "plot.png")
    plot(STATISTICS_RESULT, None, tmp_path / "means.png")  # without rliable: means only
    assert (tmp_path / "plot.png").stat().st_size > (tmp_path / "means.png").stat().st_size > 10_000


def test_the_random_policy_draws_every_action_and_scores_as_random_play_does():
    box = SimpleNamespace(action_space=Box(-2.0, 2.0, (3,)))
    actions = uniform_random_policy(box)(None, jnp.zeros((1000, 5)), jax.random.PRNGKey(0))
    assert actions.shape == (1000, 3) and -2.0 <= float(actions.min()) < -1.9 and 1.9 < float(actions.max()) <= 2.0
    discrete = uniform_random_policy(SimpleNamespace(action_space=Discrete(3)))(None, jnp.zeros((300, 4)),
                                                                                 jax.random.PRNGKey(0))
    assert set(np.asarray(discrete).tolist()) == {0, 1, 2}
    cell = random_policy_cell([])  # CartPole: random play lasts about 22 steps
    assert len(cell["returns"]) == 3 and 15 < cell["mean"] < 30


def test_clips_are_summed_per_copy_and_a_partial_clip_is_dropped():
    from experiments.mujoco_diagnose import clip_sums

    x = np.arange(14.0).reshape(7, 2)  # [T=7, copies=2]: copy 0 holds 0, 2, ..., 12; copy 1 holds 1, 3, ..., 13
    # Clips of 3 steps: steps 0-2 and 3-5 of each copy, step 6 left out.
    np.testing.assert_array_equal(clip_sums(x, 3), [0 + 2 + 4, 1 + 3 + 5, 6 + 8 + 10, 7 + 9 + 11])


def test_diagnosis_refuses_a_cell_without_a_learned_reward_or_not_a_sweep_in_one_line(tmp_path, monkeypatch, capsys):
    from experiments import mujoco_diagnose
    from rlhf_jax.sweep import Sweep

    cell = tmp_path / "rl-trpo"
    Sweep.create(cell, {"agent": "trpo", "env": {"id": "envpool/Hopper-v5"}}, {}, seeds=1)
    (cell / "group0").mkdir()
    monkeypatch.setattr("sys.argv", ["mujoco_diagnose", str(cell), "--against", str(cell)])
    with pytest.raises(SystemExit):
        mujoco_diagnose.main()
    assert f"--against: {cell} learns from the true reward" in capsys.readouterr().err
    for not_a_sweep in ([str(tmp_path), "--against", str(cell)], [str(cell), "--against", str(tmp_path)],
                        [str(tmp_path / "nowhere")]):
        monkeypatch.setattr("sys.argv", ["mujoco_diagnose", *not_a_sweep])
        with pytest.raises(SystemExit):
            mujoco_diagnose.main()
        wrong = next(path for path in not_a_sweep if path not in (str(cell), "--against"))
        assert f"error: {wrong} is not a cell's sweep directory" in capsys.readouterr().err
    for option in (["--by-life"], ["--held-labels"], ["--export-rewards", str(tmp_path / "models")]):  # no r̂ to read
        monkeypatch.setattr("sys.argv", ["mujoco_diagnose", str(cell), *option])
        with pytest.raises(SystemExit):
            mujoco_diagnose.main()
        assert f"{option[0]}: {cell} learns from the true reward" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_the_mujoco_throughput_benchmark_times_the_tasks_of_figure_2_in_its_order():
    from benchmarks import mujoco_throughput
    from experiments import reproduce

    assert mujoco_throughput.MUJOCO_TASKS == tuple(reproduce.MUJOCO_TASKS)
    for task, panel in reproduce.MUJOCO_TASKS.items():
        assert panel.rlhf == mujoco_throughput.PAPER_MUJOCO / f"{task}.yaml"
        assert panel.baselines[0].config == mujoco_throughput.PAPER_MUJOCO / f"{task}_trpo.yaml"


def test_by_health_averages_each_side_s_healthy_and_unhealthy_steps_in_units_of_the_reward_s_std():
    from types import SimpleNamespace

    from experiments.mujoco_diagnose import by_health

    def timestep(unhealthy):
        unhealthy = np.asarray(unhealthy, float)[:, None]  # [T=4, copies=1]
        return SimpleNamespace(reward=np.zeros_like(unhealthy), info={"unhealthy": unhealthy})

    plays = {("cell", 0): (None, None, timestep([0, 0, 1, 1])), ("other", 0): (None, None, timestep([0, 0, 0, 1]))}
    rhat = {("cell", 0): np.array([[2.0], [2.0], [0.0], [0.0]]), ("other", 0): np.array([[4.0], [4.0], [4.0], [-2.0]])}
    scale = np.std([2, 2, 0, 0, 4, 4, 4, -2])  # every step of both sides
    got = by_health(plays, rhat, "rhat")
    assert got == pytest.approx({"rhat_cell_healthy": 2 / scale, "rhat_cell_unhealthy": 0.0,
                                 "rhat_other_healthy": 4 / scale, "rhat_other_unhealthy": -2 / scale})


def test_held_labels_split_by_falls_and_r_hat_s_agreement_in_each_split():
    from experiments.mujoco_diagnose import fallen, split_by_falls

    falls = np.array([[0, 0], [1, 0], [0, 2], [1, 1], [1, 0]])
    mu = np.array([1.0, 0.0, 1.0, 0.0, 0.5])  # the last pair a tie: left out of every split
    rhat = np.array([[2.0, 1.0], [3.0, 1.0], [4.0, 0.0], [0.0, 1.0], [9.0, 9.0]])
    # r̂ prefers the first clip of pairs 0-2 and the second of pair 3: wrong on pair 1 alone.
    assert split_by_falls(falls, mu, rhat) == pytest.approx({
        "no_fall_pairs": 1, "no_fall_rhat_agrees": 1.0, "one_fall_pairs": 2, "one_fall_rhat_agrees": 0.5,
        "both_fall_pairs": 1, "both_fall_rhat_agrees": 1.0})
    # Gymnasium's ranges: a Walker2d at height 0.85 and angle 0.5 stands; at 0.75, angle 1.2 or height 2.1 it has fallen.
    walker = np.zeros((4, 17))
    walker[:, :2] = [[0.85, 0.5], [0.75, 0.0], [1.2, 1.2], [2.1, 0.0]]
    np.testing.assert_array_equal(fallen("Walker2d-v5", walker), [False, True, True, True])
    hopper = np.zeros((2, 4, 11))  # any leading axes
    hopper[0, :, :3] = [[1.2, 0.1, 5.0], [0.6, 0.0, 0.0], [1.2, -0.3, 0.0], [1.2, 0.0, 150.0]]
    hopper[1, :, 0] = 1.2
    np.testing.assert_array_equal(fallen("Hopper-v5", hopper), [[False, True, True, True], [False] * 4])


def test_the_implied_penalty_is_what_r_hat_charges_a_fall_in_progress_and_the_labels_bound_it_by_the_largest_lead():
    from experiments.mujoco_diagnose import implied_penalty

    progress = np.array([[10.0, 4.0], [7.0, 2.0], [3.0, 8.0], [5.0, 5.0]])
    falls = np.array([[1, 0], [0, 1], [2, 0], [1, 1]])
    oracle = progress - 50.0 * falls  # the oracle's penalty: 50 a fall
    rhat = 2.0 * progress - 30.0 * falls + 1.0  # r̂ charges 30 / 2 = 15 units of progress a fall
    got = implied_penalty(falls, rhat, oracle, penalty=50.0)
    assert got["oracle_penalty_fitted"] == pytest.approx(50.0)
    assert got["rhat_penalty"] == pytest.approx(15.0)
    assert got["rhat_fit_r2"] == pytest.approx(1.0)
    assert got["falls_per_clip"] == pytest.approx(6 / 8)
    # One-fall pairs 0-2: the fallen clip leads by 10 - 4 = 6, 2 - 7 = -5 and 3 - 8 = -5.
    assert got["one_fall_pairs"] == 3
    assert got["largest_lead_of_a_fallen_clip"] == pytest.approx(6.0)
    assert got["leads_above_rhat_penalty"] == pytest.approx(0.0)


@pytest.mark.parametrize("argv, named", [(["--tasks", "cartpole,foo"], "'foo'"), (["--budgets", "20,x"], "--budgets"),
                                         (["--budgets", "20,0"], "--budgets: each must be from 1")])
def test_the_ibt_experiment_refuses_an_unknown_task_or_budget_in_one_line_before_it_runs(argv, named, capsys,
                                                                                          monkeypatch):
    from experiments import ibt

    monkeypatch.setattr(ibt, "throughput", lambda quick: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        ibt.main(argv)
    assert named in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("module, option, value", [
    ("experiments.mujoco_curves", "--steps", "-5"), ("experiments.minatar_curves", "--env-steps", "-1"),
    ("experiments.mujoco_diagnose", "--episodes", "0"), ("experiments.reproduce", "--seeds", "0"),
    ("experiments.trpo_reference", "--seeds", "0"), ("experiments.ibt", "--batch-episodes", "x"),
    ("benchmarks.cpu_devices", "--rounds", "0"), ("benchmarks.env_throughput", "--atari-envs", "0"),
    ("benchmarks.mujoco_throughput", "--num-envs", "-64"), ("benchmarks.rlhf_pong", "--rounds", "0"),
    ("benchmarks.scaling", "--seed-envs", "0"), ("benchmarks.across_commits", "--rounds", "0"),
])
def test_a_count_given_to_an_experiment_or_benchmark_below_its_least_is_refused_in_one_line(module, option, value,
                                                                                             capsys, monkeypatch):
    import importlib

    monkeypatch.setattr("sys.argv", [module, option, value])
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main()
    assert stop.value.code == 2
    assert f"argument {option}: must be" in capsys.readouterr().err.strip().splitlines()[-1]
