"""``rlhf-jax train`` and ``rlhf-jax eval``: an agent's run in compiled chunks, saved as it goes.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.csv`` and
``tensorboard/`` (one row per chunk), ``checkpoints/`` (orbax), and at the end
``learning_curve.png``; ``rlhf-jax eval`` adds ``eval.json`` (and with ``--video``,
``eval/episode_<k>.mp4``).

The run is the agent's ``iteration`` scanned over chunks of iterations: one compiled
call per chunk, nothing crossing to the host inside it. Between chunks the host
logs, draws the progress bar and checkpoints. A resumed run restores the whole runner
(parameters, optimiser state, environment state, random key) at a chunk boundary, so
on CPU it ends with the same parameters as a run never interrupted. EnvPool's pools
live outside JAX and cannot be restored: a resumed EnvPool run starts fresh episodes.
Checkpoints come every so many updates and every half minute (:class:`SaveSchedule`); Ctrl-C
and SIGTERM stop a run after the chunk in flight, saved (:class:`StopRequests`); a resume
applies an edited learning rate and refuses other edits (:func:`apply_config_edits`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.agents import get_agent
from rlhf_jax.agents.base import env_reward
from rlhf_jax.checkpoints import (Checkpoints, config_diff, editable_on_resume, out_of_space, stop_on_write_failure,
                                  write_atomically)
from rlhf_jax.config import ExperimentConfig, RunConfig, build, to_dict
from rlhf_jax.config_base import CONFIG_FILE, dump_yaml, is_in_state, read_run_config
from rlhf_jax.envs import ATARI_NAMES, EnvConfig, make
from rlhf_jax.errors import ConfigError, Interrupted, RunError
from rlhf_jax.evaluation import LearnedReward, evaluate, record_episodes
from rlhf_jax.head_start import HeadStartFiles
from rlhf_jax.loop import Loop, LoopState
from rlhf_jax.reward.ibt_learner import IBTLearner
from rlhf_jax.reward.learner import Queries, RewardLearner
from rlhf_jax.reward.people import HostLabels, Query, wait_for_answers
from rlhf_jax.reward.preference_learner import PreferenceLearner
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.metrics_log import MetricsLog, judged_return, plot_learning_curve
from rlhf_jax.wandb_log import ID_FILE, logging_to_wandb, require_wandb

def new_run_dir(config: ExperimentConfig) -> Path:
    """The directory of a new run, holding its ``config.yaml`` (written whole or not at all:
    a run that cannot write it stops at once, leaving nothing behind)."""
    if config.run.dir:
        path = Path(config.run.dir)
        if (path / CONFIG_FILE).exists():
            raise ConfigError(f"{path} already holds a run; resume it with --resume {path} or choose another run.dir")
    else:
        path = Path("runs") / f"{config.name}-{datetime.now():%Y%m%d-%H%M%S}"
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        text = dump_yaml(to_dict(config))
        write_atomically(path / CONFIG_FILE, lambda temporary: temporary.write_text(text))
    except OSError as error:
        if created and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        full = out_of_space(error)
        raise RunError(f"cannot start a run in {path}: {error}{': ' + full if full else ''}. Nothing was "
                       f"written: {'make room or ' if full else ''}choose another run.dir, and start it again") from None
    return path


def remove_unstarted_run(run_dir: Path, checkpoints: Checkpoints) -> None:
    """Take back what a new run wrote before it could start (its W&B run refused it): its
    config.yaml, W&B id and files, its empty checkpoints folder, and its directory once empty (a
    run.dir that held other files keeps them). The same command, mended as the message says,
    then starts it, where it met "already holds a run"."""
    checkpoints.close()
    for name in (CONFIG_FILE, ID_FILE):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "wandb", ignore_errors=True)
    for folder in (checkpoints.directory, run_dir):
        with contextlib.suppress(OSError):  # not empty
            folder.rmdir()


def load_run_config(run_dir: str | Path) -> ExperimentConfig:
    """The config a run was started with, from its ``config.yaml``; one that cannot be read, or
    that sets nothing, is an error naming the file (never the defaults)."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        data = read_run_config(run_dir)
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    if not data:
        raise ConfigError(f"{path} is empty: it was never written whole, so {run_dir} cannot be resumed")
    return build(ExperimentConfig, data)


def summarize(metrics: dict) -> dict:
    """One row from a chunk's per-iteration metrics: sums of episodes, means of the rest."""
    metrics = jax.tree.map(np.asarray, metrics)
    episodes = metrics.pop("episodes").sum()
    returns = metrics.pop("episode_return_sum").sum()
    lengths = metrics.pop("episode_length_sum").sum()
    row = {"env_steps": float(metrics.pop("env_steps")[-1]), "episodes": float(episodes)}
    row["episode_return"] = float(returns / episodes) if episodes else math.nan
    row["episode_length"] = float(lengths / episodes) if episodes else math.nan
    row.update({key: float(np.mean(value)) for key, value in metrics.items()})
    return row


