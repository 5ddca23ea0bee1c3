"""Small learned-reward runs that several test files make: A2C on CartPole from 40 answers;
and the command line's train and eval as the learning tests call them.

One length for all of them, because a compiled chunk bakes in the run's length (A2C's
learning-rate schedule, the label schedule's largest chunk): runs of one length and one
learner share their compiled programs through the compilation cache (tests/compiling.py),
across test files too.
"""
import json
from pathlib import Path

from rlhf_jax.cli import main

# 5 chunks of 1024 env steps, then one of 512.
SMALL_RUN = ["a2c.total_env_steps=5632", "run.chunk_env_steps=1024"]

# Each learner's settings: the budget of 40 answers, 64 recent clips.
SMALL_LEARNERS = {
    "preferences": ["preferences.labels=40", "preferences.segment_capacity=64", "preferences.fit_pairs_per_env_step=0.01"],
    "ibt": ["reward=ibt", "ibt.episodes=40", "ibt.episode_capacity=64", "ibt.batch_episodes=8",
            "ibt.fit_episodes_per_env_step=0.002", "ibt.annotator.signal=reward"],
}


def trained(run_dir: Path, *words: str) -> Path:
    """`rlhf-jax train <words>` into ``run_dir`` (a config and overrides, or overrides alone for
    the built-in default), without TensorBoard; it must succeed. Returns ``run_dir``."""
    assert main(["train", *words, f"run.dir={run_dir}", "run.tensorboard=false"]) == 0
    return run_dir


def evaluated_return(run_dir: Path) -> float:
    """`rlhf-jax eval` of the run over 32 episodes: their mean true return."""
    assert main(["eval", str(run_dir), "--episodes", "32"]) == 0
    return json.loads((run_dir / "eval.json").read_text())["mean_true_return"]
