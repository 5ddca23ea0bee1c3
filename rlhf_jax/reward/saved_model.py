"""A reward ensemble saved on its own, as one NumPy archive: what ``rlhf-jax fit-reward``
writes and what a run starts from with ``reward_model.init_from``.

The archive holds the parts of :class:`~rlhf_jax.reward.ensemble.EnsembleState` that make
the reward function: every member's parameters (and batch statistics), its l2 coefficient
and normalisation, and the inputs' standardisation, each leaf under its path
(``params['Dense_0']['kernel']``), beside ``info``: a JSON :class:`ModelInfo` saying what
it was fitted on. The optimiser's state is not kept: a run starting from the model starts
Adam afresh, as it does for an untrained one (Adam's state does not depend on the values of
the parameters it starts from).

A model loads into a run only if the run's ensemble has its exact shape: the same
``reward_model`` architecture (:data:`ARCHITECTURE`) and observation and action spaces;
anything else is a :class:`~rlhf_jax.errors.ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.ensemble import EnsembleState, RewardModelConfig

FORMAT = "rlhf_jax.reward_model"
VERSION = 1
# The reward_model keys that make the network (its shape or its function): a saved model
# loads only into a run whose values are the same. The rest (learning rate, l2 adaptation,
# dropout, the reward's scale) are how a model is fitted or read, free to differ.
ARCHITECTURE = ("ensemble_size", "hidden", "leaky_relu_slope", "cnn_batch_norm")
# The fields of EnsembleState that are the model; opt_state and step are how it was fitted.
MODEL_FIELDS = ("params", "batch_stats", "l2", "norm_mean", "norm_std", "obs_mean", "obs_std")


class SavedModel(NamedTuple):
    """A reward ensemble's model without its optimiser: :data:`MODEL_FIELDS` of an
    :class:`EnsembleState`, as arrays."""

    params: Any
    batch_stats: Any
    l2: Any
    norm_mean: Any
    norm_std: Any
    obs_mean: Any
    obs_std: Any

    @classmethod
    def of(cls, ensemble: EnsembleState) -> "SavedModel":
        return cls(*(getattr(ensemble, name) for name in MODEL_FIELDS))

    def into(self, ensemble: EnsembleState) -> EnsembleState:
        """``ensemble`` with this model in place of its own (its optimiser state kept: fresh)."""
        cast = jax.tree.map(lambda new, old: new.astype(old.dtype), self, SavedModel.of(ensemble))
        return ensemble._replace(**cast._asdict())


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a saved model was fitted on and how, stored beside its arrays."""

    env: dict  # the environment's config section (rlhf_jax.envs.options.EnvConfig, as written to config.yaml)
    observation_shape: tuple[int, ...]
    architecture: dict  # reward_model's ARCHITECTURE keys and their values
    labels: int  # labels it was fitted to
    dataset: str  # where they came from
    steps: int  # fitting steps
    train_loss: float
    val_loss: float

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)})

    @classmethod
    def from_json(cls, text: str, where: str) -> "ModelInfo":
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ConfigError(f"{where} is not a reward model saved by rlhf-jax fit-reward (format version "
                              f"{data.get('version')!r}, this rlhf_jax reads {VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["observation_shape"] = tuple(fields["observation_shape"])
        return cls(**fields)


def architecture(config: RewardModelConfig) -> dict:
    """The :data:`ARCHITECTURE` keys of ``config``, JSON-ready."""
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in ((name, getattr(config, name)) for name in ARCHITECTURE)}


def _leaves(tree, prefix: str) -> dict[str, Any]:
    return {prefix + jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def save(path: str | Path, ensemble: EnsembleState, info: ModelInfo) -> None:
    """Write ``ensemble``'s model (module docstring) and ``info`` to ``path`` (a ``.npz``)."""
    model = jax.device_get(SavedModel.of(ensemble))
    arrays = {}
    for name, part in zip(MODEL_FIELDS, model):
        arrays.update(_leaves(part, name))
    with open(path, "wb") as file:
        np.savez(file, info=np.array(info.to_json()), **{key: np.asarray(value) for key, value in arrays.items()})


def read_info(path: str | Path, key: str = "reward_model.init_from") -> ModelInfo:
    """The :class:`ModelInfo` of the model saved at ``path``, or a one-line error naming ``key`` and the path."""
    path = Path(path)
    where = f"{key}: {path}"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist" if not path.exists() else f"{where} is not a file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "info" not in archive.files:
                raise ConfigError(f"{where} is not a reward model saved by rlhf-jax fit-reward (no info)")
            return ModelInfo.from_json(str(archive["info"]), where)
    except (OSError, ValueError, zipfile.BadZipFile, json.JSONDecodeError, KeyError, TypeError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{where} is not a reward model saved by rlhf-jax fit-reward "
                          f"({type(error).__name__}: {' '.join(str(error).split())})") from None


def check_fits(info: ModelInfo, config: RewardModelConfig, observation_shape, key: str, path) -> None:
    """Refuse a saved model whose network differs from the one ``config`` makes, naming the key."""
    now = architecture(config)
    for name in ARCHITECTURE:
        if info.architecture.get(name) != now[name]:
            raise ConfigError(f"{key}: {path} was fitted with reward_model.{name}={info.architecture.get(name)}, "
                              f"this run has reward_model.{name}={now[name]}")
    if tuple(info.observation_shape) != tuple(observation_shape):
        raise ConfigError(f"{key}: {path} was fitted on observations of shape {list(info.observation_shape)}, "
                          f"this run's are {list(observation_shape)}")


def load(path: str | Path, like: EnsembleState, key: str = "reward_model.init_from") -> SavedModel:
    """The model saved at ``path``, leaf for leaf in the structure of ``like`` (a run's
    ensemble, or its ``jax.eval_shape``); a leaf missing or of another shape is an error naming it."""
    read_info(path, key)
    wanted = {}
    for name, part in zip(MODEL_FIELDS, SavedModel.of(like)):
        wanted.update(_leaves(part, name))
    with np.load(path, allow_pickle=False) as archive:
        found = {}
        for name, leaf in wanted.items():
            if name not in archive.files:
                raise ConfigError(f"{key}: {path} holds no {name}: it was saved from another reward model")
            value = archive[name]
            if value.shape != tuple(leaf.shape):
                raise ConfigError(f"{key}: {path} holds {name} of shape {list(value.shape)}, this run's is "
                                  f"{list(leaf.shape)}")
            found[name] = value.astype(leaf.dtype)
    parts = []
    for name, part in zip(MODEL_FIELDS, SavedModel.of(like)):
        paths = jax.tree_util.tree_leaves_with_path(part)
        treedef = jax.tree.structure(part)
        parts.append(jax.tree.unflatten(treedef, [found[name + jax.tree_util.keystr(p)] for p, _ in paths]))
    return SavedModel(*parts)
