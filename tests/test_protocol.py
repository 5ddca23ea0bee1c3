"""The confirmatory protocol: registered cells, the refusal of any other config, and the decision rule."""
import csv
import dataclasses
import json
import shlex

import numpy as np
import pytest
import yaml

from experiments import confirm, protocol
from experiments.protocol import RegisteredCell, RegistrationError
from rlhf_jax.config import to_dict
from rlhf_jax.sweep import SWEEP_FILE


def small_cell(task="hopper", line="RL (trpo)", first_seed=100, seeds=2) -> RegisteredCell:
    """A registered cell of a short run, its fingerprint computed from today's files."""
    overrides = ("env.id=envpool/Hopper-v5", "env.num_envs=2", *protocol.seed_keys(first_seed, 2),
                 "trpo.total_env_steps=4000", "run.chunk_env_steps=2000", "run.tensorboard=false")
    cell = RegisteredCell(task, line, "baseline", "configs/paper/mujoco/hopper_trpo.yaml", overrides,
                          tuple(range(first_seed, first_seed + seeds)), "")
    return dataclasses.replace(cell, fingerprint=protocol.fingerprint(protocol.cell_config(cell)))


def registration(*cells) -> protocol.Registration:
    return protocol.Registration("test", 4000, 2, 0.8, 700, 6, "rule", (), tuple(cells))


def stand_in_sweep(calls, change=None):
    """Writes what a finished sweep leaves (sweep.yaml, members.csv); ``change(base)`` alters the
    config it records, as a sweep run on another config would have."""
    def run_sweep(directory, base, seeds):
        calls.append(directory)
        directory.mkdir(parents=True, exist_ok=True)
        recorded = change(base) if change else base
        (directory / SWEEP_FILE).write_text(yaml.safe_dump({"base": recorded, "swept": {}, "seeds": seeds}))
        with (directory / "members.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, ["group", "chunk", "member", "seed", "label", "env_steps", "episode_return"])
            writer.writeheader()
            for member, seed in enumerate(range(base["seed"], base["seed"] + seeds)):
                for chunk in range(2):
                    writer.writerow({"group": 0, "chunk": chunk, "member": member, "seed": seed, "label": "base",
                                     "env_steps": 2000 * (chunk + 1), "episode_return": 10.0 * (chunk + 1) + seed})
    return run_sweep


def test_a_registered_cell_runs_once_and_is_recorded_with_its_seeds_and_host(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "RUNS", tmp_path / "runs")
    cell, calls, ledger_path = small_cell(), [], tmp_path / "ledger.json"
    ledger = confirm.run(registration(cell), ledger_path, run_sweep=stand_in_sweep(calls))
    assert len(calls) == 1
    assert sorted(ledger["runs"]) == ["hopper/RL (trpo)/seed100", "hopper/RL (trpo)/seed101"]
    record = ledger["runs"]["hopper/RL (trpo)/seed101"]
    assert record["fingerprint"] == cell.fingerprint and record["episode_return"] == [111.0, 121.0]
    assert record["cpu"] and "vector_extensions" in record and "xla_flags" in record
    [attempt] = record["attempts"]  # one attempt, on this host
    assert (attempt["cpu"], attempt["vector_extensions"]) == (record["cpu"], record["vector_extensions"])
    confirm.run(registration(cell), ledger_path, run_sweep=stand_in_sweep(calls))
    assert len(calls) == 1  # recorded: never run again


def test_a_cell_whose_config_changed_since_it_was_registered_is_refused_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "RUNS", tmp_path / "runs")
    cell = dataclasses.replace(small_cell(), fingerprint="0123456789ab")  # registered on another config
    calls = []
    with pytest.raises(RegistrationError, match="hopper/RL \\(trpo\\): today's config has fingerprint .* the "
                                                "registration 0123456789ab"):
        confirm.run(registration(cell), tmp_path / "ledger.json", run_sweep=stand_in_sweep(calls))
    assert calls == [] and not (tmp_path / "ledger.json").exists()


