"""``experiments/reproduce.py --figure 2 --backend cpu``: the plan of cells, and their bookkeeping
(each cell one sweep of its seeds, recorded when it finishes, never run again), with a stand-in
for the sweep."""
import csv
import dataclasses
import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from experiments import records, reproduce
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.errors import Interrupted
from rlhf_jax.sweep import SWEEP_FILE

TASKS = ["reacher", "hopper"]


def test_cells_run_rl_and_700_labels_first_on_envpool():
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], TASKS, [700, 1400, 350], ["trpo"])
    assert [c.key for c in cells] == [
        "reacher/RL (trpo)", "reacher/700 labels", "hopper/RL (trpo)", "hopper/700 labels",
        "reacher/1400 labels", "hopper/1400 labels", "reacher/350 labels", "hopper/350 labels"]
    config = reproduce.cell_config(cells[3], 20_000, 4, Path("/tmp/unused"))
    assert config.env.id == "envpool/Hopper-v5" and config.env.num_envs == reproduce.CPU_NUM_ENVS
    assert config.env.hide_episode_end and not config.env.control_cost and config.preferences.labels == 700
    assert config.trpo.batch_size == 5_000 and config.trpo.entropy_coef == 0.01  # the paper's, as on MJX
    assert config.run.chunk_env_steps == 5_000 and config.run.checkpoint_every_updates == 1
    # The clip length is pinned, so a change of the default rule makes a new cell (a cell
    # with Hopper's 188-step clips was once taken for a finished one after the rule changed).
    assert config.preferences.segment_length == 60
    assert reproduce.cell_config(cells[2], 20_000, 4, Path("/tmp/unused")).preferences.segment_length == 0  # RL



def test_trpo_on_the_oracle_runs_after_the_second_budget_with_the_ends_hidden():
    """The extra reference line: the RL config with only the ends hidden, so it learns from the
    oracle's reward (the penalty per unhealthy step) on the task the preference runs face; it
    runs after the 1,400-label column, and the table gets its column."""
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], TASKS, [700, 1400, 350], ["trpo", "oracle"])
    assert [c.key for c in cells] == [  # Reacher never ends early: its oracle line would be RL again
        "reacher/RL (trpo)", "reacher/700 labels", "hopper/RL (trpo)", "hopper/700 labels",
        "reacher/1400 labels", "hopper/1400 labels", f"hopper/{reproduce.ORACLE_LINE}",
        "reacher/350 labels", "hopper/350 labels"]
    with pytest.raises(reproduce.ConfigError, match="no task has the baseline 'oracle'"):
        reproduce.cpu_cells(reproduce.FIGURES[2], ["reacher"], [700], ["trpo", "oracle"])
    rl, hidden = (reproduce.cell_config(cells[i], 20_000, 4, Path("/tmp/unused")) for i in (2, 6))
    assert not rl.env.hide_episode_end and hidden.env.hide_episode_end
    # the preference runs' task: their hidden ends and 200-step episodes, scored on the task itself
    assert hidden.env.max_episode_steps == 200 and hidden.run.score_on_task
    # and their oracle's penalty per unhealthy step (10 on Hopper; RL's task never pays it)
    assert hidden.env.termination_penalty == 10.0
    assert dataclasses.replace(hidden.env, hide_episode_end=False, max_episode_steps=0, termination_penalty=1.0) == rl.env
    assert hidden.trpo == rl.trpo
    assert hidden.reward == rl.reward == "env"
    cell = {"final_return": 50.0, "ratio_to_rl": 0.5, "gain_ratio_to_rl": 0.4}
    table = reproduce.ratio_table({"hopper": {"RL (trpo)": {**cell, "final_return": 100.0},
                                              reproduce.ORACLE_LINE: cell}}, [700])
    assert table.splitlines()[0].endswith(f"| 700 labels | {reproduce.ORACLE_LINE} |")
    assert table.splitlines()[2] == "| hopper | 100.0 | | 50.0 (0.50; 0.40) |"


