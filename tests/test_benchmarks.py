"""Helpers of the benchmark scripts, checked on values worked out by hand."""
import json
from pathlib import Path

import pytest


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

    # Storing a result's headline rows later (--backfill-headlines) does not re-date it; a new result does.
    def commit(text, when):
        result.write_text(text)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "r",
            GIT_COMMITTER_DATE=when, GIT_AUTHOR_DATE=when)
    commit('{"headline": []}', "2021-01-01T00:00:00+00:00")
    assert last_commit_time(result).isoformat() == stamp
    later = "2022-01-01T00:00:00+00:00"
    commit('{"changed": 1, "headline": []}', later)
    assert last_commit_time(result).isoformat() == later


def _source(name: str, data: dict):
    from benchmarks.run import BY_NAME, Source

    return Source(BY_NAME[name], Path(f"{name}.json"), data, this_run=False)


def test_report_renders_the_headline_rows_each_json_stores():
    """The table is the stored rows as they are, with each row's target met, not met or not measured."""
    from benchmarks.run import table

    replay = {"headline": [{"what": "Replay, GiB", "ours": 6.582, "peer": 52.582, "ratio": 0.1252,
                            "target": {"key": "replay_gib", "comparison": "<=", "threshold": 8, "value": 6.582}}]}
    overhead = {"quick": True, "headline": [
        {"what": "RLHF loop env steps/s", "ours": 59735.2, "peer": 812042.0, "ratio": 0.0736,
         "target": {"key": "rlhf_over_true_reward", "comparison": ">=", "threshold": 0.8, "value": 0.0736}},
        {"what": "No fitting", "ours": 279401.0, "peer": None, "ratio": None, "target": None}]}
    fit = {"quick": False, "headline": [
        {"what": "Ensemble fit vs imitation", "ours": 7386.0, "peer": None, "ratio": None,
         "target": {"key": "ensemble_fit_over_imitation", "comparison": ">=", "threshold": 10.0, "value": None}}]}
    older = {"quick": True, "pong": "a result written before benchmarks stored their rows"}
    sources = {name: _source(name, data) for name, data in
               (("replay_memory", replay), ("rlhf_overhead", overhead), ("reward_fit", fit), ("label_dataset_size", older))}
    lines = table(sources)
    assert "| Replay memory | Replay, GiB | 6.58 | 52.6 | 0.125 | <= 8 | yes | `replay_memory.json` (n/a) |" in lines
    assert ("| RLHF overhead | RLHF loop env steps/s | 59,735 | 812,042 | 0.0736 | >= 0.8 | **no** "
            "| `rlhf_overhead.json` (quick) |") in lines
    assert "| RLHF overhead | No fitting | 279,401 | – | – |  |  | `rlhf_overhead.json` (quick) |" in lines
    assert ("| Reward fitting vs imitation | Ensemble fit vs imitation | 7,386 | – | – | >= 10 | not measured "
            "| `reward_fit.json` (full) |") in lines
    assert ("| Label datasets | `label_dataset_size.json` has no headline rows: "
            "`python -m benchmarks.run --backfill-headlines` | | | | | | |") in lines
    assert "| Environments | no results yet: `python -m benchmarks.env_throughput` | | | | | | |" in lines
    # Rows in the order of benchmarks.run.BENCHMARKS, each benchmark's in its own order.
    sections = [line.split(" | ")[0] for line in lines[2:] if line.startswith("| ")]
    assert sections.index("| Reward fitting vs imitation") < sections.index("| RLHF overhead")
    assert lines[-1] == "Targets met: 1 of 2 measured (3 targets in the rows above, each stated by its benchmark)."


