"""configs/paper/: every file builds and says what Christiano et al. 2017 (appendix A), Mnih et al.
2015 and Mnih et al. 2016 say; experiments/reproduce.py keeps its ledger and skips finished runs.

No training here: configs are only loaded (and domain defaults resolved against a stand-in
spec), and reproduce.py's bookkeeping runs with a stand-in for ``train``.
"""
import dataclasses
from pathlib import Path

import pytest

from experiments import records, reproduce
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.envs.core import Box, Discrete, EnvSpec
from rlhf_jax.reward.config import resolve
from rlhf_jax.driver import true_reward_env_config

PAPER = Path(__file__).resolve().parent.parent / "configs" / "paper"
GAMES = {"beamrider": "BeamRider", "breakout": "Breakout", "enduro": "Enduro", "pong": "Pong",
         "qbert": "Qbert", "seaquest": "Seaquest", "spaceinvaders": "SpaceInvaders"}
MUJOCO = {"reacher": "Reacher", "halfcheetah": "HalfCheetah", "hopper": "Hopper", "walker2d": "Walker2d",
          "swimmer": "Swimmer", "ant": "Ant", "invertedpendulum": "InvertedPendulum",
          "inverteddoublependulum": "InvertedDoublePendulum"}
ATARI_SPEC = EnvSpec("envpool/Pong-v5", "envpool-atari", 16, (84, 84, 4), "uint8", Discrete(6), 15.0, 27_000)
MUJOCO_SPEC = EnvSpec("mjx/HalfCheetah-v5", "mjx", 64, (17,), "float32", Box(-1.0, 1.0, (6,)), 20.0, 1000)


def load(path, overrides=()):
    return load_config(ExperimentConfig, path, list(overrides))


def test_configs_paper_holds_every_experiment_and_nothing_else():
    expected = {f"atari/{g}{suffix}.yaml" for g in GAMES for suffix in ("", "_a2c", "_dqn")}
    expected |= {f"mujoco/{t}{suffix}.yaml" for t in MUJOCO for suffix in ("", "_trpo")}
    expected |= {"atari/pong_acer.yaml"}  # experiments/atari_pong.py's ACER line
    assert {str(p.relative_to(PAPER)) for p in PAPER.glob("*/*.yaml")} == expected
    assert (PAPER / "README.md").is_file() and (PAPER / "ablations.yaml").is_file()