def test_the_cell_without_the_entropy_bonus_is_the_700_label_cell_with_that_one_switch_and_runs_last():
    """Our line, not the paper's: named in --ablations, it runs after every other cell, differs
    from the 700-label cell only in TRPO's entropy bonus, and gets a column of its own."""
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], TASKS, [700, 1400], ["trpo"], ["no entropy bonus"])
    assert [c.key for c in cells][-2:] == ["reacher/no entropy bonus", "hopper/no entropy bonus"]
    assert len(cells) == 8
    labels, without = (reproduce.cell_config(next(c for c in cells if c.key == key), 20_000, 4, Path("/tmp/unused"))
                       for key in ("hopper/700 labels", "hopper/no entropy bonus"))
    assert labels.trpo.entropy_coef == 0.01 and without.trpo.entropy_coef == 0.0
    assert dataclasses.replace(without, trpo=labels.trpo, run=labels.run) == labels  # the one switch
    assert reproduce.fingerprint_of(without) != reproduce.fingerprint_of(labels)  # a cell of its own
    cell = {"final_return": 50.0, "ratio_to_rl": 0.5, "gain_ratio_to_rl": 0.4}
    table = reproduce.ratio_table({"hopper": {"RL (trpo)": {**cell, "final_return": 100.0},
                                              "no entropy bonus": cell}}, [700])
    assert table.splitlines()[0].endswith("| 700 labels | no entropy bonus |")
    assert table.splitlines()[2] == "| hopper | 100.0 | | 50.0 (0.50; 0.40) |"
    record = {"kind": "ablation", "overrides": list(cells[-1].overrides)}
    assert reproduce.legend_label("no entropy bonus", record, reproduce.FIGURES[2]) == "no entropy bonus (700 labels)"
    assert reproduce.legend_label("no entropy bonus", record, reproduce.FIGURES[5]) == "no entropy bonus"  # one budget
    overridden = {"kind": "ablation", "overrides": ["preferences.labels=700", "preferences.labels=5000"]}
    assert reproduce.legend_label("no online queries", overridden, reproduce.FIGURES[2]) == "no online queries (5000 labels)"
    with pytest.raises(SystemExit):  # a name that is neither the paper's nor ours
        reproduce.main(["--figure", "2", "--backend", "cpu", "--ablations", "no bonus", "--dry-run"])


@pytest.mark.parametrize("task", ["hopper", "walker2d", "ant", "invertedpendulum", "inverteddoublependulum"])
def test_the_tasks_that_end_early_train_on_200_step_episodes_with_the_penalty_and_are_scored_on_the_task(task):
    """The five tasks that end when unhealthy: their preference runs and the oracle line train on
    200-step episodes with the ends hidden and the penalty of 10 in their place, one value for
    the five, and are scored on the task's own episodes (``run.score_on_task``); RL trains on the
    task itself."""
    cells = {c.line: reproduce.cell_config(c, 20_000, 4, Path("/tmp/unused")) for c in reproduce.cpu_cells(
        reproduce.FIGURES[2], [task], [700], ["trpo", "oracle"])}
    rl, labels, oracle = cells["RL (trpo)"], cells["700 labels"], cells[reproduce.ORACLE_LINE]
    for shortened in (labels, oracle):
        assert shortened.env.max_episode_steps == 200 and shortened.env.hide_episode_end
        assert shortened.env.oracle == "penalty" and shortened.env.termination_penalty == 10.0
        assert shortened.run.score_on_task and shortened.run.eval_episodes == 8
    assert rl.env.max_episode_steps == 0 and not rl.run.score_on_task and not rl.env.hide_episode_end
    # 5 copies x 1,000 steps a batch: whole 200-step episodes, as on MJX (25 copies x 200)
    assert labels.trpo.batch_size % (labels.env.num_envs * 200) == 0
    assert reproduce.preference_task(reproduce.PAPER / "mujoco/halfcheetah.yaml") == ()


def test_where_metrics_are_also_sent_leaves_a_cell_the_same_cell():
    """A finished cell stays finished when a logging option is added or set; a result-changing
    setting (here the seed) makes a different run."""
    run = reproduce.Run("reacher", "RL (trpo)", reproduce.Kind.BASELINE, 0, reproduce.ROOT / "configs/paper/mujoco/reacher_trpo.yaml", ())
    plain = reproduce.run_config(run, 20_000, 4, Path("/tmp/unused"))
    logged = reproduce.run_config(dataclasses.replace(run, overrides=("run.wandb=true", "run.wandb_tags=[a]")), 20_000, 4, Path("/tmp/unused"))
    assert logged.run.wandb and reproduce.fingerprint_of(logged) == reproduce.fingerprint_of(plain)
    reseeded = reproduce.run_config(dataclasses.replace(run, seed=1), 20_000, 4, Path("/tmp/unused"))
    assert reproduce.fingerprint_of(reseeded) != reproduce.fingerprint_of(plain)