def scoring_env_config(config: ExperimentConfig) -> EnvConfig:
    """Where a run's policy is scored (``rlhf-jax eval``, ``run.score_on_task``): ``run.eval_episodes``
    copies of its environment, seeded apart from training's; with ``run.score_on_task``, the task
    itself, without the run's changes to episode ends, lengths and the oracle (the true reward scores)."""
    env = dataclasses.replace(config.env, num_envs=config.run.eval_episodes, seed=config.env.seed + 10_000)
    if config.run.score_on_task:
        env = dataclasses.replace(env, hide_episode_end=False, max_episode_steps=0, oracle="penalty")
    return env


def scoring_steps(config: ExperimentConfig, spec) -> int:
    """How long a scored play runs: ``run.eval_max_steps``, or one step past the episode limit,
    so that every copy's first episode ends inside it."""
    return config.run.eval_max_steps or spec.max_episode_steps + 1


def true_reward_env_config(config: ExperimentConfig) -> EnvConfig:
    """The environment a run on the true reward uses: DQN on Atari ends the agent's
    episode at each lost life (Mnih 2015), unless the config turns that off."""
    env = config.env
    atari = env.id.removeprefix("envpool/") in ATARI_NAMES
    if config.agent == "dqn" and config.dqn.life_loss_ends_episode and atari and not env.hide_episode_end:
        return dataclasses.replace(env, episodic_life=True)
    return env


def resolve_loop(loop: str, spec) -> str:
    """``run.loop="auto"``: Python-driven iterations for Atari CNNs on a CPU, a scan elsewhere."""
    if loop != "auto":
        return loop
    cnn = is_atari_frames(spec.observation_shape)
    return "python" if cnn and jax.default_backend() == "cpu" else "scan"


def compile_chunk(step, loop: str):
    """``run_chunk(state, length) -> (state, stacked metrics)`` from ``step(state) -> (state, metrics)``:
    one compiled ``lax.scan``, or a Python loop over one compiled step (metrics stacked alike)."""
    if loop == "scan":
        return jax.jit(lambda state, length: jax.lax.scan(lambda s, _: step(s), state, None, length),
                       static_argnums=1, donate_argnums=0)
    step = jax.jit(step, donate_argnums=0)

    def run_chunk(state, length):
        rows = []
        for _ in range(length):
            state, metrics = step(state)
            rows.append(metrics)
        return state, jax.tree.map(lambda *xs: jnp.stack(xs), *rows)

    return run_chunk


