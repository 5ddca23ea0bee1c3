"""Frozen config dataclasses from YAML, without JAX: reading, overriding, building, marking.

``build(cls, data)`` makes dataclass ``cls`` from a nested dict, checking every key, type
and declared range first: a bad config stops with a ``ConfigError`` that names the key and
lists the valid ones (or states the range), before anything runs. :mod:`rlhf_jax.config`
builds experiments with it; the labeling web app builds only the sections it reads, so
serving a run never imports JAX or an agent.

A field marked with :func:`in_state` holds a hyper-parameter that its optimiser keeps in
the training state (``optax.inject_hyperparams``), not in the compiled program: ``rlhf-jax
sweep`` runs members differing in it as one program (:func:`is_in_state`).

A field declares its range once, on the field: ``num_steps: int = positive(5, high=4096)``,
``gamma: float = in_range(0.99, 0, 1)`` (:func:`in_range`, :func:`positive`,
:func:`non_negative`; ``in_state(positive(7e-4))`` composes). Every number a config holds
is checked against its field's range, item by item for a tuple, when it is built and when a
section is made in Python (:func:`check_fields` in its ``__post_init__``); every float must
be finite and every int fit in 64 bits, range or not.

YAML is read by one loader (:func:`parse_yaml`): numbers as YAML 1.2 reads them, where
PyYAML reads YAML 1.1 (``3e-4`` and ``1e9`` are floats, ``010`` is ten, ``1:30`` a string), a
key given twice in one mapping is refused, and so are aliases that expand a document beyond
:data:`MAX_YAML_NODES` values and nesting deeper than Python's stack.
"""
from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from rlhf_jax.errors import ConfigError

# A run directory's resolved config, as training writes it.
CONFIG_FILE = "config.yaml"
_IN_STATE = "in_optimizer_state"  # the field metadata key of the mark
_RANGE = "range"  # the field metadata key of a declared range: (low, high, low_open, high_open)
_INT64 = (-2**63, 2**63 - 1)
# Steps counted on the device in int32 (runner.env_steps): a bound for step counts.
INT32_MAX = 2**31 - 1
# Units in one hidden layer: a 8192 x 8192 float32 kernel is 256 MiB.
MAX_LAYER = 8192
# The longest file name and path Linux takes (NAME_MAX, PATH_MAX), in bytes.
NAME_MAX, PATH_MAX = 255, 4096
# The most values (aliases expanded) a YAML document may hold: far beyond any config, far
# below a "billion laughs" document, which a few lines make expand to 10^9 values.
MAX_YAML_NODES = 100_000


def in_state(default):
    """A config field whose value its optimiser keeps in the training state (a learning rate
    passed through ``ops.schedules.learning_rate_in_state``): ``learning_rate: float = in_state(7e-4)``,
    or with a range, ``in_state(positive(7e-4))``."""
    if isinstance(default, dataclasses.Field):
        return dataclasses.field(default=default.default, metadata={**default.metadata, _IN_STATE: True})
    return dataclasses.field(default=default, metadata={_IN_STATE: True})


def in_range(default, low=None, high=None, *, low_open: bool = False, high_open: bool = False):
    """A field whose number (each number, for a tuple) lies between ``low`` and ``high``
    (``None``: unbounded on that side), the bounds included unless ``*_open``."""
    return dataclasses.field(default=default, metadata={_RANGE: (low, high, low_open, high_open)})


def positive(default, high=None):
    """A count (int field: at least 1) or an amount (float field: more than 0), at most ``high``."""
    integer = isinstance(default[0] if isinstance(default, tuple) else default, int)
    return in_range(default, 1, high) if integer else in_range(default, 0, high, low_open=True)


def non_negative(default, high=None):
    return in_range(default, 0, high)


def check_fields(config) -> None:
    """Check every field of the section ``config`` against its declared range (for a section
    made in Python; :func:`build` has already checked what it read, under dotted keys)."""
    for field in dataclasses.fields(config):
        _check_range(field, getattr(config, field.name), field.name)


def decay_horizon(decay_env_steps: int, total_env_steps: int) -> int:
    """The env step at which a linearly decaying learning rate reaches zero: ``decay_env_steps``,
    or the run's end where that is 0 (an ``lr_decay_env_steps`` field's meaning)."""
    return decay_env_steps or total_env_steps


def check_decay_horizon(section: str, decay_env_steps: int, total_env_steps: int) -> None:
    """A learning rate that decays linearly to zero must not get there before the run ends: it
    would train on at a rate of zero."""
    if decay_horizon(decay_env_steps, total_env_steps) < total_env_steps:
        raise ConfigError(f"{section}.lr_decay_env_steps={decay_env_steps} ends before {section}.total_env_steps="
                          f"{total_env_steps}, leaving the rate at zero: set it to 0 (decay over the run) or at "
                          f"least {total_env_steps}")