def fake_sweep(calls, interrupt_at=None):
    """A stand-in for the sweep: writes what a finished one leaves (sweep.yaml, members.csv)."""
    def run_sweep(directory, base, seeds):
        calls.append(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / SWEEP_FILE).write_text(yaml.safe_dump({"base": base, "swept": {}, "seeds": seeds}))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        returns = 100.0 if "trpo" in base["name"] else 80.0
        with (directory / "members.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, ["group", "chunk", "member", "seed", "label", "env_steps", "episode_return",
                                        "entropy"])
            writer.writeheader()
            for seed in range(base["seed"], base["seed"] + seeds):
                for chunk in range(2):
                    writer.writerow({"group": 0, "chunk": chunk, "member": seed, "seed": seed, "label": "base",
                                     "env_steps": 5000 * (chunk + 1), "episode_return": (chunk + 1) * returns / 2,
                                     "entropy": 3.0 - chunk})
    return run_sweep


def test_cells_are_recorded_as_they_finish_and_never_run_again(tmp_path, monkeypatch):
    # The interrupted attempt ran on another host than the one that finished the cell.
    some, other = ({"cpu": "Some CPU", "vector_extensions": ["avx", "avx2"], "xla_flags": ""},
                   {"cpu": "Other CPU", "vector_extensions": ["avx"], "xla_flags": ""})
    hosts = iter([some, other, some])  # RL's attempt, 700 labels' stopped one, then its last
    monkeypatch.setattr(records, "cpu_host", lambda: next(hosts))
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], ["hopper"], [700], ["trpo"])
    ledger_path, runs_dir = tmp_path / "ledger.json", tmp_path / "runs"
    made_by = {"command": "python -m experiments.reproduce --figure 2 --backend cpu", "commit": "abc", "uncommitted_changes": False,
               "cpu": "Some CPU", "vector_extensions": ["avx", "avx2"], "xla_flags": ""}
    planned = [(cell, reproduce.cell_config(cell, 10_000, 2, runs_dir)) for cell in cells]
    execute = lambda calls, **kw: reproduce.execute_cells(  # noqa: E731
        planned, ledger_path, 2, run_sweep=fake_sweep(calls, **kw), provenance=made_by)
    calls = []
    with pytest.raises(KeyboardInterrupt):  # the second cell is interrupted: the first is kept
        execute(calls, interrupt_at=2)
    assert sorted(json.loads(ledger_path.read_text())["runs"]) == ["hopper/RL (trpo)/seed0", "hopper/RL (trpo)/seed1"]
    stopped = calls[1] / records.WALL_SECONDS_FILE  # the stopped attempt's time is kept...
    assert stopped.exists()
    stopped.write_text("100.0\n")  # (as if it had run 100 s)
    calls = []
    ledger = execute(calls)
    assert len(calls) == 1 and calls[0].name.startswith("700-labels-")  # only the unfinished cell
    record = ledger["runs"]["hopper/700 labels/seed1"]
    assert 100 <= record["seconds"] < 200  # ...and counted in the cell's wall time when it finishes
    assert record["episode_return"] == [40.0, 80.0] and record["backend"] == "cpu"
    assert {key: record[key] for key in made_by} == made_by  # each cell says what made it
    assert len(record["attempts"]) == 2  # stopped once, then finished: two attempts, each with its host
    calls = []
    execute(calls)
    assert calls == []  # every cell finished: nothing runs again

    result = reproduce.with_ratios(reproduce.summary(ledger, ["hopper"]))
    cell = result["hopper"]["700 labels"]
    assert cell["made_by"] == [(made_by["command"], "abc")]
    # and where, each attempt's host: its digits are theirs
    assert cell["hosts"] == [("Other CPU", "avx", ""), ("Some CPU", "avx avx2", "")]
    assert result["hopper"]["RL (trpo)"]["hosts"] == [("Some CPU", "avx avx2", "")]
    assert cell["ratio_to_rl"] == pytest.approx(0.8)
    # gains over the first point (the mean of both lines' first points, 45): (80 - 45) / (100 - 45)
    assert cell["gain_ratio_to_rl"] == pytest.approx(35 / 55, abs=1e-4)
    assert "| hopper | 100.0 | 80.0 (0.80; 0.64) |" in reproduce.ratio_table(result, [700])
    assert "| hopper | 100.0 [2] | 80.0 (0.80; 0.64) [2] |" in reproduce.ratio_table(result, [700], seeds=5)
    assert "| hopper | 100.0 | 80.0 (0.80; 0.64) |" in reproduce.ratio_table(result, [700], seeds=2)
    assert reproduce.gain_ratios(result, "700 labels") == {"hopper": cell["gain_ratio_to_rl"]}
    assert reproduce.gain_ratios(result, "no entropy bonus") == {}  # a line that has not run counts nowhere
    assert reproduce.tasks_at({"a": 0.8, "b": 0.79, "c": None, "d": 1.5}) == 2
    # The counts the JSON carries: per label budget and per line of ours, a task counting once it
    # reaches 0.8 of RL's gain; a task whose RL cell has not run counts nowhere.
    panels = {"hopper": {"RL (trpo)": {}, "700 labels": {"gain_ratio_to_rl": 0.9},
                         "350 labels": {"gain_ratio_to_rl": 0.5}, "no entropy bonus": {"gain_ratio_to_rl": 0.8}},
              "ant": {"RL (trpo)": {}, "700 labels": {"gain_ratio_to_rl": 1.2}, "350 labels": {"gain_ratio_to_rl": 0.8}},
              "swimmer": {"700 labels": {"gain_ratio_to_rl": None}}}
    assert reproduce.claim_counts(panels, [350, 700, 1400], ["no entropy bonus"]) == {
        "tasks_at_0.8_from_700_labels": 2, "tasks_at_0.8_by_budget": {"350 labels": 1, "700 labels": 2, "1400 labels": 0},
        "tasks_at_0.8_by_ablation": {"no entropy bonus": 1}}
    # A line of ours (an ablation, TRPO on the oracle) starting elsewhere moves no ratio: the
    # untrained return is the mean first point of RL's and the label budgets' lines alone.
    for kind, line in ((reproduce.Kind.ABLATION, "no entropy bonus"), (reproduce.Kind.BASELINE, reproduce.ORACLE_LINE)):
        result["hopper"][line] = {**cell, "kind": kind, "mean_return": [-500.0, 0.0]}
    assert reproduce.with_ratios(result)["hopper"]["700 labels"]["gain_ratio_to_rl"] == pytest.approx(35 / 55, abs=1e-4)

    # A config file changes after the cells ran: the 700-label cell's records are of the old
    # config, so the figure leaves them out and names the cell, until it runs again.
    fingerprints = {cell.key: reproduce.fingerprint_of(config) for cell, config in planned}
    current, stale = reproduce.current_records(ledger, fingerprints)
    assert current == ledger and stale == []
    current, stale = reproduce.current_records(ledger, {**fingerprints, "hopper/700 labels": "0123456789"})
    assert sorted(current["runs"]) == ["hopper/RL (trpo)/seed0", "hopper/RL (trpo)/seed1"] and stale == ["hopper/700 labels"]
    assert sorted(ledger["runs"])[-1] == "hopper/RL (trpo)/seed1" and len(ledger["runs"]) == 4  # the file's ledger is kept


