"""The TRPO reference study's bookkeeping: what its report compares, and its sweeps' resumption."""
import pytest

from experiments import reproduce, trpo_reference
from rlhf_jax.config import ExperimentConfig, load_config, to_dict
from rlhf_jax.sweep import Sweep


def record(side, task, final, steps, variant="as configured", seed=0, first_seed=0):
    return {"side": side, "task": task, "seed": seed, "first_seed": first_seed, "final_return": final, "steps": steps,
            "variant": variant, "cpu": "test"}


@pytest.fixture
def ledgers(tmp_path, monkeypatch):
    """The two sides' ledgers as the report reads them, filled by each test."""
    books = {"reference": {"runs": {}}, "ours": {"runs": {}}}
    monkeypatch.setattr(trpo_reference, "load_ledger", lambda path: books[path])
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: side)
    monkeypatch.setattr(trpo_reference, "RESULTS", tmp_path)
    return books


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
