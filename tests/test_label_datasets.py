"""Label datasets (rlhf_jax.label_datasets): a run's labels exported as Parquet with a
dataset card and imported back bit for bit, for a real CartPole run, a hand-made Atari label
database (stacked frames, each stored once) and hand-made IBT marks; `datasets` loads them; a
run started from a dataset asks its labeler only for the rest of its budget; a reward model
fitted offline (`rlhf-jax fit-reward`) starts a run; the same for IBT marks and the IBT
utility; every mistake is one line."""
import dataclasses
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing here needs the network

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, load_config
from rlhf_jax.config_base import dump_yaml
from rlhf_jax import label_datasets
from rlhf_jax.feedback.labeler import QUERIES_DIR
from rlhf_jax.feedback.store import STORE_FILE, LabelStore
from rlhf_jax.ops.ring import Ring, full_ring
from rlhf_jax.reward import saved_model
from rlhf_jax.reward.data import Labels, observations_on_host, stacks_on_host
from rlhf_jax.reward.ibt import IBTConfig
from rlhf_jax.reward.ibt_learner import Annotated, IBTLearnerState
from rlhf_jax.reward.kinds import IBT, PREFERENCES
from rlhf_jax.reward.preference_learner import PreferenceState
from rlhf_jax.driver import Driver

# A2C on CartPole from 40 synthetic preferences, tiny (4 chunks of 1024 env steps); the run
# started from its labels has a budget of 60, so the label database holds 60 in both.
SMALL = ["a2c.total_env_steps=4096", "run.chunk_env_steps=1024", "preferences.segment_capacity=64",
         "preferences.fit_pairs_per_env_step=0.01", "preferences.label_capacity=60", "run.tensorboard=false"]
SOURCE_LABELS, BUDGET = 40, 60
# IBT on CartPole: the hand-made run's 3 marked clips of 6 steps; a run from them has a budget of 8.
IBT_CLIPS, IBT_BUDGET = 3, 8
IBT_SMALL = ["reward=ibt", "ibt.episode_length=6", "ibt.episode_capacity=64", "ibt.batch_episodes=8"]


def experiment(overrides=()):
    return load_config(ExperimentConfig, None, [*SMALL, *overrides], default=DEFAULT_EXPERIMENT)


