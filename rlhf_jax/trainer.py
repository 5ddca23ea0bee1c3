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
from rlhf_jax.config import ExperimentConfig, build, read_yaml, to_dict
from rlhf_jax.envs import ATARI_NAMES, EnvConfig, make
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.evaluation import evaluate
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.metrics_log import MetricsLog, plot_learning_curve

CONFIG_FILE = "config.yaml"


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
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    return build(ExperimentConfig, read_yaml(run_dir / CONFIG_FILE))


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
    command needs of any run, whatever the reward (true here, learned in the pipeline)."""

    def __init__(self, config: ExperimentConfig, env_config: EnvConfig, members: int = 1):
        """``members``: the runs of a sweep that will share this one's environment (``envs.make``)."""
        self.config = config
        self.agent = get_agent(config.agent)
        self.agent_config = getattr(config, config.agent)
        self.env = make(env_config, members)
        self.total_iterations = self.agent.num_iterations(self.agent_config, self.env)
        self.steps_per_iteration = self.agent.env_steps_per_iteration(self.agent_config, self.env)
        self.chunk_iterations = max(1, min(self.total_iterations, config.run.chunk_env_steps // self.steps_per_iteration))
        self.num_chunks = math.ceil(self.total_iterations / self.chunk_iterations)
        self.loop = resolve_loop(config.run.loop, self.env.spec)

    def chunk_length(self, chunk: int) -> int:
        done = chunk * self.chunk_iterations
        return min(self.chunk_iterations, self.total_iterations - done)

    def chunk_inputs(self, chunk: int) -> tuple[int, int]:
        """What :meth:`sweep_chunk` needs to know of chunk ``chunk``: its length in iterations
        and the labels the synthetic labeler answers at its end (none here)."""
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
        """Called once the state after ``chunk`` is safely on disk: the answers people gave
        up to then (``host``, the learned-reward loops' :class:`HostLabels`) are in it."""
        if getattr(self, "host", None) is not None:
            self.host.checkpoint_saved(chunk)


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


def restore_latest(training, run_dir: Path):
    """The newest checkpoint of ``run_dir``: (its chunk, the runner ``training`` runs)."""
    like = jax.eval_shape(training.init_runner, jax.random.PRNGKey(0))
    return Checkpoints(run_dir, config=to_dict(training.config)).restore(like)


def make_training(config: ExperimentConfig, members: int = 1):
    """What drives a run: the agent on the true reward, or the RLHF loop (``members``: see AgentRun)."""
    if config.reward == "preferences":
        from rlhf_jax.pipeline import RLHFTraining

        return RLHFTraining(config, members=members)
    if config.reward == "ibt":
        from rlhf_jax.ibt_pipeline import IBTTraining

        return IBTTraining(config, members=members)
    return Training(config, members)


def connect_people(training, config: ExperimentConfig, run_dir: Path) -> None:
    """``labeler: people``: the run's queries go to the label store in ``run_dir``."""
    from functools import partial

    from rlhf_jax.feedback.clips import check_renderable, render_clip
    from rlhf_jax.feedback.labeler import PeopleLabeler
    from rlhf_jax.reward.people import HostLabels

    spec = training.env.spec
    check_renderable(spec.id)  # before any training, not at the first clip
    labeler = PeopleLabeler(run_dir, partial(render_clip, spec), fps=spec.fps)
    training.host = HostLabels(labeler)
    print(f"queries go to people: label them with  rlhf-jax label {run_dir}", flush=True)


# A NaN in these means "nothing to measure yet", not a diverged model.
NAN_MEANS_NO_DATA = {"reward_val_loss"}  # no member has a held-out label yet
NAN_MEANS_NO_LABELS = {"reward_train_loss", "ibt_loss"}  # before the first label


def check_finite(row: dict, chunk: int) -> None:
    """Raise a :class:`RunError` when a loss in ``row`` (a chunk's metrics, as from
    :func:`summarize`) is NaN or infinite: the state after that chunk is worth nothing, and
    saving it would push a good checkpoint out. A row holds means over the chunk, so one
    bad iteration is enough to show."""
    for name, value in row.items():
        if "loss" not in name or math.isfinite(value):
            continue
        if math.isnan(value) and (name in NAN_MEANS_NO_DATA or (name in NAN_MEANS_NO_LABELS and not row.get("labels"))):
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
        connect_people(training, config, run_dir)
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
                    check_finite(row, chunk)
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
        if hasattr(training, "save_labels"):
            training.save_labels(runner, run_dir / "labels.npz")
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
