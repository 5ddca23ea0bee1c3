"""The kinds of feedback as objects (:mod:`rlhf_jax.reward.kinds`): every string that names a
kind (a config's ``reward``; a label dataset's, a ``labels.npz``'s, a saved model's or the label
store's ``kind``) becomes the one object of its kind, so what a file says it holds comes back
as the very object a run of that kind has; and people's answers become the typed answers the
learner's synthetic labeler gives, array for array."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_label_dataset_checks import hand_made

from rlhf_jax import label_datasets
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, build
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.reward import saved_model
from rlhf_jax.reward.config import PreferenceConfig
from rlhf_jax.reward.ensemble import RewardModelConfig
from rlhf_jax.reward.ibt import IBTConfig
from rlhf_jax.reward.ibt_learner import IBTLearner
from rlhf_jax.reward.kinds import IBT, KINDS, PREFERENCES, feedback_kind, kind_named
from rlhf_jax.reward.learner import Queries
from rlhf_jax.reward.people import Answer
from rlhf_jax.reward.preference_learner import PreferenceLearner

EACH = pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.reward)
K = 5  # steps per clip, as hand_made's


def config_of(kind) -> ExperimentConfig:
    return build(ExperimentConfig, {**DEFAULT_EXPERIMENT, "reward": kind.reward}, "")


def cartpole():
    return make(EnvConfig(id="gymnax/CartPole-v1", num_envs=1)).spec


def test_the_kinds_are_two_objects_each_named_once():
    assert KINDS == (PREFERENCES, IBT) and PREFERENCES is not IBT
    assert [kind.name for kind in KINDS] == ["compare", "annotate"]  # the names files and the store keep
    assert [kind.reward for kind in KINDS] == ["preferences", "ibt"]  # the config's
    assert feedback_kind("env") is None
    with pytest.raises(ValueError, match="'rate' names no kind of feedback: compare or annotate"):
        kind_named("rate")


@EACH
def test_a_config_names_its_kind_and_the_kind_its_sections(kind):
    config = config_of(kind)
    assert feedback_kind(config.reward) is kind and kind_named(kind.name) is kind
    assert kind.section(config) is getattr(config, kind.reward)  # config.preferences / config.ibt
    assert kind.model_config(config) is (config.reward_model if kind is PREFERENCES else config.ibt)
    assert kind.budget(config) == (config.preferences.labels if kind is PREFERENCES else config.ibt.episodes)
    assert kind.answers_path(config) == ""


@EACH
def test_the_kind_a_dataset_holds_comes_back_as_the_runs_kind(kind, tmp_path):
    """Written as a dataset directory and as a labels.npz, and read back: the kind the file
    names is the object of the config that learns from it."""
    dataset = hand_made(kind.name)
    assert dataset.info.feedback is kind
    directory = label_datasets.write(dataset, tmp_path / "dataset")
    npz = label_datasets.write_labels_npz(label_datasets.read(directory), tmp_path / "labels.npz")
    for info in (label_datasets.read_info(directory), label_datasets.load_labels(npz).info):
        assert info.kind == kind.name  # the file keeps the name, as before
        assert info.feedback is feedback_kind(config_of(kind).reward)
    assert [column.name for column in label_datasets.columns(dataset.info)
            if column.field in kind.answer_fields] == (["action_0", "action_1", "mu", "oracle_return_0",
                                                        "oracle_return_1"] if kind is PREFERENCES else ["marks"])


@EACH
def test_the_kind_a_saved_model_holds_comes_back_as_the_runs_kind(kind, tmp_path):
    config, spec = config_of(kind), cartpole()
    state = jax.eval_shape(lambda: kind.untrained_model(jax.random.PRNGKey(0), config, spec))
    state = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), state)
    info = saved_model.ModelInfo(env={**DEFAULT_EXPERIMENT["env"]}, observation_shape=(4,),
                                 architecture=kind.architecture_of(kind.model_config(config)), labels=1,
                                 dataset="", steps=1, train_loss=0.0, val_loss=0.0, kind=kind.name)
    saved_model.save(tmp_path / "model.npz", state, info)
    read = saved_model.read_info(tmp_path / "model.npz")
    assert read.kind == kind.name and read.feedback is feedback_kind(config.reward)
    saved_model.check_fits(read, kind, kind.model_config(config), (4,), "key", "path")
    other = IBT if kind is PREFERENCES else PREFERENCES
    with pytest.raises(ConfigError, match=f"is {kind.model}, fitted to {kind.answers}; this run has "
                                          f"reward={other.reward}, which starts from {other.model}"):
        saved_model.check_fits(read, other, other.model_config(config), (4,), "key", "path")
    model = saved_model.load(tmp_path / "model.npz", state, kind)
    assert type(model) is kind.saved_model


def test_a_model_file_of_no_known_kind_is_a_one_line_error(tmp_path):
    info = saved_model.ModelInfo(env={}, observation_shape=(4,), architecture={}, labels=1, dataset="", steps=1,
                                 train_loss=0.0, val_loss=0.0, kind="rate")
    with pytest.raises(ConfigError, match="holds a reward model of kind 'rate', which this rlhf_jax does not know"):
        saved_model.ModelInfo.from_json(info.to_json(), "model.npz")


@EACH
def test_the_kind_the_label_store_keeps_comes_back_as_the_object(kind, tmp_path):
    store = LabelStore(tmp_path / STORE_FILE)
    store.add_query(0, kind.name, [], "q0.npz", frames=K, fps=50.0)
    row = store.next_query(kind.name, "ann")
    assert kind_named(row.kind) is kind
    if kind is PREFERENCES:
        store.answer(0, "left", "ann")
    else:
        store.submit_marks(0, [(1, 1), (3, -1)], "ann")
    (answer,) = store.answers_not_in_checkpoint()
    assert kind_named(answer.kind) is kind
    mu, marks = kind.answer_of(answer.choice, answer.marks, row.frames)
    if kind is PREFERENCES:
        assert (mu, marks) == (1.0, None)
    else:
        assert mu is None and marks.tolist() == [0, 1, 0, -1, 0]


@EACH
def test_peoples_answers_become_the_answers_the_learners_labeler_gives(kind):
    """What answers_from_people makes of people's answers is what the learner's oracle gives
    (its store takes both): the same type, shapes and dtypes."""
    spec, queries = cartpole(), 3
    if kind is PREFERENCES:
        learner = PreferenceLearner(PreferenceConfig(labels=10, segment_length=K), RewardModelConfig(), spec)
        answers = [Answer(0, 1.0), Answer(1, None)]
    else:
        learner = IBTLearner(IBTConfig(episodes=10, episode_length=K), spec)
        answers = [Answer(0, None, np.int32([0, 1, 0, -1, 0])), Answer(1, None)]
    shape, clips = jax.ShapeDtypeStruct, (queries, kind.segments, K)
    shapes = Queries(shape((*clips, 4), jnp.float32), shape(clips, jnp.int32), shape(clips, jnp.float32))
    oracle = jax.eval_shape(learner.oracle, jax.random.PRNGKey(0), shapes)
    people = kind.answers_from_people(answers, queries, learner.clip_length)
    assert type(people) is type(oracle)
    assert [(x.shape, x.dtype) for x in people] == [(x.shape, x.dtype) for x in oracle]
    assert list(people.answered) == [True, False, False]  # "can't tell", no marks and padding are no answers
