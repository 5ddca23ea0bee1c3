"""The TRPO reference study: what its report compares, its sweeps' resumption, and our step against the reference's."""
import contextlib
import os
import subprocess

import numpy as np
import pytest

from experiments import records, reproduce, trpo_reference
from rlhf_jax.config import ExperimentConfig, load_config, to_dict
from rlhf_jax.sweep import Sweep


def record(side, task, final, steps, variant=None, seed=0, first_seed=0):
    default = trpo_reference.AS_CONFIGURED if side == "ours" else trpo_reference.ZOO
    return {"side": side, "task": task, "seed": seed, "first_seed": first_seed, "final_return": final, "steps": steps,
            "variant": variant or default, "cpu": "test"}


@pytest.fixture
def ledgers(tmp_path, monkeypatch):
    """The two sides' ledgers as the report reads them, filled by each test."""
    books = {"reference": {"runs": {}}, "ours": {"runs": {}}}
    monkeypatch.setattr(trpo_reference, "load_ledger", lambda path: books[path])
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: side)
    monkeypatch.setattr(trpo_reference, "locked", lambda path: contextlib.nullcontext())  # no file to lock
    monkeypatch.setattr(trpo_reference, "RESULTS", tmp_path)
    return books


@pytest.fixture(autouse=True)
def claims_apart(tmp_path, monkeypatch):
    """The reference's claims on its runs go to the test's folder, not the repository's runs/."""
    monkeypatch.setattr(trpo_reference, "RUNS", tmp_path / "runs")


def test_the_report_compares_only_our_runs_at_the_reference_budget(ledgers):
    """A 150k-step probe of ours is no final to set against the reference's 1M-step runs."""
    ledgers["reference"]["runs"] = {"ant/seed0": record("reference", "ant", 200.0, 1_000_000),
                                    "ant/seed1": record("reference", "ant", 300.0, 1_000_000, seed=1)}
    ledgers["ours"]["runs"] = {"a": record("ours", "ant", 150.0, 1_000_000),
                               "b": record("ours", "ant", 350.0, 1_000_000, seed=1),
                               "probe": record("ours", "ant", -90.0, 150_000, seed=2)}
    row = trpo_reference.report()["seed_blocks"]["0"]["as configured"]["tasks"]["ant"]
    assert row["ours_per_seed"] == [150.0, 350.0]
    assert row["ratio"] == pytest.approx(250.0 / 250.0)


def test_a_fresh_block_of_seeds_is_set_against_the_reference_on_the_same_seeds(ledgers):
    """Confirming on seeds 100-101 compares with the reference's 100-101, not its probe seeds 0-1."""
    ledgers["reference"]["runs"] = {
        "ant/seed0": record("reference", "ant", 100.0, 1_000_000),
        "ant/seed1": record("reference", "ant", 100.0, 1_000_000, seed=1),
        "ant/seed100": record("reference", "ant", 400.0, 1_000_000, seed=100, first_seed=100),
        "ant/seed101": record("reference", "ant", 600.0, 1_000_000, seed=101, first_seed=100)}
    ledgers["ours"]["runs"] = {
        "a": record("ours", "ant", 90.0, 1_000_000), "b": record("ours", "ant", 110.0, 1_000_000, seed=1),
        "c": record("ours", "ant", 250.0, 1_000_000, seed=100, first_seed=100),
        "d": record("ours", "ant", 250.0, 1_000_000, seed=101, first_seed=100)}
    blocks = trpo_reference.report()["seed_blocks"]
    assert blocks["0"]["as configured"]["tasks"]["ant"]["ratio"] == pytest.approx(1.0)
    fresh = blocks["100"]["as configured"]["tasks"]["ant"]
    assert fresh["reference_per_seed"] == [400.0, 600.0]
    assert fresh["ratio"] == pytest.approx(250.0 / 500.0)


def test_our_runs_on_a_fresh_block_start_at_its_first_seed():
    config, keys = trpo_reference.our_config("hopper", 100_000, [], first_seed=100)
    assert config.seed == 100 and config.env.seed == 100


def test_a_sweep_begun_with_another_seed_count_is_refused_not_resumed(tmp_path):
    base = to_dict(load_config(ExperimentConfig, "configs/a2c_cartpole.yaml", ["a2c.total_env_steps=1000"]))
    Sweep.create(tmp_path / "sweep", base, {}, 1)
    with pytest.raises(ValueError, match="holds a sweep of 1 seeds, not 2"):
        reproduce.run_or_resume_sweep(tmp_path / "sweep", base, 2)