def test_headline_rows_of_a_benchmark_come_from_its_result():
    from benchmarks import env_throughput, replay_memory
    from benchmarks.common import Headline, Target

    result = {"atari_replay_1m_gib": 6.0, "atari_replay_1m_target_gib": 8, "stacked_obs_and_next_gib": 48.0,
              "atari_labels_3000_gib": 1.5, "atari_labels_3000_target_gib": 1, "atari_labels_3000_stacked_gib": 4.5}
    row, labels = replay_memory.headline(result)
    assert (row.ours, row.peer, row.ratio) == (6.0, 48.0, 0.125)
    assert row.target == Target("atari_replay_1m_gib", "<=", 8, 6.0) and row.target.met
    assert not replay_memory.headline({**result, "atari_replay_1m_gib": 9.0})[0].target.met
    assert (labels.ours, labels.peer) == (1.5, 4.5) and labels.ratio == pytest.approx(1 / 3)
    assert labels.target == Target("atari_labels_3000_gib", "<=", 1, 1.5) and not labels.target.met

    result = {"atari_envs": 8, "gymnax_envs": 1024, "envpool_hopper_envs": 16, "mjx_hopper_envs": 64,
              "envpool_pong_python_steps_per_s": 1000.0, "envpool_pong_xla_steps_per_s": 1100.0,
              "envpool_pong_modified_steps_per_s": 1045.0, "envpool_xla_over_python": 1.1,
              "atari_modified_over_plain": 0.95, "gymnax_cartpole_steps_per_s": 3e6,
              "gymnax_cartpole_raw_steps_per_s": 2e6, "gymnax_ours_over_raw": 1.5, "envpool_hopper_steps_per_s": 5e3}
    rows = env_throughput.headline(result)
    assert [(r.ours, r.peer, r.ratio) for r in rows] == [(1100.0, 1000.0, 1.1), (1045.0, 1100.0, 0.95),
                                                          (3e6, 2e6, 1.5), (5e3, None, None)]
    assert [r.target and (r.target.key, r.target.comparison, r.target.threshold, r.target.met) for r in rows] == [
        ("envpool_xla_over_python", ">=", 0.95, True), ("atari_modified_over_plain", ">=", 0.95, True), None, None]
    assert rows[0].what.endswith("(8 envs)") and rows[2].what.endswith("(1024 envs)")
    with_mjx = env_throughput.headline({**result, "mjx_hopper_steps_per_s": 300.0})  # --quick measures it only with --mjx
    assert with_mjx[-1] == Headline("Hopper env steps/s, MJX (64 envs)", 300.0)
    assert [Headline.from_json(r.to_json()) for r in with_mjx] == with_mjx  # what the JSON stores and the report reads


def test_write_result_stores_the_rows_made_from_the_result_it_writes(tmp_path, monkeypatch):
    import json

    from benchmarks import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    rows = lambda result: [common.Headline(f"{result['benchmark']} figure", result["figure"])]
    path = common.write_result("made_up", {"figure": 2.5}, headline=rows)
    stored = json.loads(path.read_text())
    assert stored["figure"] == 2.5 and stored["headline"] == [
        {"what": "made_up figure", "ours": 2.5, "peer": None, "ratio": None, "target": None}]
    assert "headline" not in json.loads(common.write_result("no_rows", {"figure": 1}).read_text())


def test_across_commits_reads_the_key_each_tree_writes_and_names_a_missing_one(tmp_path):
    """A benchmark runs inside the commit's own tree (not this checkout), and its JSON there
    gives the figure; the headline's ratio and target come from the result."""
    import textwrap

    from benchmarks import across_commits

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "fake.py").write_text(textwrap.dedent("""\
        import json, pathlib, sys
        out = pathlib.Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "fake.json").write_text(json.dumps({"speed": float(sys.argv[1])}))
        """))
    assert across_commits.run_benchmark(tmp_path, "fake", ["12.5"], "speed") == 12.5
    with pytest.raises(KeyError, match="'pace'"):
        across_commits.run_benchmark(tmp_path, "fake", ["1"], "pace")
    result = {"key": "speed", "benchmark_measured": "fake", "after": "abc", "before": "def",
              "after_median": 120.0, "before_median": 10.0, "after_over_before": 12.0, "target": 10.0}
    (row,) = across_commits.headline(result)
    assert (row.ours, row.peer, row.ratio, row.target.met) == (120.0, 10.0, 12.0, True)
    assert across_commits.headline({**result, "target": None})[0].target is None


