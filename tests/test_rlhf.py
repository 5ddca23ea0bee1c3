"""The RLHF loop (rlhf_jax.loop): the built-in default learns CartPole from 500 synthetic
preferences, through the command line, and every ablation is one switch. The loop's
equivalences (whole run = host-driven chunks, Python fitting = compiled fitting) hold for
both reward learners: preferences and IBT. That a killed and resumed run of either learner ends
as the uninterrupted one is tests/test_resume.py's."""
import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax.cli import main
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, load_config
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.config import resolve
from rlhf_jax.reward.learner import fitting_blocks
from rlhf_jax.driver import Driver
from rlhf_jax.host_loop import summarize
from rlhf_jax.people_seam import attach_people
from small_runs import SMALL_LEARNERS, SMALL_RUN, trained


def experiment(overrides=()):
    return load_config(ExperimentConfig, None, list(overrides), default=DEFAULT_EXPERIMENT)


def adam_steps(opt_state) -> int:
    """The step count Adam keeps in an optimiser state (every member's, for an ensemble)."""
    counts = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
              if "count" in jax.tree_util.keystr(path)]
    return int(np.max(counts[0]))


def answers(state):
    """What a learner's answers are: the preference labels' mu, or IBT's marks."""
    held = state.learner
    return held.labels.mu if hasattr(held, "labels") else held.annotated.marks


@pytest.fixture(scope="module")
def small_driver():
    """Each learner's SMALL_RUN driver, made once per module: a driver's compiled chunks
    are its own, so the tests that share one trace and load them once."""
    made = {}

    def driver(learner):
        if learner not in made:  # not setdefault, whose default would build a driver every call
            made[learner] = Driver(experiment([*SMALL_RUN, *SMALL_LEARNERS[learner]]))
        return made[learner]

    return driver


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("rlhf") / "default")  # the README's main job