def test_a_cell_finished_at_fewer_seeds_runs_only_the_seeds_it_lacks(tmp_path):
    """``--seeds 5`` after a cell finished at 3: seeds 3 and 4 run as a sweep of their own in a
    directory beside the cell's, their pool's copies seeded as one sweep of all five would seed
    them (copy i: ``env.seed + i``, 5 copies per seed), and the three finished seeds are kept."""
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], ["hopper"], [700], ["trpo"])[:1]
    ledger_path, runs_dir = tmp_path / "ledger.json", tmp_path / "runs"
    planned = [(cell, reproduce.cell_config(cell, 10_000, 2, runs_dir)) for cell in cells]
    calls = []
    reproduce.execute_cells(planned, ledger_path, 3, run_sweep=fake_sweep(calls))
    first_three = json.loads(ledger_path.read_text())["runs"]
    calls = []
    ledger = reproduce.execute_cells(planned, ledger_path, 5, run_sweep=fake_sweep(calls))
    assert len(calls) == 1 and calls[0].name == f"rl-trpo-from-seed3-{reproduce.fingerprint_of(planned[0][1])}"
    base = yaml.safe_load((calls[0] / SWEEP_FILE).read_text())
    assert (base["seeds"], base["base"]["seed"], base["base"]["env"]["seed"]) == (2, 3, 15)
    assert sorted(ledger["runs"]) == [f"hopper/RL (trpo)/seed{seed}" for seed in range(5)]
    assert all(ledger["runs"][key] == record for key, record in first_three.items())
    assert ledger["runs"]["hopper/RL (trpo)/seed4"]["fingerprint"] == reproduce.fingerprint_of(planned[0][1])
    calls = []
    reproduce.execute_cells(planned, ledger_path, 5, run_sweep=fake_sweep(calls))
    assert calls == []  # all five finished: nothing runs again