def test_a_sweep_that_ran_another_config_is_not_recorded(tmp_path, monkeypatch):
    """The check before recording: a sweep directory whose config is not the registered one (edited,
    or run by hand with another setting) never enters the ledger."""
    monkeypatch.setattr(confirm, "RUNS", tmp_path / "runs")
    cell, ledger_path = small_cell(), tmp_path / "ledger.json"

    def another_entropy(base):
        return {**base, "trpo": {**base["trpo"], "entropy_coef": 0.05}}

    with pytest.raises(RegistrationError, match="the finished sweep in .* has fingerprint"):
        confirm.run(registration(cell), ledger_path, run_sweep=stand_in_sweep([], another_entropy))
    assert not ledger_path.exists()


def test_a_registration_is_never_rewritten(tmp_path):
    path = tmp_path / "r.yaml"
    protocol.save(registration(small_cell()), path, "# header\n")
    loaded = protocol.load(path)
    assert loaded == registration(small_cell())
    with pytest.raises(RegistrationError, match="never rewritten"):
        protocol.save(registration(small_cell(first_seed=200)), path, "")


def test_a_path_that_holds_no_registration_is_named_in_one_line_with_the_registered_ones(tmp_path):
    with pytest.raises(RegistrationError, match=r"no registration '.*nowhere.yaml'; registered: .*figure2_matched_5m"):
        protocol.load(tmp_path / "nowhere.yaml")
    (tmp_path / "broken.yaml").write_text("cells: [")
    (tmp_path / "other.yaml").write_text("budget: 1000000\n")
    for name in ("broken.yaml", "other.yaml"):
        with pytest.raises(SystemExit) as stop:
            confirm.main(["report", str(tmp_path / name)])
        assert str(stop.value).startswith(f"error: '{tmp_path / name}' is not a registration")
        assert "\n" not in str(stop.value)


def test_the_designs_use_fresh_seeds_and_one_value_per_setting_but_the_papers_per_task_ones():
    cells = confirm.design_cells(confirm.DESIGNS["figure2_1m"], ["hopper", "swimmer"])
    assert all(min(c.seeds) >= 100 for c in cells)
    assert [c.key for c in cells[:4]] == ["hopper/RL (trpo)", "hopper/700 labels", "swimmer/RL (trpo)",
                                          "swimmer/700 labels"]
    assert {len(c.seeds) for c in cells if c.line in ("RL (trpo)", "700 labels")} == {10}
    assert {len(c.seeds) for c in cells if c.line in ("1400 labels", "350 labels")} == {5}
    configs = {c.key: protocol.cell_config(c) for c in cells}
    assert configs["hopper/700 labels"].trpo.entropy_coef == 0.01
    assert configs["swimmer/700 labels"].trpo.entropy_coef == 0.001  # appendix A.1's one exception
    assert configs["hopper/RL (trpo)"].trpo.total_env_steps == 1_000_000
    # every cell's fingerprint is what today's files give it
    assert all(protocol.fingerprint(configs[c.key]) == c.fingerprint for c in cells)


def changed_keys(cell, earlier_cell) -> list[str]:
    """The resolved config's keys (``section.name``, or a top-level name) whose values differ
    between two cells, sorted."""
    new, old = (to_dict(protocol.cell_config(c)) for c in (cell, earlier_cell))
    return sorted([f"{section}.{name}" for section in new if isinstance(new[section], dict)
                   for name in new[section] if new[section][name] != old[section].get(name)]
                  + [k for k in new if not isinstance(new[k], dict) and new[k] != old[k]])


