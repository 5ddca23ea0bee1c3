"""The TRPO reference study's bookkeeping: what its report compares, and its sweeps' resumption."""
import pytest

from experiments import reproduce, trpo_reference
from rlhf_jax.config import ExperimentConfig, load_config, to_dict
from rlhf_jax.sweep import Sweep


def record(side, task, final, steps, variant="as configured", seed=0):
    return {"side": side, "task": task, "seed": seed, "final_return": final, "steps": steps, "variant": variant,
            "cpu": "test"}


def test_the_report_compares_only_our_runs_at_the_reference_budget(tmp_path, monkeypatch):
    """A 150k-step probe of ours is no final to set against the reference's 1M-step runs."""
    ledgers = {
        "reference": {"runs": {"ant/seed0": record("reference", "ant", 200.0, 1_000_000),
                               "ant/seed1": record("reference", "ant", 300.0, 1_000_000, seed=1)}},
        "ours": {"runs": {"a": record("ours", "ant", 150.0, 1_000_000), "b": record("ours", "ant", 350.0, 1_000_000, seed=1),
                          "probe": record("ours", "ant", -90.0, 150_000, variant="as configured", seed=2)}},
    }
    monkeypatch.setattr(trpo_reference, "load_ledger", lambda path: ledgers[path])
    monkeypatch.setattr(trpo_reference, "ledger_path", lambda side: side)
    monkeypatch.setattr(trpo_reference, "RESULTS", tmp_path)
    row = trpo_reference.report()["variants"]["as configured"]["tasks"]["ant"]
    assert row["ours_per_seed"] == [150.0, 350.0]
    assert row["ratio"] == pytest.approx(250.0 / 250.0)


def test_a_sweep_begun_with_another_seed_count_is_refused_not_resumed(tmp_path):
    base = to_dict(load_config(ExperimentConfig, "configs/a2c_cartpole.yaml", ["a2c.total_env_steps=1000"]))
    Sweep.create(tmp_path / "sweep", base, {}, 1)
    with pytest.raises(ValueError, match="holds a sweep of 1 seeds, not 2"):
        reproduce.run_or_resume_sweep(tmp_path / "sweep", base, 2)
