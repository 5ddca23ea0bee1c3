"""Small learned-reward runs that several test files make: A2C on CartPole from 40 answers.

One length for all of them, because a compiled chunk bakes in the run's length (A2C's
learning-rate schedule, the label schedule's largest chunk): runs of one length and one
learner share their compiled programs through the compilation cache (tests/compiling.py),
across test files too.
"""

# 5 chunks of 1024 env steps, then one of 512.
SMALL_RUN = ["a2c.total_env_steps=5632", "run.chunk_env_steps=1024"]

# Each learner's settings: the budget of 40 answers, 64 recent clips.
SMALL_LEARNERS = {
    "preferences": ["preferences.labels=40", "preferences.segment_capacity=64", "preferences.fit_pairs_per_env_step=0.01"],
    "ibt": ["reward=ibt", "ibt.episodes=40", "ibt.episode_capacity=64", "ibt.batch_episodes=8",
            "ibt.fit_episodes_per_env_step=0.002", "ibt.annotator.signal=reward"],
}