def test_a_benchmark_of_parts_reads_only_and_quick_one_way():
    from benchmarks.common import PartsRun, parse_parts

    parts = ("seeds", "pong")
    assert parse_parts("", parts, []) == PartsRun(False, parts, merge=False, repeats=3, rounds=5)
    # Some parts only: the stored result's other figures are kept.
    assert parse_parts("", parts, ["--only", "pong", "--quick"]) == PartsRun(True, ("pong",), True, 1, 3)
    with pytest.raises(SystemExit):
        parse_parts("", parts, ["--only", "atari"])


def test_a_sweeps_rate_is_the_rate_its_rows_carry_without_each_groups_compiling_chunk(tmp_path):
    from benchmarks.cpu_devices import sweep_rate

    # rlhf_jax.sweep writes the whole sweep's rate on every member's row of a chunk.
    rows = ["group,chunk,member,steps_per_second", "0,0,0,1", "0,0,1,1",  # compiling: left out
            "0,1,0,10", "0,1,1,10", "0,2,0,20", "0,2,1,20",
            "1,0,2,2", "1,0,3,2",  # the second group's program compiles too
            "1,1,2,60", "1,1,3,60"]
    (tmp_path / "members.csv").write_text("\n".join(rows) + "\n")
    assert sweep_rate(tmp_path / "members.csv") == 20.0  # the median of 10, 20 and 60
    (tmp_path / "members.csv").write_text("\n".join(rows[:3]) + "\n")
    with pytest.raises(RuntimeError, match="one chunk"):
        sweep_rate(tmp_path / "members.csv")


def test_the_report_lists_what_only_an_accelerator_can_show_with_its_command_and_the_figures_measured_there():
    """Every benchmark that declares what an accelerator would show gets a row under its own
    heading: the command that measures it and the device of its result in results/accelerator/;
    those results' headline rows follow in a table of their own, each naming its file."""
    from benchmarks.common import Headline
    from benchmarks.run import BENCHMARKS, accelerator_section

    row = Headline("RLHF loop vs A2C (Pong)", 7648.2, 10052.5, 0.7608).to_json()
    on_device = {"mujoco_throughput": _source("mujoco_throughput", {"machine": {"device": "gpu:NVIDIA H200"}}),
                 "rlhf_pong": _source("rlhf_pong", {"machine": {"device": "gpu:NVIDIA H100"}, "quick": True,
                                                    "headline": [row]})}
    lines = accelerator_section(on_device)
    assert lines[0] == "## What only an accelerator can show"
    declared = [b.name for b in BENCHMARKS if b.on_accelerator is not None]
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines
            if line.startswith("| ") and "---" not in line and line.split(" | ")[0].removeprefix("| ") in
            ["benchmark", *declared]}
    assert "mujoco_throughput" in declared and "cpu_devices" not in declared
    assert sorted(rows) == sorted(["benchmark", *declared])
    assert rows["mujoco_throughput"].endswith(
        "| `python -m benchmarks.mujoco_throughput --tasks all` | gpu:NVIDIA H200 |")
    assert rows["rlhf_pong"].endswith("| `python -m benchmarks.rlhf_pong` | gpu:NVIDIA H100 |")
    assert rows["scaling"].endswith("| not yet |")
    figures = [line for line in lines if "accelerator/" in line and line.startswith("| RLHF overhead")]
    assert figures == ["| RLHF overhead | RLHF loop vs A2C (Pong) | 7,648 | 10,052 | 0.761 |  |  | "
                       "`accelerator/rlhf_pong.json` (quick) |"]
    assert not any("accelerator/" in line for line in accelerator_section({})[9:])  # nothing measured: no figures


def test_a_benchmark_run_where_jax_has_an_accelerator_writes_beside_the_cpu_results(monkeypatch, tmp_path):
    """A result measured on a GPU goes to results/accelerator/, so that it never replaces (or is
    merged into) the CPU's figures."""
    from benchmarks import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common.jax, "default_backend", lambda: "gpu")
    common.write_result("demo", {"x": 1})
    assert (tmp_path / "accelerator" / "demo.json").exists() and not (tmp_path / "demo.json").exists()
    monkeypatch.setattr(common.jax, "default_backend", lambda: "cpu")
    common.write_result("demo", {"x": 2})
    assert json.loads((tmp_path / "demo.json").read_text())["x"] == 2