def test_a_cell_whose_config_a_line_has_run_takes_its_runs_instead_of_running_again(tmp_path):
    """A config comes to say what a line of ours said (the 700-label cell fitting at 0.3, the
    "fitting 0.3 pairs per step" line's runs): the cell takes that line's runs, each saying the
    line it was first recorded under, and runs nothing; the run the cell had before (at 1.0)
    goes to the line that has its config now ("fitting 1.0 pairs per step"), not lost."""
    ledger_path, runs_dir = tmp_path / "ledger.json", tmp_path / "runs"
    plan = lambda labels_at, ablations: [  # noqa: E731
        (cell, reproduce.cell_config(dataclasses.replace(cell, overrides=(*cell.overrides, *labels_at))
                                     if cell.kind == reproduce.Kind.LABELS else cell, 10_000, 2, runs_dir))
        for cell in reproduce.cpu_cells(reproduce.FIGURES[2], ["hopper"], [700], [], ablations)]
    before = plan(["preferences.fit_pairs_per_env_step=1.0"], ["fitting 0.3 pairs per step"])
    calls = []
    reproduce.execute_cells(before, ledger_path, 2, run_sweep=fake_sweep(calls))
    assert len(calls) == 2
    ran = json.loads(ledger_path.read_text())["runs"]
    after = plan(["preferences.fit_pairs_per_env_step=0.3"], ["fitting 0.3 pairs per step", "fitting 1.0 pairs per step"])
    calls = []
    ledger = reproduce.execute_cells(after, ledger_path, 2, run_sweep=fake_sweep(calls))
    assert calls == []
    for seed in range(2):
        labels, at_03, at_10 = (ledger["runs"][f"hopper/{line}/seed{seed}"] for line in
                                ("700 labels", "fitting 0.3 pairs per step", "fitting 1.0 pairs per step"))
        assert labels["fingerprint"] == at_03["fingerprint"] == reproduce.fingerprint_of(after[0][1])
        assert labels["run_dir"] == ran[f"hopper/fitting 0.3 pairs per step/seed{seed}"]["run_dir"]
        assert (labels["line"], labels["kind"], labels["first_recorded_as"]) == ("700 labels", "labels", "fitting 0.3 pairs per step")
        assert at_10["run_dir"] == ran[f"hopper/700 labels/seed{seed}"]["run_dir"]
        assert (at_10["kind"], at_10["first_recorded_as"]) == ("ablation", "700 labels")
    assert json.loads(ledger_path.read_text()) == ledger  # saved before anything else could run
    # the figure draws the 700-label line once, not again as "fitting 0.3" over it
    drawn = reproduce.distinct_lines(reproduce.lines_by_task(ledger, ["hopper"])["hopper"])
    assert list(drawn) == ["700 labels", "fitting 1.0 pairs per step"]