def test_the_references_settings_in_our_units_scale_its_kl_bound_and_damping_by_the_action_dims():
    """sb3-contrib averages the KL over action dimensions: 0.04 on HalfCheetah's 6 is our 0.24."""
    zoo = {"normalize": True, "n_envs": 2, "policy": "MlpPolicy", "batch_size": 128, "n_steps": 1024, "gamma": 0.99,
           "gae_lambda": 0.95, "sub_sampling_factor": 1, "cg_max_steps": 25, "cg_damping": 0.1,
           "n_critic_updates": 20, "learning_rate": 0.001, "target_kl": 0.04}
    keys = dict(key.split("=") for key in trpo_reference.in_our_units(zoo, action_dims=6))
    assert keys["trpo.max_kl"] == "0.24" and keys["trpo.cg_damping"] == "0.6"
    assert keys["trpo.line_search_decay"] == "0.8"  # sb3-contrib's shrinking factor, where ours halves
    assert keys["trpo.batch_size"] == "2048" and keys["env.num_envs"] == "2"
    assert keys["trpo.value_minibatches"] == "16" and keys["trpo.value_epochs"] == "20"
    assert keys["trpo.normalize_observations"] == "true" and keys["trpo.observation_clip"] == "10"
    without_target = dict(key.split("=") for key in trpo_reference.in_our_units(
        {k: v for k, v in zoo.items() if k != "target_kl"}, action_dims=8))
    assert without_target["trpo.max_kl"] == "0.08"  # sb3-contrib's default 0.01, on Ant's 8
    with pytest.raises(ValueError, match="sub_sampling_factor 5"):
        trpo_reference.in_our_units({**zoo, "sub_sampling_factor": 5}, action_dims=6)
    config, _ = trpo_reference.our_config("halfcheetah", 100_000, trpo_reference.in_our_units(zoo, 6))
    assert config.trpo.max_kl == pytest.approx(0.24) and config.trpo.line_search_decay == pytest.approx(0.8)


def test_the_figure_reads_its_own_rl_config_against_the_reference_block_by_block(ledgers, tmp_path):
    ledgers["reference"]["runs"] = {
        "ant/seed0": record("reference", "ant", 200.0, 1_000_000),
        "ant/seed100": record("reference", "ant", 400.0, 1_000_000, seed=100, first_seed=100)}
    ledgers["ours"]["runs"] = {
        "a": record("ours", "ant", 100.0, 1_000_000),
        "b": record("ours", "ant", 800.0, 1_000_000, variant=trpo_reference.AS_REFERENCE),
        "c": record("ours", "ant", 380.0, 1_000_000, seed=100, first_seed=100)}
    trpo_reference.report()
    line = trpo_reference.figure_rl_line(path=tmp_path / "trpo_reference.json")
    assert line["target"] == 0.9
    assert line["seed_blocks"]["0"]["tasks"]["ant"]["ratio"] == pytest.approx(0.5)  # not the other variant's 4.0
    assert line["seed_blocks"]["100"]["tasks"]["ant"]["ratio"] == pytest.approx(0.95)
    assert line["seed_blocks"]["100"]["tasks_at_target"] == 1
    assert trpo_reference.figure_rl_line(path=tmp_path / "no_report_yet.json") is None


def test_a_registered_agent_is_read_against_every_variant_of_the_reference(ledgers, tmp_path):
    """An agent with settings of its own is its variant of ours: the figure reads that variant,
    against the zoo's reference and against the reference at the same gamma and lambda."""
    agent = ["trpo.max_kl=0.01", "trpo.batch_size=2048"]
    same = "gamma=0.995 gae_lambda=0.97"
    ledgers["reference"]["runs"] = {
        "zoo": record("reference", "ant", 400.0, 1_000_000, seed=110, first_seed=110),
        "paper": record("reference", "ant", 200.0, 1_000_000, variant=same, seed=110, first_seed=110)}
    ledgers["ours"]["runs"] = {
        "configured": record("ours", "ant", 100.0, 1_000_000, seed=110, first_seed=110),
        "agent": record("ours", "ant", 380.0, 1_000_000, variant=" ".join(agent), seed=110, first_seed=110)}
    trpo_reference.report()
    line = trpo_reference.figure_rl_line(agent, tmp_path / "trpo_reference.json")
    assert line["agent"] == " ".join(agent)
    assert line["seed_blocks"]["110"]["tasks"]["ant"]["ratio"] == pytest.approx(0.95)  # not 100 / 400
    assert line["reference_variants"][same]["110"]["tasks"]["ant"]["ratio"] == pytest.approx(1.9)
    as_configured = trpo_reference.figure_rl_line(path=tmp_path / "trpo_reference.json")
    assert as_configured["seed_blocks"]["110"]["tasks"]["ant"]["ratio"] == pytest.approx(0.25)


