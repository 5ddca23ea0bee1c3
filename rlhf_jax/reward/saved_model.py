"""A reward model saved on its own, as one NumPy archive: what ``rlhf-jax fit-reward``
writes and what a run starts from with ``reward_model.init_from``.

Two kinds, as the feedback they were fitted to, each its kind of feedback's
:attr:`~rlhf_jax.reward.kinds.FeedbackKind.saved_model`: a preference reward ensemble
(:class:`SavedModel`: the parts of :class:`~rlhf_jax.reward.ensemble.EnsembleState` that make
the reward function: every member's parameters (and batch statistics), its l2 coefficient and
normalisation, and the inputs' standardisation) and an IBT utility (:class:`SavedUtility`:
the parts of :class:`~rlhf_jax.reward.ibt.IBTState`: the network's parameters, the inputs'
standardisation and the reward's scale). Each leaf is stored under its path
(``params['Dense_0']['kernel']``), beside ``info``: a JSON :class:`ModelInfo` saying what it
was fitted on, of which kind (the kind's ``name``). The optimiser's state is not kept: a run
starting from the model starts Adam afresh, as it does for an untrained one (Adam's state
does not depend on the values of the parameters it starts from).

A model loads into a run only if the run learns from its kind of feedback and its model has
the saved one's exact shape: the same architecture
(:attr:`~rlhf_jax.reward.kinds.FeedbackKind.architecture`: keys of ``reward_model`` or of
``ibt``) and observation and action spaces; anything else is a
:class:`~rlhf_jax.errors.ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.ensemble import EnsembleState, RewardModelConfig
from rlhf_jax.reward.ibt import IBTConfig, IBTState
from rlhf_jax.reward.kinds import IBT, MODEL_KEY, PREFERENCES, FeedbackKind, SavedModel, SavedUtility, kind_named

FORMAT = "rlhf_jax.reward_model"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a saved model was fitted on and how, stored beside its arrays."""

    env: dict  # the environment's config section (rlhf_jax.envs.options.EnvConfig, as written to config.yaml)
    observation_shape: tuple[int, ...]
    architecture: dict  # its kind's architecture keys (of reward_model or ibt) and their values
    labels: int  # labels (or marked clips) it was fitted to
    dataset: str  # where they came from
    steps: int  # fitting steps
    train_loss: float
    val_loss: float  # NaN where nothing was held out (IBT)
    # The feedback it was fitted to (its FeedbackKind's name); files before IBT's are all "compare".
    kind: str = PREFERENCES.name

    @property
    def feedback(self) -> FeedbackKind:
        """The kind of feedback it was fitted to."""
        return kind_named(self.kind)

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
        info = cls(**fields)
        try:
            info.feedback
        except ValueError:
            raise ConfigError(f"{where} holds a reward model of kind {info.kind!r}, which this rlhf_jax "
                              f"does not know") from None
        return info


def architecture(config: RewardModelConfig | IBTConfig) -> dict:
    """The architecture keys of ``config`` (``reward_model`` or ``ibt``), JSON-ready."""
    return (IBT if isinstance(config, IBTConfig) else PREFERENCES).architecture_of(config)


def _leaves(tree, prefix: str) -> dict[str, Any]:
    return {prefix + jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def save(path: str | Path, state: EnsembleState | IBTState, info: ModelInfo) -> None:
    """Write the model of ``state`` (a learner's reward state, of ``info.kind``) and ``info``
    to ``path`` (a ``.npz``)."""
    parts = info.feedback.saved_model
    model = jax.device_get(parts.of(state))
    arrays = {}
    for name, part in zip(parts._fields, model):
        arrays.update(_leaves(part, name))
    with open(path, "wb") as file:
        np.savez(file, info=np.array(info.to_json()), **{key: np.asarray(value) for key, value in arrays.items()})


def read_info(path: str | Path, key: str = MODEL_KEY) -> ModelInfo:
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


def check_fits(info: ModelInfo, kind: FeedbackKind, config: RewardModelConfig | IBTConfig, observation_shape,
               key: str, path) -> None:
    """Refuse a saved model of another kind than ``kind``, the run's, or whose network differs
    from the one ``config`` (the run's ``reward_model`` or ``ibt``, the kind's model section)
    makes, naming the key."""
    saved = info.feedback
    if saved is not kind:
        raise ConfigError(f"{key}: {path} is {saved.model}, fitted to {saved.answers}; this run has "
                          f"reward={kind.reward}, which starts from {kind.model}")
    now, default = kind.architecture_of(config), kind.architecture_of(type(config)())
    for name in kind.architecture:
        fitted = info.architecture.get(name, default[name])  # a key added after the file was written: its default
        if fitted != now[name]:
            raise ConfigError(f"{key}: {path} was fitted with {kind.model_section}.{name}="
                              f"{fitted}, this run has {kind.model_section}.{name}={now[name]}")
    if tuple(info.observation_shape) != tuple(observation_shape):
        raise ConfigError(f"{key}: {path} was fitted on observations of shape {list(info.observation_shape)}, "
                          f"this run's are {list(observation_shape)}")


def load(path: str | Path, like: EnsembleState | IBTState, kind: FeedbackKind,
         key: str = MODEL_KEY) -> SavedModel | SavedUtility:
    """The model saved at ``path``, leaf for leaf in the structure of ``like`` (a run's reward
    state of ``kind``, or its ``jax.eval_shape``); a leaf missing or of another shape is an error naming it."""
    read_info(path, key)
    parts = kind.saved_model
    like = parts.of(like)
    wanted = {}
    for name, part in zip(parts._fields, like):
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
    models = []
    for name, part in zip(parts._fields, like):
        paths = jax.tree_util.tree_leaves_with_path(part)
        treedef = jax.tree.structure(part)
        models.append(jax.tree.unflatten(treedef, [found[name + jax.tree_util.keystr(p)] for p, _ in paths]))
    return parts(*models)
