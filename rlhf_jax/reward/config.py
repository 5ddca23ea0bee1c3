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

This module holds every config section of reward learning: the preferences' with their
synthetic teacher's (:class:`TeacherConfig`), the reward model's (:class:`RewardModelConfig`),
and IBT's with its synthetic annotator's (:class:`IBTConfig`, :class:`AnnotatorConfig`). It
imports no JAX, so that a config is read and checked before JAX is imported; the modules that
use a section import it from here and export it too (``rlhf_jax.reward.ensemble.RewardModelConfig``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from rlhf_jax.config_base import (INT32_MAX, MAX_LAYER, check_fields, check_path_field, in_range, in_state,
                                  non_negative, positive)
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.schedule import initial_labels

if TYPE_CHECKING:
    from rlhf_jax.envs.core import EnvSpec


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """How the synthetic overseer answers; the defaults are the paper's perfect oracle.

    The teacher judges by its own return ``R = sum_t gamma^(k-1-t) r_t`` over the ``k``
    steps (``myopic_gamma = gamma``; 1 is the paper's undiscounted sum), and

    * says "can't tell" (``answered = False``) when both ``R < skip_below``;
    * calls a tie (``mu = 0.5``) when ``|R1 - R2| <= tie_gap`` (equal returns always tie);
    * otherwise prefers the larger return, or, with ``boltzmann_temperature = tau > 0``,
      prefers segment 1 with probability ``sigmoid((R1 - R2) / (tau * scale))``, where
      ``scale`` is the mean ``|R1 - R2|`` over the batch, so ``tau`` is in units of the
      return scale;
    * flips its choice with probability ``mistake_prob`` (a tie stays a tie).
    """

    boltzmann_temperature: float = non_negative(0.0)  # 0: the deterministic oracle
    mistake_prob: float = in_range(0.0, 0, 1)
    skip_below: float | None = None  # None: answer every query
    tie_gap: float = non_negative(0.0)
    myopic_gamma: float = in_range(1.0, 0, 1)  # 1: the paper's undiscounted sum

    def __post_init__(self):
        check_fields(self)



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
    from rlhf_jax.networks import is_atari_frames
    from rlhf_jax.reward.segments import check_fits_episode

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


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    """The reward model's settings; defaults are the paper's wherever it gives one.

    Values the paper leaves open, and why we chose them:

    * ``learning_rate = 3e-4`` (Adam): the paper names no optimiser settings. The model
      is refit again and again as labels arrive, so we take a step smaller than Adam's
      usual 1e-3, which keeps each refit from chasing the newest minibatches.
    * ``l2_init = 1e-3``: at initialisation the squared kernel norms of the MLP sum to
      about 140 (orthogonal, gain sqrt 2), so the penalty starts near 0.14, a fifth of
      the preference loss at chance (ln 2): present but not dominant. The adaptive rule
      moves it from there.
    * ``l2_factor = 1.1``: each adaptation changes l2 by 10%. The target band is a factor
      1.5 / 1.1 = 1.36 wide, so small steps approach it without jumping over it, and 24
      adaptations still move l2 tenfold.
    * ``l2_adapt_every = 50`` fitting steps between two adaptations, whatever the run's chunk
      (the paper's predictor adapts as it fits, asynchronously, and says no more): a chunk's
      fitting is cut into blocks of about this many steps, each followed by a refresh
      (:func:`rlhf_jax.reward.learner.fitting_blocks`). Adapting once per chunk instead let
      a 1M-step MuJoCo run of 25 chunks move l2 at most elevenfold, and its validation loss
      stayed 2-7 times the training loss, outside the paper's band. At 50, l2 can move tenfold
      in 1,200 fitting steps: 256k env steps at MuJoCo's 0.3 pairs per step, 770k at Atari's 0.1.
    * ``batch_size = 64`` pairs per gradient step, each member drawing its own.
    * ``input_std_floor = 0.1``: the MLP's inputs are standardised by the untrained policy's
      steps, under which many never move (89 of MinAtar Breakout's 100 brick cells). A
      better policy then moves them: at a floor of 1e-3 a broken brick was an input of
      -1000, and Breakout's return fell as labels grew. At 0.1 it is -10.
    """

    ensemble_size: int = positive(3, 256)
    hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    leaky_relu_slope: float = non_negative(0.01)
    mlp_dropout: float = in_range(0.0, 0, 1, high_open=True)
    cnn_dropout: float = in_range(0.5, 0, 1, high_open=True)
    cnn_batch_norm: bool = True
    random_answer_prob: float = in_range(0.1, 0, 1, high_open=True)
    validation_fraction: float = in_range(1.0 / math.e, 0, 1, high_open=True)  # 0.36787944117144233
    l2_init: float = non_negative(1e-3)
    adapt_l2: bool = True  # False: the "no regularization" ablation (l2 = 0, dropout kept)
    l2_low: float = positive(1.1)
    l2_high: float = positive(1.5)
    l2_factor: float = in_range(1.1, 1, low_open=True)
    l2_adapt_every: int = positive(50, INT32_MAX)  # fitting steps between two adaptations of l2
    learning_rate: float = in_state(positive(3e-4))
    batch_size: int = positive(64, 65_536)
    input_std_floor: float = positive(0.1)
    normalized_std: float = non_negative(0.0)  # 0: the paper's, 0.05 on Atari frames and 1 otherwise
    loss: Literal["preference", "target"] = "preference"
    bootstrap: bool = True
    # A continuous action as r̂ reads it: clipped into the action space's bounds, as the
    # environment takes it (True), or as the Gaussian policy drew it (False: the paper's
    # public reference implementation, whose predictor reads the sampled action). Agents
    # hand r̂ the sampled action; this is the one place that clips it.
    clip_actions: bool = True
    # False: r̂ reads the observation alone, its action input held at zero. Not the paper's, whose
    # r̂ reads both (an ablation): where the task's reward ignores the action, as appendix A's
    # MuJoCo tasks do once their torque cost is removed, r̂ can then learn no cost of acting
    # that the oracle lacks.
    reads_action: bool = True
    # A reward model saved by `rlhf-jax fit-reward` (a .npz) for the run to start from instead of an
    # untrained one; its architecture keys (rlhf_jax.reward.saved_model) must match these. "": none.
    init_from: str = ""

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(self.hidden))  # hashable: config is a static argument
        check_fields(self)
        check_path_field("reward_model.init_from", self.init_from)
        checks = [
            (len(self.hidden) >= 1, f"hidden must be a non-empty list of layer sizes, got {self.hidden}"),
            (self.l2_low < self.l2_high, f"need l2_low < l2_high, got l2_low={self.l2_low}, l2_high={self.l2_high}"),
            (self.loss in ("preference", "target"), f"loss must be 'preference' or 'target', got {self.loss!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"reward model: {message}")

    def reward_std(self, spec: EnvSpec) -> float:
        """The standard deviation r̂ is normalised to: 0.05 on Atari (A.2), 1 otherwise (A.1)."""
        from rlhf_jax.networks import is_atari_frames

        if self.normalized_std > 0:
            return self.normalized_std
        return 0.05 if is_atari_frames(spec.observation_shape) else 1.0



@dataclasses.dataclass(frozen=True)
class AnnotatorConfig:
    signal: Literal["reward", "potential"] = "reward"
    threshold: float = non_negative(0.0)  # |d_t| must exceed it to be marked
    fraction: float = in_range(1.0, 0, 1)  # chance that an event is marked at all
    noise: float = in_range(0.0, 0, 1)  # chance that a mark's sign is flipped

    def __post_init__(self):
        if self.signal not in ("reward", "potential"):
            raise ConfigError(f"ibt.annotator.signal must be 'reward' or 'potential', got {self.signal!r}")
        check_fields(self)



@dataclasses.dataclass(frozen=True)
class IBTConfig:
    """The IBT reward model and its loop (:mod:`rlhf_jax.reward.ibt_learner`); defaults from the paper
    where it gives them (Adam with beta_1 = 0, beta_2 = 0.999, learning rate 1e-4, batches of 96)."""

    utility: Literal["mlp", "lstm"] = "mlp"
    hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    lstm_size: int = positive(64, MAX_LAYER)
    leaky_relu_slope: float = non_negative(0.01)
    no_mark_weight: float = non_negative(1.0)  # C of Algorithm 1
    pair_samples: int = non_negative(0, 1_000_000)  # pairs drawn per episode; 0: every pair (O(T^2) memory)
    learning_rate: float = in_state(positive(1e-4))
    adam_b1: float = in_range(0.0, 0, 1, high_open=True)
    batch_episodes: int = positive(96, 65_536)
    # The agent's reward: U's rise divided by its standard deviation on recent steps, times this.
    normalized_std: float = positive(1.0)
    # The loop: annotated episodes (clips of `episode_length` steps cut from recent rollouts).
    episodes: int = positive(200, 100_000)  # the budget of annotated episodes
    initial_episodes: int = in_range(-1, -1, 100_000)  # from the untrained policy before RL; -1: 25% of the budget
    episode_length: int = in_range(50, 2, 1_000)
    episode_capacity: int = positive(500, 100_000)  # recent clips that episodes to annotate are drawn from
    annotation_decay_steps: int = positive(2_000_000, INT32_MAX)  # the annotation rate falls as c / (T + c)
    fit_episodes_per_env_step: float = non_negative(0.01)
    pretrain_epochs: int = non_negative(0, 100_000)
    annotator: AnnotatorConfig = AnnotatorConfig()
    # A label dataset of IBT marks (`rlhf-jax labels export` of an IBT run; or a finished IBT
    # run's directory) whose marked clips the run starts with: they count against the budget
    # `episodes`, and the annotator is asked for the rest only. "": none (docs/label-datasets.md).
    marks_from: str = ""

    def __post_init__(self):
        if self.utility not in ("mlp", "lstm"):
            raise ConfigError(f"ibt.utility must be 'mlp' or 'lstm', got {self.utility!r}")
        check_fields(self)
        check_path_field("ibt.marks_from", self.marks_from)
        if self.initial_episodes > self.episodes:
            raise ConfigError(f"ibt.initial_episodes ({self.initial_episodes}) exceeds the budget ({self.episodes})")