def test_a_reference_run_keeps_what_another_process_recorded_while_it_ran(tmp_path, monkeypatch):
    """The ledger was read before a run of 15 minutes and written back after it: another
    process's record from those minutes was lost."""
    path = tmp_path / "reference_runs.json"
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: path)

    def run_reference(task, steps, seed, overrides=None, control_cost=True, simulator="gymnasium"):
        records.save_json(path, {"runs": {"hopper/seed0": record("reference", "hopper", 1.0, steps)}})
        return {**record("reference", task, 2.0, steps, seed=seed), "seconds": 900.0}

    monkeypatch.setattr(trpo_reference, "run_reference", run_reference)
    trpo_reference.main(["--side", "reference", "--tasks", "ant", "--seeds", "1", "--first-seed", "100",
                         "--steps", "100"])
    runs = records.load_ledger(path)["runs"]
    assert sorted(runs) == ["ant/seed100", "hopper/seed0"]
    assert runs["ant/seed100"]["first_seed"] == 100  # the block it belongs to, for the report


def test_the_reference_with_the_papers_gamma_is_its_own_variant_block_by_block(ledgers, monkeypatch):
    """``--reference-overrides``: records of the reference with other settings are set against
    ours in ``reference_variants``, and leave the zoo's comparison as it was."""
    paper = "the zoo's settings gamma=0.995 gae_lambda=0.97"
    ledgers["reference"]["runs"] = {
        "ant/seed100": record("reference", "ant", 400.0, 1_000_000, seed=100, first_seed=100),
        "ant/seed100/gamma=0.995": record("reference", "ant", 100.0, 1_000_000, variant=paper, seed=100,
                                          first_seed=100)}
    del ledgers["reference"]["runs"]["ant/seed100"]["variant"]  # made before the reference had variants
    ledgers["ours"]["runs"] = {"c": record("ours", "ant", 200.0, 1_000_000, seed=100, first_seed=100)}
    result = trpo_reference.report()
    assert result["seed_blocks"]["100"]["as configured"]["tasks"]["ant"]["ratio"] == pytest.approx(0.5)
    assert result["reference_variants"][paper]["100"]["as configured"]["tasks"]["ant"]["ratio"] == pytest.approx(2.0)
    monkeypatch.setattr(trpo_reference, "zoo_settings", lambda task: {"gamma": 0.99, "gae_lambda": 0.95})
    assert trpo_reference.reference_overrides(["gamma=0.995", "gae_lambda=0.97"], "ant") == {
        "gamma": 0.995, "gae_lambda": 0.97}
    assert trpo_reference.reference_variant({"gamma": 0.995, "gae_lambda": 0.97}) == paper
    with pytest.raises(ValueError, match="gama=0.995"):
        trpo_reference.reference_overrides(["gama=0.995"], "ant")
    with pytest.raises(SystemExit):
        trpo_reference.main(["--side", "ours", "--reference-overrides", "gamma=0.995"])


