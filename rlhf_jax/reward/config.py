"""The settings of preference learning (Christiano et al. sections 2.2 and 3.3, appendix A).

Every field defaults to the paper; ``0`` or ``-1`` where the paper's value depends on the
domain (Atari or not), resolved by :func:`resolve` once the environment is known. Each
ablation of section 3.3 is one switch:

=====================  ==========================================================
random queries         ``preferences.selection=random``
no ensemble            ``reward_model.ensemble_size=1`` (queries then go random)
no online queries      ``preferences.online=false``: every label from the start
no regularisation      ``reward_model.adapt_l2=false``: no l2, dropout stays
segments of length 1   ``preferences.segment_length=1``
target                 ``reward_model.loss=target``: regress summed true reward
=====================  ==========================================================
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from rlhf_jax.config_base import INT32_MAX, check_fields, check_path_field, in_range, non_negative, positive
from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.reward.labelers import TeacherConfig
from rlhf_jax.reward.schedule import initial_labels
from rlhf_jax.reward.segments import check_fits_episode


@dataclasses.dataclass(frozen=True)
class PreferenceConfig:
    labels: int = positive(5_500, 1_000_000)  # the label budget (Atari 5,500; MuJoCo 350/700/1,400)
    # Labels from the untrained policy before RL: 25% of the budget (MuJoCo), 500 (Atari).
    initial_labels: int = in_range(-1, -1, 1_000_000)
    # The labelling rate after T env steps is proportional to c / (T + c), c in env steps:
    # 2e6 (MuJoCo), 1.25e6 on Atari (the paper's 5e6 frames at a frame skip of 4).
    label_decay_steps: int = non_negative(0, INT32_MAX)
    online: bool = True  # false: the "no online queries" ablation, all labels up front
    # Steps per segment: 25 on Atari (1.7 s at 15 fps), 1.5 s elsewhere: on MuJoCo at the paper's
    # clip frame rates (EnvSpec.segment_fps; 15 to 60 steps), else of simulated time.
    segment_length: int = non_negative(0, 1_000)
    segment_capacity: int = in_range(1_000, 2, 100_000)  # recent segments that candidate pairs are drawn from
    label_capacity: int = non_negative(0, 1_000_000)  # the newest labels kept: 3,000 on Atari, all of them elsewhere
    # Stacked frames (Atari): keep the 3 frames before each labelled clip that its first stacks
    # reach back to. Off, the reward model is fitted on the clip's own frames, as the labeller
    # saw it (3,000 Atari labels: 0.99 GiB instead of 1.10; rlhf_jax.reward.data).
    frames_before_clip: bool = False
    selection: Literal["disagreement", "random"] = "disagreement"
    candidates_factor: int = positive(10, 1_000)  # candidate pairs drawn per query presented
    # The predictor "processes 1 label per 10 RL timesteps" (appendix A.2).
    fit_pairs_per_env_step: float = non_negative(0.1)
    pretrain_epochs: int = in_range(-1, -1, 100_000)  # over the initial labels before RL: 200 on Atari, none elsewhere
    # Fresh pairs scored against the oracle at each refresh, for the curves' reward_accuracy
    # and reward_correlation only (nothing learns from them); 0 scores none (NaN in the curves).
    score_pairs: int = non_negative(256, 65_536)
    teacher: TeacherConfig = TeacherConfig()
    # A label dataset (`rlhf-jax labels export`; or a finished run's directory) whose labels the
    # run starts with: they count against the budget, and the labeler is asked for the rest
    # only. "": none (docs/label-datasets.md).
    labels_from: str = ""

    def __post_init__(self):
        check_fields(self)
        check_path_field("preferences.labels_from", self.labels_from)
        if self.initial_labels > self.labels:
            raise ConfigError(f"preferences.initial_labels ({self.initial_labels}) exceeds the budget ({self.labels})")


@dataclasses.dataclass(frozen=True)
class ResolvedPreferences:
    """:class:`PreferenceConfig` with the domain-dependent defaults filled in."""

    labels: int
    initial_labels: int
    label_decay_steps: int
    segment_length: int
    label_capacity: int
    pretrain_epochs: int


def resolve(config: PreferenceConfig, spec: EnvSpec) -> ResolvedPreferences:
    atari = is_atari_frames(spec.observation_shape)
    if not config.online:
        initial = config.labels
    elif config.initial_labels >= 0:
        initial = config.initial_labels
    else:
        initial = initial_labels(config.labels, atari)
    length = config.segment_length or (25 if atari else max(1, round(1.5 * (spec.segment_fps or spec.fps))))
    check_fits_episode("preferences.segment_length", length, spec)
    return ResolvedPreferences(
        labels=config.labels,
        initial_labels=initial,
        label_decay_steps=config.label_decay_steps or (1_250_000 if atari else 2_000_000),
        segment_length=length,
        label_capacity=config.label_capacity or (min(3_000, config.labels) if atari else config.labels),
        pretrain_epochs=config.pretrain_epochs if config.pretrain_epochs >= 0 else (200 if atari else 0),
    )
