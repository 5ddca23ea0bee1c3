"""``rlhf-jax sweep``: the grid, one vmapped program, the same runs on 4 devices, on two
processes, and after a SIGKILL (on this process's devices, and on 4 forced CPU devices)."""
import csv
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from compiling import ROOT, child_environment
from rlhf_jax.cli import main
from rlhf_jax.config import ExperimentConfig, apply_overrides, build, flat_keys, read_yaml, to_dict
from rlhf_jax.config_base import is_in_state
from rlhf_jax.errors import ConfigError
from rlhf_jax.statistics import interval_estimate
from rlhf_jax.config_base import split_sweep_words
from rlhf_jax.sweep import Sweep, make_groups, member_config, write_results
from rlhf_jax.driver import Driver
from rlhf_jax.trainer import train

# A2C on CartPole, 3 chunks of 2048 steps: the learning rate swept, 2 seeds each.
OVERRIDES = ["env.num_envs=8", "a2c.total_env_steps=6144", "run.chunk_env_steps=2048",
             "run.checkpoint_every_updates=1", "run.tensorboard=false"]
SWEPT = "a2c.learning_rate=0.003,0.001"


def base_config() -> dict:
    return apply_overrides(read_yaml(ROOT / "configs" / "a2c_cartpole.yaml"), OVERRIDES)


def load_state(directory: Path):
    """The newest checkpoint of a sweep group (or a run) as NumPy arrays on this process's one device."""
    manager = ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler())
    step = manager.latest_step()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          manager.item_metadata(step))
    return jax.device_get(manager.restore(step, args=ocp.args.StandardRestore(target)))


def run_cli(*words, devices: int | None = None, log: Path) -> subprocess.Popen:
    """``rlhf-jax WORDS`` in a process of its own on ``devices`` CPU devices (default: as many as
    this process has, so that its results can be compared bit for bit with this process's)."""
    devices = devices or jax.device_count()
    env = child_environment(f"--xla_force_host_platform_device_count={devices}")
    return subprocess.Popen([sys.executable, "-m", "rlhf_jax.cli", *words], cwd=ROOT, env=env,
                            stdout=log.open("a"), stderr=subprocess.STDOUT)


def sweep_words(directory: Path) -> list[str]:
    return ["sweep", str(ROOT / "configs" / "a2c_cartpole.yaml"), *OVERRIDES, SWEPT, "--seeds", "2",
            "--dir", str(directory)]


def assert_same(a, b, **tolerance) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if tolerance:
            np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), **tolerance)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory) -> Path:
    """The sweep run in this process, on its CPU device(s): one, unless XLA_FLAGS forces more."""
    directory = tmp_path_factory.mktemp("sweeps") / "local"
    _, _, swept = split_sweep_words([SWEPT])
    Sweep.create(directory, base_config(), swept, seeds=2).run(progress=False)
    return directory


@pytest.fixture(scope="module")
def four_device_sweep(tmp_path_factory) -> Path:
    """The same sweep in a process of its own, sharded over 4 forced CPU devices."""
    directory = tmp_path_factory.mktemp("sweeps") / "four"
    log = directory.parent / "four.log"
    assert run_cli(*sweep_words(directory), devices=4, log=log).wait(timeout=300) == 0, log.read_text()[-3000:]
    return directory


# ------------------------------------------------------------------ the grid
def test_words_split_into_config_overrides_and_swept_values():
    config, overrides, swept = split_sweep_words(["x.yaml", "env.num_envs=8", "a2c.learning_rate=0.1,0.01,3e-4",
                                                  "preferences.selection=random,disagreement"])
    assert config == "x.yaml" and overrides == ["env.num_envs=8"]
    # 3e-4 is a number, as in a config file (PyYAML's own loader reads the string "3e-4")
    assert swept == {"a2c.learning_rate": [0.1, 0.01, 3e-4], "preferences.selection": ["random", "disagreement"]}
    with pytest.raises(ConfigError, match="--seeds"):
        split_sweep_words(["seed=0,1"])
    with pytest.raises(ConfigError, match="key=value"):
        split_sweep_words(["x.yaml", "oops"])


