"""Scores over few seeds, aggregated as Agarwal et al. (2021) recommend ("Deep RL at the Edge
of the Statistical Precipice", arXiv:2108.13264), with their library, rliable.

Every function here is pure and takes a score matrix ``[runs, tasks]``: one row per run
(seed), one column per task, the scores of different tasks first brought to one scale
(:func:`normalize`). Beside the plain mean they give:

* :func:`interval_estimate`: the interquartile mean (IQM: the mean of the middle half of
  every score pooled, as ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` cuts it) and its
  stratified bootstrap confidence interval (runs resampled within each task);
* :func:`performance_profile`: the fraction of runs scoring above each threshold, with the
  same kind of interval at each threshold.

rliable is optional (``pip install 'rlhf_jax[stats]'``); :func:`require_rliable` says so in
one line when it cannot be imported. Its bootstrap draws from NumPy's global generator (it
ignores its ``random_state`` argument), so each function here seeds that generator for the
call and puts its state back afterwards: the same scores give the same interval, and a
caller's own random numbers are left alone.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np

# Bootstrap replications: rliable's default for performance profiles. (Its default for
# intervals, 50,000, takes seconds per interval on a CPU; a sweep summarises many.)
REPLICATIONS = 2000
CONFIDENCE = 0.95


class IntervalEstimate(NamedTuple):
    """The scores of one method (a label budget, a sweep's combination) in one number each."""

    mean: float  # the plain mean of every score
    iqm: float  # the interquartile mean
    iqm_low: float  # the IQM's stratified bootstrap confidence interval
    iqm_high: float
    confidence: float  # the interval's coverage: 0.95 for a 95% interval
    runs: int
    tasks: int


def shown_iqm(estimate: IntervalEstimate | None) -> str:
    """An estimate's IQM and interval as the tables show them: ``"412.3 [398.0, 430.1]"`` (``"n/a"``: none)."""
    return f"{estimate.iqm:.1f} [{estimate.iqm_low:.1f}, {estimate.iqm_high:.1f}]" if estimate else "n/a"


class PerformanceProfile(NamedTuple):
    """The fraction of runs (every run of every task) that score above each threshold."""

    thresholds: np.ndarray  # [k]
    fraction: np.ndarray  # [k]
    low: np.ndarray  # [k]: the stratified bootstrap confidence interval at each threshold
    high: np.ndarray  # [k]
    confidence: float


def require_rliable():
    """rliable's ``(library, metrics)`` modules, or an ImportError saying how to get them."""
    try:
        from rliable import library, metrics
    except ModuleNotFoundError as error:
        raise ImportError(f"interquartile means with bootstrap intervals need rliable: pip install "
                          f"'rlhf_jax[stats]' ({error})") from None
    except Exception as error:  # noqa: BLE001 - what a broken install raises is not ours to choose
        # rliable 1.2 needs arch < 8, and arch 7 fails to import under pandas 3 (a TypeError).
        raise ImportError(f"rliable is installed but cannot be imported ({type(error).__name__}: {error}); "
                          f"its arch (< 8) needs pandas < 3: pip install 'pandas<3'") from None
    return library, metrics


def normalize(scores: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Each task's scores (column) on one scale: 0 at that task's ``low``, 1 at its ``high``."""
    scores, low, high = (np.asarray(x, np.float64) for x in (scores, low, high))
    if np.any(high == low):
        raise ValueError(f"normalize: a task's low and high reference are equal ({low}, {high})")
    return (scores - low) / (high - low)


def interval_estimate(scores: np.ndarray, replications: int = REPLICATIONS, confidence: float = CONFIDENCE,
                      seed: int = 0) -> IntervalEstimate:
    """The mean and the IQM of ``scores [runs, tasks]``, with the IQM's confidence interval."""
    scores = _score_matrix(scores)
    library, metrics = require_rliable()
    with _global_numpy_seed(seed):
        point, interval = library.get_interval_estimates(
            {"scores": scores}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=replications,
            confidence_interval_size=confidence)
    (low,), (high,) = interval["scores"]
    return IntervalEstimate(float(np.mean(scores)), float(point["scores"][0]), float(low), float(high),
                            confidence, *scores.shape)


def performance_profile(scores: np.ndarray, thresholds: np.ndarray, replications: int = REPLICATIONS,
                        confidence: float = CONFIDENCE, seed: int = 0) -> PerformanceProfile:
    """The score distribution of ``scores [runs, tasks]`` at each of ``thresholds``, with intervals."""
    scores, thresholds = _score_matrix(scores), np.asarray(thresholds, np.float64)
    library, _ = require_rliable()
    with _global_numpy_seed(seed):
        fraction, interval = library.create_performance_profile(
            {"scores": scores}, thresholds, reps=replications, confidence_interval_size=confidence)
    low, high = interval["scores"]
    return PerformanceProfile(thresholds, np.asarray(fraction["scores"], np.float64), low, high, confidence)


def _score_matrix(scores) -> np.ndarray:
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2 or 0 in scores.shape:
        raise ValueError(f"scores must be a matrix [runs, tasks] with at least one of each, got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite: leave out the runs that have no score")
    return scores


@contextlib.contextmanager
def _global_numpy_seed(seed: int):
    """NumPy's global generator seeded with ``seed`` inside the block, as it was outside it."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


# ---------------------------------------------------------------------- figures
def draw_intervals(ax, names: list[str], estimates: list[IntervalEstimate], score: str) -> None:
    """On matplotlib axes ``ax``: each method's IQM with its interval, and its plain mean."""
    y = np.arange(len(names))
    iqm = np.array([e.iqm for e in estimates])
    below, above = iqm - [e.iqm_low for e in estimates], [e.iqm_high for e in estimates] - iqm
    ax.errorbar(iqm, y, xerr=[below, above], fmt="o", capsize=4,
                label=f"IQM, {estimates[0].confidence:.0%} interval" if estimates else None)
    ax.plot([e.mean for e in estimates], y, "x", color="black", label="mean", zorder=3)
    ax.set_yticks(y, names)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_xlabel(score)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)


def draw_profiles(ax, names: list[str], profiles: list[PerformanceProfile], score: str) -> None:
    """On matplotlib axes ``ax``: each method's performance profile, its interval shaded."""
    for name, profile in zip(names, profiles):
        (line,) = ax.plot(profile.thresholds, profile.fraction, label=name)
        ax.fill_between(profile.thresholds, profile.low, profile.high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel(f"{score} above")
    ax.set_ylabel("fraction of runs")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