class AgentRun:
    """An agent on an environment, its run cut into chunks of iterations: what the training
    command needs of any run, whatever the reward (true in :class:`Training`, learned in
    :class:`LearnedRewardTraining`)."""

    def __init__(self, config: ExperimentConfig, env_config: EnvConfig, members: int = 1):
        """``members``: the runs of a sweep that will share this one's environment (``envs.make``)."""
        self.config = config
        self.agent = get_agent(config.agent)
        self.agent_config = getattr(config, config.agent)
        self.env = make(env_config, members)
        self.total_iterations = self.agent.num_iterations(self.agent_config, self.env)
        self.steps_per_iteration = self.agent.env_steps_per_iteration(self.agent_config, self.env)
        if self.agent_config.total_env_steps < self.steps_per_iteration:
            raise ConfigError(f"{config.agent}.total_env_steps={self.agent_config.total_env_steps} is less than one "
                              f"iteration: at least {self.steps_per_iteration} env steps here "
                              f"(env.num_envs={self.env.num_envs})")
        self.chunk_iterations = max(1, min(self.total_iterations, config.run.chunk_env_steps // self.steps_per_iteration))
        self.num_chunks = math.ceil(self.total_iterations / self.chunk_iterations)
        self.loop = resolve_loop(config.run.loop, self.env.spec)

    def chunk_length(self, chunk: int) -> int:
        done = chunk * self.chunk_iterations
        return min(self.chunk_iterations, self.total_iterations - done)

    def chunk_inputs(self, chunk: int) -> tuple[int, int]:
        """What :meth:`sweep_chunk` needs to know of chunk ``chunk``: its length in iterations
        and the answers the synthetic labeler gives at its end (none here)."""
        return self.chunk_length(chunk), 0

    def task_scorer(self):
        """``score(policy_params) -> float`` with ``run.score_on_task`` (else None): the mean true
        return of ``run.eval_episodes`` whole episodes of the task itself, the run's environment
        without its changes to episode ends and lengths. The same starts at every call where the
        environment draws them from the key (gymnax); EnvPool's pool draws new ones."""
        config = self.config
        if not config.run.score_on_task:
            return None
        env = make(scoring_env_config(config))
        act = self.agent.make_policy(self.agent_config, env.spec)
        steps = scoring_steps(config, env.spec)
        key = jax.random.PRNGKey(config.seed + 10_000)
        score = jax.jit(lambda params: evaluate(act, params, env, key, steps))
        return lambda params: score(params).mean_return()

    def reset_env(self, runner, key):
        """``runner`` (an agent's) with freshly reset environments: after restoring an EnvPool run."""
        env_state, timestep = self.env.reset(key)
        return runner._replace(env_state=env_state, obs=timestep.obs)

    def restore_latest(self, run_dir: Path):
        return restore_latest(self, run_dir)

    def prepare(self, runner, first_chunk: int, stopped=lambda: False, notes: dict | None = None):
        """Anything a run does once before its first chunk (fresh, or resumed from a
        checkpoint saved with ``notes``), unless ``stopped()``: nothing here."""
        return runner

    def finish(self, stopped=lambda: False) -> bool:
        """Anything a run waits for after its last chunk, unless ``stopped()``: nothing here.
        Whether it is all done."""
        return True

    def optimizer_states(self) -> dict[str, str]:
        """Where the optimiser state of each config section the run uses lives in its state:
        a path prefix, as ``jax.tree_util.keystr`` writes paths (``""``: the whole state)."""
        return {self.config.agent: ""}

    def checkpoint_notes(self) -> dict:
        """What a checkpoint records besides the state, for :meth:`prepare` on a resume: nothing here."""
        return {}

    def checkpoint_saved(self) -> None:
        """Called once the state is safely on disk: nothing to tell here."""

    def unmeasured(self, row: dict) -> set[str]:
        """The losses in a chunk's ``row`` that a NaN leaves unmeasured rather than diverged: none here."""
        return set()

    def save_outputs(self, state, run_dir: Path) -> None:
        """What a finished run writes besides its checkpoints and metrics: nothing here."""

    def learned_reward(self, runner) -> LearnedReward | None:
        """The reward the run learned, as of ``runner``: none here (the agent learns from the true reward)."""
        return None


class Training(AgentRun):
    """The agent on the environment's reward: everything compiled, shared by a fresh start and a resume."""

    def __init__(self, config: ExperimentConfig, members: int = 1):
        super().__init__(config, true_reward_env_config(config), members)
        self.iteration = self.agent.make_iteration(self.agent_config, self.env, env_reward)
        self._run_chunk = compile_chunk(lambda r: self.iteration(r)[:2], self.loop)
        self.init_runner = jax.jit(lambda key: self.agent.init_runner(key, self.agent_config, self.env))

    def run_chunk(self, runner, chunk: int):
        return self._run_chunk(runner, self.chunk_length(chunk))

    def sweep_chunk(self, runner, length: int, wanted):
        """A chunk as a pure function, for ``vmap`` over a sweep's runs (``wanted`` unused)."""
        return jax.lax.scan(lambda r, _: self.iteration(r)[:2], runner, None, length)

    def policy_params(self, runner):
        return runner.params


def make_learner(config: ExperimentConfig, spec, preloaded: int = 0) -> RewardLearner:
    """The reward learner ``config.reward`` names, for an environment of ``spec`` (``preloaded``:
    the answers a dataset gives it at the start, :mod:`rlhf_jax.head_start`)."""
    if config.reward == "preferences":
        return PreferenceLearner(config.preferences, config.reward_model, spec, preloaded)
    return IBTLearner(config.ibt, spec, preloaded)


class LearnedRewardTraining(AgentRun):
    """The RLHF loop (:mod:`rlhf_jax.loop`) driven from the host: its chunks compiled, and,
    with people, the one seam where queries leave the device and answers come back.

    Its "runner" is the whole :class:`~rlhf_jax.loop.LoopState`, answers and buffers included.
    On a CPU, a CNN's fitting runs one compiled step per dispatch (``run.loop``, see
    :func:`resolve_loop`); the steps, keys and answers are the same as in a compiled loop.
    """

    def __init__(self, config: ExperimentConfig, members: int = 1):
        # The agent learns from the learned reward only: no life-loss episodes or other true-reward helpers.
        super().__init__(config, config.env, members)
        # A dataset's labels and a fitted reward model to start from: checked now, read at the start.
        self.head_start = HeadStartFiles(config, self.env.spec)
        self.learner = make_learner(config, self.env.spec, self.head_start.preloaded)
        self.rlhf = Loop(self.agent, self.agent_config, self.env, self.learner, self.total_iterations,
                         self.chunk_iterations)
        self.people: PeopleSeam | None = None
        self.fit_from_python = self.loop == "python"
        loop = self.rlhf
        self._collect = compile_chunk(loop.collect, self.loop)
        self._start = jax.jit(loop.start)
        self._init = jax.jit(loop.init)
        self._ask = jax.jit(loop.ask, static_argnums=2, donate_argnums=0)
        self._learn = jax.jit(loop.learn, donate_argnums=0)
        self._fit_one = jax.jit(loop.fit_one, donate_argnums=0)
        self._fit_and_refresh = jax.jit(loop.fit_and_refresh, static_argnums=1, donate_argnums=0)
        self._refresh = jax.jit(loop.refresh, donate_argnums=0)

    def attach_people(self, labeler) -> None:
        """People (any :class:`~rlhf_jax.reward.people.AsyncLabeler`) answer every query,
        the initial ones too, in place of the synthetic labeler."""
        self.people = PeopleSeam(self.rlhf, HostLabels(labeler))

    def init_runner(self, key) -> LoopState:
        """A fresh run: the untrained policy's clips and, with the synthetic labeler, the
        initial answers and pretraining (with people, :meth:`prepare` asks them). A head start
        (:mod:`rlhf_jax.head_start`) is read here, unless the run is only traced for its shapes."""
        given = self.head_start.arrays(abstract=isinstance(key, jax.core.Tracer))
        if self.people is not None:
            return self._start(key, given)
        if not self.fit_from_python:
            return self._init(key, given)
        state = self._start(key, given)
        budget = self.learner.budget
        if budget.initial_asked:
            state = self._ask(state, jnp.int32(budget.initial_asked), budget.initial_asked)
        if not (budget.initial_asked or budget.preloaded):
            return self._refresh(state)[0]
        return self._fit_and_refresh_from_python(state, self.learner.pretrain_steps)[0]

    def _fit_and_refresh_from_python(self, state: LoopState, steps: int):
        losses = []
        for _ in range(steps):
            state, loss = self._fit_one(state)
            losses.append(loss)
        state, metrics = self._refresh(state)
        return state, {**metrics, "reward_fit_loss": jnp.mean(jnp.stack(losses)) if losses else jnp.nan}

    def fit_and_refresh(self, state: LoopState, steps: int):
        if self.fit_from_python:
            return self._fit_and_refresh_from_python(state, steps)
        return self._fit_and_refresh(state, steps)

    def prepare(self, state: LoopState, first_chunk: int, stopped=lambda: False, notes: dict | None = None) -> LoopState:
        """Before the first chunk a run (fresh, or resumed from a checkpoint saved with
        ``notes``) drives: with people, take back the queries whose answers the state does
        not hold; before RL, put the initial queries to them,
        wait for their answers (``people.wait_for_initial_labels``, until ``stopped()``) and
        pretrain on them."""
        if self.people is None:
            return state
        state = self.people.restore(state, (notes or {}).get("answers_in_state"))
        if first_chunk > 0:
            return state
        state = self.people.exchange(state, max(0, self.learner.budget.initial_asked - int(state.asked)))
        if self.config.people.wait_for_initial_labels:
            state = self.people.wait_for_answers(state, stopped)
        if stopped():  # the run stops before its first chunk: nothing to pretrain for
            return state
        return self.fit_and_refresh(state, self.learner.pretrain_steps)[0]

    def finish(self, stopped=lambda: False) -> bool:
        """With people: wait until every query asked has reached them (its clips rendered)."""
        return self.people is None or self.people.finish(stopped)

    def optimizer_states(self) -> dict[str, str]:
        return {self.config.agent: ".runner", {"preferences": "reward_model", "ibt": "ibt"}[self.config.reward]: ".learner"}

    def run_chunk(self, state: LoopState, chunk: int):
        length = self.chunk_length(chunk)
        state, metrics = self._collect(state, length)
        wanted = max(0, self.rlhf.due_after(chunk) - int(state.asked))
        if self.people is not None:
            state = self.people.exchange(state, wanted)
            state, learned = self.fit_and_refresh(state, self.rlhf.fit_steps)
        elif self.fit_from_python:
            state = self._ask(state, jnp.int32(wanted), self.rlhf.max_queries)
            state, learned = self.fit_and_refresh(state, self.rlhf.fit_steps)
        else:
            state, learned = self._learn(state, jnp.int32(wanted))
        learned["labels_waiting"] = len(self.people.host.pending) if self.people else 0
        metrics.update({k: np.full(length, v) for k, v in jax.device_get(learned).items()})
        return state, metrics

    def chunk_inputs(self, chunk: int) -> tuple[int, int]:
        return self.chunk_length(chunk), int(self.rlhf.wanted[chunk])

    def sweep_chunk(self, state: LoopState, length: int, wanted):
        """:meth:`Loop.chunk` with the chunk's learning metrics repeated per iteration, as ``run_chunk``'s."""
        state, metrics, learned = self.rlhf.chunk(state, length, wanted)
        return state, {**metrics, **{k: jnp.full(length, v) for k, v in learned.items()}}

    def checkpoint_notes(self) -> dict:
        """With people: the ids of the answers the state holds (a restore tells the label
        store, even if the run died before :meth:`checkpoint_saved` could)."""
        return {} if self.people is None else {"answers_in_state": self.people.host.in_state()}

    def checkpoint_saved(self) -> None:
        """With people: the answers in the state just saved need never be delivered again."""
        if self.people is not None:
            self.people.host.checkpoint_saved()

    def unmeasured(self, row: dict) -> set[str]:
        return self.learner.unmeasured(row)

    def reset_env(self, state: LoopState, key) -> LoopState:
        return state._replace(runner=super().reset_env(state.runner, key))

    def policy_params(self, state: LoopState):
        return state.runner.params

    def learned_reward(self, state: LoopState) -> LearnedReward:
        return LearnedReward(self.learner.reward_fn, self.learner.reward_params(state.learner))

    def save_outputs(self, state: LoopState, run_dir: Path) -> None:
        """The answers the run learned from, with their clips: ``labels.npz``."""
        write_atomically(run_dir / "labels.npz", lambda path: self.learner.save(state.learner, path))


class PeopleSeam:
    """Where people meet the loop: proposed queries leave the device as
    :class:`~rlhf_jax.reward.people.Query`, and their answers come back as the learner's typed
    answers, stored by the same :meth:`Loop.store` the synthetic labeler's go through."""

    def __init__(self, loop: Loop, host: HostLabels):
        self.loop, self.host, self.learner = loop, host, loop.learner
        self.size = loop.max_queries
        self._propose = jax.jit(loop.propose, static_argnums=1, donate_argnums=0)
        self._store = jax.jit(loop.store, donate_argnums=0)

    def restore(self, state: LoopState, in_state: list[int] | None) -> LoopState:
        """After a restart from a state holding the answers ``in_state`` (``None``: not
        recorded): the queries the labeler still holds count as asked."""
        return state._replace(asked=jnp.int32(self.host.restore(int(state.asked), in_state)))

    def exchange(self, state: LoopState, wanted: int) -> LoopState:
        """Ask people ``wanted`` more queries and store whatever answers arrived."""
        while wanted > 0:  # at most `size` queries per proposal
            state, queries = self._propose(state, self.size)
            queries = jax.device_get(queries)
            first_id = int(state.asked)
            asked = [Query(first_id + i, self.learner.kind, *(x[i] for x in queries))
                     for i in range(min(wanted, self.size))]
            self.host.ask(asked)
            state = state._replace(asked=state.asked + len(asked))
            wanted -= len(asked)
        arrived = self.host.arrived()
        for start in range(0, len(arrived), self.size):
            batch, answers = zip(*arrived[start:start + self.size])
            padding = self.size - len(batch)
            stack = lambda xs: np.concatenate([np.stack(xs), np.zeros((padding, *xs[0].shape), xs[0].dtype)])
            queries = Queries(*(stack(field) for field in zip(*((q.obs, q.action, q.oracle_reward) for q in batch))))
            state = self._store(state, queries, self.learner.answers_from_people(answers, self.size))
        return state

    def wait_for_answers(self, state: LoopState, stopped=lambda: False) -> LoopState:
        """The paper's start: RL begins once every initial query has its answer."""
        return wait_for_answers(self.host, state, lambda s: self.exchange(s, 0), stopped=stopped)

    def finish(self, stopped) -> bool:
        """The end of a run: wait until every query asked has reached people (or ``stopped()``);
        whether every one has. The queries a stop leaves unrendered are rendered by a resume."""
        labeler = self.host.labeler
        if labeler.wait_for_renders(stopped=lambda: True):
            return True
        print(f"making the clips of the last queries for people ({labeler.where()})", flush=True)
        return labeler.wait_for_renders(stopped)


def restore_latest(training, run_dir: Path):
    """The newest checkpoint of ``run_dir``: (its chunk, the runner ``training`` runs)."""
    like = jax.eval_shape(training.init_runner, jax.random.PRNGKey(0))
    return Checkpoints(run_dir, config=to_dict(training.config)).restore(like)


def make_training(config: ExperimentConfig, members: int = 1):
    """What drives a run: the agent on the true reward, or the RLHF loop (``members``: see AgentRun)."""
    if config.reward == "env":
        return Training(config, members)
    return LearnedRewardTraining(config, members)


def connect_people(training: LearnedRewardTraining, run_dir: Path) -> None:
    """``labeler: people``: the run's queries go to the label store in ``run_dir``."""
    from functools import partial

    from rlhf_jax.feedback.clips import check_renderable, render_clip
    from rlhf_jax.feedback.labeler import PeopleLabeler

    spec = training.env.spec
    check_renderable(spec.id)  # before any training, not at the first clip
    training.attach_people(PeopleLabeler(run_dir, partial(render_clip, spec), fps=spec.fps))
    print(f"queries go to people: label them with  rlhf-jax label {run_dir}", flush=True)


def check_finite(row: dict, chunk: int, unmeasured: set[str] = frozenset()) -> None:
    """Raise a :class:`RunError` when a loss in ``row`` (a chunk's metrics, as from
    :func:`summarize`) is NaN or infinite: the state after that chunk is worth nothing, and
    saving it would push a good checkpoint out. A row holds means over the chunk, so one
    bad iteration is enough to show. A NaN in ``unmeasured`` (the learner says which:
    nothing to measure yet) is no divergence."""
    for name, value in row.items():
        if "loss" not in name or math.isfinite(value):
            continue
        if math.isnan(value) and name in unmeasured:
            continue
        raise RunError(f"training diverged: {name} is {value} in chunk {chunk} (env steps up to {row['env_steps']:.0f})")


def stopped_diverging(checkpoints: Checkpoints) -> str:
    """What is left of a diverged run. Not a resume: the checkpoint holds the state, keys and
    learning rate that led to the divergence, so it would happen again, bit for bit."""
    last = checkpoints.last_intact()
    if last is None:
        return "No checkpoint was saved yet: start the run again with a smaller learning rate, say."
    return (f"The last good checkpoint, {last} ({checkpoints.directory / str(last)}), is intact, but resumed it "
            f"would diverge again the same way: start a new run with a smaller learning rate, say "
            f"(rlhf-jax eval {checkpoints.run_dir} scores the checkpoint's policy).")


class SaveSchedule:
    """When a run saves its state: after every ``run.checkpoint_every_updates`` updates (whole
    chunks, at least one), after its last chunk, and once ``run.checkpoint_every_minutes`` of
    wall-clock time have passed since the last save (or the start), but never sooner than 19
    times the last save's duration after it, so that saving takes at most about 5% of a run."""

    def __init__(self, run: RunConfig, chunk_iterations: int, num_chunks: int, clock=time.monotonic):
        self.every = max(1, run.checkpoint_every_updates // chunk_iterations)
        self.seconds, self.num_chunks, self.clock = run.checkpoint_every_minutes * 60, num_chunks, clock
        self._last, self._took = clock(), 0.0  # when the last save ended, how long it took

    def due(self, chunk: int) -> bool:
        """Whether the state after ``chunk`` is to be saved."""
        timed = self.seconds > 0 and self.clock() - self._last >= max(self.seconds, 19 * self._took)
        return (chunk + 1) % self.every == 0 or chunk + 1 == self.num_chunks or timed

    def saved(self, started: float) -> None:
        """A save that began at ``started`` (on ``clock``) has ended."""
        self._last = self.clock()
        self._took = self._last - started


class StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM, while the block runs, ask the run to stop where its state is
    whole: after the chunk in flight, whose state it then saves (:attr:`requested`). Nothing is
    raised inside a compiled call: an interrupt there lost the state it had donated to it, and
    could end in a segfault. A second signal stops at once, as a kill would, saying which
    checkpoint is the newest (``hint()``). Handlers are set in the main thread only, before
    anything renders a clip: SDL (pygame's, which draws them) takes a SIGTERM nobody handles
    for itself, and a people run then ignored SIGTERM. A signal the process was started
    ignoring (a background job's Ctrl-C) stays ignored; the previous handlers come back after
    the block."""

    NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}

    def __init__(self):
        self.signal: int | None = None
        self.hint = lambda: ""  # which checkpoint is intact, for a stop at once
        self._previous = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.NAMES
                              if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, number: int, frame) -> None:
        # os.write, not print: a handler may run in the middle of a print to the same stream.
        if self.signal is not None:
            os.write(2, f"\n{self.NAMES[number]} again: stopped at once. {self.hint()}\n".encode())
            os._exit(128 + number)
        self.signal = number
        os.write(2, f"\n{self.NAMES[number]}: stopping where the run's state is whole, after the chunk in "
                    f"flight, and saving it (again to stop at once)\n".encode())

    def interrupted(self, what: str) -> Interrupted:
        """The error a run stopped by the signal raises; ``what``: how far it got, what is saved."""
        return Interrupted(self.signal, f"interrupted by {self.NAMES[self.signal]} {what}")


def apply_config_edits(training: AgentRun, checkpoints: Checkpoints, chunk: int, state):
    """``state`` (restored from checkpoint ``chunk``) under the run's config.yaml, which may have
    been edited since the checkpoint was written: a hyper-parameter its optimiser keeps in the
    state (``config_base.in_state``, the learning rates) takes its new value there; a change a
    resume cannot apply (one compiled into the program or shaping the state) is refused, naming
    every such key, before anything is written. Keys of how the run is driven (``run.*``,
    ``people.*``) are free (:func:`rlhf_jax.checkpoints.editable_on_resume`)."""
    saved = checkpoints.saved_config(chunk)
    if saved is None:  # a checkpoint from before configs were saved with them
        return state
    diff = config_diff(saved, to_dict(training.config))
    refused = [f"{key}: {before} when saved, {now} now" for key, (before, now) in diff.items()
               if not editable_on_resume(key)]
    if refused:
        raise ConfigError(
            f"{checkpoints.run_dir / CONFIG_FILE} was changed since checkpoint {chunk} was written, in keys a resume "
            f"cannot apply (they are compiled into the run or shape its state): {'; '.join(refused)}. Put those "
            f"values back to resume, or start a new run with them. Nothing was overwritten: the run directory is "
            f"as it was.")
    where = training.optimizer_states()
    for key, (before, now) in diff.items():
        section = key.split(".")[0]
        if is_in_state(ExperimentConfig, key) and section in where:
            state = set_hyperparameter(state, where[section], before, now, key)
            print(f"{key}: {before} when saved, {now} now: the resumed run uses {now}", flush=True)
    return state


def set_hyperparameter(state, prefix: str, before: float, now: float, key: str):
    """``state`` with the in-state hyper-parameter ``key`` changed from ``before`` to ``now``:
    in the optimiser states under path ``prefix``, every ``hyperparams`` value equal to ``before``
    (one per ensemble member, say). Each optimiser holds one marked hyper-parameter, so the
    value names it."""
    found = 0

    def replace(path, leaf):
        nonlocal found
        name = jax.tree_util.keystr(path)
        if not name.startswith(prefix) or ".hyperparams" not in name:
            return leaf
        match = leaf == jnp.asarray(before, leaf.dtype)
        found += int(match.sum())
        return jnp.where(match, jnp.asarray(now, leaf.dtype), leaf)

    state = jax.tree_util.tree_map_with_path(replace, state)
    if not found:
        raise ConfigError(f"{key} was changed, but the checkpoint holds no optimiser state with its old value "
                          f"{before}: put it back to resume")
    return state


def train(config: ExperimentConfig | None = None, resume: str | Path | None = None, progress: bool = True) -> Path:
    """Train from scratch (``config``) or continue the run in ``resume``; returns the run directory.

    A run resumed before its first checkpoint starts again from the beginning, in the same
    directory (with people, the queries they have answered meanwhile are kept). A resume
    restores before it writes anything, so one that cannot (config.yaml edited in keys a resume
    cannot apply) leaves the run directory as it was. A run stops with a :class:`RunError`, its
    last checkpoint intact, when a file cannot be written (disk full) or a loss stops being
    finite (the state after that chunk is not saved), and with an :class:`Interrupted` after
    Ctrl-C or SIGTERM, the state after its last chunk saved (:class:`StopRequests`)."""
    with StopRequests() as stop:
        return _train(config, resume, progress, stop)


def _train(config: ExperimentConfig | None, resume: str | Path | None, progress: bool, stop: StopRequests) -> Path:
    if resume is not None:
        run_dir = Path(resume)
        config = load_run_config(run_dir)
    require_wandb(config.run)  # before anything is written
    training = make_training(config)
    new = resume is None  # a run this command starts: taken back if it cannot start
    if new:
        run_dir = new_run_dir(config)
    checkpoints = Checkpoints(run_dir, config=to_dict(config))
    stop.hint = checkpoints.resume_hint
    if resume is not None and checkpoints.latest() is None:
        resume = None
        print(f"{run_dir} has no checkpoint yet: starting it from the beginning", flush=True)
    first_chunk = 0
    if resume is not None:
        saved_chunk, runner = checkpoints.restore(jax.eval_shape(training.init_runner, jax.random.PRNGKey(config.seed)))
        runner = apply_config_edits(training, checkpoints, saved_chunk, runner)
        first_chunk = saved_chunk + 1
    with stop_on_write_failure(checkpoints, f"to {run_dir}"), contextlib.ExitStack() as started:
        try:
            wandb_run = started.enter_context(logging_to_wandb(config, run_dir, run_dir.name))
        except RunError:
            if new:
                remove_unstarted_run(run_dir, checkpoints)
            raise
        if config.labeler == "people":
            connect_people(training, run_dir)
        log = MetricsLog(run_dir, tensorboard=config.run.tensorboard, wandb=wandb_run)
        if resume is None:
            log.truncate_after(0)  # rows of an attempt that never reached a checkpoint
            runner = training.init_runner(jax.random.PRNGKey(config.seed))
        else:
            if training.env.spec.backend.startswith("envpool"):
                # The saved handle points into a pool that died with the old process.
                runner = training.reset_env(runner, jax.random.PRNGKey(config.seed))
            log.truncate_after(int(runner.env_steps))
        print(f"run directory: {run_dir}", flush=True)
        runner = training.prepare(runner, first_chunk, stop.requested, checkpoints.notes(first_chunk - 1) if resume else None)

        from tqdm import tqdm

        total_steps = training.total_iterations * training.steps_per_iteration
        bar = tqdm(total=total_steps, initial=int(runner.env_steps), unit="step", unit_scale=True,
                   disable=not progress, dynamic_ncols=True)
        schedule = SaveSchedule(config.run, training.chunk_iterations, training.num_chunks)
        saved_chunk = first_chunk - 1  # the newest chunk whose state is saved
        score = training.task_scorer()
        try:
            for chunk in range(first_chunk, training.num_chunks):
                if stop.requested():
                    break
                start = time.perf_counter()
                runner, metrics = training.run_chunk(runner, chunk)
                row = summarize(metrics)
                row["steps_per_second"] = (row["env_steps"] - bar.n) / (time.perf_counter() - start)
                if score is not None:
                    row["task_return"] = score(training.policy_params(runner))
                log.append(row)
                try:
                    check_finite(row, chunk, training.unmeasured(row))
                except RunError as error:
                    raise RunError(f"{error}, so its state was not saved. {stopped_diverging(checkpoints)}") from None
                bar.update(int(row["env_steps"]) - bar.n)
                shown = {"steps_per_s": f"{row['steps_per_second']:.3g}", "true_return": f"{judged_return(row):.4g}"}
                if "labels" in row:
                    shown["labels"] = int(row["labels"])
                bar.set_postfix(shown)
                if schedule.due(chunk) or stop.requested():
                    started = schedule.clock()
                    checkpoints.save(chunk, runner, training.checkpoint_notes())
                    training.checkpoint_saved()
                    schedule.saved(started)
                    saved_chunk = chunk
            if stop.requested():
                done = (f"after {saved_chunk + 1} of its {training.num_chunks} chunks" if saved_chunk >= first_chunk
                        else "before it finished a chunk")
                raise stop.interrupted(f"{done}. {checkpoints.resume_hint()}")
        finally:
            bar.close()
            log.close()
            checkpoints.close()
        title = f"{config.agent} on {config.env.id}" + {"preferences": " from preferences", "ibt": " from IBT marks"}.get(config.reward, "")
        rows = log.rows()
        # People answer at their own pace: their run's curve marks when the answers arrived.
        write_atomically(run_dir / "learning_curve.png",
                         lambda path: plot_learning_curve(rows, path, title, mark_labels=config.labeler == "people"))
        training.save_outputs(runner, run_dir)
        if not training.finish(stop.requested):
            raise stop.interrupted(f"after the run's last chunk, while the clips of its last queries were made "
                                   f"for people: rlhf-jax train --resume {run_dir} makes the rest")
        if wandb_run is not None:
            wandb_run.log_image("learning_curve", run_dir / "learning_curve.png")
            if config.labeler == "people":
                from rlhf_jax.feedback.store import STORE_FILE, LabelStore

                store = LabelStore(run_dir / STORE_FILE, config.people)
                wandb_run.log_label_counts(store.counts(training.learner.kind))
    return run_dir


def evaluate_run(run_dir: str | Path, episodes: int | None = None, seed: int = 0, videos: int = 0,
                 say=print) -> dict:
    """Score the run's latest policy on whole true episodes (the agent's evaluation protocol),
    write the first ``videos`` of them as MP4s (:mod:`rlhf_jax.episode_video`) and the result
    as ``eval.json``. ``say`` shows the score (as JSON) before anything is written, so a write
    that fails (a read-only or full disk) stops with a :class:`RunError` but loses no score."""
    from rlhf_jax import episode_video

    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    num_envs = episodes or config.run.eval_episodes
    if videos:
        episode_video.check_video_request(config.env.id, videos, num_envs)
    training = make_training(config)
    _, runner = restore_latest(training, run_dir)
    env = make(dataclasses.replace(scoring_env_config(config), num_envs=num_envs))
    max_steps = scoring_steps(config, env.spec)
    act = training.agent.make_policy(training.agent_config, env.spec)
    params, key = training.policy_params(runner), jax.random.PRNGKey(seed)
    score = jax.jit(lambda params, key: evaluate(act, params, env, key, max_steps))(params, key)
    finished, mean_return = int(score.episodes), score.mean_return()
    result = {
        "env": config.env.id, "agent": config.agent, "env_steps": int(runner.env_steps),
        "episodes": finished, "mean_true_return": None if math.isnan(mean_return) else mean_return,
    }
    say(json.dumps(result, indent=2))
    try:
        if videos:
            # The same key and environment as the score: the videos show episodes it counted.
            learned = training.learned_reward(runner)  # None on the true reward: no r-hat panel
            reward_fn, reward_params = (None, None) if learned is None else learned
            record = jax.jit(lambda params, reward_params, key: record_episodes(
                act, params, env, key, max_steps, videos, reward_fn, reward_params))
            recording = record(params, reward_params, key)
            written = episode_video.write_episode_videos(env.spec, recording, run_dir)
            result["videos"] = [{**video._asdict(), "path": str(video.path)} for video in written]
            say("videos: " + ", ".join(video["path"] for video in result["videos"]))
        (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    except OSError as error:
        raise RunError(f"cannot write to {run_dir}: {error}: the score above is not saved") from None
    return result