def test_the_mujoco_throughput_benchmark_names_a_task_it_does_not_know_before_measuring(monkeypatch, capsys):
    import sys

    from benchmarks import mujoco_throughput

    monkeypatch.setattr(mujoco_throughput, "measure", lambda *a: pytest.fail("measured an unknown task"))
    monkeypatch.setattr(sys, "argv", ["mujoco_throughput", "--tasks", "hopper,hoper"])
    with pytest.raises(SystemExit):
        mujoco_throughput.main()
    assert "--tasks: no MuJoCo task hoper (known: reacher, halfcheetah, hopper" in capsys.readouterr().err


@pytest.mark.parametrize("rates, error", [("0.3,x", "--fit-rates: not a comma-separated list of numbers: '0.3,x'"),
                                          ("0.3,0", "--fit-rates: a fitting rate is a positive number of pairs per env step, not 0")])
def test_the_mujoco_throughput_benchmark_refuses_a_bad_fitting_rate_before_measuring(monkeypatch, capsys, rates, error):
    import sys

    from benchmarks import mujoco_throughput

    monkeypatch.setattr(mujoco_throughput, "measure", lambda *a: pytest.fail("measured with a bad fitting rate"))
    monkeypatch.setattr(sys, "argv", ["mujoco_throughput", "--fit-rates", rates])
    with pytest.raises(SystemExit):
        mujoco_throughput.main()
    assert error in capsys.readouterr().err


def test_the_mujoco_throughput_headline_has_a_row_for_each_fitting_rate_measured():
    """The loop's row names the rate its config fits at (1.0 in results from before it was
    recorded), and each other rate measured has a row of its own."""
    from benchmarks.mujoco_throughput import headline

    task = {"num_envs": 64, "trpo_steps_per_s": 100.0, "raw_steps_per_s": 120.0, "trpo_over_raw": 0.83,
            "rlhf_steps_per_s": 60.0, "rlhf_over_trpo": 0.6, "rlhf_fit_rate": 0.3, "fit_rates": [0.1, 1.0],
            "rlhf_fit_0.1_steps_per_s": 85.0, "rlhf_fit_0.1_over_trpo": 0.85,
            "rlhf_fit_1_steps_per_s": 32.0, "rlhf_fit_1_over_trpo": 0.32}
    rows = [row for row in headline({"tasks": {"hopper": task}}) if "RLHF loop" in row.what]
    assert [(row.ours, row.ratio) for row in rows] == [(60.0, 0.6), (85.0, 0.85), (32.0, 0.32)]
    assert "fitting 0.3 pairs per env step as its config does" in rows[0].what and rows[0].target is not None
    assert "fitting 1.0 pairs per env step instead of its config's 0.3" in rows[2].what
    before = {key: value for key, value in task.items() if key != "rlhf_fit_rate"}
    assert "fitting 1.0 pairs per env step as its config does" in headline({"tasks": {"hopper": before}})[1].what


def test_every_result_names_the_host_that_gives_its_digits(tmp_path, monkeypatch):
    import json

    from benchmarks import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_onednn=true")
    monkeypatch.setattr(common, "cpu_model", lambda: "Made-up CPU 9000")
    stored = json.loads(common.write_result("made_up", {"figure": 1}).read_text())["machine"]
    assert stored["cpu"] == "Made-up CPU 9000" and stored["xla_flags"] == "--xla_cpu_use_onednn=true"
    assert set(stored["vector_extensions"]) <= set(common.VECTOR_EXTENSIONS)


def test_the_pong_loop_states_xla_arithmetic_only_where_it_counts_the_convolutions():
    """XLA's cost analysis on a GPU leaves cuDNN's convolutions out: the arithmetic row is a CPU's only."""
    from benchmarks.rlhf_pong import headline

    result = {"labels_held": 3000, "chunk_env_steps": 10000, "pong_rlhf_steps_per_s": 7648.2,
              "pong_true_reward_steps_per_s": 10052.5, "pong_rlhf_over_true_reward": 0.7608,
              "flops_per_env_step_fitting": 3.0e8, "flops_per_env_step_a2c": 7.6e7}
    on_cpu = headline({**result, "machine": {"device": "cpu:cpu"}})
    on_gpu = headline({**result, "machine": {"device": "gpu:NVIDIA H100 80GB HBM3"}})
    assert [row.ratio for row in on_gpu] == [0.7608]
    assert len(on_cpu) == 2 and on_cpu[1].ratio == pytest.approx(3.0e8 / 7.6e7)