def error_line(capsys) -> str:
    """What the command printed: exactly one line, no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write_run(run_dir, config: dict) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_yaml(config))


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("labels") / "cartpole"
    assert main(["train", *SMALL, f"preferences.labels={SOURCE_LABELS}", f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def cartpole_dataset(cartpole_run):
    out = cartpole_run.parent / "cartpole-labels"
    assert main(["labels", "export", str(cartpole_run), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def atari_labels():
    """A hand-made label database of 3 Pong-shaped pairs of 5-step segments: random frames, and
    stacks that restart (a new episode) at steps 2 and 4 of the first segment of pair 1."""
    rows, k, stack = 3, 5, 4
    rng = np.random.default_rng(0)
    restart = np.zeros((rows, 2, k), bool)
    restart[1, 0, [2, 4]] = True
    restart[2, 1, 1] = True
    return Labels(
        frames=jnp.asarray(rng.integers(0, 256, (rows, 2, k + stack - 1, 84, 84), np.uint8)),
        restart=jnp.asarray(restart), action=jnp.asarray(rng.integers(0, 6, (rows, 2, k), np.int32)),
        mu=jnp.asarray([1.0, 0.5, 0.0], jnp.float32), oracle_return=jnp.asarray(rng.normal(size=(rows, 2)), jnp.float32),
        holdout=jnp.asarray(rng.random((rows, 3)) < 0.37), ring=full_ring(rows), stack=stack,
        history=stack - 1)


@pytest.fixture(scope="module")
def atari_run(atari_labels, tmp_path_factory):
    """A finished preference run on Pong (made by hand: no Atari run), its labels.npz written
    as a run writes it (PREFERENCES.save_answers)."""
    run_dir = tmp_path_factory.mktemp("labels") / "pong"
    write_run(run_dir, {"name": "pong", "agent": "a2c", "reward": "preferences", "env": {"id": "envpool/Pong-v5"}})
    PREFERENCES.save_answers(PreferenceState(None, atari_labels), run_dir / "labels.npz")
    return run_dir


@pytest.fixture(scope="module")
def ibt_run(tmp_path_factory):
    """A finished IBT run on CartPole (made by hand), its labels.npz written as a run writes it
    (IBT.save_answers)."""
    run_dir = tmp_path_factory.mktemp("labels") / "ibt"
    write_run(run_dir, {"name": "ibt", "agent": "a2c", "reward": "ibt", "env": {**DEFAULT_EXPERIMENT["env"]},
                        "ibt": {"episodes": 4, "episode_length": 6, "batch_episodes": 8}})
    rng = np.random.default_rng(1)
    annotated = Annotated(rng.normal(size=(4, 6, 4)).astype(np.float32), rng.integers(-1, 2, (4, 6), np.int32),
                          Ring(np.int32(3), np.int32(3)))  # the fourth row was never annotated: not saved
    IBT.save_answers(IBTLearnerState(None, annotated), run_dir / "labels.npz")
    return run_dir


@pytest.fixture(scope="module")
def ibt_dataset(ibt_run):
    out = ibt_run.parent / "ibt-marks"
    assert main(["labels", "export", str(ibt_run), str(out)]) == 0
    return out


# ---------------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.parametrize("run", ["cartpole_run", "atari_run", "ibt_run"])
def test_export_then_import_gives_the_labels_back_bit_for_bit(run, request, tmp_path):
    run_dir = request.getfixturevalue(run)
    dataset, npz = tmp_path / "dataset", tmp_path / "imported.npz"
    assert main(["labels", "export", str(run_dir), str(dataset)]) == 0
    assert main(["labels", "import", str(dataset), str(npz)]) == 0
    original, imported = np.load(run_dir / "labels.npz"), np.load(npz)
    assert set(original.files) < set(imported.files)  # the run's arrays, and who gave each label
    for key in original.files:  # observations, actions, answers or marks, oracle returns, held-out flags
        assert imported[key].dtype == original[key].dtype, key
        np.testing.assert_array_equal(imported[key], original[key], err_msg=key)
    # Importing it again into the run it came from would overwrite the run's own labels.
    assert main(["labels", "import", str(dataset), str(run_dir)]) == 2


def test_stacked_frames_are_stored_once_and_stacks_rebuilt(atari_run, atari_labels, tmp_path):
    """The Atari path: the dataset holds the label database's frames and restarts as they were,
    k + 3 frames a segment, not k stacks of 4; loaded, every stack comes back."""
    assert main(["labels", "export", str(atari_run), str(tmp_path / "pong")]) == 0
    dataset = label_datasets.read(tmp_path / "pong")
    assert dataset.info.stack == 4 and dataset.info.frame_shape == (84, 84)
    np.testing.assert_array_equal(dataset.rows.frames, np.asarray(atari_labels.frames))
    np.testing.assert_array_equal(dataset.rows.restart, np.asarray(atari_labels.restart))
    assert dataset.rows.frames[0, 0].shape == (5 + 3, 84, 84)
    stacks = stacks_on_host(dataset.rows.frames, dataset.rows.restart, 4)
    np.testing.assert_array_equal(stacks, observations_on_host(atari_labels))
    assert dataset.provenance.who == ("oracle",) * 3 and np.isnan(dataset.provenance.seconds).all()


def test_datasets_loads_the_parquet_with_the_documented_columns(cartpole_dataset, tmp_path):
    import datasets

    info = label_datasets.read_info(cartpole_dataset)
    loaded = datasets.load_dataset("parquet", data_files=str(cartpole_dataset / "data" / "*.parquet"),
                                   split="train", cache_dir=str(tmp_path / "cache"))
    assert loaded.column_names == [column.name for column in label_datasets.columns(info)]
    assert len(loaded) == info.rows == SOURCE_LABELS
    saved = np.load(cartpole_dataset.parent / "cartpole" / "labels.npz")
    rows = loaded.with_format("numpy")
    np.testing.assert_array_equal(rows["mu"], saved["mu"])
    np.testing.assert_array_equal(np.stack(rows["frames_1"]), saved["obs"][:, 1])  # CartPole: frames are observations
    assert set(loaded["choice"]) <= {"left", "right", "tie"} and set(loaded["who"]) == {"oracle"}
    assert loaded["env_id"][0] == "gymnax/CartPole-v1" and loaded["seconds"][0] is None
    # The second way the brief names: one file.
    one = datasets.Dataset.from_parquet(str(label_datasets.shard_files(cartpole_dataset)[0]),
                                        cache_dir=str(tmp_path / "cache"))
    assert one.num_rows == SOURCE_LABELS


def test_the_card_names_the_rows_and_every_column(cartpole_dataset):
    text = (cartpole_dataset / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["license"] and front["task_categories"] == ["reinforcement-learning"]
    assert front["size_categories"] == ["n<1K"]
    assert front["configs"][0]["data_files"][0]["path"] == "data/*.parquet"
    assert f"{SOURCE_LABELS} labels" in text
    for column in label_datasets.columns(label_datasets.read_info(cartpole_dataset)):
        assert f"| `{column.name}` |" in text, column.name


def test_who_answered_comes_from_the_label_store(tmp_path):
    """A people run's labels carry who answered each and how long it took: answers are matched
    to labels by their segments, in whatever order the label database holds them."""
    run_dir = tmp_path / "people"
    write_run(run_dir, {"reward": "preferences", "labeler": "people", "env": {"id": "gymnax/CartPole-v1"}})
    rng = np.random.default_rng(2)
    obs = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    action = rng.integers(0, 2, (3, 2, 3)).astype(np.int32)
    store = LabelStore(run_dir / STORE_FILE)
    (run_dir / QUERIES_DIR).mkdir()
    for query_id, (choice, who, seconds) in enumerate([("left", "ann", 2.5), ("cant_tell", "ann", 1.0),
                                                       ("right", "bob", 4.0)]):
        np.savez(run_dir / QUERIES_DIR / f"q{query_id}.npz", obs=obs[query_id], action=action[query_id],
                 oracle_reward=np.zeros((2, 3), np.float32))  # as the labeler saves a query
        store.add_query(query_id, "compare", [], f"q{query_id}.npz", frames=3, fps=50.0)
        store.answer(query_id, choice, who, seconds)
    # The label database: query 2 then query 0 ("can't tell" is never a label).
    np.savez(run_dir / "labels.npz", obs=obs[[2, 0]], action=action[[2, 0]], mu=np.float32([0.0, 1.0]),
             oracle_return=np.zeros((2, 2), np.float32), holdout=np.zeros((2, 3), bool))
    assert main(["labels", "export", str(run_dir), str(tmp_path / "dataset")]) == 0
    provenance = label_datasets.read(tmp_path / "dataset").provenance
    assert provenance.who == ("bob", "ann")
    np.testing.assert_array_equal(provenance.seconds, [4.0, 2.5])
    np.testing.assert_array_equal(provenance.query_id, [2, 0])
    assert "answered by 2 people" in (tmp_path / "dataset" / "README.md").read_text()


@pytest.mark.slow
def test_answers_after_a_people_runs_last_fit_are_exported_counted_and_trained_on_by_a_run_from_it(
        tmp_path, capsys, monkeypatch):
    """A people run's store held 8 answers, the run had trained on 4, and the export wrote 4 without
    a word. Every answer is exported; the export counts those the run never trained on, in a line,
    its metadata and its card; a run continued from the people run's labels starts from all 8."""
    import threading
    import time

    from rlhf_jax.feedback import clips

    monkeypatch.setattr(clips, "render_clip", lambda spec, obs, path, fps: path.write_bytes(b"clip"))
    run_dir = tmp_path / "people"
    overrides = ["a2c.total_env_steps=8192", "run.chunk_env_steps=4096", "preferences.labels=16",
                 "preferences.segment_capacity=32", "preferences.fit_pairs_per_env_step=0.01", "run.tensorboard=false"]
    answered = []

    def answer(choice: str) -> None:
        store = LabelStore(run_dir / STORE_FILE)
        query = store.next_query("compare", "ann")
        if query is not None:
            store.answer(query.id, choice, "ann", 2.0)
            answered.append(query.id)

    def answer_the_initial_queries():  # the run waits for these 4 (25% of 16) before RL starts
        while len(answered) < 4:
            if (run_dir / STORE_FILE).exists():
                answer("left")
            time.sleep(0.05)

    threading.Thread(target=answer_the_initial_queries, daemon=True).start()
    assert main(["train", "configs/rlhf_cartpole_people.yaml", f"run.dir={run_dir}", *overrides]) == 0
    for choice in ("right", "tie", "cant_tell", "left", "right"):  # after the run's last fit
        answer(choice)
    with np.load(run_dir / "labels.npz") as trained:
        assert len(trained["mu"]) == 4
    capsys.readouterr()

    assert main(["labels", "export", str(run_dir), str(tmp_path / "dataset")]) == 0
    out = capsys.readouterr().out
    said = "4 of the 8 labels arrived after the run's last fit (the last 4 rows): the run never trained on them"
    assert said in out, out
    dataset = label_datasets.read(tmp_path / "dataset")
    assert dataset.info.rows == 8 and dataset.info.after_last_fit == 4
    late = [query_id for query_id in answered[4:] if query_id != answered[6]]  # "can't tell" is no label
    assert list(dataset.provenance.query_id) == answered[:4] + late
    np.testing.assert_array_equal(dataset.rows.mu, [1, 1, 1, 1, 0, 0.5, 1, 0])
    assert said in (tmp_path / "dataset" / "README.md").read_text()

    continued = Driver(load_config(ExperimentConfig, "configs/rlhf_cartpole_people.yaml",
                                          [*overrides, "labeler=synthetic", f"preferences.labels_from={run_dir}"]))
    assert continued.learner.budget.preloaded == 8


