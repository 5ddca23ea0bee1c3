"""A preregistered protocol: every cell of a confirmatory figure fixed before any of it runs.

A *registration* is a YAML file committed before the first of its runs. It fixes, for each
cell (one line of one task's panel: "RL (trpo)", "700 labels"), the config file, every
override (the back end, the budget, the env steps, the seeds), the seeds themselves (fresh:
no probe has used them) and the resolved config's *fingerprint*; and, once for the figure,
the decision rule. The runner (:mod:`experiments.confirm`) recomputes each cell's fingerprint
from today's files before it runs the cell and again from the finished sweep's own config
before it records it, and refuses both when it differs (:class:`RegistrationError`): a
changed setting is a new registration with a new block of seeds, and what the old one
recorded stays in the record.

The decision rule (:func:`decide`): a task's *gain ratio* is the label cell's final true
return's gain over the untrained policy, divided by RL's gain (the final return is the mean
of the last tenth of a seed's curve; the untrained policy's return is the mean first point of
the task's RL and label cells). Per task the mean over seeds and the interquartile mean of
the per-seed ratios, each with a 95% stratified bootstrap interval (:func:`gain_ratio_estimate`).
A task counts at ``threshold`` by the mean, and separately by the interval's lower bound.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml

from experiments.records import ROOT
from experiments.reproduce import digest, fingerprinted_fields
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.errors import ConfigError

REGISTRATIONS = ROOT / "experiments" / "registrations"  # one YAML file per registration
BOOTSTRAP_DRAWS = 10_000
CONFIDENCE = 0.95


class RegistrationError(ConfigError):
    """A cell whose config is not the one its registration fixed: it is neither run nor recorded."""


@dataclasses.dataclass(frozen=True)
class RegisteredCell:
    """One line of one task's panel at the seeds the registration gives it."""

    task: str
    line: str  # "RL (trpo)" or "<budget> labels"
    kind: str  # experiments.reproduce.Kind's value: "baseline" or "labels"
    config: str  # the config file, from the repository root
    overrides: tuple[str, ...]  # every key the cell sets beyond its file, the seed keys among them
    seeds: tuple[int, ...]  # consecutive: one sweep runs them
    fingerprint: str

    @property
    def key(self) -> str:
        return f"{self.task}/{self.line}"


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str
    steps: int  # env steps per seed, every cell
    points: int  # chunks per run: points of each curve
    threshold: float  # of RL's gain
    claim_budget: int  # the label budget the claim counts
    claim_tasks: int  # the claim holds when at least this many tasks count by the mean
    decision_rule: str
    per_task_settings: tuple[dict, ...]  # each {task, key, value, reason}: the only values that differ by task
    cells: tuple[RegisteredCell, ...]
    # the agent's settings beyond its config files, the same in every cell (RL's and the label runs'); each
    # cell's overrides hold them too, so its fingerprint does
    agent: tuple[str, ...] = ()

    def cell(self, key: str) -> RegisteredCell:
        return next(c for c in self.cells if c.key == key)


def seed_keys(first: int, num_envs: int) -> list[str]:
    """The overrides that start a sweep's seeds at ``first``: each seed's copies then reset from
    env seeds no other seed of the block uses (the pool seeds copy i of member k with
    ``env.seed + k * num_envs + i``)."""
    return [f"seed={first}", f"env.seed={first * num_envs}"]


def cell_config(cell: RegisteredCell, root: Path = ROOT) -> ExperimentConfig:
    """The cell's resolved config from today's files (its ``run.dir`` left at the default)."""
    return load_config(ExperimentConfig, root / cell.config, list(cell.overrides))


def fingerprint(config: ExperimentConfig) -> str:
    """The resolved config's fingerprint, less where the run is written (``run.dir``) and the
    W&B settings (:func:`experiments.reproduce.fingerprinted_fields`)."""
    fields = fingerprinted_fields(config)
    fields["run"] = {k: v for k, v in fields["run"].items() if k != "dir"}
    return digest(fields, 12)


def check_fingerprint(cell: RegisteredCell, config: ExperimentConfig, where: str) -> None:
    """Refuse a cell whose config is not the registered one, in one line naming both prints."""
    found = fingerprint(config)
    if found != cell.fingerprint:
        raise RegistrationError(f"{cell.key}: {where} has fingerprint {found}, the registration {cell.fingerprint}; "
                                f"run it on the commit its registration's header names, or register anew with fresh seeds")


