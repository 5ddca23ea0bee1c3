"""The label schedule of Christiano et al. appendix A ("label annealing"), host-side.

"At the beginning of training we compare a number of trajectory segments drawn from
rollouts of an untrained (randomly initialized) policy ... For the rest of training,
labels are fed in at a rate decaying inversely with the number of timesteps; after
twice as many timesteps have elapsed, we answer about half as many queries per unit
time." The initial labels are 25% of the budget on MuJoCo (A.1) and 500 on Atari (A.2);
the rate after T steps is proportional to ``c / (T + c)`` with ``c = 2e6`` (MuJoCo) or
``5e6`` (Atari).
"""
from __future__ import annotations

import math


def _check_non_negative(**values) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"label schedule: {name} must be >= 0, got {value}")


def labels_due(env_steps: float, total_env_steps: float, budget: int, initial: int, decay_steps: float) -> int:
    """How many labels should exist after ``env_steps`` environment steps.

    ``initial`` labels come before RL starts; after that the labelling rate is

        rate(T) = a c / (T + c),   c = decay_steps,

    so at ``T = c`` it is half the rate at 0. Integrating,

        due(T) = initial + a c ln(1 + T / c),

    and choosing ``a`` so that the rest of the budget is spent by ``T_total``
    (``due(T_total) = budget``) gives

        due(T) = initial + (budget - initial) ln(1 + T / c) / ln(1 + T_total / c),

    floored to a whole label and capped at ``budget`` (from ``T_total`` on). ``T`` and
    ``c`` must count the same unit (the paper's Atari ``c`` counts frames).
    """
    _check_non_negative(env_steps=env_steps, budget=budget, initial=initial)
    if total_env_steps <= 0 or decay_steps <= 0:
        raise ValueError(
            f"label schedule: total_env_steps and decay_steps must be > 0, got {total_env_steps} and {decay_steps}"
        )
    if initial > budget:
        raise ValueError(f"label schedule: {initial} initial labels exceed the budget of {budget}")
    if env_steps >= total_env_steps:
        return int(budget)
    spent = math.log1p(env_steps / decay_steps) / math.log1p(total_env_steps / decay_steps)
    return min(int(budget), int(math.floor(initial + (budget - initial) * spent)))


def initial_labels(budget: int, atari: bool, initial_fraction: float = 0.25, atari_initial: int = 500) -> int:
    """Labels collected from the untrained policy before RL: ``initial_fraction`` of the
    budget on MuJoCo (25%, appendix A.1), ``atari_initial`` on Atari (500, A.2), never
    more than the budget."""
    _check_non_negative(budget=budget, atari_initial=atari_initial)
    if not 0.0 <= initial_fraction <= 1.0:
        raise ValueError(f"label schedule: initial_fraction must be in [0, 1], got {initial_fraction}")
    wanted = atari_initial if atari else math.floor(initial_fraction * budget)
    return int(min(wanted, budget))