def test_a_people_runs_atari_labels_are_matched_to_their_answers_without_the_frames_before_each_clip(tmp_path):
    """By default a run keeps each Atari clip's own frames and rebuilds its first stacks, which its
    queries hold as played: each label is still matched to its answer, and none counted as unseen."""
    rows, k = 2, 5
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (rows, 2, k + 3, 84, 84), np.uint8)  # 3 frames before each clip
    played = np.moveaxis(np.stack([frames[:, :, t:t + 4] for t in range(k)], axis=2), 3, -1)  # [rows, 2, k, 84, 84, 4]
    action = rng.integers(0, 6, (rows, 2, k)).astype(np.int32)
    run_dir = tmp_path / "pong"
    write_run(run_dir, {"name": "pong", "agent": "a2c", "reward": "preferences", "labeler": "people",
                        "env": {"id": "envpool/Pong-v5"}})
    store = LabelStore(run_dir / STORE_FILE)
    (run_dir / QUERIES_DIR).mkdir()
    for query_id, choice in enumerate(["left", "tie"]):
        np.savez(run_dir / QUERIES_DIR / f"q{query_id}.npz", obs=played[query_id], action=action[query_id],
                 oracle_reward=np.zeros((2, k), np.float32))
        store.add_query(query_id, "compare", [], f"q{query_id}.npz", frames=k, fps=15.0)
        store.answer(query_id, choice, "ann", 3.0)
    labels = Labels(frames=jnp.asarray(frames[:, :, 3:]), restart=jnp.zeros((rows, 2, k), bool),
                    action=jnp.asarray(action), mu=jnp.asarray([1.0, 0.5], jnp.float32),
                    oracle_return=jnp.zeros((rows, 2), jnp.float32), holdout=jnp.zeros((rows, 3), bool),
                    ring=full_ring(rows), stack=4, history=0)
    PREFERENCES.save_answers(PreferenceState(None, labels), run_dir / "labels.npz")
    dataset = label_datasets.from_run(run_dir)
    assert dataset.info.rows == rows and dataset.info.after_last_fit == 0
    assert dataset.provenance.who == ("ann", "ann") and list(dataset.provenance.query_id) == [0, 1]