# ---------------------------------------------------------------- the file
def save(registration: Registration, path: Path, header: str) -> None:
    """Write a new registration; an existing one is never overwritten (it is the record)."""
    if path.exists():
        raise RegistrationError(f"{path} exists: a registration is never rewritten; register anew under another name")
    data = {field.name: getattr(registration, field.name) for field in dataclasses.fields(Registration)
            if field.name not in ("per_task_settings", "cells", "agent")}
    data["per_task_settings"] = [dict(s) for s in registration.per_task_settings]
    if registration.agent:  # written before the cells; the registrations from before it have none
        data["agent"] = list(registration.agent)
    data["cells"] = [{**dataclasses.asdict(c), "overrides": list(c.overrides), "seeds": list(c.seeds)}
                     for c in registration.cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=110))


def load(path: Path) -> Registration:
    """The registration a file holds; a :class:`RegistrationError` naming the file where there is
    none (no such file, not YAML, or not what :func:`save` writes)."""
    path = Path(path)
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in REGISTRATIONS.glob("*.yaml")))
        raise RegistrationError(f"no registration {str(path)!r}; registered: {known}")
    try:
        data = yaml.safe_load(path.read_text())
        cells = tuple(RegisteredCell(**{**c, "overrides": tuple(c["overrides"]), "seeds": tuple(c["seeds"])})
                      for c in data.pop("cells"))
        return Registration(**{**data, "per_task_settings": tuple(data["per_task_settings"]), "cells": cells,
                               "agent": tuple(data.get("agent", ()))})
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as error:
        reason = " ".join(str(error).split())  # YAML's messages span lines
        raise RegistrationError(f"{str(path)!r} is not a registration ({type(error).__name__}: {reason})") from None


# ---------------------------------------------------------------- the decision rule
@dataclasses.dataclass(frozen=True)
class GainRatio:
    """A label cell's gain over the untrained policy as a fraction of RL's, over its seeds."""

    mean: float
    mean_low: float
    mean_high: float
    iqm: float
    iqm_low: float
    iqm_high: float
    per_seed: tuple[float, ...]  # each seed's gain over RL's mean gain
    seeds: int
    rl_seeds: int


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The interquartile mean: the mean of the middle half (scipy's ``trim_mean(x, 0.25)``)."""
    from scipy.stats import trim_mean

    return trim_mean(values, 0.25, axis=axis)


def gain_ratio_estimate(labels: list[float], rl: list[float], start: float, draws: int = BOOTSTRAP_DRAWS,
                        seed: int = 0) -> GainRatio | None:
    """``(mean(labels) - start) / (mean(rl) - start)`` and the IQM of the per-seed ratios, each
    with a 95% stratified bootstrap interval: every draw resamples the label cell's seeds and
    RL's seeds, each within its own cell (Agarwal et al. 2021's stratified bootstrap, the strata
    being the two cells), and the interval is the draws' 2.5th to 97.5th percentile. None where
    RL gained nothing (no ratio to take)."""
    labels_, rl_ = np.asarray(labels, float), np.asarray(rl, float)
    rl_gain = rl_.mean() - start
    if rl_gain <= 0:
        return None
    rng = np.random.default_rng(seed)
    label_draws = rng.choice(labels_, (draws, len(labels_)))
    rl_gains = rng.choice(rl_, (draws, len(rl_))).mean(1) - start
    valid = rl_gains > 0  # a draw in which RL gained nothing has no ratio
    ratios = (label_draws[valid] - start) / rl_gains[valid, None]
    tail = (1 - CONFIDENCE) / 2 * 100
    low_mean, high_mean = np.percentile(ratios.mean(1), [tail, 100 - tail])
    low_iqm, high_iqm = np.percentile(iqm(ratios, axis=1), [tail, 100 - tail])
    per_seed = (labels_ - start) / rl_gain
    return GainRatio(float(per_seed.mean()), float(low_mean), float(high_mean), float(iqm(per_seed)),
                     float(low_iqm), float(high_iqm), tuple(float(r) for r in per_seed), len(labels_), len(rl_))


def decide(ratios: dict[str, GainRatio | None], threshold: float) -> dict:
    """The counts the decision rule reads: tasks at ``threshold`` by the mean and by the lower bound."""
    known = {task: r for task, r in ratios.items() if r is not None}
    return {"tasks": len(ratios),
            "at_threshold_by_mean": sorted(t for t, r in known.items() if r.mean >= threshold),
            "at_threshold_by_lower_bound": sorted(t for t, r in known.items() if r.mean_low >= threshold)}