def test_the_tasks_without_their_control_cost_are_a_study_of_their_own(ledgers, tmp_path, monkeypatch):
    """``--no-control-cost``: both sides run the task as figure 2 scores it; the report never sets
    a run without the control cost against one with it, and the figure reads both."""
    paper = "the zoo's settings gamma=0.995 gae_lambda=0.97"
    agent = ["trpo.max_kl=0.01"]
    without = lambda r: {**r, "control_cost": False}
    ledgers["reference"]["runs"] = {
        "with": record("reference", "ant", -10.0, 1_000_000, variant=paper, seed=120, first_seed=120),
        "without": without(record("reference", "ant", 500.0, 1_000_000, variant=paper, seed=120, first_seed=120))}
    ledgers["ours"]["runs"] = {
        "without": without(record("ours", "ant", 450.0, 1_000_000, variant=" ".join(agent), seed=120,
                                  first_seed=120))}
    result = trpo_reference.report()
    assert result["reference_variants"][paper]["120"] == {}  # ours ran no task with its control cost here
    figure = result["without_control_cost"]["reference_variants"][paper]["120"][" ".join(agent)]
    assert figure["tasks"]["ant"]["ratio"] == pytest.approx(0.9) and figure["tasks_at_target"] == 1
    line = trpo_reference.figure_rl_line(agent, tmp_path / "trpo_reference.json")
    assert line["without_control_cost"]["reference_variants"][paper]["120"]["tasks"]["ant"]["ratio"] == \
        pytest.approx(0.9)
    assert line["reference_variants"] == {}
    # each side's run is the task without its control cost
    config, _ = trpo_reference.our_config("ant", 100_000, [], control_cost=False)
    assert config.env.control_cost is False
    assert trpo_reference.our_config("ant", 100_000, [])[0].env.control_cost is True
    path = tmp_path / "reference_runs.json"
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: path)
    monkeypatch.setattr(trpo_reference, "load_ledger", records.load_ledger)  # a real file, from here on
    asked = []
    monkeypatch.setattr(trpo_reference, "run_reference", lambda task, steps, seed, overrides=None, control_cost=True,
                        simulator="gymnasium": asked.append(control_cost) or {**record("reference", task, 2.0, steps),
                                                                              "seconds": 1.0})
    trpo_reference.main(["--side", "reference", "--tasks", "ant", "--seeds", "1", "--first-seed", "120",
                         "--steps", "100", "--no-control-cost"])
    assert asked == [False] and list(records.load_ledger(path)["runs"]) == ["ant/seed120/no_control_cost"]


def test_the_reference_plays_the_task_without_its_control_cost_when_asked():
    pytest.importorskip("stable_baselines3")
    for task in ("ant", "halfcheetah"):
        weights = [e.unwrapped._ctrl_cost_weight for e in trpo_reference.reference_env(task, 2, 0, False).envs]
        assert weights == [0.0, 0.0]
        assert trpo_reference.reference_env(task, 1, 0).envs[0].unwrapped._ctrl_cost_weight > 0


def test_a_task_the_zoo_has_not_tuned_takes_its_mujoco_defaults():
    table = {"Ant-v4": {"gamma": 0.99}, "Swimmer-v4": {"gamma": 0.9999}}
    assert trpo_reference.zoo_entry(table, "swimmer") == "Swimmer-v4"
    assert trpo_reference.zoo_entry(table, "ant") == "Ant-v4"
    assert trpo_reference.zoo_entry(table, "invertedpendulum") == trpo_reference.ZOO_MUJOCO_DEFAULTS == "Ant-v4"


def test_the_reference_on_envpools_task_is_its_own_variant_and_ledger_key(tmp_path, monkeypatch):
    """``--reference-on envpool``: the reference plays the task ours plays, recorded apart from
    its runs on Gymnasium's task, which it never overwrites."""
    assert trpo_reference.reference_variant({}, "envpool") == "the zoo's settings on EnvPool's task"
    assert trpo_reference.reference_variant({"gamma": 0.995}) == "the zoo's settings gamma=0.995"
    path = tmp_path / "reference_runs.json"
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: path)
    asked = []
    monkeypatch.setattr(trpo_reference, "run_reference", lambda task, steps, seed, overrides=None, control_cost=True,
                        simulator="gymnasium": asked.append(simulator) or {**record("reference", task, 2.0, steps),
                                                                           "seconds": 1.0})
    for on in ([], ["--reference-on", "envpool"]):
        trpo_reference.main(["--side", "reference", "--tasks", "inverteddoublependulum", "--seeds", "1",
                             "--first-seed", "940", "--steps", "100", *on])
    assert asked == ["gymnasium", "envpool"]
    assert sorted(records.load_ledger(path)["runs"]) == ["inverteddoublependulum/seed940",
                                                          "inverteddoublependulum/seed940/envpool"]
    with pytest.raises(SystemExit):
        trpo_reference.main(["--side", "ours", "--reference-on", "envpool"])