def test_the_dry_run_prints_only_what_the_ledger_lacks(tmp_path, monkeypatch, capsys):
    """``--dry-run`` on the CPU back end reads the ledger: a cell finished at three seeds is
    printed as the sweep of seeds 3 and 4 beside them (base seed 3, pool seed 15, two seeds),
    a finished cell not at all, and a cell never run as the sweep of all five; with every cell
    finished, a comment that nothing is left to run."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    argv = ["--figure", "2", "--backend", "cpu", "--tasks", "hopper", "--budgets", "700", "--baselines", "trpo",
            "--runs-dir", str(tmp_path / "runs")]
    cells = reproduce.cpu_cells(reproduce.FIGURES[2], ["hopper"], [700], ["trpo"])
    planned = [(cell, reproduce.cell_config(cell, reproduce.CPU_STEPS, reproduce.CPU_POINTS,
                                            tmp_path / "runs" / "fig2_cpu")) for cell in cells]
    reproduce.execute_cells(planned[:1], tmp_path / "reproduce_fig2_cpu_runs.json", 3, run_sweep=fake_sweep([]))
    capsys.readouterr()
    reproduce.main([*argv, "--dry-run"])
    rl, labels = capsys.readouterr().out.splitlines()
    assert rl.endswith("# hopper/RL (trpo)") and " seed=3 " in rl and " env.seed=15 " in rl and "--seeds 2 " in rl
    assert f"rl-trpo-from-seed3-{reproduce.fingerprint_of(planned[0][1])}" in rl
    assert labels.endswith("# hopper/700 labels") and "--seeds 5 " in labels and " seed=" not in labels
    reproduce.execute_cells(planned[:1], tmp_path / "reproduce_fig2_cpu_runs.json", 5, run_sweep=fake_sweep([]))
    capsys.readouterr()
    reproduce.main([*argv, "--dry-run"])
    assert [line.split("#")[-1] for line in capsys.readouterr().out.splitlines()] == [" hopper/700 labels"]
    reproduce.execute_cells(planned, tmp_path / "reproduce_fig2_cpu_runs.json", 5, run_sweep=fake_sweep([]))
    capsys.readouterr()
    reproduce.main([*argv, "--dry-run"])
    assert capsys.readouterr().out == "# nothing to run: the 2 cells have 5 seeds each in reproduce_fig2_cpu_runs.json\n"


@pytest.mark.parametrize("stop, code", [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM, "stopped"), 143)])
def test_a_stop_inside_a_cell_ends_the_command_with_its_resume_message(monkeypatch, capsys, stop, code):
    """Ctrl-C (or SIGTERM) inside a cell reaches the command as the run's Interrupted, its
    checkpoint whole: the command says where the finished cells are and that the same command
    goes on from there, and exits with the signal's status instead of a traceback."""
    def interrupted(*args, **kwargs):
        raise stop

    monkeypatch.setattr(reproduce, "execute_cells", interrupted)
    with pytest.raises(SystemExit) as exit_:
        reproduce.main(["--figure", "2", "--backend", "cpu", "--tasks", "hopper"])
    assert exit_.value.code == code
    assert "the same command goes on from there" in capsys.readouterr().err


def test_another_cpu_budget_is_another_figure_beside_the_standing_one(monkeypatch):
    """``--steps 2000000`` writes ``reproduce_fig2_cpu_2m``'s ledger, not the 1M figure's, so
    that its cells do not replace the 1M cells (which would then drop out of the outputs as
    made by an earlier config); the 1M budget keeps the figure's plain name."""
    assert reproduce.result_name(2, False, True, reproduce.CPU_STEPS) == "reproduce_fig2_cpu"
    assert reproduce.result_name(2, False, True, 2_000_000) == "reproduce_fig2_cpu_2m"
    assert reproduce.result_name(2, False, True, 1_500_000) == "reproduce_fig2_cpu_1500k"
    assert reproduce.result_name(5, True, False, 20_000) == "reproduce_fig5_quick"
    ledgers, steps = [], []

    def capture(cells, ledger_path, seeds, **kwargs):
        ledgers.append(ledger_path.name)
        steps.append({config.trpo.total_env_steps for _, config in cells})
        raise KeyboardInterrupt  # nothing runs, nothing is written

    monkeypatch.setattr(reproduce, "execute_cells", capture)
    with pytest.raises(SystemExit):
        reproduce.main(["--figure", "2", "--backend", "cpu", "--tasks", "hopper", "--steps", "2000000"])
    assert ledgers == ["reproduce_fig2_cpu_2m_runs.json"] and steps == [{2_000_000}]