def test_learning_rates_share_a_program_other_keys_make_one_group_per_value():
    groups = make_groups({"seed": 7}, {"a2c.entropy_coef": [0.0, 0.01], "a2c.learning_rate": [1e-3, 3e-3]}, seeds=2)
    assert len(groups) == 2 and all(len(g) == 4 for g in groups)  # entropy: 2 programs of 2 rates x 2 seeds
    assert [m.seed for m in groups[0]] == [7, 8, 7, 8]
    assert {dict(m.values)["a2c.entropy_coef"] for m in groups[1]} == {0.01}
    assert [m.index for g in groups for m in g] == list(range(8))
    with pytest.raises(ConfigError, match="at least 1"):
        make_groups({}, {}, seeds=0)


def test_groups_follow_the_in_state_marks_and_unknown_keys_are_refused():
    # ACER applies its rate outside the optimiser: a program per value; the marked rates share one.
    groups = make_groups({}, {"acer.learning_rate": [1e-3, 3e-3], "trpo.value_learning_rate": [1e-3, 3e-3],
                              "reward_model.learning_rate": [1e-4, 3e-4]}, seeds=1)
    assert len(groups) == 2 and all(len(g) == 4 for g in groups)
    with pytest.raises(ConfigError, match=r"^unknown key 'a2c.learning_rat'; valid keys of a2c: total_env_steps"):
        make_groups({}, {"a2c.learning_rat": [1e-3, 3e-3]}, seeds=1)
    with pytest.raises(ConfigError, match="unknown key 'seed.x'"):
        make_groups({}, {"seed.x": [1, 2]}, seeds=1)


OPTIMIZED = ("a2c", "acer", "dqn", "trpo", "reward_model", "ibt")  # the config sections with an optimiser


def hyperparams_in_state(section: str, config: ExperimentConfig) -> list[float]:
    """The values of the hyper-parameters in the optimiser states that ``section`` initialises
    (``optax.inject_hyperparams`` keeps them under ``hyperparams``)."""
    from rlhf_jax.agents import AGENTS, get_agent
    from rlhf_jax.envs import make
    from rlhf_jax.reward.ensemble import init_ensemble
    from rlhf_jax.reward.ibt import init_ibt

    env, key = make(config.env), jax.random.key(0)
    if section in AGENTS:
        state = get_agent(section).init_runner(key, getattr(config, section), env)
    else:
        state = {"reward_model": init_ensemble, "ibt": init_ibt}[section](key, getattr(config, section), env.spec)
    values = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if "hyperparams" in jax.tree_util.keystr(path):
            (value,) = np.unique(np.asarray(leaf))  # one value, whatever the ensemble's size
            values.append(float(value))
    return sorted(values)


def test_grouping_marks_are_exactly_the_hyperparameters_in_the_optimizer_states():
    keys = flat_keys(to_dict(ExperimentConfig()))
    marked = {key for key in keys if is_in_state(ExperimentConfig, key)}
    assert {key.split(".")[0] for key in marked} <= set(OPTIMIZED)
    # Every marked key gets a value of its own: each section's optimiser states must hold
    # exactly its marked keys' values, and nothing else.
    values = {key: 1e-4 * (2 + i) for i, key in enumerate(sorted(marked))}
    base = {"env": {"id": "gymnax/CartPole-v1", "num_envs": 2}, "dqn": {"replay_capacity": 1000}}
    config = build(ExperimentConfig, apply_overrides(base, [f"{key}={value}" for key, value in values.items()]))
    for section in OPTIMIZED:
        expected = sorted(value for key, value in values.items() if key.startswith(f"{section}."))
        assert hyperparams_in_state(section, config) == pytest.approx(expected), section


def test_runs_a_sweep_cannot_vmap_are_refused():
    people = apply_overrides(base_config(), ["reward=preferences", "labeler=people"])
    with pytest.raises(ConfigError, match="people"):
        member_config(people, make_groups(people, {}, 1)[0][0])