@pytest.mark.slow
def test_a_run_from_a_dataset_asks_only_for_the_rest_of_its_budget(cartpole_dataset):
    driver = Driver(experiment([f"preferences.labels={BUDGET}",
                                         f"preferences.labels_from={cartpole_dataset}"]))
    assert driver.learner.budget.preloaded == SOURCE_LABELS
    assert driver.loop.due_after(-1) == 0  # 25% of 60 is 15, fewer than the 40 given: none asked before RL
    assert int(driver.loop.wanted.sum()) == BUDGET - SOURCE_LABELS
    state = driver.init(jax.random.PRNGKey(0))
    held = jax.device_get(state.learner.labels)
    assert int(state.asked) == 0 and int(held.ring.size) == SOURCE_LABELS
    given = label_datasets.read(cartpole_dataset).rows
    np.testing.assert_array_equal(held.frames[:SOURCE_LABELS], given.frames)
    np.testing.assert_array_equal(held.mu[:SOURCE_LABELS], given.mu)
    for chunk in range(driver.num_chunks):
        state, _, _ = driver.run_chunk(state, chunk)
    assert int(state.asked) == BUDGET - SOURCE_LABELS  # the oracle answered only the rest
    assert int(state.learner.labels.ring.size) == BUDGET


@pytest.mark.slow
def test_a_reward_model_fitted_offline_starts_a_run(cartpole_dataset, tmp_path, capsys):
    path = tmp_path / "reward.npz"
    assert main(["fit-reward", str(cartpole_dataset), "--steps", "3", "--out", str(path)]) == 0
    assert f"reward_model.init_from={path}" in capsys.readouterr().out
    info = saved_model.read_info(path)
    assert info.labels == SOURCE_LABELS and info.steps == 3
    # No initial labels: nothing is fitted before RL, so the run starts with the model as saved.
    driver = Driver(experiment([f"preferences.labels={SOURCE_LABELS}", "preferences.initial_labels=0",
                                         f"reward_model.init_from={path}"]))
    ensemble = driver.init(jax.random.PRNGKey(0)).learner.ensemble
    with np.load(path) as archive:  # the file as written, leaf by leaf under its path
        for name in ("params", "obs_mean", "obs_std", "l2"):
            for where, leaf in jax.tree_util.tree_leaves_with_path(getattr(ensemble, name)):
                key = name + jax.tree_util.keystr(where)
                np.testing.assert_array_equal(leaf, archive[key], err_msg=key)
    assert not np.array_equal(ensemble.obs_std, np.ones_like(ensemble.obs_std))  # CartPole's own, not a default