def test_envpools_task_ends_an_episode_as_stable_baselines_expects():
    """The step that ends an episode returns the next one's first observation, the last one in
    ``terminal_observation``, and a fall is not a time limit (SB3 bootstraps V only at the latter)."""
    pytest.importorskip("stable_baselines3")
    env = trpo_reference.reference_env("inverteddoublependulum", 2, 0, simulator="envpool")
    first = env.reset()
    assert first.shape == (2, 9) and abs(first[:, 0]).max() < 0.2  # the cart starts near the middle
    ends = {}  # copy -> (its info, the observation returned) at its first end; the copies may end apart
    for _ in range(50):  # full force one way: both poles fall within a few steps
        observations, _, dones, infos = env.step(np.ones((2, 1), np.float32))
        for i in np.flatnonzero(dones):
            ends.setdefault(int(i), (infos[i], observations[i].copy()))
        if len(ends) == 2:
            break
    assert sorted(ends) == [0, 1]
    for info, returned in ends.values():
        assert info["TimeLimit.truncated"] is False and info["episode"]["l"] >= 1
        assert abs(info["terminal_observation"][0]) > abs(returned[0])  # pushed away; the new episode starts
        assert abs(returned[0]) < 0.2  # near the middle


def test_a_code_change_that_alters_trpos_results_names_a_fresh_run_of_ours(monkeypatch):
    """A run directory named by the config alone was resumed, and its returns read, after a
    change listed in ``RESULT_CHANGES`` had made the same config compute something else."""
    config, _ = trpo_reference.our_config("hopper", 100_000, [])
    monkeypatch.setattr(reproduce, "RESULT_CHANGES", ())
    before = trpo_reference.run_directory("hopper", config)
    elsewhere = reproduce.ResultChange("another a2c rule", lambda c: c.agent == "a2c")
    monkeypatch.setattr(reproduce, "RESULT_CHANGES", (elsewhere,))
    assert trpo_reference.run_directory("hopper", config) == before
    trpo = reproduce.ResultChange("another trpo rule", lambda c: c.agent == "trpo")
    monkeypatch.setattr(reproduce, "RESULT_CHANGES", (elsewhere, trpo))
    assert trpo_reference.run_directory("hopper", config) != before


def test_our_run_on_changed_code_supersedes_the_old_record_in_the_report_and_keeps_it(ledgers, monkeypatch):
    """The same seed of the same variant, re-run under a new fingerprint, counted twice in the
    report; the old record is kept apart, not deleted."""
    old = {**record("ours", "ant", 100.0, 1_000_000), "fingerprint": "old"}
    other_seed = {**record("ours", "ant", 300.0, 1_000_000, seed=1), "fingerprint": "old"}
    ledgers["ours"]["runs"] = {"ant/old/seed0": old, "ant/old/seed1": other_seed}
    ledgers["reference"]["runs"] = {"ant/seed0": record("reference", "ant", 200.0, 1_000_000)}
    saved = trpo_reference.save_json  # the ledgers live in ``ledgers``; the report's table in a file
    monkeypatch.setattr(trpo_reference, "save_json",
                        lambda path, data: ledgers[path].update(data) if path in ledgers else saved(path, data))
    monkeypatch.setattr(records, "git_commit", lambda: {"commit": "test"})
    rerun = {**record("ours", "ant", 200.0, 1_000_000), "fingerprint": "new"}
    rerun.pop("steps")  # the run's budget comes with its provenance, as in ``run_ours``
    monkeypatch.setattr(trpo_reference, "run_ours", lambda *args, **kwargs: [rerun])
    trpo_reference.main(["--side", "ours", "--tasks", "ant", "--seeds", "1"])
    ours = ledgers["ours"]
    assert sorted(ours["runs"]) == ["ant/new/seed0", "ant/old/seed1"]
    assert ours["superseded"]["ant/old/seed0"]["final_return"] == 100.0
    assert ours["superseded"]["ant/old/seed0"]["superseded_by"] == "new"
    row = trpo_reference.report()["seed_blocks"]["0"]["as configured"]["tasks"]["ant"]
    assert sorted(row["ours_per_seed"]) == [200.0, 300.0]