@pytest.mark.parametrize("swept, named", [
    # agent=a2c,dqn ran its DQN group for DQN's default 50M env steps: the budget is the agent's own.
    ({"agent": ["a2c", "dqn"]}, "agent cannot be swept: it chooses the section"),
    ({"reward": ["preferences", "ibt"]}, "reward cannot be swept: it chooses the section"),
    # Keys that do not change the work ran the same runs once per value.
    ({"run.dir": ["a", "b"]}, "run.dir cannot be swept: it does not change what a run computes"),
    ({"run.tensorboard": [True, False]}, "run.tensorboard cannot be swept"),
    ({"name": ["a", "b"]}, "name cannot be swept"),
    ({"dqn.learning_rate": [1e-3, 3e-3]}, "dqn.learning_rate cannot be swept: this sweep's agent is a2c"),
    ({"ibt.learning_rate": [1e-3, 3e-3]}, "ibt.learning_rate cannot be swept: this sweep's reward is env"),
])
def test_sweeping_a_key_that_chooses_a_section_or_changes_no_run_is_refused(swept, named, tmp_path):
    with pytest.raises(ConfigError, match=f"^{named}"):
        Sweep.create(tmp_path / "sweep", base_config(), swept, seeds=1)
    assert not (tmp_path / "sweep").exists()


def test_a_value_swept_twice_is_refused():
    with pytest.raises(ConfigError, match="a2c.learning_rate=0.001,1e-3 gives 0.001 twice"):
        split_sweep_words(["a2c.learning_rate=0.001,1e-3"])


