"""The kinds of feedback a run learns from, one object each: preferences between pairs of
segments (:data:`PREFERENCES`; Christiano et al. 2017) and progress and regress marks inside
clips (:data:`IBT`; the IBT paper, DeepMind 2022).

A :class:`FeedbackKind` is everything that says what its kind of feedback is, outside the
reward learner's pure device functions (:class:`~rlhf_jax.reward.learner.RewardLearner`):

* its names: the config's ``reward`` that learns from it, and the ``name`` that the files
  keep (a label dataset's and a saved model's ``kind``, the label store's rows, the web
  page's address): ``compare`` or ``annotate``. Each string is turned into the object in one
  place: :func:`feedback_kind` (a config's ``reward``) and :func:`kind_named` (a file's, the
  store's or a page's);
* its config section (:meth:`~FeedbackKind.section`), the section that makes its model, and
  the keys and words its rules and messages name;
* its label dataset's schema (the arrays and columns of a row; :mod:`rlhf_jax.label_datasets`
  reads and writes any kind's by them) and its saved model's parts
  (:mod:`rlhf_jax.reward.saved_model`);
* how people's answers become the learner's typed answers (:meth:`~FeedbackKind.answers_from_people`),
  and how a run's answers are saved (:meth:`~FeedbackKind.save_answers`, ``labels.npz``).

Nothing here imports JAX: the label web app reads this module. What needs JAX, or a model's
module, imports it when called.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

MODEL_KEY = "reward_model.init_from"  # a model fitted offline, for either kind
# P[left segment preferred] for each answer on the compare page; "can't tell" is never trained on.
CHOICE_MU = {"left": 1.0, "right": 0.0, "tie": 0.5, "cant_tell": None}
# An episode to mark plays slowed down to last at least this long: at the environment's own
# pace it can be over before a person has seen it (50 CartPole steps at 50 fps: 1 s).
ANNOTATE_MIN_SECONDS = 10.0


class Preferences(NamedTuple):
    """Answers to ``Q`` pairs: ``mu`` = P[first preferred] (1, 0 or 0.5); unanswered rows are never stored."""

    mu: Any  # [Q] float32
    answered: Any  # [Q] bool


class Marks(NamedTuple):
    """Answers to ``Q`` clips: one mark per frame; rows not ``answered`` are never stored."""

    marks: Any  # [Q, T] int32 in {-1, 0, +1}
    answered: Any  # [Q] bool


def _of(cls, state):
    """The model's fields of a learner's reward state (or its ``jax.eval_shape``), by name."""
    missing = [name for name in cls._fields if not hasattr(state, name)]
    if missing:
        raise TypeError(f"a {type(state).__name__} is not the model of a {cls.__name__}: it has no "
                        f"{', '.join(missing)}")
    return cls(*(getattr(state, name) for name in cls._fields))


def _into(model, state):
    """``state`` with ``model``'s fields in place of its own (the rest, its optimiser's: kept fresh)."""
    import jax

    cast = jax.tree.map(lambda new, old: new.astype(old.dtype), model, _of(type(model), state))
    return state._replace(**cast._asdict())


class SavedModel(NamedTuple):
    """A preference reward ensemble's model without its optimiser: the fields of an
    :class:`~rlhf_jax.reward.ensemble.EnsembleState` that make the reward function, as arrays."""

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
    """An IBT utility without its optimiser: the fields of an :class:`~rlhf_jax.reward.ibt.IBTState`
    but ``opt_state``."""

    params: Any
    obs_mean: Any
    obs_std: Any
    reward_std: Any

    of = classmethod(_of)
    into = _into


class Column(NamedTuple):
    """One column of a label dataset: its Parquet type (an element type, nested in fixed-size
    lists of ``shape``), what the card says of it, and the :class:`~rlhf_jax.label_datasets.LabelRows`
    field it holds (``field[:, side]`` for one segment's; ``""``: none, it is written from
    something else)."""

    name: str
    dtype: str  # a NumPy dtype's name, or "string"
    shape: tuple[int, ...]  # per row; () for one value a row
    meaning: str
    field: str = ""
    side: int | None = None

    @property
    def type(self) -> str:
        """As the card shows it: ``float32 [75, 4]``."""
        return f"{self.dtype} {list(self.shape)}" if self.shape else self.dtype


class CardWords(NamedTuple):
    """What a label dataset's card (:mod:`rlhf_jax.label_datasets.card`) says of its kind."""

    title: str  # "<title> labels on <env>"
    tag: str
    what: str  # "<rows> labels: <what> <k>-step segments of <env>"
    done: str  # "..., <done> by <who>"
    made: str  # how the rows were made
    answers: str  # "a run starting from these <answers>"
    citation: str


