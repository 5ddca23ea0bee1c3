"""``rlhf-jax train`` and ``rlhf-jax eval``: an agent's run in compiled chunks, saved as it goes.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.csv`` and
``tensorboard/`` (one row per chunk), ``checkpoints/`` (orbax), and at the end
``learning_curve.png``; ``rlhf-jax eval`` adds ``eval.json``.

The run is the agent's ``iteration`` scanned over chunks of iterations: one compiled
call per chunk, nothing crossing to the host inside it. Between chunks the host
logs, draws the progress bar and checkpoints. A resumed run restores the whole runner
(parameters, optimiser state, environment state, random key) at a chunk boundary, so
on CPU it ends with the same parameters as a run never interrupted. EnvPool's pools
live outside JAX and cannot be restored: a resumed EnvPool run starts fresh episodes.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from datetime import datetime
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from rlhf_jax.agents import get_agent
from rlhf_jax.agents.base import env_reward
from rlhf_jax.checkpoints import Checkpoints, stop_on_write_failure
from rlhf_jax.config import ExperimentConfig, build, to_dict
from rlhf_jax.config_base import CONFIG_FILE, read_run_config
from rlhf_jax.envs import ATARI_NAMES, EnvConfig, make
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.evaluation import evaluate
from rlhf_jax.loop import Loop, LoopState
from rlhf_jax.reward.ibt_learner import IBTLearner
from rlhf_jax.reward.learner import Queries, RewardLearner
from rlhf_jax.reward.people import HostLabels, Query, wait_for_answers
from rlhf_jax.reward.preference_learner import PreferenceLearner
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.metrics_log import MetricsLog, plot_learning_curve

def new_run_dir(config: ExperimentConfig) -> Path:
    if config.run.dir:
        path = Path(config.run.dir)
        if (path / CONFIG_FILE).exists():
            raise ConfigError(f"{path} already holds a run; resume it with --resume {path} or choose another run.dir")
    else:
        path = Path("runs") / f"{config.name}-{datetime.now():%Y%m%d-%H%M%S}"
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def load_run_config(run_dir: str | Path) -> ExperimentConfig:
    return build(ExperimentConfig, read_run_config(run_dir))


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

    def reset_env(self, runner, key):
        """``runner`` (an agent's) with freshly reset environments: after restoring an EnvPool run."""
        env_state, timestep = self.env.reset(key)
        return runner._replace(env_state=env_state, obs=timestep.obs)

    def restore_latest(self, run_dir: Path):
        return restore_latest(self, run_dir)

    def prepare(self, runner, first_chunk: int):
        """Anything a run does once before its first chunk (fresh or resumed): nothing here."""
        return runner

    def checkpoint_saved(self, chunk: int) -> None:
        """Called once the state after ``chunk`` is safely on disk: nothing to tell here."""

    def unmeasured(self, row: dict) -> set[str]:
        """The losses in a chunk's ``row`` that a NaN leaves unmeasured rather than diverged: none here."""
        return set()

    def save_outputs(self, state, run_dir: Path) -> None:
        """What a finished run writes besides its checkpoints and metrics: nothing here."""


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


def make_learner(config: ExperimentConfig, spec) -> RewardLearner:
    """The reward learner ``config.reward`` names, for an environment of ``spec``."""
    if config.reward == "preferences":
        return PreferenceLearner(config.preferences, config.reward_model, spec)
    return IBTLearner(config.ibt, spec)


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
        self.learner = make_learner(config, self.env.spec)
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
        initial answers and pretraining (with people, :meth:`prepare` asks them)."""
        if self.people is not None:
            return self._start(key)
        if not self.fit_from_python:
            return self._init(key)
        state = self._start(key)
        initial = self.learner.budget.initial
        if not initial:
            return self._refresh(state)[0]
        state = self._ask(state, jnp.int32(initial), initial)
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

    def prepare(self, state: LoopState, first_chunk: int) -> LoopState:
        """Before the first chunk a run (fresh or resumed) drives: with people, take back the
        queries the label store still holds; before RL, put the initial queries to them,
        wait for their answers (``people.wait_for_initial_labels``) and pretrain on them."""
        if self.people is None:
            return state
        state = self.people.restore(state)
        if first_chunk > 0:
            return state
        state = self.people.exchange(state, max(0, self.learner.budget.initial - int(state.asked)), -1)
        if self.config.people.wait_for_initial_labels:
            state = self.people.wait_for_answers(state)
        return self.fit_and_refresh(state, self.learner.pretrain_steps)[0]

    def run_chunk(self, state: LoopState, chunk: int):
        length = self.chunk_length(chunk)
        state, metrics = self._collect(state, length)
        wanted = max(0, self.rlhf.due_after(chunk) - int(state.asked))
        if self.people is not None:
            state = self.people.exchange(state, wanted, chunk)
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

    def checkpoint_saved(self, chunk: int) -> None:
        """The answers people gave up to ``chunk`` are in the checkpoint just saved."""
        if self.people is not None:
            self.people.host.checkpoint_saved(chunk)

    def unmeasured(self, row: dict) -> set[str]:
        return self.learner.unmeasured(row)

    def reset_env(self, state: LoopState, key) -> LoopState:
        return state._replace(runner=super().reset_env(state.runner, key))

    def policy_params(self, state: LoopState):
        return state.runner.params

    def save_outputs(self, state: LoopState, run_dir: Path) -> None:
        """The answers the run learned from, with their clips: ``labels.npz``."""
        self.learner.save(state.learner, run_dir / "labels.npz")


class PeopleSeam:
    """Where people meet the loop: proposed queries leave the device as
    :class:`~rlhf_jax.reward.people.Query`, and their answers come back as the learner's typed
    answers, stored by the same :meth:`Loop.store` the synthetic labeler's go through."""

    def __init__(self, loop: Loop, host: HostLabels):
        self.loop, self.host, self.learner = loop, host, loop.learner
        self.size = loop.max_queries
        self._propose = jax.jit(loop.propose, static_argnums=1, donate_argnums=0)
        self._store = jax.jit(loop.store, donate_argnums=0)

    def restore(self, state: LoopState) -> LoopState:
        """After a restart: the queries the labeler still holds count as asked."""
        return state._replace(asked=jnp.int32(self.host.restore(int(state.asked))))

    def exchange(self, state: LoopState, wanted: int, chunk: int) -> LoopState:
        """Ask people ``wanted`` more queries and store whatever answers arrived
        (during ``chunk``; -1: before RL)."""
        while wanted > 0:  # at most `size` queries per proposal
            state, queries = self._propose(state, self.size)
            queries = jax.device_get(queries)
            first_id = int(state.asked)
            asked = [Query(first_id + i, self.learner.kind, *(x[i] for x in queries))
                     for i in range(min(wanted, self.size))]
            self.host.ask(asked)
            state = state._replace(asked=state.asked + len(asked))
            wanted -= len(asked)
        arrived = self.host.arrived(chunk)
        for start in range(0, len(arrived), self.size):
            batch, answers = zip(*arrived[start:start + self.size])
            padding = self.size - len(batch)
            stack = lambda xs: np.concatenate([np.stack(xs), np.zeros((padding, *xs[0].shape), xs[0].dtype)])
            queries = Queries(*(stack(field) for field in zip(*((q.obs, q.action, q.oracle_reward) for q in batch))))
            state = self._store(state, queries, self.learner.answers_from_people(answers, self.size))
        return state

    def wait_for_answers(self, state: LoopState) -> LoopState:
        """The paper's start: RL begins once every initial query has its answer."""
        return wait_for_answers(self.host, state, lambda s: self.exchange(s, 0, -1))


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


def train(config: ExperimentConfig | None = None, resume: str | Path | None = None, progress: bool = True) -> Path:
    """Train from scratch (``config``) or continue the run in ``resume``; returns the run directory.

    A run resumed before its first checkpoint starts again from the beginning, in the same
    directory (with people, the queries they have answered meanwhile are kept). A resume
    restores before it writes anything, so one that cannot (config.yaml edited to other
    shapes) leaves the run directory as it was. A run stops with a :class:`RunError`, its
    last checkpoint intact, when a file cannot be written (disk full) or a loss stops being
    finite (the state after that chunk is not saved)."""
    if resume is not None:
        run_dir = Path(resume)
        config = load_run_config(run_dir)
    training = make_training(config)
    if resume is None:
        run_dir = new_run_dir(config)
    checkpoints = Checkpoints(run_dir, config=to_dict(config))
    if resume is not None and checkpoints.latest() is None:
        resume = None
        print(f"{run_dir} has no checkpoint yet: starting it from the beginning", flush=True)
    if config.labeler == "people":
        connect_people(training, run_dir)
    first_chunk = 0
    if resume is not None:
        saved_chunk, runner = checkpoints.restore(jax.eval_shape(training.init_runner, jax.random.PRNGKey(config.seed)))
        first_chunk = saved_chunk + 1
    log = MetricsLog(run_dir, tensorboard=config.run.tensorboard)
    if resume is None:
        log.truncate_after(0)  # rows of an attempt that never reached a checkpoint
        runner = training.init_runner(jax.random.PRNGKey(config.seed))
    else:
        if training.env.spec.backend.startswith("envpool"):
            # The saved handle points into a pool that died with the old process.
            runner = training.reset_env(runner, jax.random.PRNGKey(config.seed))
        log.truncate_after(int(runner.env_steps))
    print(f"run directory: {run_dir}", flush=True)
    runner = training.prepare(runner, first_chunk)

    from tqdm import tqdm

    total_steps = training.total_iterations * training.steps_per_iteration
    bar = tqdm(total=total_steps, initial=int(runner.env_steps), unit="step", unit_scale=True,
               disable=not progress, dynamic_ncols=True)
    every = max(1, config.run.checkpoint_every_updates // training.chunk_iterations)
    state_chunk = saved_chunk = first_chunk - 1  # the chunk `runner` holds the state after
    with stop_on_write_failure(checkpoints, f"to {run_dir}"):
        try:
            for chunk in range(first_chunk, training.num_chunks):
                start = time.perf_counter()
                runner, metrics = training.run_chunk(runner, chunk)
                row = summarize(metrics)
                row["steps_per_second"] = (row["env_steps"] - bar.n) / (time.perf_counter() - start)
                log.append(row)
                try:
                    check_finite(row, chunk, training.unmeasured(row))
                except RunError as error:
                    raise RunError(f"{error}, so its state was not saved. {stopped_diverging(checkpoints)}") from None
                state_chunk = chunk
                bar.update(int(row["env_steps"]) - bar.n)
                shown = {"steps_per_s": f"{row['steps_per_second']:.3g}", "true_return": f"{row['episode_return']:.4g}"}
                if "labels" in row:
                    shown["labels"] = int(row["labels"])
                bar.set_postfix(shown)
                if (chunk + 1) % every == 0 or chunk + 1 == training.num_chunks:
                    checkpoints.save(chunk, runner)
                    training.checkpoint_saved(chunk)
                    saved_chunk = chunk
        except KeyboardInterrupt:
            bar.close()
            # Save the newest whole state, unless the interrupt came while its buffers were
            # being handed to the next chunk (they are donated), where the last save stands.
            if state_chunk > saved_chunk and not any(x.is_deleted() for x in jax.tree.leaves(runner)):
                checkpoints.save(state_chunk, jax.block_until_ready(runner))
                training.checkpoint_saved(state_chunk)
            print(f"interrupted: resume with  rlhf-jax train --resume {run_dir}", flush=True)
            raise
        finally:
            bar.close()
            log.close()
            checkpoints.close()
        title = f"{config.agent} on {config.env.id}" + {"preferences": " from preferences", "ibt": " from IBT marks"}.get(config.reward, "")
        plot_learning_curve(log.rows(), run_dir / "learning_curve.png", title)
        training.save_outputs(runner, run_dir)
    return run_dir


def evaluate_run(run_dir: str | Path, episodes: int | None = None, seed: int = 0) -> dict:
    """Score the run's latest policy on whole true episodes (the agent's evaluation protocol)."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    training = make_training(config)
    _, runner = restore_latest(training, run_dir)
    num_envs = episodes or config.run.eval_episodes
    env = make(dataclasses.replace(config.env, num_envs=num_envs, seed=config.env.seed + 10_000))
    max_steps = config.run.eval_max_steps or env.spec.max_episode_steps + 1
    act = training.agent.make_policy(training.agent_config, env.spec)
    score = jax.jit(lambda params, key: evaluate(act, params, env, key, max_steps))(training.policy_params(runner), jax.random.PRNGKey(seed))
    finished = int(score["episodes"])
    result = {
        "env": config.env.id, "agent": config.agent, "env_steps": int(runner.env_steps),
        "episodes": finished,
        "mean_true_return": float(score["episode_return_sum"]) / finished if finished else None,
    }
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
