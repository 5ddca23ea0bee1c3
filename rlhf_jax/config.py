"""Experiments as frozen dataclasses, read from YAML and overridden with ``key=value``.

``load_config(ExperimentConfig, "configs/x.yaml", ["env.num_envs=8"])`` reads the
file, applies the overrides (nested keys with dots, values parsed as YAML scalars),
and builds the dataclasses, checking every key and type first: a bad config stops
with a ``ConfigError`` that names the key and lists the valid ones, before anything runs.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from rlhf_jax.agents.a2c import A2CConfig
from rlhf_jax.agents.acer import ACERConfig
from rlhf_jax.agents.dqn import DQNConfig
from rlhf_jax.agents.trpo import TRPOConfig
from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.config import PeopleConfig
from rlhf_jax.reward.config import PreferenceConfig
from rlhf_jax.reward.ensemble import RewardModelConfig
from rlhf_jax.reward.ibt import IBTConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How a run is driven and saved (not part of any algorithm)."""

    dir: str = ""  # "" makes runs/<name>-<date>-<time>
    # Env steps per compiled chunk: progress, metrics and checkpoints happen between chunks.
    chunk_env_steps: int = 50_000
    # One update is one agent iteration (A2C: one gradient step on n x num_envs steps;
    # DQN: num_envs / gcd(num_envs, update_period) gradient steps).
    checkpoint_every_updates: int = 10_000
    # How a chunk's iterations are driven: "scan" compiles them into one loop; "python"
    # dispatches one compiled iteration at a time. "auto" picks "python" for convolutional
    # networks on the CPU, where XLA runs convolution gradients inside a loop about 10x
    # slower than outside one (jax-ml/jax#12868), and "scan" everywhere else.
    loop: Literal["auto", "scan", "python"] = "auto"
    tensorboard: bool = True
    eval_episodes: int = 32
    eval_max_steps: int = 0  # 0: the environment's episode limit

    def __post_init__(self):
        if self.chunk_env_steps < 1 or self.checkpoint_every_updates < 1 or self.eval_episodes < 1:
            raise ConfigError("run.chunk_env_steps, run.checkpoint_every_updates and run.eval_episodes must be positive")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """The root of every experiment file in ``configs/``: what to train, on what, and how to run it."""

    name: str = "experiment"
    seed: int = 0
    agent: Literal["a2c", "acer", "dqn", "trpo"] = "a2c"
    # What the agent learns from: the environment's reward, a reward model fitted to
    # preferences between its segments (rlhf_jax.pipeline), or an IBT utility fitted to
    # progress and regress marks in its episodes (rlhf_jax.ibt_pipeline).
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
        if self.labeler == "people" and self.reward == "env":
            raise ConfigError("labeler=people needs a learned reward: set reward to preferences or ibt")


# What `rlhf-jax train` runs when given no config file (configs/rlhf_cartpole.yaml says the
# same): A2C on CartPole learning from 500 synthetic preferences, a few minutes on 2 cores.
DEFAULT_EXPERIMENT = {
    "name": "rlhf-cartpole",
    "agent": "a2c",
    "reward": "preferences",
    "env": {"id": "gymnax/CartPole-v1", "num_envs": 32, "hide_episode_end": True, "hidden_end": "reset"},
    "a2c": {"total_env_steps": 1_024_000, "num_steps": 8, "learning_rate": 0.003},  # 20 chunks
    # The paper's A2C reward scale (its Atari std 0.05): at std 1 A2C's values grow too large.
    "reward_model": {"normalized_std": 0.05},
    "preferences": {"labels": 500, "fit_pairs_per_env_step": 0.1},
    "run": {"chunk_env_steps": 51_200},
}


def build(cls, data: dict, where: str = ""):
    """Make dataclass ``cls`` from a nested dict, checking keys and types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping of keys to values, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key {path!r}; valid keys{' of ' + where if where else ''}: {', '.join(fields)}")
        kwargs[key] = _convert(hints[key], value, path)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where or 'config'}: {error}") from None


def _convert(hint, value, path: str):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, path)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _convert(option, value, path)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0])
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{path} must be one of {list(typing.get_args(hint))}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is an int in Python; refuse it where a number is asked for, and vice versa.
    if isinstance(value, hint) and not (hint is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"{path} must be of type {hint.__name__}, got {value!r} ({type(value).__name__})")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with each ``a.b.c=value`` set (value parsed as YAML)."""
    data = _copy(data)
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r} must look like key=value (nested keys with dots)")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {override!r}: {part!r} is not a section")
        try:
            node[leaf] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"override {override!r}: cannot parse the value: {error}") from None
    return data


def _copy(data):
    return {k: _copy(v) for k, v in data.items()} if isinstance(data, dict) else data


def flat_keys(data: dict, prefix: str = "") -> dict:
    """A nested config dict keyed as overrides are: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return data


def load_config(cls, path: str | Path | None, overrides: list[str] = (), default: dict | None = None):
    """Read ``path`` (or start from ``default``, else the dataclass defaults), apply overrides, build ``cls``."""
    data = read_yaml(path) if path is not None else (default or {})
    return build(cls, apply_overrides(data, list(overrides)))


def to_dict(config) -> dict:
    """The plain nested dict of a config, as written to a run directory."""
    return _plain(dataclasses.asdict(config))


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