class FeedbackKind:
    """One kind of feedback (module docstring). Kinds are compared by identity: there is one
    object per kind, :data:`PREFERENCES` and :data:`IBT`."""

    name: str  # what files, the label store and the web page's address call it
    reward: str  # the config's `reward` that learns from it
    section_name: str  # its config section
    model_section: str  # the config section that makes its model (and names its optimiser's state)
    answers_key: str  # the key naming a label dataset to start from
    budget_key: str  # the key of the answer budget
    length_key: str  # the key of the steps per clip
    # In words:
    model: str  # its reward model
    answers: str  # its answers, counted ("3 marked clips")
    learns_from: str  # what a run of it learns from ("an agent learned from ...")
    holds: str  # what a dataset of it holds ("not ...")
    judges: str  # what an answer does to segments ("... of 75 steps")
    batch_unit: str  # what a fitting step's batch is of
    page_title: str  # the web page's
    instruction: str  # the web page's, unless people.instruction says another
    card: CardWords
    # Its label dataset and saved model:
    segments: int  # clips a query shows, and a dataset row holds
    answer_fields: tuple[str, ...]  # the LabelRows fields of its answers, beside the frames; labels.npz's keys too
    npz_obs: str  # how labels.npz holds its observations, in words
    architecture: tuple[str, ...]  # the keys of its model section that make the network
    saved_model: type  # its model without the optimiser, as a file keeps it: SavedModel or SavedUtility
    # The synthetic labeler, as a dataset names it: `perfect` with its defaults, else
    # `noisy(key=value, ...)` with the settings of `labeler_key` that differ.
    perfect_labeler: str
    noisy_labeler: str
    labeler_key: str

    def __repr__(self) -> str:
        return f"<feedback {self.name}: reward={self.reward}>"

    # ------------------------------------------------------------------ config
    def section(self, config):
        """Its section of an :class:`~rlhf_jax.config.ExperimentConfig`: ``config.preferences`` or ``config.ibt``."""
        return getattr(config, self.section_name)

    def model_config(self, config):
        """The section of ``config`` that makes its model: ``config.reward_model`` or ``config.ibt``."""
        return getattr(config, self.model_section)

    def answers_path(self, config) -> str:
        """The label dataset a run of ``config`` starts from (:attr:`answers_key`; "": none)."""
        return getattr(self.section(config), self.answers_key.split(".")[1])

    def budget(self, config) -> int:
        """The answers a run of ``config`` asks for in all (:attr:`budget_key`)."""
        return getattr(self.section(config), self.budget_key.split(".")[1])

    def clip_length(self, config, spec) -> int:
        """Steps per clip of a run of ``config`` on an environment of ``spec`` (:attr:`length_key`)."""
        raise NotImplementedError

    def offline_settings(self, rows: int) -> dict:
        """Settings of its section for a fit offline (``rlhf-jax fit-reward``) to ``rows`` answers, all given."""
        return {}

    def fitted(self, config) -> str:
        """What ``rlhf-jax fit-reward`` fits, in words."""
        raise NotImplementedError

    def architecture_of(self, model_config) -> dict:
        """The :attr:`architecture` keys of ``model_config`` (its :attr:`model_section`), JSON-ready."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in ((name, getattr(model_config, name)) for name in self.architecture)}

    def untrained_model(self, key, config, spec):
        """An untrained model of a run of ``config`` (what the learner's ``reward_params`` are)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ label datasets
    @property
    def keeps_actions(self) -> bool:
        return "action" in self.answer_fields

    def answer_arrays(self, info) -> dict[str, tuple[tuple[int, ...], str]]:
        """The :class:`~rlhf_jax.label_datasets.LabelRows` fields of its answers that a dataset
        of ``info`` holds beside the frames, each as its ``(shape, dtype)``."""
        raise NotImplementedError

    def columns(self, info, frame_word: str) -> list[Column]:
        """The columns of a dataset of ``info`` that hold its segments and answers, in their order
        (:func:`rlhf_jax.label_datasets.columns` puts the label's and the environment's before
        them, who answered after)."""
        raise NotImplementedError

    def to_npz_obs(self, obs: np.ndarray) -> np.ndarray:
        """``obs [N, c, k, ...]`` as ``labels.npz`` keeps them: a single clip without its segment axis."""
        return obs if self.segments > 1 else obs[:, 0]

    def from_npz_obs(self, obs: np.ndarray) -> np.ndarray | None:
        """``labels.npz``'s observations as ``[N, c, k, ...]``; None if they are not of this kind's shape."""
        axis = self.segments > 1
        if obs.ndim < 3 + axis or (axis and obs.shape[1] != self.segments):
            return None
        return obs if axis else obs[:, None]

    def synthetic_labeler(self, config: dict) -> str:
        """The name a synthetic labeler gives its labels in a run of the nested config dict
        ``config``: ``oracle`` (the paper's perfect one), or ``teacher(...)`` / ``annotator(...)``
        with the settings that differ from the defaults."""
        from rlhf_jax.config_base import build

        section, key = self.labeler_key.split(".")
        settings = build(self._labeler_config(), config.get(section, {}).get(key, {}), self.labeler_key)
        changed = [f"{f.name}={getattr(settings, f.name)}" for f in dataclasses.fields(settings)
                   if getattr(settings, f.name) != f.default]
        return f"{self.noisy_labeler}({', '.join(changed)})" if changed else self.perfect_labeler

    def _labeler_config(self) -> type:
        raise NotImplementedError

    def answer_shapes(self, info):
        """The shapes and dtypes (``jax.ShapeDtypeStruct``) of :meth:`given_answers` of a dataset of ``info``."""
        raise NotImplementedError

    def given_answers(self, dataset, config, where: str):
        """A dataset's answers as a run of ``config`` starts from them (the learner's
        ``head_start``); ``where`` names the dataset in an error."""
        raise NotImplementedError

    # ------------------------------------------------------------------ people
    def clip_fps(self, frames: int, fps: float) -> float:
        """The frame rate of a query's clips of ``frames`` steps on an environment of ``fps``."""
        return fps

    def answer_of(self, choice: str, marks: Sequence[tuple[int, int]], frames: int):
        """``(mu, marks)`` of a :class:`~rlhf_jax.reward.people.Answer` from the label store's
        answer (``choice``, and ``marks`` as ``(step, sign)``) to a query of ``frames`` steps."""
        raise NotImplementedError

    def answer_details(self, marks: Sequence[tuple[int, int]]) -> dict:
        """What the web app's JSON shows of an answer beside its choice."""
        return {}

    def simulated_answer(self, oracle_reward: np.ndarray):
        """``(mu, marks)`` as a simulated person answers a query whose clips' oracle rewards are
        ``oracle_reward [c, k]`` (:class:`~rlhf_jax.reward.people.SimulatedPerson`)."""
        raise NotImplementedError

    def answers_from_people(self, answers: Sequence, size: int, clip_length: int):
        """People's answers (:class:`rlhf_jax.reward.people.Answer`), padded to ``size`` rows,
        as the learner's typed answers (what its ``oracle`` gives, and its ``store`` takes)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ a run's outputs
    def save_answers(self, state, path) -> None:
        """The answers a learner's ``state`` holds, with their clips, as a NumPy archive at
        ``path`` (a run's ``labels.npz``)."""
        raise NotImplementedError

    def unmeasured(self, row: dict) -> set[str]:
        """The losses a NaN in a chunk's metrics ``row`` leaves unmeasured rather than diverged."""
        raise NotImplementedError


class PreferenceFeedback(FeedbackKind):
    """Preferences between pairs of segments (Christiano et al. 2017)."""

    name = "compare"
    reward = section_name = "preferences"
    model_section = "reward_model"
    answers_key, budget_key, length_key = "preferences.labels_from", "preferences.labels", "preferences.segment_length"
    model, answers, learns_from = "a preference reward model", "labels", "preferences"
    holds, judges, batch_unit = "preferences between segments", "compares segments", "pairs"
    page_title = "Which clip is better?"
    instruction = (
        "Watch both clips. Choose the one in which the agent does better at its task; call it a tie "
        "when both do equally well, and 'can't tell' when you cannot judge (it will not be used).")
    card = CardWords(
        "Preference", "preference-learning", "preferences between pairs of", "answered",
        "Each segment was cut from the agent's recent play; the pairs were chosen as the run's queries "
        "(Christiano et al. 2017, section 2.2) and the answer is the probability that the left segment is "
        "the better one.", "labels",
        "Christiano, Leike, Brown, Martic, Legg and Amodei: Deep reinforcement learning from human "
        "preferences. NeurIPS 2017.")
    segments = 2
    answer_fields = ("action", "mu", "oracle_return")
    npz_obs = "pairs of segments [N, 2, k, ...]"
    # The reward_model keys that make the network (its shape or its function): a saved model
    # loads only into a run whose values are the same. The rest (learning rate, l2 adaptation,
    # dropout, the reward's scale) are how a model is fitted or read, free to differ.
    architecture = ("ensemble_size", "hidden", "leaky_relu_slope", "cnn_batch_norm", "reads_action")
    saved_model = SavedModel
    perfect_labeler, noisy_labeler, labeler_key = "oracle", "teacher", "preferences.teacher"

    def clip_length(self, config, spec) -> int:
        from rlhf_jax.reward.config import resolve

        return resolve(config.preferences, spec).segment_length

    def offline_settings(self, rows: int) -> dict:
        # Every label given before RL, all kept; no per-step oracle rewards to score against, only returns.
        return dict(initial_labels=-1, label_capacity=rows, score_pairs=0)

    def fitted(self, config) -> str:
        return f"{config.reward_model.ensemble_size} reward models"

    def untrained_model(self, key, config, spec):
        from rlhf_jax.reward.ensemble import init_ensemble

        return init_ensemble(key, config.reward_model, spec)

    def answer_arrays(self, info) -> dict[str, tuple[tuple[int, ...], str]]:
        n, c, k = info.rows, self.segments, info.segment_length
        arrays = dict(action=((n, c, k, *info.action_shape), info.action_dtype), mu=((n,), "float32"),
                      oracle_return=((n, c), "float32"))
        if info.members:
            arrays["holdout"] = ((n, info.members), "bool")
        return arrays

    def columns(self, info, frame_word: str) -> list[Column]:
        k, frames = info.segment_length, (info.frames_per_segment, *info.frame_shape)
        pair = []
        for side, name in ((0, "left"), (1, "right")):
            pair += [Column(f"frames_{side}", info.observation_dtype, frames,
                            f"segment {side}'s {frame_word}, oldest first (shown {name})", "frames", side),
                     Column(f"restart_{side}", "bool", (k,), f"step t of segment {side} does not continue step t-1's",
                            "restart", side)]
        pair += [Column(f"action_{side}", info.action_dtype, (k, *info.action_shape), f"segment {side}'s actions",
                        "action", side) for side in (0, 1)]
        answer = [Column("mu", "float32", (), "the answer: P[segment 0 preferred], 1.0, 0.0 or 0.5 (tie)", "mu"),
                  Column("choice", "string", (), "the same in words: left, right or tie")]
        answer += [Column(f"oracle_return_{side}", "float32", (), f"segment {side}'s summed true reward; null if "
                          f"unknown", "oracle_return", side) for side in (0, 1)]
        if info.members:
            answer.append(Column("holdout", "bool", (info.members,),
                                 "held out of reward-model member m's training, for its validation, in the source run",
                                 "holdout"))
        return pair + answer

    def _labeler_config(self) -> type:
        from rlhf_jax.reward.labelers import TeacherConfig

        return TeacherConfig

    def answer_shapes(self, info):
        import jax

        from rlhf_jax.reward.data import LabelledPairs

        shape, rows, k = jax.ShapeDtypeStruct, info.rows, info.segment_length
        return LabelledPairs(shape((rows, 2, info.frames_per_segment, *info.frame_shape), info.observation_dtype),
                             shape((rows, 2, k), bool), shape((rows, 2, k, *info.action_shape), info.action_dtype),
                             shape((rows,), np.float32), shape((rows, 2), np.float32))

    def given_answers(self, dataset, config, where: str):
        from rlhf_jax.errors import ConfigError
        from rlhf_jax.reward.data import LabelledPairs

        info, rows = dataset.info, dataset.rows
        if config.reward_model.loss == "target" and np.isnan(rows.oracle_return).any():
            raise ConfigError(f"{where} does not know the oracle's returns of every segment, which "
                              f"reward_model.loss=target regresses")
        return LabelledPairs(rows.frames.astype(info.observation_dtype), rows.restart.astype(bool),
                             rows.action.astype(info.action_dtype), rows.mu.astype(np.float32),
                             rows.oracle_return.astype(np.float32))

    def answer_of(self, choice: str, marks: Sequence[tuple[int, int]], frames: int):
        return CHOICE_MU[choice], None

    def simulated_answer(self, oracle_reward: np.ndarray):
        first, second = oracle_reward.sum(-1)
        return 1.0 if first > second else 0.0 if first < second else 0.5, None

    def answers_from_people(self, answers: Sequence, size: int, clip_length: int) -> Preferences:
        """"Can't tell" (``mu is None``) and padding are not answers."""
        mu = np.zeros(size, np.float32)
        answered = np.zeros(size, bool)
        for i, answer in enumerate(answers):
            answered[i] = answer.mu is not None
            mu[i] = answer.mu if answer.mu is not None else 0.0
        return Preferences(mu, answered)

    def save_answers(self, state, path) -> None:
        """The labels themselves (``state.labels``), with the segments they compare."""
        import jax

        from rlhf_jax.reward.data import observations_on_host

        obs = observations_on_host(state.labels)
        labels = jax.device_get(state.labels)
        n = int(labels.ring.size)
        np.savez_compressed(path, obs=obs[:n], action=labels.action[:n], mu=labels.mu[:n],
                            oracle_return=labels.oracle_return[:n], holdout=labels.holdout[:n])

    def unmeasured(self, row: dict) -> set[str]:
        """The validation loss until some member holds a label out, the training loss before the first label."""
        return {"reward_val_loss"} | ({"reward_train_loss"} if not row.get("labels") else set())


class IBTFeedback(FeedbackKind):
    """Progress and regress marks inside clips (the IBT paper, DeepMind 2022)."""

    name = "annotate"
    reward = section_name = model_section = "ibt"
    answers_key, budget_key, length_key = "ibt.marks_from", "ibt.episodes", "ibt.episode_length"
    model, answers, learns_from = "an IBT utility", "marked clips", "IBT marks"
    holds, judges, batch_unit = "IBT marks on clips", "marks clips", "clips"
    page_title = "Mark progress and regress"
    instruction = (
        "Play or scrub through the episode. Mark a moment of progress towards the task where it "
        "happens, and a moment of regress (a step away from it) likewise; then submit the episode, "
        "with no marks if nothing happened.")
    card = CardWords(
        "IBT", "inter-temporal-bradley-terry", "progress and regress marks on", "annotated",
        "Each clip was cut from the agent's recent play and marked step by step (the IBT paper, "
        "DeepMind 2022).", "marks",
        "DeepMind Interactive Agents Team: Improving multimodal interactive agents with "
        "reinforcement learning from human feedback. 2022.")
    segments = 1
    answer_fields = ("marks",)
    npz_obs = "clips [N, k, ...]"
    architecture = ("utility", "hidden", "lstm_size", "leaky_relu_slope")  # the ibt keys that make its network
    saved_model = SavedUtility
    perfect_labeler = noisy_labeler = "annotator"
    labeler_key = "ibt.annotator"

    def clip_length(self, config, spec) -> int:
        return config.ibt.episode_length

    def fitted(self, config) -> str:
        return "the IBT utility"

    def untrained_model(self, key, config, spec):
        from rlhf_jax.reward.ibt import init_ibt

        return init_ibt(key, config.ibt, spec)

    def answer_arrays(self, info) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"marks": ((info.rows, info.segment_length), "int32")}

    def columns(self, info, frame_word: str) -> list[Column]:
        k, frames = info.segment_length, (info.frames_per_segment, *info.frame_shape)
        return [
            Column("frames", info.observation_dtype, frames, f"the clip's {frame_word}, oldest first", "frames", 0),
            Column("restart", "bool", (k,), "step t's observation does not continue step t-1's (a new episode)",
                   "restart", 0),
            Column("marks", "int32", (k,), "+1 progress, -1 regress, 0 no mark, one per step", "marks"),
        ]

    def _labeler_config(self) -> type:
        from rlhf_jax.reward.annotators import AnnotatorConfig

        return AnnotatorConfig

    def answer_shapes(self, info):
        import jax

        from rlhf_jax.reward.data import MarkedClips

        shape, rows, k = jax.ShapeDtypeStruct, info.rows, info.segment_length
        return MarkedClips(shape((rows, k, *info.observation_shape), info.observation_dtype),
                           shape((rows, k), np.int32))

    def given_answers(self, dataset, config, where: str):
        """The annotated clips D keeps: whole observations, stacks rebuilt from the frames."""
        from rlhf_jax.reward.data import MarkedClips, stacks_on_host

        info, rows = dataset.info, dataset.rows
        obs = stacks_on_host(rows.frames, rows.restart, info.stack)[:, 0]
        return MarkedClips(obs.astype(info.observation_dtype), rows.marks.astype(np.int32))

    def clip_fps(self, frames: int, fps: float) -> float:
        """Slower than the environment's if the clip would otherwise last less than
        :data:`ANNOTATE_MIN_SECONDS`: a person must see the episode to mark it."""
        return min(fps, frames / ANNOTATE_MIN_SECONDS)

    def answer_of(self, choice: str, marks: Sequence[tuple[int, int]], frames: int):
        row = np.zeros(frames, np.int32)
        for step, sign in marks:
            row[step] = sign
        return None, row

    def answer_details(self, marks: Sequence[tuple[int, int]]) -> dict:
        return {"marks": [{"step": step, "sign": sign} for step, sign in marks]}

    def simulated_answer(self, oracle_reward: np.ndarray):
        """+1 / -1 on the frame after a reward above / below 0 (the annotator with ``signal=reward, threshold=0``)."""
        reward = oracle_reward[0, :-1]
        return None, np.concatenate([[0], np.sign(reward)]).astype(np.int32)

    def answers_from_people(self, answers: Sequence, size: int, clip_length: int) -> Marks:
        """A clip skipped without marks (``marks is None``) and padding are not answers."""
        marks = np.zeros((size, clip_length), np.int32)
        answered = np.zeros(size, bool)
        for i, answer in enumerate(answers):
            if answer.marks is not None:
                marks[i], answered[i] = answer.marks, True
        return Marks(marks, answered)

    def save_answers(self, state, path) -> None:
        """The annotated clips (``state.annotated``) and their marks."""
        import jax

        annotated = jax.device_get(state.annotated)
        n = int(annotated.ring.size)
        np.savez_compressed(path, obs=annotated.obs[:n], marks=annotated.marks[:n])

    def unmeasured(self, row: dict) -> set[str]:
        """Before the first annotated clip the fitting loss measures nothing."""
        return set() if row.get("labels") else {"reward_fit_loss"}


PREFERENCES = PreferenceFeedback()
IBT = IBTFeedback()
KINDS = (PREFERENCES, IBT)


def feedback_kind(reward: str) -> FeedbackKind | None:
    """The kind of feedback a config's ``reward`` learns from (None for ``env``, the
    environment's own reward): the one place a ``reward`` becomes a kind."""
    return next((kind for kind in KINDS if kind.reward == reward), None)


def kind_named(name: str) -> FeedbackKind:
    """The kind a file, the label store or the web page names (``compare`` or ``annotate``):
    the one place such a name becomes a kind. A :class:`ValueError` for another name."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"{name!r} names no kind of feedback: {' or '.join(kind.name for kind in KINDS)}")
