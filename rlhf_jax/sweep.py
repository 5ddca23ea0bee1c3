"""``rlhf-jax sweep``: every seed and hyper-parameter combination of an experiment in one program.

    rlhf-jax sweep configs/a2c_cartpole.yaml --seeds 4 a2c.learning_rate=0.001,0.003 a2c.entropy_coef=0.0,0.01

A *member* is one run: one seed and one value of every swept key. Members that differ only
in seeds and in hyper-parameters held in the training state (config fields marked with
``config_base.in_state``: the learning rates ``optax.inject_hyperparams`` keeps in the optimiser
state) share one compiled program: their states are stacked and the run's pure chunk
(``Loop.chunk``) is vmapped over them. A swept key that changes the program (a shape, a loop
length, an entropy coefficient compiled into the loss) makes one such *group* per value, run
one after another.

The stacked members are spread over every device with ``jax.sharding``: a one-axis ``Mesh``
named ``members``, each leaf of the state ``NamedSharding``-ed along its leading axis (members
are padded with copies to a multiple of the device count). Each member's computation never
looks at another's, so XLA partitions the program without communication, and every device
computes exactly what one device would. With ``jax.distributed`` (``--coordinator``), the
mesh spans the devices of every process; each process initialises only the members that live
on its own devices, and process 0 writes the results.

A sweep directory holds ``sweep.yaml`` (base config, swept values, seeds), ``members.csv``
(one row per member per chunk), ``results.csv`` and ``results.md`` (one row per combination:
mean and std over seeds of the last chunk's true return, and its interquartile mean with a
stratified bootstrap interval, :mod:`rlhf_jax.statistics`), ``curves.png``, ``statistics.png``
(those intervals, and performance profiles), and
``group<g>/checkpoints/`` (orbax, the stacked state after each chunk): ``--resume`` skips
finished groups and continues the current one from its newest checkpoint.

EnvPool (Atari, MuJoCo) and Gymnasium environments are stepped outside JAX, by copies in this
process (``Environment.copies_on_host``), which cannot themselves be vmapped. A group on them
builds one set holding every member's copies (members x ``env.num_envs``): vmapped over the
members, each vector step joins their actions into one call and splits its results among them
(``envs.shared_pool.shared_by_members``); a group of one member runs unbatched. Those copies
live in one process and feed one device, so such a sweep runs on the first device of a single
process; its members start from the copies' first reset after initialisation (and again after a
resume: the copies died with the old process).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.config import ExperimentConfig, apply_overrides, build, read_yaml
from rlhf_jax.config_base import dump_yaml, is_in_state, override
from rlhf_jax.driver import Driver
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.files import write_atomically
from rlhf_jax.host_loop import ChunkDone, run_chunks, summarize
from rlhf_jax.metrics_log import judged_return
from rlhf_jax.run_control import StopRequests, check_finite
from rlhf_jax.statistics import (CONFIDENCE, IntervalEstimate, draw_intervals, draw_profiles, interval_estimate,
                                 performance_profile, require_rliable, shown_iqm)
from rlhf_jax.wandb_log import WandbRun, logging_to_wandb, require_wandb

SWEEP_FILE = "sweep.yaml"
# The most runs one sweep holds (combinations x seeds): each is made and checked before the
# first runs, and a group's runs run at once, stacked.
MAX_RUNS = 10_000


@dataclass(frozen=True)
class Member:
    """One run of a sweep: its index, seed and swept values (key -> value)."""

    index: int
    seed: int
    values: tuple[tuple[str, object], ...]

    def overrides(self) -> list[str]:
        return [override(key, value) for key, value in self.values] + [f"seed={self.seed}"]

    def label(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.values) or "base"


def make_groups(base: dict, swept: dict[str, list], seeds: int) -> list[list[Member]]:
    """The members, grouped by the values of the swept keys that change the program."""
    if seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {seeds}")
    combinations = math.prod(len(values) for values in swept.values())
    if combinations * seeds > MAX_RUNS:
        raise ConfigError(f"this sweep would be {combinations * seeds} runs ({combinations} combination"
                          f"{'s' if combinations > 1 else ''} x {seeds} seeds): a sweep runs at most {MAX_RUNS}; "
                          "give fewer --seeds or swept values")
    in_state = {key: is_in_state(ExperimentConfig, key) for key in swept}  # an unknown key stops here
    program_keys = [key for key in swept if not in_state[key]]
    state_keys = [key for key in swept if in_state[key]]
    first_seed = int(base.get("seed", 0))
    groups, index = [], 0
    for program_values in itertools.product(*(swept[k] for k in program_keys)):
        group = []
        for state_values in itertools.product(*(swept[k] for k in state_keys)):
            values = tuple(zip(program_keys, program_values)) + tuple(zip(state_keys, state_values))
            for seed in range(first_seed, first_seed + seeds):
                group.append(Member(index, seed, values))
                index += 1
        groups.append(group)
    return groups


# Keys a sweep cannot vary. Those that choose a section: each value's runs would take that
# section's settings, its run budget among them, from a base config written for one value (DQN's
# default 50M env steps under a sweep of agent=a2c,dqn). Those that change no run: each value
# would run the same runs again (a sweep's labels come from the synthetic labeler, so people.*
# is read by none of them).
SECTION_CHOOSERS = {"agent": "a2c, acer, dqn or trpo", "reward": "preferences, ibt or reward_model"}
UNCHANGING_KEYS = ("name", "run.dir", "run.tensorboard", "run.checkpoint_every_updates", "run.checkpoint_every_minutes",
                   "run.wandb", "run.wandb_project", "run.wandb_entity", "run.wandb_tags", "run.wandb_mode")
UNCHANGING_SECTIONS = ("people",)


def refuse_unsweepable(base: dict, swept: dict[str, list]) -> None:
    """A ConfigError naming the first swept key whose values would not make different runs of
    one base config: a key that chooses a section, one that changes no run, or one in a section
    the base config's agent or reward never reads."""
    from rlhf_jax.agents import AGENTS
    from rlhf_jax.reward.kinds import KINDS, MODEL_KEY, feedback_kind

    agent = base.get("agent", ExperimentConfig.agent)
    reward = base.get("reward", ExperimentConfig.reward)
    kind = feedback_kind(reward)
    read = {kind.section_name, kind.model_section} if kind else set()
    unread = {s for k in KINDS for s in (k.section_name, k.model_section)} - read
    for key in swept:
        section = key.split(".")[0]
        if key in SECTION_CHOOSERS:
            raise ConfigError(f"{key} cannot be swept: it chooses the section ({SECTION_CHOOSERS[key]}) whose settings, "
                              f"run budget among them, every run takes from the one base config; run one sweep per {key}")
        if key in UNCHANGING_KEYS or section in UNCHANGING_SECTIONS:
            where = " (a sweep's directory is --dir)" if key == "run.dir" else ""
            raise ConfigError(f"{key} cannot be swept: it does not change what a run computes, so each value would "
                              f"run the same runs again; give it one value{where}")
        if section in AGENTS and section != agent:
            raise ConfigError(f"{key} cannot be swept: this sweep's agent is {agent}, which never reads {section}.*")
        if section in unread and not (key == MODEL_KEY and kind is not None):
            raise ConfigError(f"{key} cannot be swept: this sweep's reward is {reward}, which never reads {section}.*")