def test_the_own_episodes_design_changes_only_the_label_runs_episode_length_on_fresh_seeds():
    design = confirm.DESIGNS["figure2_own_episodes_1m"]
    cells = {c.key: c for c in confirm.design_cells(design, ["hopper", "halfcheetah"])}
    before = {c.key: c for c in confirm.design_cells(confirm.DESIGNS["figure2_1m"], ["hopper", "halfcheetah"])}
    used = {seed for name in ("figure2_1m", "figure2_5m")
            for c in confirm.design_cells(confirm.DESIGNS[name], ["hopper"]) for seed in c.seeds}
    assert all(not set(c.seeds) & used for c in cells.values())
    configs = {key: protocol.cell_config(c) for key, c in cells.items()}
    assert configs["hopper/700 labels"].env.max_episode_steps == 0  # the task's own 1,000
    assert protocol.cell_config(before["hopper/700 labels"]).env.max_episode_steps == 200

    changed = lambda key: changed_keys(cells[key], before[key])

    # a task whose label runs kept their own length already, and every RL cell, differ in the seeds alone
    assert changed("halfcheetah/700 labels") == changed("hopper/RL (trpo)") == ["env.seed", "seed"]
    assert changed("hopper/700 labels") == ["env.max_episode_steps", "env.seed", "seed"]
    assert [s["key"] for s in design.per_task_settings].count("env.max_episode_steps") == 1


def test_the_bonus_per_dimension_design_changes_only_the_label_runs_bonus_unit_on_fresh_seeds():
    design = confirm.DESIGNS["figure2_bonus_per_dimension_5m"]
    cells = {c.key: c for c in confirm.design_cells(design, ["ant", "inverteddoublependulum"])}
    before = {c.key: c for c in confirm.design_cells(confirm.DESIGNS["figure2_reset_5m"],
                                                       ["ant", "inverteddoublependulum"])}
    changed = lambda key: changed_keys(cells[key], before[key])

    assert changed("ant/RL (trpo)") == ["env.seed", "seed"]
    assert changed("ant/700 labels") == changed("inverteddoublependulum/700 labels") == [
        "env.seed", "seed", "trpo.entropy_per_action_dimension"]
    assert protocol.cell_config(cells["ant/700 labels"]).trpo.entropy_coef == 0.01  # the paper's, per dimension
    assert [s["key"] for s in design.per_task_settings].count("trpo.entropy_per_action_dimension") == 1


# What a batches design changes in each cell against its predecessor: the agent's three batch keys and the seeds.
BATCH_KEYS_AND_SEEDS = ["env.num_envs", "env.seed", "seed", "trpo.normalize_value_targets", "trpo.observation_moments"]


def test_the_batches_design_changes_only_how_the_agent_makes_its_batches_on_fresh_seeds():
    """figure2_batches_1m is figure2_reset_1m with the agent the reference comparison ran: every
    cell, RL's and the labels', differs from its reset cell in the three batch settings and the seeds."""
    design = confirm.DESIGNS["figure2_batches_1m"]
    cells = {c.key: c for c in confirm.design_cells(design, ["hopper", "inverteddoublependulum"])}
    before = {c.key: c for c in confirm.design_cells(confirm.DESIGNS["figure2_reset_1m"],
                                                       ["hopper", "inverteddoublependulum"])}
    assert cells.keys() == before.keys()
    for key, cell in cells.items():
        assert changed_keys(cell, before[key]) == BATCH_KEYS_AND_SEEDS, key
        config = protocol.cell_config(cell)
        assert config.env.num_envs == 2 and config.trpo.observation_moments == "every_step"
        assert not config.trpo.normalize_value_targets
    # the comparison's --ours-overrides, key for key, so the figure's JSON finds its rows
    assert " ".join(design.agent) == ("trpo.kl_per_action_dimension=true trpo.max_kl=0.01 trpo.cg_damping=0.1 "
                                      "trpo.line_search_decay=0.8 trpo.batch_size=2048 trpo.cg_iterations=25 "
                                      "trpo.fisher_subsample=1 trpo.value_epochs=20 trpo.value_minibatches=16 "
                                      "trpo.observation_clip=10 trpo.observation_min_std=0.0001 "
                                      "trpo.observation_moments=every_step trpo.normalize_value_targets=false "
                                      "env.num_envs=2")