def test_a_run_of_ours_names_each_attempts_host(tmp_path, monkeypatch):
    """Our side's sweep, resumable like the figures' cells, keeps each attempt's host in its records."""
    import test_reproduce_cpu

    monkeypatch.setattr(trpo_reference, "RUNS", tmp_path)
    monkeypatch.setattr(trpo_reference, "run_or_resume_sweep", test_reproduce_cpu.fake_sweep([]))
    records = trpo_reference.run_ours("hopper", 10_000, 2, [])
    assert [r["seed"] for r in records] == [0, 1]
    assert all(len(r["attempts"]) == 1 and r["attempts"][0]["cpu"] for r in records)
    # Each chunk's entropy (3.0, then 2.0, over Hopper's 3 dimensions) as the policy's width
    log_2_pi_e = np.log(2 * np.pi * np.e)
    width = lambda entropy: np.exp(entropy / 3 - log_2_pi_e / 2)  # noqa: E731
    assert records[0]["policy_width"] == pytest.approx([width(3.0), width(2.0)])


def test_the_width_is_the_geometric_mean_std_of_the_gaussian_of_that_entropy():
    sigmas = np.array([0.3, 2.0, 0.05])
    entropy = float(np.sum(0.5 * np.log(2 * np.pi * np.e * sigmas ** 2)))
    assert trpo_reference.gaussian_width(entropy, 3) == pytest.approx(np.prod(sigmas) ** (1 / 3))


def test_values_are_averaged_over_the_stretch_they_were_recorded_in():
    """Stretches of 10 env steps: steps 1-10 the first, 11-20 the second; none in the third."""
    values = [(1, 2.0), (10, 4.0), (11, 7.0), (20, 9.0), (40, 1.0)]
    assert trpo_reference.binned_means(values, 40, points=4) == [3.0, 8.0, None, 1.0]


def test_a_reference_run_records_the_width_of_the_policy_that_collected_each_batch():
    """Two batches of 2 x 1,024 steps: the first collected by the untrained policy (log std 0,
    width 1), the second by the policy its one update moved."""
    pytest.importorskip("sb3_contrib")
    pytest.importorskip("rl_zoo3")
    run = trpo_reference.run_reference("inverteddoublependulum", 4096, 0, simulator="envpool")
    recorded = [(i, w) for i, w in enumerate(run["policy_width"]) if w is not None]
    assert [i for i, _ in recorded] == [12, 24]  # env steps 2,048 and 4,096 of 25 stretches
    assert recorded[0][1] == 1.0 and 0.0 < recorded[1][1] != 1.0


@pytest.mark.parametrize("argv, named", [
    (["--side", "ours", "--tasks", "hopper", "--ours-overrides", "trpo.nope=1"], "trpo.nope"),
    (["--side", "ours", "--tasks", "hopper", "--ours-overrides", "trpo.max_kl=big"], "trpo.max_kl"),
    (["--side", "reference", "--tasks", "hopper", "--ours-overrides", "trpo.max_kl=0.02"], "--ours-overrides"),
])
def test_a_wrong_setting_of_ours_stops_in_one_line_before_any_run(argv, named, capsys, monkeypatch):
    monkeypatch.setattr(trpo_reference, "run_ours", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(trpo_reference, "run_reference", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        trpo_reference.main(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert named in error and "Traceback" not in error


def _reference_runs(tmp_path, monkeypatch):
    """Run the reference's seeds 100-102 of Ant in this process, recording which seeds it ran."""
    path, ran = tmp_path / "reference_runs.json", []
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: path)

    def run_reference(task, steps, seed, overrides=None, control_cost=True, simulator="gymnasium"):
        ran.append(seed)
        return {**record("reference", task, 2.0, steps, seed=seed), "seconds": 60.0}

    monkeypatch.setattr(trpo_reference, "run_reference", run_reference)
    trpo_reference.main(["--side", "reference", "--tasks", "ant", "--seeds", "3", "--first-seed", "100",
                         "--steps", "100"])
    return ran, records.load_ledger(path)["runs"]


def test_processes_given_one_block_share_it_each_seed_run_once(tmp_path, monkeypatch, capsys):
    claims = tmp_path / "runs" / "claims"
    claims.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])  # another process, running seed 101
    try:
        (claims / "ant_seed101").write_text(f"{other.pid} {records._boot()}\n")
        ran, runs = _reference_runs(tmp_path, monkeypatch)
    finally:
        other.kill()
        other.wait()
    assert ran == [100, 102] and sorted(runs) == ["ant/seed100", "ant/seed102"]
    assert "reference ant seed 101: another process runs it" in capsys.readouterr().out
    assert sorted(p.name for p in claims.iterdir()) == ["ant_seed101"]  # its own claims given up, the other's kept