def member_config(base: dict, member: Member) -> ExperimentConfig:
    config = build(ExperimentConfig, apply_overrides(base, member.overrides()))
    require_wandb(config.run)
    if config.labeler != "synthetic":
        raise ConfigError("a sweep's labels come from the synthetic labeler: people label one run (rlhf-jax train)")
    if config.env.backend == "envpool" and jax.process_count() > 1:
        raise ConfigError(f"{config.env.id}: an EnvPool pool lives in one process; sweep it without "
                          "--num-processes (its runs share one pool and one device)")
    return config


class GroupProgram:
    """One group's members as one sharded, vmapped program over ``mesh``."""

    people = None  # a sweep's labels come from the synthetic labeler

    def __init__(self, base: dict, members: list[Member], mesh: Mesh):
        self.members = members
        self.configs = [member_config(base, m) for m in members]
        self._drivers = {}  # a config without its seed -> its driver, to initialise members with
        self._chunks = {}  # chunk length -> the compiled, vmapped chunk
        first = self._driver_for(self.configs[0])
        # EnvPool, Gymnasium: the members step one set of copies together instead of vmapped ones.
        self.shared_pool = first.env.copies_on_host
        if self.shared_pool:  # one pool feeds one device (module docstring)
            mesh = Mesh(np.array(jax.local_devices()[:1]), ("members",))
        self.padded = math.ceil(len(members) / mesh.devices.size) * mesh.devices.size
        self.sharding = NamedSharding(mesh, PartitionSpec("members"))
        # Whose chunk every member runs: on a shared pool, the driver of the pool they share.
        self.driver = Driver(self.configs[0], members=self.padded) if self.shared_pool and self.padded > 1 else first
        self.num_chunks = self.driver.num_chunks

    def over_members(self, fn, in_axes=0):
        """``jax.vmap(fn, in_axes)`` over the members, but for one member on copies of the host:
        a pool's call is joined for several members only, and cannot be vmapped, so the one
        member runs unbatched, its leading axis taken off and put back."""
        if not (self.shared_pool and self.padded == 1):
            return jax.vmap(fn, in_axes=in_axes)

        def one(*args):
            axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
            args = [a if axis is None else jax.tree.map(lambda x: x[0], a) for a, axis in zip(args, axes)]
            return jax.tree.map(lambda x: x[None], fn(*args))
        return one

    def _driver_for(self, config: ExperimentConfig) -> Driver:
        key = dataclasses.replace(config, seed=0)
        if key not in self._drivers:
            self._drivers[key] = Driver(config)
        return self._drivers[key]

    def abstract_state(self):
        one = self.driver.abstract_state()
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.padded, *x.shape), x.dtype, sharding=self.sharding), one)

    def init_state(self):
        """Each process initialises the members on its own devices, one at a time (vmapped
        orthogonal initialisers can hang on a CPU; see ``rlhf_jax.loop.Loop.make_train``)."""
        local = sorted({i for index in self.sharding.addressable_devices_indices_map(
            (self.padded,)).values() for i in range(*index[0].indices(self.padded))})
        states = {}
        for i in local:
            config = self.configs[min(i, len(self.members) - 1)]  # padding repeats the last member
            states[i] = jax.device_get(self._driver_for(config).init(jax.random.PRNGKey(config.seed)))
        leaves_by_member = {i: jax.tree.leaves(s) for i, s in states.items()}
        abstract = self.abstract_state()
        treedef = jax.tree.structure(abstract)

        def leaf(n, shape_dtype):
            def shard(index):
                rows = range(*index[0].indices(self.padded))
                return np.stack([leaves_by_member[i][n] for i in rows])
            return jax.make_array_from_callback(shape_dtype.shape, self.sharding, shard)

        return self.start_pool(jax.tree.unflatten(treedef, [leaf(n, s) for n, s in enumerate(jax.tree.leaves(abstract))]))

    def start_pool(self, state):
        """Atari: every member's environments reset through the shared pool (they were
        initialised, or restored, with environments of their own); others: ``state`` as it is."""
        if not self.shared_pool:
            return state
        keys = jax.random.split(jax.random.PRNGKey(self.configs[0].seed), self.padded)
        reset = jax.jit(self.over_members(self.driver.loop.reset_env), out_shardings=self.sharding, donate_argnums=0)
        return reset(state, keys)

    def run_chunk(self, state, chunk: int):
        """Chunk ``chunk`` of every member: :meth:`Loop.chunk <rlhf_jax.loop.Loop.chunk>` vmapped,
        ``(state, metrics [members, iterations], learned [members])``."""
        loop = self.driver.loop
        length = loop.chunk_length(chunk)
        if length not in self._chunks:
            vmapped = self.over_members(lambda s, w: loop.chunk(s, length, w), in_axes=(0, None))
            self._chunks[length] = jax.jit(vmapped, out_shardings=self.sharding, donate_argnums=0)
        return self._chunks[length](state, jnp.int32(loop.wanted[chunk]))