@pytest.mark.slow
def test_the_default_asks_its_500_labels_on_schedule(default_run):
    with open(default_run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    labels = [float(r["labels"]) for r in rows]
    assert labels == sorted(labels) and labels[-1] == 500  # the schedule spends the whole budget
    assert float(rows[0]["labels"]) > 125  # the untrained policy's 25%, then online labels


@pytest.mark.slow
def test_the_default_learns_from_500_labels_across_seeds(default_run, tmp_path):
    """The default's learning target, as a rate: of seeds 0-2 (seed 0 the run above, seeds 1-2 one sweep),
    at least two end with a last-chunk true return of 400 or more; the untrained policy scores
    about 20. Over seeds 0-15 about one run in eight stalls near 120 (docs/reward/preferences.md),
    so two stalls of three fail about one processor in twenty-three (four seeds, at most one
    stall, one in thirteen). No single seed is asserted: a seed's fate follows the processor,
    the compiler's flags and the number of members vmapped beside it (XLA's CPU code rounds
    differently in each). Seed 0 ended at 500 on an AVX2 host under the suite's flags and XLA's
    defaults, and on an AVX-512 host at 500 under XLA's defaults but 130 under the suite's
    flags (2026-12-01), where seeds 1-2 as a two-member sweep ended at 500 / 500 (72 s, against
    91 s for seeds 1-3). Seed 0 reaches 500 with or without the paper's entropy bonus, so it
    does not guard the bonus."""
    assert main(["sweep", "seed=1", "--seeds", "2", "--dir", str(tmp_path / "sweep"), "run.tensorboard=false"]) == 0
    with open(tmp_path / "sweep" / "members.csv") as f:
        rows = list(csv.DictReader(f))
    last = max(int(row["chunk"]) for row in rows)
    finals = {int(row["seed"]): float(row["episode_return"]) for row in rows if int(row["chunk"]) == last}
    with open(default_run / "metrics.csv") as f:
        finals[0] = float(list(csv.DictReader(f))[-1]["episode_return"])
    assert sorted(finals) == [0, 1, 2] and sum(r >= 400 for r in finals.values()) >= 2, finals


def test_the_run_keeps_its_labels_and_reward_metrics(default_run):
    for name in ("config.yaml", "metrics.csv", "learning_curve.png", "labels.npz"):
        assert (default_run / name).is_file(), name
    saved = np.load(default_run / "labels.npz")
    assert saved["mu"].shape == (500,)
    assert set(np.unique(saved["mu"])) <= {0.0, 0.5, 1.0}
    # The oracle prefers the segment with the larger oracle return, ties when equal.
    first, second = saved["oracle_return"][:, 0], saved["oracle_return"][:, 1]
    expected = np.where(first > second, 1.0, np.where(first < second, 0.0, 0.5))
    np.testing.assert_array_equal(saved["mu"], expected)
    assert saved["obs"].shape == (500, 2, 75, 4)  # 1.5 s of CartPole at 50 fps
    with open(default_run / "metrics.csv") as f:
        accuracy = np.array([float(row["reward_accuracy"]) for row in csv.DictReader(f)])
    # On fresh oracle pairs that are not ties (NaN: every pair tied, nothing to score).
    assert np.nanmean(accuracy) >= 0.8


@pytest.mark.parametrize("overrides, check", [
    (["preferences.selection=random"], lambda t: t.prefs.selection == "random"),
    (["reward_model.ensemble_size=1"], lambda t: t.prefs.selection == "random"),
    (["preferences.online=false"], lambda t: t.settings.initial_labels == 500 and t.budget.due(10**6, 10**7) == 500),
    (["reward_model.adapt_l2=false"], lambda t: not t.model.adapt_l2),
    (["preferences.segment_length=1"], lambda t: t.settings.segment_length == 1),
    (["reward_model.loss=target"], lambda t: t.model.loss == "target"),
])
def test_each_ablation_is_one_switch(overrides, check):
    assert check(Driver(experiment(overrides)).learner)


def test_paper_defaults_resolve_by_domain():
    cartpole = resolve(experiment().preferences, experiment().env and _spec("gymnax/CartPole-v1"))
    assert (cartpole.initial_labels, cartpole.segment_length, cartpole.label_decay_steps) == (125, 75, 2_000_000)
    atari = resolve(load_config(ExperimentConfig, None, []).preferences, _spec("envpool/Pong-v5"))
    assert (atari.labels, atari.initial_labels, atari.segment_length, atari.label_capacity, atari.pretrain_epochs) == (
        5_500, 500, 25, 3_000, 200)


def _spec(env_id):
    from rlhf_jax.envs import EnvConfig, make

    return make(EnvConfig(id=env_id, num_envs=1)).spec


def test_bad_preference_settings_are_refused():
    with pytest.raises(ConfigError, match="initial_labels"):
        experiment(["preferences.labels=10", "preferences.initial_labels=20"])
    with pytest.raises(ConfigError, match="reward"):
        experiment(["reward=people"])


@pytest.mark.slow
def test_people_answer_at_their_own_pace_and_cant_tell_is_never_stored():
    import time

    from rlhf_jax.reward.people import SimulatedPerson

    config = experiment(["a2c.total_env_steps=4096", "run.chunk_env_steps=1024", *SMALL_LEARNERS["preferences"]])
    person = SimulatedPerson(delay=0.2, cant_tell=3)
    driver = Driver(config)
    attach_people(driver, person)
    state = driver.init(jax.random.PRNGKey(0))
    assert int(state.learner.labels.ring.size) == 0  # people answer the initial queries too
    state = driver.people.prepare(state, 0)  # asks the untrained policy's 25%, waits for the answers
    assert int(state.asked) == 10 and int(state.learner.labels.ring.size) == 10 - 3  # answers 3, 6, 9: can't tell
    initial = int(state.learner.labels.ring.size)
    state, metrics, learned = driver.run_chunk(state, 0)
    assert int(state.asked) > 10 and int(state.learner.labels.ring.size) == initial  # none answered yet: training went on
    time.sleep(1.0)
    for chunk in range(1, driver.num_chunks):
        state, metrics, learned = driver.run_chunk(state, chunk)
    time.sleep(1.0)
    state = driver.people.exchange(state, 0)
    assert int(state.asked) == 40 and not driver.people.host.pending  # the whole budget, all answered
    stored = int(state.learner.labels.ring.size)
    assert stored == 40 - 40 // 3  # every third answer was "can't tell"
    labels = jax.device_get(state.learner.labels)
    first, second = labels.oracle_return[:stored].T
    np.testing.assert_array_equal(labels.mu[:stored],
                                  np.where(first > second, 1.0, np.where(first < second, 0.0, 0.5)))


@pytest.mark.slow
@pytest.mark.parametrize("learner", sorted(SMALL_LEARNERS))
def test_the_whole_run_as_one_function_equals_the_host_driven_chunks(learner, small_driver):
    """``make_train`` (what vmapped sweeps and benchmarks run) computes what ``rlhf-jax train`` does,
    including a last, shorter chunk (5 chunks of 1024 steps, then 512), for either learner."""
    driver = small_driver(learner)
    loop = driver.loop
    assert driver.num_chunks == loop.num_chunks == 6 and driver.loop.chunk_length(5) == 2
    key = jax.random.PRNGKey(3)
    whole, metrics, learned = jax.jit(loop.make_train().whole)(key)
    state = driver.init(key)
    for chunk in range(driver.num_chunks):
        state, _, _ = driver.run_chunk(state, chunk)
    assert int(whole.asked) == int(state.asked) == 40
    np.testing.assert_array_equal(learned["labels"], np.cumsum([10, *loop.wanted])[1:])
    assert metrics["episodes"].shape == (driver.loop.total_iterations,)
    for a, b in zip(jax.tree.leaves(whole.runner.params), jax.tree.leaves(state.runner.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(answers(whole), answers(state))


@pytest.mark.slow
@pytest.mark.parametrize("learner", sorted(SMALL_LEARNERS))
def test_seeds_vmapped_as_a_sweep_runs_them_equal_each_run_alone(learner, small_driver):
    """What ``rlhf-jax sweep`` compiles for a group (``Loop.chunk`` vmapped over stacked
    states) computes each seed's run as ``rlhf-jax train`` drives it alone (its first three chunks)."""
    driver = small_driver(learner)
    chunks = range(3)
    keys = [jax.random.PRNGKey(seed) for seed in (0, 1)]
    alone = []
    for key in keys:
        state = driver.init(key)
        for chunk in chunks:
            state, _, _ = driver.run_chunk(state, chunk)
        alone.append(state)
    together = jax.tree.map(lambda *xs: jnp.stack(xs), *[driver.init(key) for key in keys])
    for chunk in chunks:
        length, wanted = driver.loop.chunk_length(chunk), driver.loop.wanted[chunk]
        chunk_fn = jax.vmap(lambda s, w: driver.loop.chunk(s, length, w), in_axes=(0, None))
        together, _, _ = jax.jit(chunk_fn)(together, jnp.int32(wanted))
    for seed, state in enumerate(alone):
        member = jax.tree.map(lambda x: x[seed], together)
        assert int(member.asked) == int(state.asked)
        np.testing.assert_array_equal(answers(member), answers(state))
        for a, b in zip(jax.tree.leaves(member.runner.params), jax.tree.leaves(state.runner.params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("learner", sorted(SMALL_LEARNERS))
def test_fitting_from_python_equals_the_compiled_loop(learner):
    """``run.loop=python`` (CNNs on a CPU) dispatches each fitting step, pretraining included, on its own."""
    small = ["a2c.total_env_steps=2048", "run.chunk_env_steps=1024", *SMALL_LEARNERS[learner],
             "preferences.labels=20", "preferences.pretrain_epochs=30", "preferences.fit_pairs_per_env_step=0.1",
             "ibt.episodes=20", "ibt.pretrain_epochs=30", "ibt.batch_episodes=64", "ibt.fit_episodes_per_env_step=0.125"]
    ends = []
    for loop in ("scan", "python"):
        driver = Driver(experiment([*small, f"run.loop={loop}"]))
        assert driver.compiled.dispatch == loop and driver.learner.pretrain_steps == 3
        state = driver.init(jax.random.PRNGKey(5))
        for chunk in range(driver.num_chunks):
            state, metrics, learned = driver.run_chunk(state, chunk)
        ends.append(state)
    scan, python = ends
    assert int(driver.learner.answers_held(python.learner)) == int(driver.learner.answers_held(scan.learner)) == 20
    model = lambda state: driver.learner.reward_params(state.learner)
    assert driver.loop.fit_steps == 2
    steps = 3 + 2 * 2  # pretraining, then 2 per chunk
    assert adam_steps(model(python).opt_state) == adam_steps(model(scan).opt_state) == steps
    # Compiled differently, the two differ by rounding, which Adam magnifies where it divides a
    # near-zero gradient by its own size. The preference loss cannot see the output layer's bias
    # (it adds the same to both clips' sums), so its gradient is nearly zero, rounding decides its
    # sign, and each of the 7 Adam steps may move the bias by up to lr (3e-4) either way; every other
    # weight agrees closely.
    lr = driver.config.reward_model.learning_rate
    theirs = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(model(python).params)}
    for path, a in jax.tree_util.tree_leaves_with_path(model(scan).params):
        name = jax.tree_util.keystr(path)
        free = learner == "preferences" and name == "['Dense_2']['bias']"
        np.testing.assert_allclose(a, theirs[name], rtol=1e-3, atol=2 * steps * lr if free else 2e-4, err_msg=name)


def test_asking_alone_works_under_either_dispatch():
    """``CompiledLoop.ask`` is compiled under ``run.loop=scan`` (an accelerator's default) as
    under ``python``: a benchmark fills the label ring with it alone. The same key asks the
    same queries either way, and ``wanted`` of the ``num`` proposed are answered."""
    held = {}
    for loop in ("scan", "python"):
        driver = Driver(experiment([*SMALL_RUN, *SMALL_LEARNERS["preferences"], f"run.loop={loop}"]))
        state = driver.compiled.start(jax.random.PRNGKey(3))
        before = int(driver.learner.answers_held(state.learner))
        state = driver.compiled.ask(state, 3, 5)
        assert int(state.asked) == 3 and int(driver.learner.answers_held(state.learner)) == before + 3, loop
        held[loop] = state.learner.labels
    for a, b in zip(jax.tree.leaves(held["scan"]), jax.tree.leaves(held["python"])):
        np.testing.assert_array_equal(a, b)


def test_a_fit_is_cut_into_blocks_of_about_so_many_steps():
    assert fitting_blocks(187, 50) == ((47, 3), (46, 1))  # 187 / 50 rounds to 4 blocks
    assert fitting_blocks(40, 10) == ((10, 4),)
    assert fitting_blocks(24, 50) == ((24, 1),)  # fewer than one block's steps: one block
    assert fitting_blocks(100, 0) == ((100, 1),)  # a learner whose refresh adapts nothing
    assert fitting_blocks(0, 50) == ()


@pytest.mark.slow
def test_l2_adapts_every_so_many_fitting_steps_however_the_fit_is_called():
    """Section 2.2.3's adaptive l2 moves at a rate per fitting step, not per chunk: with
    ``reward_model.l2_adapt_every=10``, 40 fitting steps adapt it 4 times, whether in one call or
    in two of 20, compiled or from Python. ``l2_high`` is set so low that every member is
    overfitting by it, so each adaptation multiplies its l2 by 1.1."""
    small = [*SMALL_RUN, *SMALL_LEARNERS["preferences"], "reward_model.l2_adapt_every=10",
             "reward_model.l2_low=0.0001", "reward_model.l2_high=0.001"]
    copy = lambda state: jax.tree.map(jnp.copy, state)
    for loop in ("scan", "python"):
        driver = Driver(experiment([*small, f"run.loop={loop}"]))
        state = driver.init(jax.random.PRNGKey(0))
        start = np.asarray(state.learner.ensemble.l2)
        once, metrics = driver.compiled.fit_and_refresh(copy(state), 40)
        twice, _ = driver.compiled.fit_and_refresh(driver.compiled.fit_and_refresh(copy(state), 20)[0], 20)
        np.testing.assert_allclose(once.learner.ensemble.l2, start * 1.1 ** 4, rtol=1e-5, err_msg=loop)
        np.testing.assert_allclose(twice.learner.ensemble.l2, start * 1.1 ** 4, rtol=1e-5, err_msg=loop)
        assert np.isfinite(metrics["reward_fit_loss"]) and float(metrics["reward_l2"]) == pytest.approx(
            start.mean() * 1.1 ** 4, rel=1e-5)


@pytest.mark.slow
def test_scoring_the_reward_model_is_monitoring_only(small_driver):
    """``preferences.score_pairs`` sets how many fresh pairs score r̂ against the oracle; 0
    scores none (NaN in the curves) and the run is otherwise the same, bit for bit (two chunks)."""
    ends = {}
    for pairs in (0, 256):  # 256, the default, is the other tests' run
        driver = (small_driver("preferences") if pairs == 256 else
                    Driver(experiment([*SMALL_RUN, *SMALL_LEARNERS["preferences"], f"preferences.score_pairs={pairs}"])))
        state = driver.init(jax.random.PRNGKey(1))
        for chunk in range(2):
            state, metrics, learned = driver.run_chunk(state, chunk)
        ends[pairs] = state, summarize(metrics, learned)
    (none, unscored), (some, scored) = ends[0], ends[256]
    assert np.isnan(unscored["reward_accuracy"]) and np.isnan(unscored["reward_correlation"])
    assert np.isfinite(scored["reward_correlation"])
    for a, b in zip(jax.tree.leaves((none.runner.params, none.learner)), jax.tree.leaves((some.runner.params, some.learner))):
        np.testing.assert_array_equal(a, b)