@pytest.mark.slow
def test_an_ibt_utility_fitted_offline_starts_an_ibt_run(ibt_dataset, tmp_path, capsys):
    """fit-reward on IBT marks fits the IBT utility with the IBT learner's own steps, and an IBT
    run starts from it: at step 0 its utility is the saved one."""
    path = tmp_path / "utility.npz"
    assert main(["fit-reward", str(ibt_dataset), "--steps", "2", "--out", str(path)]) == 0
    assert f"reward_model.init_from={path}" in capsys.readouterr().out
    info = saved_model.read_info(path)
    assert (info.kind, info.labels, info.steps) == ("annotate", IBT_CLIPS, 2)
    assert info.architecture == saved_model.architecture(IBTConfig(batch_episodes=8))
    # No initial marks: nothing is fitted before RL, so the run starts with the utility as saved.
    driver = Driver(experiment([*IBT_SMALL, "ibt.initial_episodes=0", f"reward_model.init_from={path}"]))
    model = driver.init(jax.random.PRNGKey(0)).learner.model
    with np.load(path) as archive:  # the file as written, leaf by leaf under its path
        for name in ("params", "obs_mean", "obs_std"):
            for where, leaf in jax.tree_util.tree_leaves_with_path(getattr(model, name)):
                key = name + jax.tree_util.keystr(where)
                np.testing.assert_array_equal(leaf, archive[key], err_msg=key)


@pytest.mark.slow
def test_an_ibt_run_from_marks_asks_only_for_the_rest_of_its_budget(ibt_dataset):
    driver = Driver(experiment([*IBT_SMALL, f"ibt.episodes={IBT_BUDGET}", f"ibt.marks_from={ibt_dataset}"]))
    assert driver.learner.budget.preloaded == IBT_CLIPS
    assert driver.loop.due_after(-1) == 0  # 25% of 8 is 2, fewer than the 3 given: none asked before RL
    assert int(driver.loop.wanted.sum()) == IBT_BUDGET - IBT_CLIPS
    state = driver.init(jax.random.PRNGKey(0))
    held = jax.device_get(state.learner.annotated)
    assert int(state.asked) == 0 and int(held.ring.size) == IBT_CLIPS
    given = np.load(ibt_dataset.parent / "ibt" / "labels.npz")
    np.testing.assert_array_equal(held.obs[:IBT_CLIPS], given["obs"])
    np.testing.assert_array_equal(held.marks[:IBT_CLIPS], given["marks"])
    for chunk in range(driver.num_chunks):
        state, _, _ = driver.run_chunk(state, chunk)
    assert int(state.asked) == IBT_BUDGET - IBT_CLIPS  # the annotator marked only the rest
    assert int(state.learner.annotated.ring.size) == IBT_BUDGET


