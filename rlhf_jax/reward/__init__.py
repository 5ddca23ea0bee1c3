"""Learning a reward from people: preference and annotation models, queries, labelers, schedules.

The names in ``__all__`` are the pure functions and modules meant for JAX code of your own
(the examples in ``examples/`` use them). They are loaded on first use, so importing a light
submodule (``rlhf_jax.reward.people``, which the label web app reads) imports no JAX.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # Preferences between segments (Christiano et al. 2017, equation 1).
    "preference_probability": "rlhf_jax.reward.preference",
    "preference_loss": "rlhf_jax.reward.preference",
    # The synthetic oracle and the noisy simulated teachers, and the label database D.
    "TeacherConfig": "rlhf_jax.reward.config",
    "oracle_answers": "rlhf_jax.reward.labelers",
    "teacher_returns": "rlhf_jax.reward.labelers",
    "add_labels": "rlhf_jax.reward.labelers",
    "Queries": "rlhf_jax.reward.learner",
    "take_clips": "rlhf_jax.reward.learner",
    "Segments": "rlhf_jax.reward.data",
    "Labels": "rlhf_jax.reward.data",
    "empty_labels": "rlhf_jax.reward.data",
    # The ensemble of reward predictors (section 2.2.3): init, fit, reward.
    "RewardModelConfig": "rlhf_jax.reward.config",
    "EnsembleState": "rlhf_jax.reward.ensemble",
    "init_ensemble": "rlhf_jax.reward.ensemble",
    "set_input_statistics": "rlhf_jax.reward.ensemble",
    "fit": "rlhf_jax.reward.ensemble",
    "member_returns": "rlhf_jax.reward.ensemble",
    "normalized_reward": "rlhf_jax.reward.ensemble",
    "update_normalization": "rlhf_jax.reward.ensemble",
    # Which pairs to ask about (section 2.2.4).
    "select_queries": "rlhf_jax.reward.queries",
    # IBT: Algorithm 1's loss and equation 2's reward.
    "UtilityMLP": "rlhf_jax.reward.ibt",
    "ibt_loss": "rlhf_jax.reward.ibt",
    "sampled_ibt_loss": "rlhf_jax.reward.ibt",
    "utility_reward": "rlhf_jax.reward.ibt",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