@pytest.mark.parametrize("path", sorted(PAPER.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_paper_config_builds(path):
    config = load(path)
    assert config.name == f"paper-{path.stem.replace('_', '-')}"


def test_ablations_are_the_six_of_section_3_3_and_apply_to_every_preference_config():
    ablations = reproduce.read_ablations()
    assert list(ablations) == ["random queries", "no ensemble", "no online queries", "no regularization",
                               "no segments", "target"]
    hopper = load(PAPER / "mujoco/hopper.yaml")
    switched = {
        "random queries": lambda c: c.preferences.selection == "random",
        "no ensemble": lambda c: c.reward_model.ensemble_size == 1,
        "no online queries": lambda c: not c.preferences.online,
        "no regularization": lambda c: not c.reward_model.adapt_l2,
        "no segments": lambda c: c.preferences.segment_length == 1,
        "target": lambda c: c.reward_model.loss == "target",
    }
    for name, overrides in ablations.items():
        assert switched[name](load(PAPER / "mujoco/hopper.yaml", overrides)) and not switched[name](hopper)
        for path in [*(PAPER / f"atari/{g}.yaml" for g in GAMES), *(PAPER / f"mujoco/{t}.yaml" for t in MUJOCO)]:
            load(path, overrides)
    # labels_vs_return reads the same file (one list of ablations, not two)
    from experiments.labels_vs_return import ABLATIONS

    assert ABLATIONS == ablations


@pytest.mark.parametrize("game", GAMES)
def test_atari_preferences_are_appendix_a2(game):
    config = load(PAPER / f"atari/{game}.yaml")
    assert (config.agent, config.reward, config.labeler) == ("a2c", "preferences", "synthetic")
    assert config.env.id == f"envpool/{GAMES[game]}-v5" and config.env.num_envs == 16  # N = 16 workers
    assert config.env.hide_score and config.env.hide_episode_end and not config.env.episodic_life
    a2c = config.a2c
    assert (a2c.num_steps, a2c.gamma, a2c.entropy_coef, a2c.learning_rate) == (5, 0.99, 0.01, 7e-4)
    assert (a2c.rms_decay, a2c.rms_eps, a2c.network) == (0.99, 1e-5, "nature")
    assert (a2c.total_env_steps, a2c.lr_decay_env_steps) == (50_000_000, 80_000_000)
    assert config.preferences.labels == 5_500
    assert load(PAPER / f"atari/{game}.yaml", ["preferences.labels=350"]).preferences.labels == 350
    resolved = resolve(config.preferences, ATARI_SPEC)
    assert resolved.segment_length == 25 and resolved.initial_labels == 500 and resolved.pretrain_epochs == 200
    assert resolved.label_capacity == 3_000 and resolved.label_decay_steps == 1_250_000  # 5e6 frames
    model = config.reward_model
    assert model.reward_std(ATARI_SPEC) == 0.05
    assert (model.ensemble_size, model.cnn_dropout, model.cnn_batch_norm, model.leaky_relu_slope) == (3, 0.5, True, 0.01)
    assert model.adapt_l2 and model.random_answer_prob == 0.1
    assert (config.preferences.candidates_factor, config.preferences.selection) == (10, "disagreement")
    assert config.preferences.fit_pairs_per_env_step == 0.1  # "1 label per 10 RL timesteps"


@pytest.mark.parametrize("game", GAMES)
def test_atari_rl_baselines_are_mnih(game):
    a2c = load(PAPER / f"atari/{game}_a2c.yaml")
    rlhf = load(PAPER / f"atari/{game}.yaml")
    assert (a2c.agent, a2c.reward, a2c.env.id) == ("a2c", "env", rlhf.env.id)
    assert a2c.env.episodic_life and not a2c.env.hide_score and not a2c.env.hide_episode_end
    assert a2c.a2c.reward_clip == 1.0 and a2c.env.noop_max == 30
    assert a2c.a2c == dataclasses.replace(rlhf.a2c, reward_clip=1.0)  # the agent is the same

    dqn = load(PAPER / f"atari/{game}_dqn.yaml")
    assert (dqn.agent, dqn.reward, dqn.env.id) == ("dqn", "env", rlhf.env.id)
    d = dqn.dqn
    assert (d.total_env_steps, d.replay_capacity, d.batch_size, d.target_update_period) == (50_000_000, 1_000_000, 32, 10_000)
    assert (d.gamma, d.learning_rate, d.rms_decay, d.rms_eps) == (0.99, 0.00025, 0.95, 0.01)
    assert (d.epsilon_start, d.epsilon_end, d.exploration_steps, d.replay_start) == (1.0, 0.1, 1_000_000, 50_000)
    assert (d.update_period, d.reward_clip, d.huber_delta, d.eval_epsilon, d.double_q) == (4, 1.0, 1.0, 0.05, False)
    assert true_reward_env_config(dqn).episodic_life  # a lost life ends DQN's episode


def test_pong_acer_is_wang_et_al_with_mnih_wrappers():
    acer = load(PAPER / "atari/pong_acer.yaml")
    assert (acer.agent, acer.reward, acer.env.id, acer.env.num_envs) == ("acer", "env", "envpool/Pong-v5", 16)
    assert acer.env.episodic_life and acer.acer.reward_clip == 1.0 and acer.acer.network == "a3c"
    a = acer.acer
    assert (a.num_steps, a.replay_ratio, a.truncation, a.trust_region_delta, a.average_decay) == (20, 4.0, 10.0, 1.0, 0.99)


@pytest.mark.parametrize("task", MUJOCO)
def test_mujoco_preferences_are_appendix_a1(task):
    config = load(PAPER / f"mujoco/{task}.yaml")
    assert (config.agent, config.reward, config.env.id) == ("trpo", "preferences", f"mjx/{MUJOCO[task]}-v5")
    assert config.env.hide_episode_end and not config.env.control_cost
    assert (config.trpo.gamma, config.trpo.gae_lambda) == (0.995, 0.97)
    assert config.trpo.entropy_coef == (0.001 if task == "swimmer" else 0.01)
    assert config.preferences.labels == 700
    resolved = resolve(config.preferences, MUJOCO_SPEC)
    assert resolved.segment_length == 30  # 1.5 s at 20 fps
    assert resolved.initial_labels == 175 and resolved.label_decay_steps == 2_000_000 and resolved.pretrain_epochs == 0
    model = config.reward_model
    assert model.reward_std(MUJOCO_SPEC) == 1.0
    assert (model.hidden, model.leaky_relu_slope, model.ensemble_size) == ((64, 64), 0.01, 3)
    # Not the paper's (it gives a rate for Atari only): three times its Atari fitting, at Adam's
    # 1e-3, one value for all eight tasks; no dropout on any
    assert (config.preferences.fit_pairs_per_env_step, model.learning_rate) == (0.3, 1e-3)
    assert model.mlp_dropout == 0.0
    # with the ends hidden, the tasks that end early run 200-step episodes with the penalty of 10 in
    # place of the end; the others keep their own length
    ends_early = task in ("hopper", "walker2d", "ant", "invertedpendulum", "inverteddoublependulum")
    assert config.env.max_episode_steps == (200 if ends_early else 0)
    assert config.env.oracle == "penalty" and config.env.termination_penalty == (10.0 if ends_early else 1.0)

    rl = load(PAPER / f"mujoco/{task}_trpo.yaml")
    assert (rl.agent, rl.reward, rl.env.id, rl.env.num_envs) == ("trpo", "env", config.env.id, config.env.num_envs)
    # RL on the same task: the paper removed torque costs from the tasks, not from the labels only
    assert not rl.env.hide_episode_end and not rl.env.control_cost and rl.trpo.entropy_coef == 0.0
    assert (rl.trpo.gamma, rl.trpo.gae_lambda) == (0.995, 0.97)
    # one agent in both: standardised observations and value targets (the usual TRPO's, not the paper's)
    for run in (config, rl):
        assert run.trpo.normalize_observations and run.trpo.normalize_value_targets


def test_figures_plan_the_papers_lines():
    assert reproduce.FIGURES[2].budgets == (350, 700, 1400) and reproduce.FIGURES[2].seeds == 5
    assert reproduce.FIGURES[3].budgets == (350, 700, 1400, 5500) and reproduce.FIGURES[3].seeds == 3
    assert "no segments" in reproduce.FIGURES[5].ablations and "no segments" not in reproduce.FIGURES[6].ablations
    figure = reproduce.FIGURES[6]
    runs = reproduce.plan(figure, ["pong"], [5500], ["no online queries"], ["a2c", "dqn"], 1)
    assert [r.line for r in runs] == ["RL (a2c)", "RL (dqn)", "5500 labels", "no online queries"]
    offline = reproduce.run_config(runs[-1], 0, 0, Path("/tmp/unused"))
    assert offline.preferences.labels == 5_000 and not offline.preferences.online  # A.2's exception
    mujoco = reproduce.plan(reproduce.FIGURES[2], list(MUJOCO), [350, 700, 1400], [], ["trpo"], 5)
    assert len(mujoco) == 8 * 4 * 5 and [r.seed for r in mujoco[:32]] == [0] * 32  # seed by seed


def fake_training(calls, interrupt_at=None):
    """A stand-in for rlhf_jax.trainer.train: writes what a run writes, optionally interrupted."""

    def train(config=None, resume=None, progress=True):
        run_dir = Path(resume) if resume is not None else Path(config.run.dir)
        calls.append((run_dir, resume is not None))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text("stand-in\n")
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        (run_dir / "metrics.csv").write_text(
            "env_steps,episodes,episode_return,labels\n100,3,10.0,5\n200,0,nan,7\n300,2,30.0,9\n")
        return run_dir

    return train


def test_reproduce_records_each_run_and_skips_finished_ones(tmp_path):
    figure = reproduce.FIGURES[5]
    runs = reproduce.plan(figure, ["cartpole"], [20], ["target"], ["a2c"], 2, reproduce.QUICK_TASKS)
    ledger_path, runs_dir = tmp_path / "ledger.json", tmp_path / "runs"
    made_by = {"command": "python -m experiments.reproduce --figure 5 --quick", "commit": "abc", "uncommitted_changes": True}
    execute = lambda calls, **kw: reproduce.execute(runs, ledger_path, runs_dir, steps=300, points=3,  # noqa: E731
                                                    train_fn=fake_training(calls, **kw), progress=False,
                                                    provenance=made_by)
    calls = []
    with pytest.raises(KeyboardInterrupt):  # the second run is interrupted: the first is kept
        execute(calls, interrupt_at=2)
    assert list(records.load_ledger(ledger_path)["runs"]) == ["cartpole/RL (a2c)/seed0"]

    calls = []
    ledger = execute(calls)
    assert len(calls) == len(runs) - 1 and calls[0][1]  # the interrupted run resumed, the rest started
    assert [c[1] for c in calls[1:]] == [False] * (len(runs) - 2)
    assert set(ledger["runs"]) == {run.key for run in runs}
    record = ledger["runs"]["cartpole/target/seed1"]
    assert record["episode_return"] == [10.0, None, 30.0] and record["labels"] == [5.0, 7.0, 9.0]
    assert record["overrides"] == ["preferences.labels=20", "reward_model.loss=target"]
    assert {key: record[key] for key in made_by} == made_by  # each run says what made it

    calls = []
    execute(calls)
    assert calls == []  # everything finished: nothing runs again
    reproduce.execute(runs, ledger_path, runs_dir, steps=600, points=3, train_fn=fake_training(calls), progress=False)
    assert len(calls) == len(runs)  # other settings are other runs

    result = reproduce.summary(records.load_ledger(ledger_path), ["cartpole"])
    assert result["cartpole"]["target"]["final_return"] == 30.0 and result["cartpole"]["target"]["seeds"] == 2
    reproduce.plot(records.load_ledger(ledger_path), figure, ["cartpole"], tmp_path / "fig.png", quick=True)
    assert (tmp_path / "fig.png").stat().st_size > 0


# Appendix A.1: "trajectory segments that last 1.5 seconds, which varies from 15 to 60 timesteps
# depending on the task": 1.5 s at each task's clip frame rate (rlhf_jax.envs.core.MUJOCO_SEGMENT_FPS:
# Reacher and the pendulums 10 fps, HalfCheetah and Ant 20, Walker2d 30, Hopper and Swimmer 40).
# At the simulation's own rate Hopper's clips would be 188 steps (8 ms a step) and Reacher's 75,
# more than its 50-step episode.
PAPER_SEGMENT_STEPS = {"reacher": 15, "halfcheetah": 30, "hopper": 60, "walker2d": 45, "swimmer": 60,
                       "ant": 30, "invertedpendulum": 15, "inverteddoublependulum": 15}


@pytest.mark.parametrize("backend", ["envpool", "mjx"])
@pytest.mark.parametrize("task", MUJOCO)
def test_mujoco_segments_are_the_papers_15_to_60_steps(task, backend):
    from rlhf_jax.envs import make

    config = load(PAPER / f"mujoco/{task}.yaml", [f"env.id={backend}/{MUJOCO[task]}-v5", "env.num_envs=1"])
    spec = make(config.env).spec
    assert resolve(config.preferences, spec).segment_length == PAPER_SEGMENT_STEPS[task]
    simulated = dataclasses.replace(spec, segment_fps=0.0, max_episode_steps=1000)  # 1.5 s of simulated time
    assert resolve(config.preferences, simulated).segment_length == round(1.5 * spec.fps)