def check_path_field(key: str, value: str) -> None:
    """A field naming a file or directory (``""``: none): no surrounding blanks or line breaks,
    which a path typed into YAML or an override can carry by mistake, and no longer than a file
    system takes (:data:`PATH_MAX`, :data:`NAME_MAX` between slashes). Whether the path exists
    is checked where it is read, not when the config is built (a config travels between machines)."""
    if value and (value != value.strip() or any(c in value for c in "\n\r\0")):
        raise ConfigError(f"{key} must be a path without surrounding blanks or line breaks, got {_show(value)}")
    size, longest = byte_length(value), max(map(byte_length, value.split("/")))
    if size >= PATH_MAX or longest > NAME_MAX:
        raise ConfigError(f"{key} is too long for a file system: at most {PATH_MAX - 1} bytes, {NAME_MAX} between "
                          f"slashes, got {size} bytes, {longest} between slashes")


def byte_length(text: str) -> int:
    """How many bytes ``text`` takes as a file name (UTF-8)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_value(cls, name: str, value, path: str) -> None:
    """Check ``value`` against the declared range of field ``name`` of dataclass ``cls``, calling it ``path``
    (a command-line option that stands for the field)."""
    _check_range(next(f for f in dataclasses.fields(cls) if f.name == name), value, path)


def _check_range(field, value, path: str) -> None:
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            _check_range(field, item, f"{path}[{i}]")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path} must be a finite number, got {value}")
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise ConfigError(f"{path} must fit in a signed 64-bit integer, got {value}")
    low, high, low_open, high_open = field.metadata.get(_RANGE, (None, None, False, False))
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        bounds = [f"{'more than' if low_open else 'at least'} {low}" if low is not None else "",
                  f"{'less than' if high_open else 'at most'} {high}" if high is not None else ""]
        rule = "a positive number" if bounds == ["more than 0", ""] else " and ".join(b for b in bounds if b)
        raise ConfigError(f"{path} must be {rule}, got {value}")


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
        _check_range(fields[key], kwargs[key], path)
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
            raise ConfigError(f"{path} must be one of {list(typing.get_args(hint))}, got {_show(value)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list, got {_show(value)}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # A count written as 1e9 or 2e6 (the README's way) is the integer it names.
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    # bool is an int in Python; refuse it where a number is asked for, and vice versa.
    if isinstance(value, hint) and not (hint is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"{path} must be of type {hint.__name__}, got {_show(value)} ({type(value).__name__})")


# A value shown in a message: short, whatever its size (never a whole expanded alias tree).
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxstring, _shown.maxother = 2, 4, 4, 60, 60
_show = _shown.repr


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with each ``a.b.c=value`` set (value parsed as YAML)."""
    data = _copy(data)
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {_show(override)} must look like key=value (nested keys with dots)")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {_show(override)}: {part!r} is not a section")
        node[leaf] = parse_value(text, f"override {_show(override)}")
    return data


def config_and_overrides(words: list[str]) -> tuple[str | None, list[str]]:
    """A command's ``[CONFIG] [key=value ...]``: the first word is a config file unless it has an '='."""
    config = words[0] if words and "=" not in words[0] else None
    return config, words[1:] if config else words


def split_sweep_words(words: list[str]) -> tuple[str | None, list[str], dict[str, list]]:
    """A sweep's ``[CONFIG] key=value ... key=v1,v2 ...`` -> (config file, overrides, swept key -> values)."""
    config, words = config_and_overrides(words)
    overrides, swept = [], {}
    for word in words:
        key, sep, text = word.partition("=")
        if not sep:
            raise ConfigError(f"{word!r} must look like key=value or key=v1,v2,...")
        if "," in text:
            if key in swept:
                raise ConfigError(f"{key} is swept twice")
            values = [parse_value(part, f"swept key {key}") for part in text.split(",")]
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:  # its runs would run twice
                raise ConfigError(f"{word} gives {twice} twice")
            swept[key] = values
        else:
            overrides.append(word)
    if "seed" in swept:
        raise ConfigError("sweep seeds with --seeds N, not seed=a,b")
    return config, overrides, swept


