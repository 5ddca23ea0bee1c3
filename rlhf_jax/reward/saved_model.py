"""A reward model saved on its own, as one NumPy archive: what ``rlhf-jax fit-reward``
writes and what a run starts from with ``reward_model.init_from``.

Two kinds, as the feedback they were fitted to (:data:`MODELS`): a preference reward
ensemble (:class:`SavedModel`: the parts of :class:`~rlhf_jax.reward.ensemble.EnsembleState`
that make the reward function: every member's parameters (and batch statistics), its l2
coefficient and normalisation, and the inputs' standardisation) and an IBT utility
(:class:`SavedUtility`: the parts of :class:`~rlhf_jax.reward.ibt.IBTState`: the network's
parameters, the inputs' standardisation and the reward's scale). Each leaf is stored under
its path (``params['Dense_0']['kernel']``), beside ``info``: a JSON :class:`ModelInfo`
saying what it was fitted on, of which kind. The optimiser's state is not kept: a run
starting from the model starts Adam afresh, as it does for an untrained one (Adam's state
does not depend on the values of the parameters it starts from).

A model loads into a run only if the run learns from its kind of feedback and its model has
the saved one's exact shape: the same architecture (:attr:`ModelKind.architecture`: keys of
``reward_model`` or of ``ibt``) and observation and action spaces; anything else is a
:class:`~rlhf_jax.errors.ConfigError` naming the key.
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
from rlhf_jax.reward.ibt import IBTConfig, IBTState
from rlhf_jax.reward.learner import MODEL_KEY, feedback_of

FORMAT = "rlhf_jax.reward_model"
VERSION = 1
# The reward_model keys that make the network (its shape or its function): a saved model
# loads only into a run whose values are the same. The rest (learning rate, l2 adaptation,
# dropout, the reward's scale) are how a model is fitted or read, free to differ.
ARCHITECTURE = ("ensemble_size", "hidden", "leaky_relu_slope", "cnn_batch_norm")
# The same of an IBT utility: the ibt keys that make its network.
IBT_ARCHITECTURE = ("utility", "hidden", "lstm_size", "leaky_relu_slope")
# The fields of EnsembleState that are the model; opt_state and step are how it was fitted.
MODEL_FIELDS = ("params", "batch_stats", "l2", "norm_mean", "norm_std", "obs_mean", "obs_std")


def _of(cls, state):
    """The model's fields of a learner's reward state (or its ``jax.eval_shape``), by name."""
    return cls(*(getattr(state, name) for name in cls._fields))


def _into(model, state):
    """``state`` with ``model``'s fields in place of its own (the rest, its optimiser's: kept fresh)."""
    cast = jax.tree.map(lambda new, old: new.astype(old.dtype), model, _of(type(model), state))
    return state._replace(**cast._asdict())


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

    of = classmethod(_of)  # SavedModel.of(ensemble)
    into = _into  # model.into(ensemble): the ensemble with this model in place of its own


class SavedUtility(NamedTuple):
    """An IBT utility without its optimiser: the fields of an :class:`IBTState` but ``opt_state``."""

    params: Any
    obs_mean: Any
    obs_std: Any
    reward_std: Any

    of = classmethod(_of)
    into = _into


class ModelKind(NamedTuple):
    """What a saved model of one kind is made of, and which section of a run's config makes it."""

    kind: str  # the feedback's (rlhf_jax.reward.learner.Feedback.kind): "compare" or "annotate"
    section: str  # the config section of its architecture
    config: type  # that section's class
    architecture: tuple[str, ...]  # the section's keys that make the network
    parts: type  # SavedModel or SavedUtility
    state: type  # the learner's reward state it is cut from


MODELS = (ModelKind("compare", "reward_model", RewardModelConfig, ARCHITECTURE, SavedModel, EnsembleState),
          ModelKind("annotate", "ibt", IBTConfig, IBT_ARCHITECTURE, SavedUtility, IBTState))


def model_kind(kind: str | None = None, config=None, state=None) -> ModelKind:
    """The :class:`ModelKind` of a feedback ``kind``, of a config section (``reward_model``
    or ``ibt``), or of a learner's reward state (or its ``jax.eval_shape``)."""
    for model in MODELS:
        if kind == model.kind or isinstance(config, model.config) or isinstance(state, model.state):
            return model
    raise TypeError(f"no saved model of kind {kind!r}, config {type(config)} or state {type(state)}")


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a saved model was fitted on and how, stored beside its arrays."""

    env: dict  # the environment's config section (rlhf_jax.envs.options.EnvConfig, as written to config.yaml)
    observation_shape: tuple[int, ...]
    architecture: dict  # its ModelKind's architecture keys (of reward_model or ibt) and their values
    labels: int  # labels (or marked clips) it was fitted to
    dataset: str  # where they came from
    steps: int  # fitting steps
    train_loss: float
    val_loss: float  # NaN where nothing was held out (IBT)
    kind: str = "compare"  # the feedback it was fitted to (ModelKind.kind); files before IBT's are all "compare"

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
        if fields.get("kind", "compare") not in {model.kind for model in MODELS}:
            raise ConfigError(f"{where} holds a reward model of kind {fields['kind']!r}, which this rlhf_jax "
                              f"does not know")
        return cls(**fields)


def architecture(config: RewardModelConfig | IBTConfig) -> dict:
    """The architecture keys of ``config`` (``reward_model`` or ``ibt``), JSON-ready."""
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in ((name, getattr(config, name)) for name in model_kind(config=config).architecture)}


def _leaves(tree, prefix: str) -> dict[str, Any]:
    return {prefix + jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def save(path: str | Path, state: EnsembleState | IBTState, info: ModelInfo) -> None:
    """Write the model of ``state`` (a learner's reward state, of ``info.kind``) and ``info``
    to ``path`` (a ``.npz``)."""
    kind = model_kind(info.kind)
    assert isinstance(state, kind.state), f"a {type(state).__name__} saved as a model of kind {info.kind}"
    model = jax.device_get(kind.parts.of(state))
    arrays = {}
    for name, part in zip(kind.parts._fields, model):
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


def check_fits(info: ModelInfo, config: RewardModelConfig | IBTConfig, observation_shape, key: str, path) -> None:
    """Refuse a saved model of another kind than the one ``config`` (the run's ``reward_model``
    or ``ibt``) makes, or whose network differs from it, naming the key."""
    want = model_kind(config=config)
    if info.kind != want.kind:
        saved, run = feedback_of(info.kind), feedback_of(want.kind)
        raise ConfigError(f"{key}: {path} is {saved.model}, fitted to {saved.answers}; this run has "
                          f"reward={run.reward}, which starts from {run.model}")
    now = architecture(config)
    for name in want.architecture:
        if info.architecture.get(name) != now[name]:
            raise ConfigError(f"{key}: {path} was fitted with {want.section}.{name}={info.architecture.get(name)}, "
                              f"this run has {want.section}.{name}={now[name]}")
    if tuple(info.observation_shape) != tuple(observation_shape):
        raise ConfigError(f"{key}: {path} was fitted on observations of shape {list(info.observation_shape)}, "
                          f"this run's are {list(observation_shape)}")


def load(path: str | Path, like: EnsembleState | IBTState, key: str = MODEL_KEY) -> SavedModel | SavedUtility:
    """The model saved at ``path``, leaf for leaf in the structure of ``like`` (a run's reward
    state, or its ``jax.eval_shape``); a leaf missing or of another shape is an error naming it."""
    read_info(path, key)
    parts = model_kind(state=like).parts
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