def test_the_5m_batches_design_is_the_bonus_per_dimension_design_with_the_batches_agent_on_fresh_seeds():
    """figure2_batches_5m differs from figure2_bonus_per_dimension_5m in the agent alone, in every
    cell, and its seeds are not figure2_batches_1m's."""
    design = confirm.DESIGNS["figure2_batches_5m"]
    cells = {c.key: c for c in confirm.design_cells(design, ["ant", "reacher"])}
    before = {c.key: c for c in confirm.design_cells(confirm.DESIGNS["figure2_bonus_per_dimension_5m"],
                                                       ["ant", "reacher"])}
    assert cells.keys() == before.keys() == {"ant/RL (trpo)", "ant/700 labels", "reacher/RL (trpo)",
                                             "reacher/700 labels"}
    for key, cell in cells.items():
        assert changed_keys(cell, before[key]) == BATCH_KEYS_AND_SEEDS, key
        assert protocol.cell_config(cell).trpo.total_env_steps == 5_000_000
    assert protocol.cell_config(cells["ant/700 labels"]).trpo.entropy_per_action_dimension
    assert design.agent == confirm.DESIGNS["figure2_batches_1m"].agent
    one_million = {seed for c in confirm.design_cells(confirm.DESIGNS["figure2_batches_1m"], ["ant"])
                   for seed in c.seeds}
    assert all(not set(c.seeds) & one_million for c in cells.values())


def test_a_designs_agent_runs_in_every_cell_and_is_written_in_its_registration(tmp_path):
    """One agent for RL and the label runs alike: its settings are in every cell's config, and so
    in every fingerprint; the registration names them once, and reads them back."""
    agent = ("trpo.kl_per_action_dimension=true", "trpo.max_kl=0.01", "trpo.batch_size=2048")
    design = dataclasses.replace(confirm.DESIGNS["figure2_1m"], agent=agent)
    cells = confirm.design_cells(design, ["hopper"])
    before = {c.key: c for c in confirm.design_cells(confirm.DESIGNS["figure2_1m"], ["hopper"])}
    for cell in cells:
        config = protocol.cell_config(cell)
        assert config.trpo.kl_per_action_dimension and config.trpo.max_kl == 0.01 and config.trpo.batch_size == 2048
        assert cell.fingerprint != before[cell.key].fingerprint
    path = tmp_path / "r.yaml"
    protocol.save(dataclasses.replace(registration(*cells), agent=agent), path, "")
    assert protocol.load(path).agent == agent
    assert yaml.safe_load(path.read_text())["agent"] == list(agent)
    # a registration without an agent is written as before agents had one
    protocol.save(registration(*cells), tmp_path / "plain.yaml", "")
    assert "agent" not in yaml.safe_load((tmp_path / "plain.yaml").read_text())
    assert protocol.load(tmp_path / "plain.yaml").agent == ()


def test_every_design_has_seeds_of_its_own_and_the_matched_agent_is_in_every_cell():
    seeds = {name: {seed for c in confirm.design_cells(design, ["hopper"]) for seed in c.seeds}
             for name, design in confirm.DESIGNS.items()}
    for name, mine in seeds.items():
        assert min(mine) >= 100
        assert all(not mine & theirs for other, theirs in seeds.items() if other != name), name
    comparison = set(range(110, 113)) | set(range(120, 123))  # where the matched agent was compared
    for name in ("figure2_matched_1m", "figure2_matched_5m"):
        assert not seeds[name] & comparison
        for cell in confirm.design_cells(confirm.DESIGNS[name], ["hopper", "swimmer"]):
            config = protocol.cell_config(cell)
            assert config.trpo.kl_per_action_dimension and config.trpo.batch_size == 2048
            assert config.trpo.gamma == 0.995 and config.trpo.gae_lambda == 0.97  # the paper's
            assert config.env.max_episode_steps == 0 or cell.kind == "baseline"


def test_the_gain_ratio_and_its_interval_by_hand():
    estimate = protocol.gain_ratio_estimate([3.0, 5.0, 7.0], [9.0, 11.0], start=1.0)
    # RL's mean gain is 10 - 1 = 9; the seeds' gains 2, 4, 6
    assert estimate.per_seed == pytest.approx((2 / 9, 4 / 9, 6 / 9))
    assert estimate.mean == pytest.approx(4 / 9) and estimate.iqm == pytest.approx(4 / 9)
    assert estimate.mean_low < estimate.mean < estimate.mean_high
    # the most a draw can give: every label seed 7 over RL's smallest gain, 8
    assert estimate.mean_high <= 6 / 8 + 1e-12 and estimate.mean_low >= 2 / 10 - 1e-12
    assert protocol.gain_ratio_estimate([3.0, 5.0, 7.0], [9.0, 11.0], start=1.0) == estimate  # seeded
    assert protocol.gain_ratio_estimate([3.0], [1.0, 0.5], start=2.0) is None  # RL gained nothing