@pytest.mark.parametrize("holder", ["a process that has ended", "a process of an earlier boot"])
def test_a_claim_whose_process_is_gone_is_taken_over(holder, tmp_path, monkeypatch):
    claims = tmp_path / "runs" / "claims"
    claims.mkdir(parents=True)
    if holder == "a process that has ended":
        ended = subprocess.Popen(["true"])
        ended.wait()
        (claims / "ant_seed101").write_text(f"{ended.pid} {records._boot()}\n")
    else:
        (claims / "ant_seed101").write_text(f"{os.getpid()} an-earlier-boot\n")
    ran, _ = _reference_runs(tmp_path, monkeypatch)
    assert ran == [100, 101, 102] and not list(claims.iterdir())


def our_policy_params(torch_params: dict) -> dict:
    """sb3's MlpPolicy actor (two tanh layers, ``action_net``, ``log_std``) as our ``Policy``'s params."""
    dense = lambda name: {"kernel": torch_params[f"{name}.weight"].T, "bias": torch_params[f"{name}.bias"]}
    return {"params": {"MLPTorso_0": {"Dense_0": dense("mlp_extractor.policy_net.0"),
                                      "Dense_1": dense("mlp_extractor.policy_net.2")},
                       "mean": dense("action_net"), "log_std": torch_params["log_std"]}}


def test_our_policy_step_is_sb3_contribs_on_its_own_batches():
    """sb3-contrib's TRPO updates Hopper's three-dimensional Gaussian policy on its own batches; our
    step (:func:`rlhf_jax.agents.trpo.make_policy_step`), given the same parameters, inputs, actions
    and standardised advantages, with the reference's settings in our units (:func:`in_our_units`:
    its per-dimension KL bound and damping, its CG steps and line search), moves the policy as the
    reference does: the same natural gradient, scaled to the same edge of the trust region."""
    pytest.importorskip("sb3_contrib")
    import jax
    import torch
    from jax.flatten_util import ravel_pytree
    from sb3_contrib import TRPO
    from stable_baselines3.common.env_util import make_vec_env

    from rlhf_jax.agents.trpo import make_policy_step
    from rlhf_jax.envs import make

    settings = {"n_envs": 2, "n_steps": 512, "batch_size": 128, "gamma": 0.99, "gae_lambda": 0.95,
                "cg_max_steps": 25, "n_critic_updates": 2, "learning_rate": 0.001}
    batches = []

    class Recorded(TRPO):
        def train(self):
            actor = lambda: {k: v.detach().numpy().copy() for k, v in self.policy.state_dict().items()
                             if "value" not in k}
            buffer = self.rollout_buffer  # [steps, copies, ...] until train() flattens it
            batch = (buffer.observations.copy(), buffer.actions.copy(), buffer.advantages.copy())
            before = actor()
            super().train()
            batches.append((before, actor(), *batch))

    torch.set_num_threads(1)
    reference = Recorded("MlpPolicy", make_vec_env("Hopper-v5", n_envs=2, seed=0), seed=0, device="cpu",
                         **{k: v for k, v in settings.items() if k != "n_envs"})
    reference.learn(total_timesteps=3 * 1024)
    config = load_config(ExperimentConfig, reproduce.PAPER / "mujoco" / "hopper_trpo.yaml",
                         ["env.id=envpool/Hopper-v5", *trpo_reference.in_our_units(settings, 3)])
    step = jax.jit(make_policy_step(config.trpo, make(config.env).spec))
    assert len(batches) == 3
    for before, after, observations, actions, advantages in batches:
        advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)  # as sb3-contrib does
        start = ravel_pytree(our_policy_params(before))[0]
        ours, metrics = step(our_policy_params(before), observations, actions, advantages,
                             np.ones(advantages.shape, np.float32))
        fraction = float(metrics["step_fraction"])
        theirs = ravel_pytree(our_policy_params(after))[0] - start
        ours = ravel_pytree(ours)[0] - start
        assert fraction > 0 and float(np.linalg.norm(theirs)) > 0  # both stepped
        # The same to a few parts in a million here; float32 CG on another CPU may round otherwise.
        assert float(np.linalg.norm(ours - theirs)) < 1e-3 * float(np.linalg.norm(theirs))
