"""The learning-curve PNG: the true return, and on a people run a mark where labels arrived."""
import math

from rlhf_jax.metrics_log import LabelArrival, label_arrivals, plot_learning_curve

# A people run's rows: answers arrived in chunks 0, 2 and 4 (the count rose); none in 1 and 3.
ROWS = [
    {"env_steps": 100.0, "episode_return": 10.0, "labels": 4.0},
    {"env_steps": 200.0, "episode_return": 12.0, "labels": 4.0},
    {"env_steps": 300.0, "episode_return": 15.0, "labels": 9.0},
    {"env_steps": 400.0, "episode_return": math.nan, "labels": 9.0},
    {"env_steps": 500.0, "episode_return": 20.0, "labels": 12.0},
]


def test_labels_arrived_in_the_chunks_whose_count_rose():
    assert label_arrivals(ROWS) == [LabelArrival(100.0, 4.0), LabelArrival(300.0, 9.0), LabelArrival(500.0, 12.0)]
    assert label_arrivals([{**row, "labels": 0.0} for row in ROWS]) == []  # none answered yet
    assert label_arrivals([{"env_steps": 1.0, "episode_return": 3.0}]) == []  # a run on the true reward


def test_a_people_runs_curve_marks_the_chunks_where_labels_arrived(tmp_path):
    drawn = plot_learning_curve(ROWS, tmp_path / "curve.png", "people", mark_labels=True)
    assert drawn.label_marks == (100.0, 300.0, 500.0)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_other_runs_curves_have_no_marks(tmp_path):
    assert plot_learning_curve(ROWS, tmp_path / "curve.png", "synthetic labels").label_marks == ()
