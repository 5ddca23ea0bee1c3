"""Experiments as frozen dataclasses, read from YAML and overridden with ``key=value``.

``load_config(ExperimentConfig, "configs/x.yaml", ["env.num_envs=8"])`` reads the
file, applies the overrides (nested keys with dots, values parsed as YAML scalars),
and builds the dataclasses, checking every key, type and declared range first: a bad
config stops with a ``ConfigError`` that names the key and lists the valid ones (or states
the range), before anything runs.

That machinery is :mod:`rlhf_jax.config_base`'s. This module gathers every section's dataclass
into :class:`ExperimentConfig`. Neither imports JAX: the sections live apart from the code that
uses them (:mod:`rlhf_jax.agents.options`, :mod:`rlhf_jax.envs.options`,
:mod:`rlhf_jax.reward.config`, :mod:`rlhf_jax.feedback.config`), so that a config is read and
checked, and its mistakes reported, in a fraction of a second.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
from typing import Literal

from rlhf_jax.agents.options import A2CConfig, ACERConfig, DQNConfig, TRPOConfig
# The generic machinery lives in the jax-free config_base; imported here too, for callers of this module.
from rlhf_jax.config_base import apply_overrides, build, flat_keys, load_config, read_yaml, to_dict  # noqa: F401
from rlhf_jax.config_base import (INT32_MAX, NAME_MAX, byte_length, check_fields, check_path_field, non_negative,
                                  parse_mapping, positive)
from rlhf_jax.envs.options import MAX_ENVS, EnvConfig
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.reward.config import IBTConfig, PreferenceConfig, RewardModelConfig
from rlhf_jax.reward.kinds import KINDS, MODEL_KEY, feedback_kind


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How a run is driven and saved (not part of any algorithm)."""

    dir: str = ""  # "" makes runs/<name>-<date>-<time>
    # Env steps per compiled chunk: progress, metrics and checkpoints happen between chunks.
    chunk_env_steps: int = positive(50_000, INT32_MAX)
    # One update is one agent iteration (A2C: one gradient step on n x num_envs steps;
    # DQN: num_envs / gcd(num_envs, update_period) gradient steps).
    checkpoint_every_updates: int = positive(10_000, INT32_MAX)
    # Also checkpoint once this much wall-clock time has passed since the last checkpoint (or
    # the start), so that a run shorter than checkpoint_every_updates can resume too (the
    # default run takes about a minute); but a run spends at most about 5% of its time
    # saving. 0: by updates only.
    checkpoint_every_minutes: float = non_negative(0.5)
    # How a chunk's iterations are driven: "scan" compiles them into one loop; "python"
    # dispatches one compiled iteration at a time. "auto" picks "python" for convolutional
    # networks on the CPU, where XLA runs convolution gradients inside a loop about 10x
    # slower than outside one (jax-ml/jax#12868), and "scan" everywhere else.
    loop: Literal["auto", "scan", "python"] = "auto"
    tensorboard: bool = True
    # Weights & Biases (rlhf_jax.wandb_log; pip install 'rlhf_jax[wandb]'): the metrics, the
    # config and the learning curve to a W&B run as well; a sweep logs one per member.
    wandb: bool = False
    wandb_project: str = "rlhf-jax"
    wandb_entity: str = ""  # "": your default W&B entity
    wandb_tags: tuple[str, ...] = ()
    # "offline" writes the W&B run under the run directory, for `wandb sync` to upload later;
    # "online" streams it to the W&B server (after `wandb login`).
    wandb_mode: Literal["offline", "online"] = "offline"
    eval_episodes: int = positive(32, MAX_ENVS)  # one copy of the environment each
    eval_max_steps: int = non_negative(0, INT32_MAX)  # 0: the environment's episode limit
    # After every chunk, also score each run's policy on eval_episodes whole episodes of the
    # task itself: the run's environment without its changes to episode ends and lengths
    # (env.hide_episode_end, env.max_episode_steps), as the metric task_return. Where those
    # changes make the training episodes other than the task's (InvertedPendulum from labels in
    # 100-step episodes), task_return is the return to set beside RL's.
    score_on_task: bool = False

    def __post_init__(self):
        check_fields(self)
        check_path_field("run.dir", self.dir)


