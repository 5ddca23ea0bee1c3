"""What a run may start from besides an untrained reward model and no answers:

* ``preferences.labels_from`` (``reward: preferences``) or ``ibt.marks_from`` (``reward: ibt``):
  the answers of a label dataset of the run's kind (:mod:`rlhf_jax.label_datasets`;
  or a finished run's directory, or a ``labels.npz``), put in the label database (IBT: the
  annotated clips D) before the first query. They count against the budget
  (``preferences.labels``, ``ibt.episodes``): the labeler, synthetic or people, is asked only
  for the rest (:class:`~rlhf_jax.reward.learner.Budget`). Christiano et al. reused one set
  of labels across seeds in their ablations ("no online queries"); this is how.
* ``reward_model.init_from``: a reward model saved by ``rlhf-jax fit-reward``
  (:mod:`rlhf_jax.reward.saved_model`) in place of the untrained one: a preference reward
  model for ``reward: preferences``, an IBT utility for ``reward: ibt``.

What differs between the two kinds (the keys and their words, the dataset's answers, the
model) is the :class:`~rlhf_jax.reward.kinds.FeedbackKind` of the run's ``reward``; every rule
below holds for both. :class:`HeadStartFiles` checks both files against the run when the run
is built, so a wrong file stops it before anything is written, with a one-line error naming
the key; it reads them when the run starts (:meth:`HeadStartFiles.arrays`), and not for a
resumed run, whose checkpoint holds them already.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.config import ExperimentConfig
from rlhf_jax.config_base import build
from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.envs.options import EnvConfig, task_mismatch
from rlhf_jax.errors import ConfigError
from rlhf_jax.replay import frame_stack
from rlhf_jax.reward import saved_model
from rlhf_jax.reward.data import action_shape_dtype
from rlhf_jax.reward.kinds import MODEL_KEY, feedback_kind
from rlhf_jax.reward.learner import HeadStart


class HeadStartFiles:
    """A run's dataset (``preferences.labels_from`` or ``ibt.marks_from``) and ``reward_model.init_from``,
    checked (module docstring)."""

    def __init__(self, config: ExperimentConfig, spec: EnvSpec, dataset_named: str = ""):
        self.config, self.spec = config, spec
        self.kind = feedback_kind(config.reward)
        self.labels_key = self.kind.answers_key
        self.labels_path, self.model_path = self.kind.answers_path(config), config.reward_model.init_from
        # How messages name the dataset: by the key that gave it, or as a command that was given
        # the dataset itself names it (``dataset_named``: fit-reward's DATASET_DIR, no key typed).
        self.labels_where = dataset_named or f"{self.labels_key}: {self.labels_path}"
        self._labels_prefix = "" if dataset_named else f"{self.labels_key}: "
        self.preloaded = 0  # answers the dataset gives
        self._info = None  # the dataset's DatasetInfo
        self._labels = None  # its LabelDataset, where reading the info read them too
        self._given: HeadStart | None = None
        if self.labels_path:
            from rlhf_jax import label_datasets  # Parquet's pyarrow: only for a run that reads labels

            try:
                self._info, self._labels = label_datasets.labels_info(self.labels_path)
            except ConfigError as error:
                raise ConfigError(f"{self._labels_prefix}{error}") from None
            self._check_labels(self._info)
            self.preloaded = self._info.rows
        if self.model_path:
            self._check_model(saved_model.read_info(self.model_path, MODEL_KEY))

    def _check_labels(self, info) -> None:
        where, spec, kind = self.labels_where, self.spec, self.kind
        if info.feedback is not kind:
            raise ConfigError(f"{where} holds {info.feedback.learns_from}, not {kind.holds}")
        mismatch = task_mismatch(info.env, self.config.env)
        if mismatch:
            raise ConfigError(f"{where} was labelled on another environment than this run's: {mismatch}")
        length, budget = kind.clip_length(self.config, spec), kind.budget(self.config)
        if info.segment_length != length:
            raise ConfigError(f"{where} {kind.judges} of {info.segment_length} steps, this run's {kind.length_key} "
                              f"makes {length}: set it to {info.segment_length}")
        if (info.observation_shape, info.observation_dtype, info.stack) != (
                tuple(spec.observation_shape), str(np.dtype(spec.observation_dtype)), frame_stack(spec)):
            raise ConfigError(f"{where} holds observations {info.observation_dtype} {list(info.observation_shape)}, "
                              f"this run's environment gives {np.dtype(spec.observation_dtype)} "
                              f"{list(spec.observation_shape)}")
        shape, dtype = action_shape_dtype(spec)
        if kind.keeps_actions and (info.action_shape, info.action_dtype) != (tuple(shape), str(np.dtype(dtype))):
            raise ConfigError(f"{where} holds actions {info.action_dtype} {list(info.action_shape)}, this run's "
                              f"are {np.dtype(dtype)} {list(shape)}")
        if info.rows > budget:
            raise ConfigError(f"{where} holds {info.rows} {kind.answers}, more than the run's budget "
                              f"{kind.budget_key}={budget}: raise the budget to at least {info.rows}")

    def _check_model(self, info: saved_model.ModelInfo) -> None:
        where = f"{MODEL_KEY}: {self.model_path}"
        saved_model.check_fits(info, self.kind, self.kind.model_config(self.config), self.spec.observation_shape,
                               MODEL_KEY, self.model_path)
        mismatch = task_mismatch(build(EnvConfig, info.env, "env"), self.config.env)
        if mismatch:
            raise ConfigError(f"{where} was fitted on another environment than this run's: {mismatch}")

    @property
    def empty(self) -> bool:
        return not (self.labels_path or self.model_path)

    def arrays(self, abstract: bool = False) -> HeadStart:
        """The run's :class:`HeadStart`, read once. ``abstract``: zeros of its shapes, for a
        run traced only for its state's shapes (restoring a checkpoint), where reading the
        files would be wasted."""
        if self.empty:
            return HeadStart()
        if abstract:
            return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), self._shapes())
        if self._given is None:
            self._given = self._read()
        return self._given

    def _like(self):
        """The shapes of this run's reward model, the learner's ``reward_params`` (nothing allocated)."""
        return jax.eval_shape(lambda: self.kind.untrained_model(jax.random.PRNGKey(0), self.config, self.spec))

    def _shapes(self) -> HeadStart:
        """The shapes and dtypes of :meth:`_read`'s arrays, from the files' descriptions alone."""
        answers = model = None
        if self.labels_path:
            answers = self.kind.answer_shapes(self._info)
        if self.model_path:
            model = self.kind.saved_model.of(self._like())
        return HeadStart(answers, model)

    def _read(self) -> HeadStart:
        answers = model = None
        if self.labels_path:
            from rlhf_jax import label_datasets

            try:
                dataset = self._labels or label_datasets.load_labels(self.labels_path)
                label_datasets.check_actions(dataset, self.spec.action_space, self.labels_path)
            except ConfigError as error:
                raise ConfigError(f"{self._labels_prefix}{error}") from None
            answers = self.kind.given_answers(dataset, self.config, self.labels_where)
            self._labels = None  # the arrays live on in the head start
        if self.model_path:
            model = saved_model.load(self.model_path, self._like(), self.kind, MODEL_KEY)
        return HeadStart(answers, model)