def device_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("members",))


def agree(*flags: bool) -> tuple[bool, ...]:
    """``flags`` that every process acts on alike, each true where it is true on any process:
    whether to save (each process has its own clock) and whether to stop (a signal may reach
    one process), so that all of them take part in each collective save."""
    if jax.process_count() == 1:
        return flags
    gathered = np.asarray(multihost_utils.process_allgather(np.array(flags)))
    return tuple(bool(x) for x in gathered.reshape(-1, len(flags)).any(0))


def gather(tree):
    """A sharded tree as NumPy on every process (all of it, whichever process holds it)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


class Sweep:
    """A sweep directory: its definition, its members' rows and results."""

    def __init__(self, directory: Path, base: dict, swept: dict[str, list], seeds: int):
        self.directory = Path(directory)
        self.base, self.swept, self.seeds = base, swept, seeds
        self.groups = make_groups(base, swept, seeds)

    @classmethod
    def create(cls, directory: Path, base: dict, swept: dict, seeds: int) -> "Sweep":
        sweep = cls(directory, base, swept, seeds)
        refuse_unsweepable(base, swept)
        for group in sweep.groups:  # every member's config is checked before anything runs
            for member in group:
                member_config(base, member)
        if jax.process_index() == 0:  # the one process that writes files
            if (directory / SWEEP_FILE).exists():
                raise ConfigError(f"{directory} already holds a sweep; resume it with --resume {directory}")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / SWEEP_FILE).write_text(dump_yaml({"base": base, "swept": swept, "seeds": seeds}))
        return sweep

    @classmethod
    def load(cls, directory: Path) -> "Sweep":
        if not (Path(directory) / SWEEP_FILE).is_file():
            raise ConfigError(f"{directory} is not a sweep directory: it has no {SWEEP_FILE}")
        saved = read_yaml(Path(directory) / SWEEP_FILE)
        return cls(directory, saved["base"], saved["swept"], saved["seeds"])

    def restore_group(self, group: int = 0) -> tuple[GroupProgram, int, object]:
        """Group ``group``'s program and its newest checkpoint, ``(program, chunk, state)``, the
        state stacked over the group's members: to look at a sweep's policies and reward models
        after (or while) it runs. A ConfigError if the group has no checkpoint yet."""
        program = GroupProgram(self.base, self.groups[group], device_mesh())
        chunk, state = Checkpoints(self.directory / f"group{group}", resume_command="").restore(program.abstract_state())
        return program, chunk, state

    # ------------------------------------------------------------- rows
    @property
    def rows_file(self) -> Path:
        return self.directory / "members.csv"

    def rows(self) -> list[dict]:
        if not self.rows_file.exists():
            return []
        with self.rows_file.open() as f:
            return [{k: (v if k == "label" else number(v)) for k, v in row.items()} for row in csv.DictReader(f)]

    def write_rows(self, rows: list[dict]) -> None:
        if jax.process_index() != 0 or not rows:
            return
        keys = list(dict.fromkeys(k for row in rows for k in row))

        def write(temporary: Path) -> None:
            with temporary.open("w", newline="") as f:
                writer = csv.DictWriter(f, keys)
                writer.writeheader()
                writer.writerows(rows)

        write_atomically(self.rows_file, write)  # never a half-written file

    def wandb_runs(self, program: GroupProgram, open_runs: contextlib.ExitStack) -> dict[int, WandbRun]:
        """The W&B run of each member of ``program`` whose ``run.wandb`` is on, grouped under the
        sweep's name and open until ``open_runs`` closes. Process 0 logs, as it writes the files."""
        if jax.process_index() != 0:
            return {}
        runs = {}
        for member, config in zip(program.members, program.configs):
            run = open_runs.enter_context(logging_to_wandb(config, self.directory, f"{member.label()}, seed {member.seed}",
                                                           member=member.index, group=self.directory.name))
            if run is not None:
                runs[member.index] = run
        return runs

    # ------------------------------------------------------------- the run
    def run(self, progress: bool = True) -> Path:
        """Run (or go on with) every group; Ctrl-C and SIGTERM stop it after the chunk in
        flight, saved, as they stop ``rlhf-jax train`` (:class:`rlhf_jax.run_control.StopRequests`)."""
        with StopRequests() as stop:
            return self._run(progress, stop)

    def _run(self, progress: bool, stop: StopRequests) -> Path:
        from tqdm import tqdm

        mesh = device_mesh()
        rows = self.rows()
        warned: set[int] = set()
        total = len([m for g in self.groups for m in g])
        print(f"sweep {self.directory}: {total} runs in {len(self.groups)} compiled program(s) over "
              f"{jax.device_count()} device(s)", flush=True)
        for g, members in enumerate(self.groups):
            program = GroupProgram(self.base, members, mesh)
            driver = program.driver
            score = driver.task_scorer()
            checkpoints = Checkpoints(self.directory / f"group{g}",
                                      resume_command=f"rlhf-jax sweep --resume {self.directory}")
            stop.hint = checkpoints.resume_hint
            done = {int(r["chunk"]) for r in rows if int(r["group"]) == g}
            if len(done) == program.num_chunks:
                continue
            if checkpoints.latest() is None:
                state, first = program.init_state(), 0
            else:
                saved, state = checkpoints.restore(program.abstract_state())
                state, first = program.start_pool(state), saved + 1
            rows = [r for r in rows if int(r["group"]) != g or int(r["chunk"]) < first]
            bar = tqdm(total=program.num_chunks, initial=first, unit="chunk", disable=not progress,
                       desc=f"group {g + 1}/{len(self.groups)} ({len(members)} runs)", dynamic_ncols=True)
            with contextlib.ExitStack() as open_runs:
                wandb_runs = self.wandb_runs(program, open_runs)

                def report(chunk_done: ChunkDone) -> None:
                    chunk = chunk_done.chunk
                    metrics, learned = gather((chunk_done.metrics, chunk_done.learned))
                    policies = gather(driver.policy_params(chunk_done.state)) if score is not None else None
                    env_steps = len(members) * driver.loop.chunk_length(chunk) * driver.loop.steps_per_iteration
                    for m, member in enumerate(members):
                        row = summarize(*jax.tree.map(lambda x: x[m], (metrics, learned)))
                        row = {"group": g, "chunk": chunk, "member": member.index, "seed": member.seed,
                               "label": member.label(), **row, "steps_per_second": env_steps / chunk_done.seconds}
                        if policies is not None:
                            row["task_return"] = score(jax.tree.map(lambda x: x[m], policies))
                        rows.append(row)
                        if member.index in wandb_runs:
                            wandb_runs[member.index].log_row(row)
                        try:
                            check_finite(row, chunk, driver.unmeasured(row))
                        except RunError as error:  # one diverging learning rate need not stop the others
                            if member.index not in warned:
                                warned.add(member.index)
                                print(f"warning: run {member.index} ({member.label()}, seed {member.seed}): {error}",
                                      flush=True)
                    self.write_rows(rows)
                    returns = [judged_return(r) for r in rows if int(r["group"]) == g and int(r["chunk"]) == chunk]
                    bar.set_postfix(true_return=f"{over_seeds(np.nanmean, returns):.4g}")
                    bar.update()

                _, _, stopping = run_chunks(program, state, first, checkpoints, stop, driver.config.run,
                                            driver.loop.chunk_iterations, report, agree)
                bar.close()
                checkpoints.close()
            if stopping:
                where = f"in group {g + 1} of {len(self.groups)}. {checkpoints.resume_hint()}"
                if not stop.requested():  # the signal reached another process
                    raise RunError(f"stopped with the sweep's other processes, one of which was interrupted, {where}")
                raise stop.interrupted(where)
        if jax.process_index() == 0:
            write_results(self.directory, self.rows(), list(self.swept))
        return self.directory