def test_the_pong_training_over_raw_stepping_target_is_a_cpus():
    """On a CPU the network and the pool share the cores, which the 0.8 target is about; on an
    accelerator the row is shown without it."""
    from benchmarks.agent_throughput import headline

    result = {"cartpole_envs": 32, "pong_envs": 16, "a2c_pong_steps_per_s": 11002.4,
              "envpool_pong_raw_steps_per_s": 16233.4, "a2c_pong_over_raw_env": 0.6796}
    row = lambda device: headline({**result, "machine": {"device": device}})[3]  # noqa: E731
    assert row("cpu:cpu").target.met is False and row("gpu:NVIDIA H100 80GB HBM3").target is None


def test_env_throughput_only_mjx_keeps_the_stored_results_mode(tmp_path, monkeypatch):
    """``--only-mjx --quick`` merged into a full stored result leaves the file's ``quick`` (its
    EnvPool and gymnax parts' mode) as it was, records MJX's own, and its row says so; with no
    stored result, the file's mode is MJX's."""
    import sys

    from benchmarks import common, env_throughput

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(env_throughput, "make", lambda config: config)
    monkeypatch.setattr(env_throughput, "measure_scan", lambda env, steps, repeats: 500.0)
    monkeypatch.setattr(sys, "argv", ["env_throughput", "--only-mjx", "--quick"])
    env_throughput.main()
    alone = json.loads((tmp_path / "env_throughput.json").read_text())
    assert alone["quick"] is True and alone["mjx_hopper_quick"] is True

    full = {"quick": False, "atari_envs": 8, "mjx_hopper_envs": 256,
            "mjx_hopper_steps_per_s": 900.0, "mjx_hopper_quick": False}
    (tmp_path / "env_throughput.json").write_text(json.dumps(full))
    env_throughput.main()
    merged = json.loads((tmp_path / "env_throughput.json").read_text())
    assert merged["quick"] is False and merged["atari_envs"] == 8
    assert merged["mjx_hopper_quick"] is True and merged["mjx_hopper_steps_per_s"] == 500.0
    assert merged["headline"][-1]["what"] == "Hopper env steps/s, MJX (64 envs --quick)"


def test_env_throughput_rows_are_those_of_the_parts_measured():
    """``--only-mjx`` (MJX's Hopper alone, where EnvPool cannot load) writes a result whose one row is MJX's."""
    from benchmarks.env_throughput import headline

    [row] = headline({"quick": True, "mjx_hopper_envs": 64, "mjx_hopper_steps_per_s": 123456.0})
    assert row.what == "Hopper env steps/s, MJX (64 envs)" and row.ours == 123456.0


@pytest.mark.parametrize("argv, named", [(["--before", "no-such-commit"], "--before"),
                                         (["--after", "no-such-commit"], "--after"),
                                         (["--benchmark", "no_such_benchmark"], "--benchmark"),
                                         (["--rounds", "0"], "--rounds")])
def test_across_commits_refuses_a_wrong_commit_benchmark_or_rounds_in_one_line(argv, named, capsys, monkeypatch):
    from benchmarks import across_commits

    monkeypatch.setattr(across_commits.subprocess, "run", _refuse_worktrees(across_commits.subprocess.run))
    with pytest.raises(SystemExit):
        across_commits.main(argv)
    assert named in capsys.readouterr().err.strip().splitlines()[-1]


def _refuse_worktrees(run):
    """subprocess.run, but a worktree added is a test failure: the refusal comes first."""
    def guarded(command, *args, **kwargs):
        if command[:3] == ["git", "worktree", "add"]:
            pytest.fail("a worktree was added")
        return run(command, *args, **kwargs)
    return guarded