def test_a_refused_sweep_is_a_one_line_error(tmp_path, capsys):
    assert main(["sweep", *OVERRIDES, "agent=a2c,dqn", "--dir", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one sweep per agent" in err, err
    assert not (tmp_path / "sweep").exists()


# ------------------------------------------------------------- one program
@pytest.mark.slow
def test_table_and_plot_summarise_every_member(local_sweep):
    with (local_sweep / "members.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 3  # 4 runs x 3 chunks
    with (local_sweep / "results.csv").open() as f:
        table = {row["combination"]: row for row in csv.DictReader(f)}
    assert set(table) == {"a2c.learning_rate=0.003", "a2c.learning_rate=0.001"}
    for label, row in table.items():
        finals = [float(r["episode_return"]) for r in rows if r["label"] == label and r["chunk"] == "2"]
        assert int(row["seeds"]) == 2
        assert float(row["final_true_return_mean"]) == pytest.approx(np.mean(finals))
    assert (local_sweep / "curves.png").stat().st_size > 10_000
    assert "| a2c.learning_rate=0.001 | 2 |" in (local_sweep / "results.md").read_text()


@pytest.mark.slow
def test_each_member_is_the_run_rlhf_jax_train_makes(local_sweep, tmp_path):
    """Member 3 (learning rate 0.001, seed 1) against that run trained alone."""
    stacked = load_state(local_sweep / "group0" / "checkpoints")
    member = jax.tree.map(lambda x: x[3], stacked)
    assert member["opt_state"][1]["hyperparams"]["learning_rate"] == np.float32(0.001)  # the rate is in the state
    config = build(ExperimentConfig, apply_overrides(base_config(), [
        "a2c.learning_rate=0.001", "seed=1", f"run.dir={tmp_path / 'alone'}"]))

    _, alone = Driver(config).restore_latest(train(config, progress=False))
    # One member alone and four vmapped are compiled for different shapes: XLA may sum in
    # another order, so equal up to float32 rounding.
    assert_same(member["params"], jax.device_get(alone.params), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_four_devices_and_two_processes_compute_the_same_runs(local_sweep, four_device_sweep, tmp_path):
    """The same sweep sharded over 4 CPU devices, then over 2 processes of 2 devices each
    (``jax.distributed`` on localhost): the same results as one device."""
    log = tmp_path / "log.txt"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    processes = [run_cli(*sweep_words(tmp_path / "two_hosts"), "--coordinator", f"localhost:{port}",
                         "--num-processes", "2", "--process-id", str(i), devices=2, log=log) for i in range(2)]
    assert [p.wait(timeout=300) for p in processes] == [0, 0], log.read_text()[-3000:]

    one = load_state(local_sweep / "group0" / "checkpoints")
    sharded = load_state(four_device_sweep / "group0" / "checkpoints")
    distributed = load_state(tmp_path / "two_hosts" / "group0" / "checkpoints")
    assert_same(sharded, distributed)  # one member per device either way: bit for bit
    # One device runs the 4 members as one batch, 4 devices 1 each: float32 rounding apart.
    assert_same(one, sharded, rtol=1e-4, atol=1e-5)
    assert (tmp_path / "two_hosts" / "results.md").read_text() == (four_device_sweep / "results.md").read_text()


@pytest.mark.parametrize("uninterrupted, devices", [("local_sweep", None), ("four_device_sweep", 4)],
                         ids=["devices_of_this_process", "4_devices"])
@pytest.mark.slow
def test_a_sweep_killed_with_sigkill_resumes_to_the_same_end(uninterrupted, devices, request, tmp_path):
    """Killed after its first checkpoint and resumed, on the devices of the uninterrupted sweep
    it is compared with: bit for bit. (On another number of devices the programs are compiled
    for other shapes and agree to float32 rounding only: see the test above.)"""
    uninterrupted = request.getfixturevalue(uninterrupted)
    log = tmp_path / "log.txt"
    directory = tmp_path / "killed"
    process = run_cli(*sweep_words(directory), devices=devices, log=log)
    first = directory / "group0" / "checkpoints" / "0"
    deadline = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, log.read_text()[-3000:]  # killed before the end
    resumed = run_cli("sweep", "--resume", str(directory), devices=devices, log=log)
    assert resumed.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert_same(load_state(directory / "group0" / "checkpoints"), load_state(uninterrupted / "group0" / "checkpoints"))
    assert (directory / "results.md").read_text() == (uninterrupted / "results.md").read_text()


# ------------------------------------------------------------------- Atari
def test_members_sharing_one_pool_see_what_the_pool_of_all_their_environments_gives():
    """Vmapped over 2 members of 2 environments, reset and steps go through one pool of 4:
    each member gets its slice of what a plain pool of 4 (same seed) returns for the same actions."""
    from rlhf_jax.envs import EnvConfig, make

    shared = make(EnvConfig(id="envpool/Breakout-v5", num_envs=2, seed=3), members=2)
    plain = make(EnvConfig(id="envpool/Breakout-v5", num_envs=4, seed=3))
    assert shared.num_envs == 2 and shared.pool.config["num_envs"] == 4
    actions = jnp.asarray(np.random.default_rng(0).integers(0, 4, size=(12, 2, 2)), jnp.int32)

    def play(env, key, actions):
        state, first = env.reset(key)
        _, steps = jax.lax.scan(env.step, state, actions)
        return first.obs, steps.obs, steps.reward, steps.info["lives"]

    members = jax.jit(jax.vmap(lambda k, a: play(shared, k, a), in_axes=(0, 1)))(
        jax.random.split(jax.random.PRNGKey(0), 2), actions)
    whole = jax.jit(lambda a: play(plain, jax.random.PRNGKey(0), a))(actions.reshape(12, 4))
    first, obs, reward, lives = whole
    assert float(jnp.abs(obs[:, :2].astype(jnp.int32) - obs[:, 2:]).sum()) > 0  # the members differ
    np.testing.assert_array_equal(members[0], first.reshape(2, 2, 84, 84, 4))
    for mine, theirs in zip(members[1:], (obs, reward, lives)):
        np.testing.assert_array_equal(mine, np.moveaxis(theirs.reshape(12, 2, 2, *theirs.shape[2:]), 1, 0))


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [2, 1])
def test_an_atari_sweep_runs_its_members_on_one_shared_pool(tmp_path, seeds):
    """Of one seed too: a pool's call cannot be vmapped (it is joined for several members only)."""
    overrides = ["env.num_envs=2", "a2c.total_env_steps=40", "run.chunk_env_steps=20", "run.tensorboard=false"]
    base = apply_overrides(read_yaml(ROOT / "configs" / "paper" / "atari" / "breakout_a2c.yaml"), overrides)
    directory = Sweep.create(tmp_path / "breakout", base, {}, seeds=seeds).run(progress=False)
    with (directory / "members.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["chunk"], r["seed"], r["env_steps"]) for r in rows] == [
        (str(chunk), str(seed), f"{20.0 * (chunk + 1)}") for chunk in range(2) for seed in range(seeds)]
    if seeds == 2:
        assert rows[-1]["loss"] != rows[-2]["loss"]  # two runs, not one copied
    assert f"| base | {seeds} |" in (directory / "results.md").read_text()


# ------------------------------------------------------------- statistics
def results_of(tmp_path, finals: dict[str, list[float]]) -> Path:
    """``write_results`` of members whose last chunk (of two) scored ``finals``, per combination."""
    rows, member = [], 0
    for label, returns in finals.items():
        for seed, final in enumerate(returns):
            rows += [{"group": 0.0, "chunk": float(chunk), "member": float(member), "seed": float(seed), "label": label,
                      "env_steps": 100.0 * (chunk + 1), "episode_return": value}
                     for chunk, value in enumerate([1.0, final])]
            member += 1
    write_results(tmp_path, rows, ["a2c.learning_rate"])
    return tmp_path


def test_a_combination_whose_seeds_ended_no_episode_is_nan_without_warnings(tmp_path):
    """Chunks too short for any episode to end left numpy's "All-NaN slice" warning in the log."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        directory = results_of(tmp_path, {"a": [np.nan, np.nan]})
    assert "| a | 2 | nan ± nan |" in (directory / "results.md").read_text()


def test_sweep_seeds_have_a_maximum(tmp_path, capsys):
    """--seeds 100000000 printed nothing for 300 s; --seeds 1000000 took 434 MB in 120 s."""
    started = time.monotonic()
    assert main(["sweep", *OVERRIDES, SWEPT, "--seeds", "100000000", "--dir", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "200000000 runs (2 combinations x 100000000 seeds): a sweep runs at most 10000" in err
    assert time.monotonic() - started < 30 and not (tmp_path / "sweep").exists()


def test_members_csv_keeps_whole_numbers_whole_when_a_resume_rewrites_it(tmp_path):
    """A resumed sweep read every number back as a float and wrote 0 as 0.0: a seed of 2^53 or
    more lost its last digits."""
    sweep = Sweep(tmp_path, base_config(), {}, seeds=1)
    rows = [{"group": 0, "chunk": 0, "member": 0, "seed": 2**53 + 1, "label": "base", "env_steps": 2048,
             "episode_return": 21.5, "loss": float("nan")}]
    sweep.write_rows(rows)
    sweep.write_rows(sweep.rows())  # what a resume does: the rows read back, with its own after them
    assert (tmp_path / "members.csv").read_text().splitlines()[1] == "0,0,0,9007199254740993,base,2048,21.5,nan"
    (read,) = sweep.rows()
    assert read["seed"] == 2**53 + 1 and isinstance(read["chunk"], int) and isinstance(read["episode_return"], float)


@pytest.mark.slow
def test_results_give_each_combinations_iqm_with_its_interval(tmp_path):
    directory = results_of(tmp_path, {"a": [10.0, 20.0, 30.0, 1000.0], "b": [5.0, 5.0, np.nan, 5.0, 5.0]})
    with (directory / "results.csv").open() as f:
        table = {row["combination"]: row for row in csv.DictReader(f)}
    # a: the middle half of 10 20 30 1000 is 20 30; its mean, pulled up by the 1000, is 265.
    expected = interval_estimate(np.array([[10.0], [20.0], [30.0], [1000.0]]))
    assert float(table["a"]["final_true_return_iqm"]) == pytest.approx(25.0) == pytest.approx(expected.iqm)
    assert float(table["a"]["final_true_return_iqm_low"]) == pytest.approx(expected.iqm_low)
    assert float(table["a"]["final_true_return_iqm_high"]) == pytest.approx(expected.iqm_high)
    assert float(table["a"]["final_true_return_mean"]) == pytest.approx(265.0)
    # b: the member whose last chunk ended no episode is left out; the rest agree exactly.
    assert [float(table["b"][f"final_true_return_iqm{end}"]) for end in ("", "_low", "_high")] == [5.0] * 3
    markdown = (directory / "results.md").read_text()
    assert "IQM [95% interval]" in markdown
    assert f"| 25.0 [{expected.iqm_low:.1f}, {expected.iqm_high:.1f}] |" in markdown
    assert (directory / "statistics.png").read_bytes()[:4] == b"\x89PNG"


def test_without_rliable_results_say_so_and_keep_the_mean(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rliable", None)
    directory = results_of(tmp_path, {"a": [10.0, 20.0]})
    assert "note: interquartile means with bootstrap intervals need rliable" in capsys.readouterr().out
    assert "| a | 2 | 15.0 ± 5.0 | 200 | n/a |" in (directory / "results.md").read_text()
    assert not (directory / "statistics.png").exists()
