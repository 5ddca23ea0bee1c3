"""Frozen config dataclasses from YAML, without JAX: reading, overriding, building, marking.

``build(cls, data)`` makes dataclass ``cls`` from a nested dict, checking every key and
type first: a bad config stops with a ``ConfigError`` that names the key and lists the valid
ones, before anything runs. :mod:`rlhf_jax.config` builds experiments with it; the labeling
web app builds only the sections it reads, so serving a run never imports JAX or an agent.

A field marked with :func:`in_state` holds a hyper-parameter that its optimiser keeps in
the training state (``optax.inject_hyperparams``), not in the compiled program: ``rlhf-jax
sweep`` runs members differing in it as one program (:func:`is_in_state`).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from rlhf_jax.errors import ConfigError

# A run directory's resolved config, as training writes it.
CONFIG_FILE = "config.yaml"
_IN_STATE = "in_optimizer_state"  # the field metadata key of the mark


def in_state(default):
    """A config field whose value its optimiser keeps in the training state (a learning rate
    passed through ``ops.schedules.learning_rate_in_state``): ``learning_rate: float = in_state(7e-4)``."""
    return dataclasses.field(default=default, metadata={_IN_STATE: True})


def is_in_state(cls, key: str) -> bool:
    """Whether the dotted ``key`` of dataclass ``cls`` (``a2c.learning_rate``) is marked :func:`in_state`."""
    where = ""
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"unknown key {key!r}: {where} is not a section")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        path = f"{where}.{part}" if where else part
        if part not in fields:
            raise _unknown_key(path, where, fields)
        field, cls, where = fields[part], typing.get_type_hints(cls)[part], path
    return bool(field.metadata.get(_IN_STATE))


def _unknown_key(path: str, where: str, fields) -> ConfigError:
    return ConfigError(f"unknown key {path!r}; valid keys{' of ' + where if where else ''}: {', '.join(fields)}")


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
            raise _unknown_key(path, where, fields)
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


def read_run_config(run_dir: str | Path) -> dict:
    """The nested dict of the config saved in run directory ``run_dir`` (not yet built)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    return read_yaml(run_dir / CONFIG_FILE)


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