@pytest.mark.parametrize("words, named", [
    (["labels", "export", "{tmp}/nowhere", "{tmp}/out"], "run directory '{tmp}/nowhere' does not exist"),
    (["labels", "export", "{tmp}", "{tmp}/out"], "{tmp} is not a run directory"),
    (["labels", "export", "{empty_run}", "{tmp}/out"], "{empty_run} has no labels.npz"),
    # It advised resuming the run, which never yields labels.
    (["labels", "export", "{env_run}", "{tmp}/out"],
     "{env_run} learned from the environment's reward (reward: env): it has no labels"),
    (["labels", "export", "{pong}", "{cartpole_dataset}"], "{cartpole_dataset} already exists and is not empty"),
    (["labels", "import", "{tmp}", "{tmp}/x.npz"], "{tmp} is not a label dataset"),
    (["labels", "import", "{cartpole_dataset}", "{pong}"], "env.id: gymnax/CartPole-v1 there, envpool/Pong-v5 here"),
    (["labels", "import", "{cartpole_dataset}", "{tmp}/no/x.npz"], "{tmp}/no does not exist"),
    (["fit-reward", "{tmp}/nowhere"], "{tmp}/nowhere does not exist"),
    # A run's directory where its exported labels belong: say how to make them.
    (["fit-reward", "{pong}"], "{pong} is a run directory, not a label dataset: rlhf-jax labels export {pong} OUT_DIR"),
    # fit-reward names the dataset as it was given, never a key the command line has not typed.
    (["fit-reward", "{ibt_dataset}", "ibt.episode_length=5"],
     "error: the dataset {ibt_dataset} marks clips of 6 steps, this run's ibt.episode_length makes 5: set it to 6"),
    (["fit-reward", "{cartpole_dataset}", "env.hidden_end=continue"],
     "error: the dataset {cartpole_dataset} was labelled on another environment than this run's: "
     "env.hidden_end: reset there, continue here"),
    (["train", *SMALL, "preferences.labels_from={tmp}/nowhere"], "preferences.labels_from: {tmp}/nowhere does not exist"),
    (["train", *SMALL, "preferences.labels_from={cartpole_dataset}", "env.hidden_end=continue"],
     "another environment than this run's: env.hidden_end: reset there, continue here"),
    (["train", *SMALL, "preferences.labels_from={cartpole_dataset}", "preferences.labels=30"],
     "holds 40 labels, more than the run's budget preferences.labels=30"),
    (["train", *SMALL, "preferences.labels_from={cartpole_dataset}", "preferences.segment_length=50"],
     "compares segments of 75 steps"),
    (["train", *SMALL, "reward=ibt", "preferences.labels_from={cartpole_dataset}"],
     "preferences.labels_from gives a preference reward model its start: it needs reward=preferences"),
    (["train", *SMALL, "reward_model.init_from={tmp}/x.npz"], "reward_model.init_from: {tmp}/x.npz does not exist"),
    (["train", *SMALL, "reward_model.init_from={cartpole_dataset}/README.md"], "is not a reward model saved by"),
    (["train", *SMALL, "reward_model.init_from={model}", "reward_model.hidden=[32]"],
     "was fitted with reward_model.hidden=[64, 64], this run has reward_model.hidden=[32]"),
    (["train", *SMALL, "reward_model.init_from={model}", "reward_model.reads_action=false"],
     "was fitted with reward_model.reads_action=True, this run has reward_model.reads_action=False"),
    # The wrong kind: a preference model or dataset for an IBT run, an IBT utility for a preference run.
    (["train", *SMALL, *IBT_SMALL, "reward_model.init_from={model}"],
     "reward_model.init_from: {model} is a preference reward model, fitted to labels; this run has reward=ibt, "
     "which starts from an IBT utility"),
    (["train", *SMALL, "reward_model.init_from={utility}"],
     "reward_model.init_from: {utility} is an IBT utility, fitted to marked clips; this run has "
     "reward=preferences, which starts from a preference reward model"),
    (["train", *SMALL, *IBT_SMALL, "ibt.marks_from={cartpole_dataset}"],
     "ibt.marks_from: {cartpole_dataset} holds preferences, not IBT marks on clips"),
    (["train", *SMALL, "preferences.labels_from={ibt_dataset}"],
     "preferences.labels_from: {ibt_dataset} holds IBT marks, not preferences between segments"),
    (["train", *SMALL, "ibt.marks_from={ibt_dataset}"],
     "ibt.marks_from gives an IBT utility its start: it needs reward=ibt, this config has reward=preferences"),
    (["train", *SMALL, *IBT_SMALL, "ibt.utility=lstm", "reward_model.init_from={utility}"],
     "was fitted with ibt.utility=mlp, this run has ibt.utility=lstm"),
    (["train", *SMALL, *IBT_SMALL, "ibt.episodes=2", "ibt.marks_from={ibt_dataset}"],
     "ibt.marks_from: {ibt_dataset} holds 3 marked clips, more than the run's budget ibt.episodes=2"),
])
def test_mistakes_are_one_line_errors_naming_the_path_or_key(words, named, cartpole_dataset, atari_run, ibt_dataset,
                                                             tmp_path, capsys):
    places = {"tmp": tmp_path, "cartpole_dataset": cartpole_dataset, "pong": atari_run,
              "empty_run": tmp_path / "run", "ibt_dataset": ibt_dataset, "model": tmp_path / "model.npz",
              "utility": tmp_path / "utility.npz", "env_run": tmp_path / "env_run"}
    write_run(tmp_path / "run", {"reward": "preferences"})
    write_run(tmp_path / "env_run", {"reward": "env"})
    if "{model}" in " ".join(words):  # a model's file as fit-reward writes it, without fitting one
        _fake_model(tmp_path / "model.npz")
    if "{utility}" in " ".join(words):
        _fake_model(tmp_path / "utility.npz", "annotate")
    words = [word.format(**places) for word in words]
    assert main(words) == 2
    line = error_line(capsys)
    assert named.format(**places) in line, line
    assert not (tmp_path / "out").exists()