def number(text: str) -> int | float:
    """A number of ``members.csv`` as it was written: a whole number an int (a seed of 2^53 or
    more keeps its digits, which a float would round), anything else a float."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def over_seeds(statistic, values, axis=None):
    """``statistic`` (``np.nanmean`` and its kin) of the seeds' values that exist: NaN where none
    does (a chunk in which no seed's episode ended), without numpy's warning for that."""
    with warnings.catch_warnings():  # numpy's words for a slice with no value; others (overflow) still show
        warnings.filterwarnings("ignore", "Mean of empty slice|Degrees of freedom|All-NaN slice", RuntimeWarning)
        return statistic(values, axis=axis)


def write_results(directory: Path, rows: list[dict], swept_keys: list[str]) -> None:
    """``results.csv``/``results.md``: per combination, the last chunk's true return over seeds
    (their mean and std, and their IQM with its interval); ``curves.png``: true return against
    env steps, the mean over seeds with its range; ``statistics.png``: the IQMs and the
    performance profiles of the last chunk's true return (:mod:`rlhf_jax.statistics`). Each
    return is the one a run is judged by (:func:`~rlhf_jax.metrics_log.judged_return`): on the task
    itself where the run scored one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_label: dict[str, dict[int, list[dict]]] = {}
    for row in rows:
        by_label.setdefault(row["label"], {}).setdefault(int(row["member"]), []).append(row)
    table = []
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, members in by_label.items():
        finals = [last_row(r) for r in members.values()]
        returns = np.array([judged_return(f) for f in finals])
        table.append({"combination": label, "seeds": len(finals),
                      "final_true_return_mean": float(over_seeds(np.nanmean, returns)),
                      "final_true_return_std": float(over_seeds(np.nanstd, returns)),
                      "env_steps": int(finals[0]["env_steps"])})
        curves = [sorted(r, key=lambda r: r["chunk"]) for r in members.values()]
        steps = [r["env_steps"] for r in curves[0]]
        values = np.array([[judged_return(r) for r in curve] for curve in curves])
        axes.plot(steps, over_seeds(np.nanmean, values, 0), label=label)
        axes.fill_between(steps, over_seeds(np.nanmin, values, 0), over_seeds(np.nanmax, values, 0), alpha=0.2)
    axes.set_xlabel("env steps")
    axes.set_ylabel("true episode return (on the task where scored)")
    axes.set_title(f"sweep over {', '.join(swept_keys) or 'seeds'}: mean and range over seeds")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(directory / "curves.png", dpi=100)
    plt.close(figure)

    finals = {label: final_returns(members) for label, members in by_label.items()}
    estimates = write_statistics(directory, finals, swept_keys)
    for row in table:
        estimate = estimates.get(row["combination"])
        row.update(final_true_return_iqm=estimate.iqm if estimate else math.nan,
                   final_true_return_iqm_low=estimate.iqm_low if estimate else math.nan,
                   final_true_return_iqm_high=estimate.iqm_high if estimate else math.nan)
    with (directory / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    lines = [f"| combination | seeds | final true return (mean ± std) | env steps | IQM [{CONFIDENCE:.0%} interval] |",
             "|---|---|---|---|---|"]
    lines += [f"| {t['combination']} | {t['seeds']} | {t['final_true_return_mean']:.1f} ± "
              f"{t['final_true_return_std']:.1f} | {t['env_steps']} | {shown_iqm(estimates.get(t['combination']))} |"
              for t in table]
    (directory / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def last_row(rows: list[dict]) -> dict:
    """A member's row of its last chunk (of ``rows``, its rows)."""
    return max(rows, key=lambda r: r["chunk"])


def final_returns(members: dict[int, list[dict]]) -> np.ndarray:
    """Each member's true return in its last chunk, those whose last chunk ended no episode left out."""
    returns = np.array([judged_return(last_row(rows)) for rows in members.values()])
    return returns[np.isfinite(returns)]


def write_statistics(directory: Path, finals: dict[str, np.ndarray],
                     swept_keys: list[str]) -> dict[str, IntervalEstimate]:
    """``statistics.png`` and the IQM of each combination's final returns (one task: a matrix
    ``[seeds, 1]`` each); nothing, with a note, without rliable."""
    import matplotlib.pyplot as plt

    try:
        require_rliable()
    except ImportError as error:
        print(f"note: {error}; results have the mean and std only", flush=True)
        return {}
    scored = {label: returns[:, None] for label, returns in finals.items() if returns.size}
    if not scored:
        return {}
    every = np.concatenate(list(scored.values()))
    margin = 0.05 * (every.max() - every.min()) or 1.0  # so that each profile falls from 1 to 0
    thresholds = np.linspace(every.min() - margin, every.max() + margin, 50)
    estimates = {label: interval_estimate(scores) for label, scores in scored.items()}
    profiles = {label: performance_profile(scores, thresholds) for label, scores in scored.items()}
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(scored) + 3.5))
    draw_intervals(left, list(estimates), list(estimates.values()), "final true return")
    draw_profiles(right, list(profiles), list(profiles.values()), "final true return")
    figure.suptitle(f"sweep over {', '.join(swept_keys) or 'seeds'}: the last chunk's true return over seeds")
    figure.tight_layout()
    figure.savefig(directory / "statistics.png", dpi=100)
    plt.close(figure)
    return estimates


def sweep_directory(base: dict) -> Path:
    from datetime import datetime

    if base.get("run", {}).get("dir"):
        return Path(base["run"]["dir"])
    return Path("runs") / f"sweep-{base.get('name', 'experiment')}-{datetime.now():%Y%m%d-%H%M%S}"
