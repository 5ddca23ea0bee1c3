"""``run.score_on_task``: runs whose training episodes are not the task's (here CartPole cut to
20-step episodes) are also scored, after every chunk, on whole episodes of the task itself
(CartPole's own 500-step limit), by ``rlhf-jax train`` and by a sweep alike."""
import csv
from pathlib import Path

import jax
import numpy as np
import pytest

from rlhf_jax.agents import a2c
from rlhf_jax.config import ExperimentConfig, apply_overrides, build, load_config, read_yaml
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.evaluation import Score, evaluate
from rlhf_jax.metrics_log import judged_return
from rlhf_jax.sweep import Sweep
from rlhf_jax.driver import Driver, scoring_env_config
from rlhf_jax.trainer import evaluate_run, train

ROOT = Path(__file__).resolve().parent.parent
EPISODES = 8
OVERRIDES = ["env.num_envs=8", "env.max_episode_steps=20", "a2c.total_env_steps=16384", "run.chunk_env_steps=8192",
             "run.checkpoint_every_updates=1", "run.tensorboard=false", "run.score_on_task=true",
             f"run.eval_episodes={EPISODES}"]


def base_config() -> dict:
    return apply_overrides(read_yaml(ROOT / "configs" / "a2c_cartpole.yaml"), OVERRIDES)


def task_return(config: ExperimentConfig, params) -> float:
    """The policy's mean return over the first whole episode of 8 copies of plain CartPole-v1,
    written out here as the option's docstring says it: no shortened episodes."""
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=EPISODES, seed=config.env.seed + 10_000))
    act = a2c.make_policy(config.a2c, env.spec)
    score = evaluate(act, params, env, jax.random.PRNGKey(config.seed + 10_000), 501)
    return score.mean_return()


def rows_of(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) for k, v in row.items() if k != "label"} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = build(ExperimentConfig, apply_overrides(base_config(), [f"run.dir={tmp_path_factory.mktemp('run')}"]))
    directory = train(config, progress=False)
    return config, directory


@pytest.mark.slow
def test_a_run_logs_its_policy_scored_on_the_task(run):
    config, directory = run
    rows = rows_of(directory / "metrics.csv")
    assert len(rows) == 2 and all(r["episode_return"] <= 20 for r in rows)  # the training episodes
    _, runner = Driver(config).restore_latest(directory)
    assert rows[-1]["task_return"] == pytest.approx(task_return(config, runner.params), rel=1e-6)
    assert rows[-1]["task_return"] > 20  # longer than any training episode could be
    assert evaluate_run(directory, episodes=EPISODES)["mean_true_return"] > 20  # `rlhf-jax eval` scores the task too


@pytest.mark.slow
def test_a_sweep_scores_each_member_on_the_task(tmp_path):
    """Every member on the same episodes of the task (the base config's seed draws them)."""
    directory = tmp_path / "sweep"
    Sweep.create(directory, base_config(), {}, seeds=2).run(progress=False)
    program, _, state = Sweep.load(directory).restore_group(0)
    params = program.driver.policy_params(state)
    config = build(ExperimentConfig, base_config())
    rows = [r for r in rows_of(directory / "members.csv") if r["chunk"] == 1]
    assert len(rows) == 2
    for row in rows:
        member = jax.tree.map(lambda x: np.asarray(x)[int(row["member"])], params)
        assert row["task_return"] == pytest.approx(task_return(config, member), rel=1e-6)
    # The sweep's table reports the task's return, not the 20-step training episodes'.
    with (directory / "results.csv").open() as f:
        summary = next(csv.DictReader(f))
    assert float(summary["final_true_return_mean"]) == pytest.approx(np.mean([r["task_return"] for r in rows]), rel=1e-6)


def test_a_score_is_the_mean_first_episode_return_and_nan_without_one():
    """Worked by hand: 3 first episodes summing to 12 score 4; none ended in time scores NaN
    (``rlhf-jax eval`` writes that as null, the chunk rows as NaN), never a division by zero."""
    assert Score(episodes=np.int32(3), return_sum=np.float32(12.0)).mean_return() == 4.0
    assert np.isnan(Score(episodes=np.int32(0), return_sum=np.float32(0.0)).mean_return())


def test_the_task_scored_on_has_none_of_the_runs_changes_the_oracle_included():
    """InvertedDoublePendulum's figure-2 runs train on the smooth oracle in 50-step hidden-end
    episodes; they are scored on the task itself, which a smooth oracle without hidden ends would
    refuse to build."""
    config = load_config(ExperimentConfig, None, [
        "agent=trpo", "env.id=envpool/InvertedDoublePendulum-v5", "env.hide_episode_end=true",
        "env.oracle=smooth", "env.max_episode_steps=50", "run.score_on_task=true"])
    env = scoring_env_config(config)
    assert (env.hide_episode_end, env.max_episode_steps, env.oracle) == (False, 0, "penalty")
    assert make(env).spec.max_episode_steps == 1000


def test_the_task_scored_on_charges_no_fall_on_the_restart_step():
    """A run whose hidden restarts charge the restart step (``env.penalty_step=restart``) is
    scored on the task, where no restart is hidden and the option would be refused."""
    config = load_config(ExperimentConfig, None, [
        "agent=trpo", "env.id=envpool/Hopper-v5", "env.hide_episode_end=true", "env.hidden_end=reset",
        "env.penalty_step=restart", "run.score_on_task=true"])
    env = scoring_env_config(config)
    assert (env.hide_episode_end, env.penalty_step) == (False, "failing")
    assert make(env).spec.max_episode_steps == 1000


def test_the_small_tasks_experiment_scores_on_the_task_the_driver_scores_on():
    """``experiments.labels_vs_return`` builds its scoring copies itself; its task is the driver's."""
    from experiments.labels_vs_return import EVAL_EPISODES, evaluation_env
    config = load_config(ExperimentConfig, None, ["env.hide_episode_end=true", "env.max_episode_steps=50",
                                                  "run.score_on_task=true", f"run.eval_episodes={EVAL_EPISODES}"])
    env = evaluation_env(config.env)
    assert env._config == scoring_env_config(config)
    assert (env._config.hide_episode_end, env.spec.max_episode_steps) == (False, 500)


def test_a_row_is_judged_by_its_task_return_where_it_has_one():
    """The rule the sweep's table, the learning curve and the figures share."""
    assert judged_return({"episode_return": 20.0, "task_return": 500.0}) == 500.0
    assert judged_return({"episode_return": 20.0}) == 20.0