def override(key: str, value) -> str:
    """The ``key=value`` override that sets ``key`` to ``value`` (:func:`apply_overrides` reads it back)."""
    return f"{key}={dump_yaml(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def parse_value(text: str, where: str):
    """The value ``text`` names, read as YAML (:func:`parse_yaml`), or a one-line error naming ``where``."""
    try:
        return parse_yaml(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: cannot parse the value: {_one_line(error)}") from None


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


class KeyInfo(typing.NamedTuple):
    """One key of a config, as ``rlhf-jax config keys`` shows it."""

    key: str  # dotted, as overrides name it: a2c.learning_rate
    type: str  # int, float, bool, str, one of a|b, list of int, ...
    default: Any  # the value a config that leaves the key out gets
    comment: str  # what the source says of the field (its comments, joined), or ""


def describe_keys(cls, prefix: str = "") -> list[KeyInfo]:
    """Every key of dataclass ``cls`` and of its sections, in order, with its type, default and
    the comments its field carries in the source (read without importing what uses it)."""
    hints, comments = typing.get_type_hints(cls), _field_comments(cls)
    keys = []
    for field in dataclasses.fields(cls):
        hint, key = hints[field.name], f"{prefix}{field.name}"
        if dataclasses.is_dataclass(hint):
            keys.extend(describe_keys(hint, f"{key}."))
        else:
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            keys.append(KeyInfo(key, _type_name(hint), default, comments.get(field.name, "")))
    return keys


def _type_name(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + "|".join(map(str, args))
    if origin in (tuple, list):
        return f"list of {_type_name(args[0]) if args else 'values'}"
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    return getattr(hint, "__name__", str(hint))


def _field_comments(cls) -> dict[str, str]:
    """``{field: its comments}``: the comment lines just above each field and the one after it."""
    import inspect

    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):  # no source (a frozen application, a class made at run time)
        return {}
    names, found, above, in_docstring = {f.name for f in dataclasses.fields(cls)}, {}, [], False
    for line in lines[1:]:
        text = line.strip()
        if text.count('"""') % 2:  # a docstring opens or closes: its lines are no fields
            in_docstring = not in_docstring
            continue
        if in_docstring:
            continue
        if text.startswith("#"):
            above.append(text.lstrip("#").strip())
            continue
        match = re.match(r"(\w+)\s*:[^#]*?(?:#\s*(.*))?$", text)
        if match and match.group(1) in names and match.group(1) not in found:
            found[match.group(1)] = " ".join([*above, match.group(2) or ""]).strip()
        above = []
    return found


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, made strict (module docstring)."""

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # what a merge brings in may be given again after it
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # PyYAML refuses it itself
            if key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (first on line {first[key]})", key_node.start_mark)
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def compose_document(self):
        node = super().compose_document()
        if _expanded_size(node, {}) > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"its aliases expand it to more than {MAX_YAML_NODES} values", node.start_mark)
        return node


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, reading numbers as :class:`_Loader` does, so that it quotes a
    string such as ``"1e5"`` that the loader would read back as a number."""


# YAML 1.2's numbers (its core schema) in place of PyYAML's YAML 1.1 ones: a float has a dot or
# an exponent (1.1 wants a dot: 1e9 was a string); an integer is decimal, 0o octal or 0x
# hexadecimal (1.1 read 010 as 8, 1:30 as 90 and 1_000 as 1000: 1.2 reads 10 and two strings).
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_NUMBERS = ((_INT, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),  # int first: 10 is no float
            (_FLOAT, r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
             "-+.0123456789"))
for _yaml_class in (_Loader, _Dumper):
    _yaml_class.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for _tag, _pattern, _first in _NUMBERS:
        _yaml_class.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))


def _construct_int(loader: _Loader, node) -> int:
    """A YAML 1.2 integer: decimal (leading zeros and all), 0o octal or 0x hexadecimal."""
    text = loader.construct_scalar(node)
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    digits = text if base == 10 else text[2:]
    if len(digits) > 100:  # far past 64 bits, which every setting fits; int() reads at most 4,300 digits
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(digits)} digits is more than any setting holds", node.start_mark)
    return int(digits, base)


_Loader.add_constructor(_INT, _construct_int)


def _expanded_size(node, sizes: dict) -> int:
    """How many values ``node`` holds with every alias expanded (shared nodes counted once each time)."""
    if id(node) not in sizes:
        sizes[id(node)] = math.inf  # a node inside itself (a recursive alias) is infinite
        children = node.value if isinstance(node, yaml.SequenceNode) else (
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]


def parse_yaml(text: str):
    """The one YAML loader of configs and ``key=value`` overrides (module docstring)."""
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:  # PyYAML's parser recurses for each level: "[[[[..." 5,000 deep
        raise yaml.YAMLError("it is nested too deeply") from None


def dump_yaml(data, **options) -> str:
    """YAML text that :func:`parse_yaml` reads back as ``data`` (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, **options)


def _one_line(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    context = getattr(error, "context", None)
    problem = getattr(error, "problem", None) or str(error)
    return where + (f"{context}: " if context else "") + problem


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{str(path)!r} is a directory; give a config file (a run's is its config.yaml)")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    return parse_mapping(text, path)


def parse_mapping(text: str, where) -> dict:
    """The mapping of keys to values that YAML ``text`` holds (a config file's, or one stored
    elsewhere), or a one-line error naming ``where``."""
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: not valid YAML: {_one_line(error)}") from None
    if data is None:
        raise ConfigError(f"{where}: the file is empty (or only comments): it sets nothing")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of keys to values")
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