def test_the_iqm_is_the_mean_of_the_middle_half():
    values = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0])
    assert protocol.iqm(values) == pytest.approx(np.mean([2.0, 3.0, 4.0, 5.0]))


def test_the_decision_rule_counts_by_the_mean_and_by_the_lower_bound():
    def ratio(mean, low):
        return protocol.GainRatio(mean, low, mean + 0.1, mean, low, mean + 0.1, (mean,), 1, 1)

    counts = protocol.decide({"a": ratio(0.9, 0.85), "b": ratio(0.85, 0.4), "c": ratio(0.5, 0.2), "d": None}, 0.8)
    assert counts == {"tasks": 4, "at_threshold_by_mean": ["a", "b"], "at_threshold_by_lower_bound": ["a"]}


def test_the_report_reads_the_registered_cells_only(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "RUNS", tmp_path / "runs")
    rl, labels = small_cell(), dataclasses.replace(small_cell(line="700 labels"), kind="labels")
    ledger = confirm.run(registration(rl), tmp_path / "ledger.json", run_sweep=stand_in_sweep([]))
    # the label cell's records, as a finished run of it would leave them
    for seed in labels.seeds:
        ledger["runs"][f"{labels.key}/seed{seed}"] = {**ledger["runs"][f"{rl.key}/seed{seed}"], "line": labels.line,
                                                      "kind": "labels", "fingerprint": labels.fingerprint}
    ledger["runs"]["hopper/700 labels/seed999"] = {**ledger["runs"][f"{rl.key}/seed100"], "line": "700 labels",
                                                   "kind": "labels", "seed": 999, "fingerprint": "stale"}
    result = confirm.report(registration(rl, labels), ledger)
    cell = result["tasks"]["hopper"]["700 labels"]
    assert cell["seeds"] == 2  # the stale record is left out
    assert cell["gain_ratio"]["mean"] == pytest.approx(1.0)
    assert result["counts"]["700 labels"]["at_threshold_by_mean"] == ["hopper"]
    assert json.dumps(result)  # the JSON the report writes


def test_the_figures_json_says_how_its_rl_line_compares_with_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "RESULTS", tmp_path)
    monkeypatch.setattr(confirm, "plot", lambda *args, **kwargs: None)
    comparison = {"target": 0.9, "seed_blocks": {"100": {"tasks_at_target": 3, "tasks_compared": 4}}}
    monkeypatch.setattr(confirm, "figure_rl_line", lambda agent: comparison if agent == [] else None)
    confirm.publish(registration(small_cell()), {"runs": {}})
    assert json.loads((tmp_path / "test.json").read_text())["rl_line_against_reference"] == comparison


def test_a_cells_record_keeps_the_command_that_ran_it_quoted_so_that_pasting_it_runs_the_same(monkeypatch):
    seen = {}
    monkeypatch.setattr(confirm, "enable_compilation_cache", lambda: None)
    monkeypatch.setattr(confirm, "run", lambda *args, provenance, **kwargs: seen.update(provenance) or {"runs": {}})
    monkeypatch.setattr(confirm, "publish", lambda registration, ledger: {})
    monkeypatch.setattr(confirm, "table", lambda result: "")
    argv = ["run", "experiments/registrations/figure2_matched_5m.yaml", "--cells", "hopper/700 labels"]
    confirm.main(argv)
    assert seen["command"] == ("python -m experiments.confirm run experiments/registrations/figure2_matched_5m.yaml "
                               "--cells 'hopper/700 labels'")
    assert shlex.split(seen["command"])[3:] == argv