def test_a_registered_result_change_gives_the_cells_it_touches_a_new_fingerprint_and_only_those(monkeypatch):
    """An entry in ``RESULT_CHANGES`` (here: another draw of r̂'s dropout masks) makes the cells
    whose config it touches new cells, so the figure's command runs them again on the new code;
    the others keep the fingerprint they had, and with the list empty every cell keeps its own."""
    figure = reproduce.FIGURES[2]
    cells = {cell.key: cell for cell in reproduce.cpu_cells(figure, ["hopper"], [700], ["trpo"],
                                                            ["reward dropout 0.5"])}
    dropout_cell, plain_cell = cells["hopper/reward dropout 0.5"], cells["hopper/700 labels"]

    def fingerprints():
        return [reproduce.fingerprint_of(reproduce.cell_config(cell, reproduce.CPU_STEPS, reproduce.CPU_POINTS,
                                                               Path("/tmp/unused")))
                for cell in (dropout_cell, plain_cell)]

    monkeypatch.setattr(reproduce, "RESULT_CHANGES", ())  # the library's own entries apart
    before = fingerprints()
    change = reproduce.ResultChange("dropout masks, another draw", lambda c: c.reward_model.mlp_dropout > 0)
    monkeypatch.setattr(reproduce, "RESULT_CHANGES", (change,))
    after = fingerprints()
    assert after[0] != before[0]  # this r̂ fits with dropout: a new cell
    assert after[1] == before[1]  # Hopper's does not: its records stay


def test_a_cells_wall_time_is_on_disk_while_it_runs(tmp_path):
    """A process killed outright runs no ``finally``: the time spent so far must already be written."""
    seen = []

    def work():  # waits (10 s at most) to see the file grow past the earlier attempt's time
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            value = float((tmp_path / records.WALL_SECONDS_FILE).read_text())
            if value > 100.0:
                seen.append(value)
            time.sleep(0.01)

    (tmp_path / records.WALL_SECONDS_FILE).write_text("100.0\n")  # an earlier attempt's
    total = records.run_timed(tmp_path, work, every=0.05)
    assert seen and seen[0] > 100.0 and total > 100.0  # (the file keeps a tenth of a second)


def test_a_write_of_the_time_cut_short_leaves_the_time_before(tmp_path, monkeypatch):
    """The machine going away while the wall seconds are rewritten leaves the file as it was, not
    a few characters of the new one that the next attempt would read as its time, or fail on."""
    (tmp_path / records.WALL_SECONDS_FILE).write_text("100.0\n")
    write_text = Path.write_text

    def cut_short(self, text, *args, **kwargs):  # two characters written, then the machine is gone
        write_text(self, text[:2])
        raise SystemExit("killed")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(SystemExit):
        records.run_timed(tmp_path, lambda: None, every=60)
    monkeypatch.undo()
    assert (tmp_path / records.WALL_SECONDS_FILE).read_text() == "100.0\n"


def test_each_attempt_at_a_run_names_the_host_that_computed_it(tmp_path, monkeypatch):
    """A run stopped on one machine and resumed on another was computed by both: each attempt's
    host, start and seconds are kept in the run's directory, on disk while it runs."""
    hosts = iter([{"cpu": "AMD EPYC", "vector_extensions": ["avx2", "avx512f"], "xla_flags": ""},
                  {"cpu": "AMD EPYC", "vector_extensions": ["avx2"], "xla_flags": "--xla_cpu_use_onednn=true"}])
    monkeypatch.setattr(records, "cpu_host", lambda: next(hosts))
    seen = []

    def work():  # waits (10 s at most) for this attempt to be on disk before it ends
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            if len(records.attempts_of(tmp_path)) == 2:
                seen.append(True)
            time.sleep(0.01)

    records.run_timed(tmp_path, lambda: None, every=0.05)
    records.run_timed(tmp_path, work, every=0.05)
    first, second = records.attempts_of(tmp_path)
    assert seen and first["vector_extensions"] == ["avx2", "avx512f"] and second["vector_extensions"] == ["avx2"]
    assert second["xla_flags"] == "--xla_cpu_use_onednn=true" and first["began"] <= second["began"]
    assert first["seconds"] >= 0 and second["seconds"] > 0
    assert records.attempts_of(tmp_path / "never-run") == []


def test_the_gaussian_kl_change_touches_trpo_cells_and_no_others():
    """The KL written through the variances' ratio rounds otherwise in float32, so a TRPO cell run
    on it is a new cell; A2C's cells are untouched."""
    touches = {change.name: change.touches for change in reproduce.RESULT_CHANGES}
    touched = touches["Gaussian KL through the variances' ratio"]
    trpo = load_config(ExperimentConfig, reproduce.PAPER / "mujoco" / "hopper.yaml")
    a2c = load_config(ExperimentConfig, reproduce.PAPER / "atari" / "pong.yaml")
    assert touched(trpo) and not touched(a2c)