def test_a_model_saved_before_an_architecture_key_existed_holds_that_keys_default(tmp_path):
    """A file written before ``reward_model.reads_action`` existed reads the action: it loads into
    a run that does, and is refused by one that does not."""
    from rlhf_jax.errors import ConfigError
    from rlhf_jax.reward.ensemble import RewardModelConfig

    _fake_model(tmp_path / "model.npz")
    info = saved_model.read_info(tmp_path / "model.npz")
    info = dataclasses.replace(info, architecture={k: v for k, v in info.architecture.items() if k != "reads_action"})
    check = lambda config: saved_model.check_fits(info, PREFERENCES, config, (4,), "reward_model.init_from", "m.npz")
    check(RewardModelConfig())
    with pytest.raises(ConfigError, match="fitted with reward_model.reads_action=True, this run has .*=False"):
        check(RewardModelConfig(reads_action=False))


def test_without_pyarrow_datasets_are_a_one_line_error(cartpole_run, tmp_path, capsys, monkeypatch):
    """Parquet needs the labels extra; training does not import it."""
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert main(["labels", "export", str(cartpole_run), str(tmp_path / "out")]) == 2
    assert "need pyarrow: pip install 'rlhf_jax[labels]'" in error_line(capsys)
    assert not (tmp_path / "out").exists()


def _fake_model(path, kind="compare"):
    """A saved model of the default reward model (kind "compare") or IBT utility ("annotate") on
    CartPole (untrained: what matters is its info)."""
    from rlhf_jax.envs import EnvConfig, make
    from rlhf_jax.reward.ensemble import init_ensemble
    from rlhf_jax.reward.ibt import init_ibt

    config = experiment()
    spec = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=1)).spec
    section = config.reward_model if kind == "compare" else config.ibt
    init = init_ensemble if kind == "compare" else init_ibt
    state = jax.eval_shape(lambda: init(jax.random.PRNGKey(0), section, spec))
    state = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), state)
    info = saved_model.ModelInfo(env={**DEFAULT_EXPERIMENT["env"]}, observation_shape=(4,),
                                 architecture=saved_model.architecture(section), labels=1, dataset="",
                                 steps=1, train_loss=0.0, val_loss=0.0, kind=kind)
    saved_model.save(path, state, info)
