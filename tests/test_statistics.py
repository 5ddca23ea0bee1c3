"""rlhf_jax.statistics: the IQM, its stratified bootstrap interval and performance profiles,
checked against the same computations written out in NumPy."""
import sys

import numpy as np
import pytest

from rlhf_jax.statistics import interval_estimate, normalize, performance_profile, require_rliable

# 4 runs of 2 tasks. Pooled and sorted: 1 2 3 10 20 30 40 100; the middle half: 3 10 20 30.
SCORES = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, 40.0]])
IQM_BY_HAND = (3 + 10 + 20 + 30) / 4
REPLICATIONS = 300


def iqm(scores: np.ndarray) -> float:
    """scipy's trim_mean(scores, 0.25, axis=None), which rliable's IQM is: cut the lowest and the
    highest int(n / 4) of the n pooled scores, average the rest."""
    pooled = np.sort(scores, axis=None)
    cut = int(0.25 * pooled.size)
    return float(np.mean(pooled[cut:pooled.size - cut]))


def stratified_bootstrap(scores: np.ndarray, statistic, seed: int, replications: int) -> np.ndarray:
    """The statistic of each resample: every task keeps its column, its runs drawn with replacement
    (one draw per cell, from NumPy's global generator seeded with ``seed``)."""
    runs, tasks = scores.shape
    np.random.seed(seed)
    return np.array([statistic(scores[np.random.choice(runs, (runs, tasks), replace=True), np.arange(tasks)])
                     for _ in range(replications)])


def test_the_iqm_is_the_mean_of_the_middle_half_and_ignores_an_outlier():
    estimate = interval_estimate(SCORES, replications=REPLICATIONS)
    assert estimate.iqm == pytest.approx(IQM_BY_HAND) == pytest.approx(iqm(SCORES))
    assert estimate.mean == pytest.approx(SCORES.mean())  # the plain mean, which the 100 pulls up
    assert (estimate.runs, estimate.tasks) == (4, 2)


def test_the_interval_is_the_percentile_interval_of_a_stratified_bootstrap():
    estimate = interval_estimate(SCORES, replications=REPLICATIONS, seed=7)
    resampled = stratified_bootstrap(SCORES, iqm, seed=7, replications=REPLICATIONS)
    low, high = np.percentile(resampled, [2.5, 97.5])
    assert (estimate.iqm_low, estimate.iqm_high) == (pytest.approx(low), pytest.approx(high))
    assert estimate.iqm_low < estimate.iqm < estimate.iqm_high
    # Another seed draws other resamples: the seed is what makes the interval repeatable.
    assert interval_estimate(SCORES, replications=REPLICATIONS, seed=8).iqm_low != pytest.approx(low)


def test_a_constant_matrix_has_a_zero_width_interval_at_the_constant():
    estimate = interval_estimate(np.full((5, 3), 2.5), replications=REPLICATIONS)
    assert estimate.iqm == estimate.iqm_low == estimate.iqm_high == estimate.mean == 2.5


def test_the_performance_profile_counts_the_runs_above_each_threshold():
    thresholds = np.array([0.0, 5.0, 25.0, 50.0, 200.0])
    profile = performance_profile(SCORES, thresholds, replications=REPLICATIONS, seed=3)
    np.testing.assert_allclose(profile.fraction, [1.0, 5 / 8, 3 / 8, 1 / 8, 0.0])
    above = lambda scores: np.array([np.mean(scores > tau) for tau in thresholds])
    resampled = stratified_bootstrap(SCORES, above, seed=3, replications=REPLICATIONS)
    np.testing.assert_allclose(profile.low, np.percentile(resampled, 2.5, axis=0))
    np.testing.assert_allclose(profile.high, np.percentile(resampled, 97.5, axis=0))


def test_the_bootstrap_leaves_the_callers_random_numbers_alone():
    np.random.seed(11)
    expected = np.random.rand(3)
    np.random.seed(11)
    interval_estimate(SCORES, replications=20)
    performance_profile(SCORES, [1.0], replications=20)
    np.testing.assert_array_equal(np.random.rand(3), expected)


def test_normalize_puts_each_tasks_references_at_0_and_1():
    normalized = normalize(SCORES, low=[0.0, 10.0], high=[100.0, 50.0])
    np.testing.assert_allclose(normalized[:, 0], SCORES[:, 0] / 100)
    np.testing.assert_allclose(normalized[:, 1], [0.0, 0.25, 0.5, 0.75])
    with pytest.raises(ValueError, match="equal"):
        normalize(SCORES, low=[1.0, 1.0], high=[1.0, 2.0])


@pytest.mark.parametrize("scores", [np.zeros(3), np.zeros((0, 2)), np.array([[1.0, np.nan]])])
def test_scores_that_are_no_finite_matrix_are_refused(scores):
    with pytest.raises(ValueError, match="scores must be"):
        interval_estimate(scores)


def test_without_rliable_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rliable", None)
    with pytest.raises(ImportError, match=r"need rliable: pip install 'rlhf_jax\[stats\]'"):
        require_rliable()