# A run's directory is runs/<name>-<date>-<time>, a sweep's runs/sweep-<name>-<date>-<time>:
# the name may take what those leave of a file name's NAME_MAX bytes.
MAX_NAME = NAME_MAX - len("sweep--20260101-120000")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """The root of every experiment file in ``configs/``: what to train, on what, and how to run it."""

    name: str = "experiment"
    seed: int = 0
    agent: Literal["a2c", "acer", "dqn", "trpo"] = "a2c"
    # What the agent learns from: the environment's reward, a reward model fitted to
    # preferences between its segments, or an IBT utility fitted to progress and regress
    # marks in its clips (both driven by the one loop of rlhf_jax.loop).
    reward: Literal["env", "preferences", "ibt"] = "env"
    # Who answers the queries of a learned reward: the synthetic oracle on the device, or
    # people through the label store and `rlhf-jax label RUN_DIR` (rlhf_jax.feedback).
    labeler: Literal["synthetic", "people"] = "synthetic"
    env: EnvConfig = EnvConfig()
    a2c: A2CConfig = A2CConfig()
    acer: ACERConfig = ACERConfig()
    dqn: DQNConfig = DQNConfig()
    trpo: TRPOConfig = TRPOConfig()
    reward_model: RewardModelConfig = RewardModelConfig()
    preferences: PreferenceConfig = PreferenceConfig()
    ibt: IBTConfig = IBTConfig()
    people: PeopleConfig = PeopleConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self):
        check_fields(self)
        # The run directory is runs/<name>-<date>-<time>: a name with a path in it would put it elsewhere.
        if self.name in ("", ".", "..") or any(c in self.name for c in "/\\\0"):
            raise ConfigError(f"name must be a plain file name (no '/', '\\' or '..'), got {self.name!r}")
        if byte_length(self.name) > MAX_NAME:
            raise ConfigError(f"name must be at most {MAX_NAME} bytes: it names the run's directory, "
                              f"runs/<name>-<date>-<time>; got {byte_length(self.name)}")
        if self.labeler == "people" and self.reward == "env":
            raise ConfigError("labeler=people needs a learned reward: set reward to preferences or ibt")
        for kind in KINDS:  # a dataset of one kind of answers starts that kind's model only
            if kind.answers_path(self) and feedback_kind(self.reward) is not kind:
                raise ConfigError(f"{kind.answers_key} gives {kind.model} its start: it needs "
                                  f"reward={kind.reward}, this config has reward={self.reward}")
        if self.reward_model.init_from and feedback_kind(self.reward) is None:
            raise ConfigError(f"{MODEL_KEY} gives a learned reward model its start: it needs reward="
                              f"{' or '.join(kind.reward for kind in KINDS)}, this config has reward={self.reward}")


# The keys naming files on the machine a config was written on. A config that travels (the
# one a label dataset keeps) carries none of them, so it never chooses what is read here.
LOCAL_FILE_KEYS = ("run.dir", MODEL_KEY, *(kind.answers_key for kind in KINDS))


def without_local_files(data: dict) -> dict:
    """The nested config dict ``data`` without :data:`LOCAL_FILE_KEYS`: each takes its default."""
    data = {name: dict(value) if isinstance(value, dict) else value for name, value in data.items()}
    for key in LOCAL_FILE_KEYS:
        section, name = key.split(".")
        if isinstance(data.get(section), dict):
            data[section].pop(name, None)
    return data


# What `rlhf-jax train` and `rlhf-jax sweep` run when given no config file: A2C on CartPole
# learning from 500 synthetic preferences, a few minutes on 2 cores. Its one copy is package
# data (pyproject's package-data ships it in the wheel), whose comments say why each value is
# what it is; DEFAULT_EXPERIMENT is that file's mapping, as a config file's would be.
DEFAULT_EXPERIMENT_FILE = importlib.resources.files("rlhf_jax") / "configs" / "default.yaml"
DEFAULT_EXPERIMENT = parse_mapping(DEFAULT_EXPERIMENT_FILE.read_text(encoding="utf-8"), "rlhf_jax/configs/default.yaml")
