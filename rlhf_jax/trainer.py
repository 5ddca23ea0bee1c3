"""``rlhf-jax train`` and ``rlhf-jax eval``: an agent's run in compiled chunks, saved as it goes.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.csv`` and
``tensorboard/`` (one row per chunk), ``checkpoints/`` (orbax), and at the end
``learning_curve.png``; ``rlhf-jax eval`` adds ``eval.json`` (and with ``--video``,
``eval/episode_<k>.mp4``).

The run is a :class:`~rlhf_jax.driver.Driver`'s chunks, each one compiled call with
nothing crossing to the host inside it (:mod:`rlhf_jax.driver`), run by the host loop that
sweeps share (:mod:`rlhf_jax.host_loop`); between chunks this command logs, draws the
progress bar and checks for divergence. A resumed run restores the whole state (parameters,
optimiser state, environment state, random key) at a chunk boundary, so on CPU it ends with
the same parameters as a run never interrupted. EnvPool's pools live outside JAX and cannot be
restored: a resumed EnvPool run starts fresh episodes. Checkpoints come every so many updates
and every half minute (:class:`~rlhf_jax.run_control.SaveSchedule`); Ctrl-C and SIGTERM stop a
run after the chunk in flight, saved (:class:`~rlhf_jax.run_control.StopRequests`); a resume
applies an edited learning rate and refuses other edits
(:func:`~rlhf_jax.run_dir.apply_config_edits`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

import jax

from rlhf_jax.checkpoints import Checkpoints, stop_on_write_failure
from rlhf_jax.config import ExperimentConfig, to_dict
from rlhf_jax.driver import Driver, scoring_env_config, scoring_steps
from rlhf_jax.envs import make
from rlhf_jax.errors import RunError
from rlhf_jax.evaluation import evaluate, record_episodes
from rlhf_jax.files import write_atomically
from rlhf_jax.host_loop import ChunkDone, run_chunks, summarize
from rlhf_jax.metrics_log import MetricsLog, judged_return, plot_learning_curve
from rlhf_jax.people_seam import check_people, connect_people
from rlhf_jax.run_control import StopRequests, check_finite, stopped_diverging
from rlhf_jax.run_dir import apply_config_edits, load_run_config, new_run_dir, remove_unstarted_run
from rlhf_jax.wandb_log import logging_to_wandb, require_wandb


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
    if config.labeler == "people":
        check_people(config.env.id)
    driver = Driver(config)
    new = resume is None  # a run this command starts: taken back if it cannot start
    if new:
        run_dir = new_run_dir(config)
    checkpoints = Checkpoints(run_dir, config=to_dict(config))
    stop.hint = checkpoints.resume_hint
    if resume is not None and checkpoints.latest() is None:
        resume = None
        print(f"{run_dir} has no checkpoint yet: starting it from the beginning", flush=True)
    first_chunk, finished = 0, False
    if resume is not None:
        saved_chunk, state = checkpoints.restore(driver.abstract_state())
        # A finished run whose outputs were written has nothing to resume: it ran no chunk, yet
        # drew its curve again and logged that to W&B as a row of its own. One killed after its
        # last checkpoint goes on to write them; a people run to make any clips still missing.
        finished = saved_chunk + 1 >= driver.num_chunks and outputs_written(driver, run_dir)
        if finished:
            print(f"{run_dir} is finished: all {driver.num_chunks} chunks ({int(state.env_steps)} env steps) were "
                  f"run; nothing to resume" + (", but the clips of its last queries, if any are missing"
                                                 if config.labeler == "people" else ""), flush=True)
            if config.labeler != "people":
                checkpoints.close()
                return run_dir
        state = apply_config_edits(driver, checkpoints, saved_chunk, state)
        first_chunk = saved_chunk + 1
    with stop_on_write_failure(checkpoints, f"to {run_dir}"), contextlib.ExitStack() as started:
        try:  # a finished run logs nothing more
            wandb_run = None if finished else started.enter_context(logging_to_wandb(config, run_dir, run_dir.name))
        except RunError:
            if new:
                remove_unstarted_run(run_dir, checkpoints)
            raise
        people = connect_people(driver, run_dir) if config.labeler == "people" else None
        log = MetricsLog(run_dir, tensorboard=config.run.tensorboard, wandb=wandb_run)
        if resume is None:
            log.truncate_after(0)  # rows of an attempt that never reached a checkpoint
            state = driver.init(jax.random.PRNGKey(config.seed))
        else:
            if driver.env.spec.backend.startswith("envpool"):
                # The saved handle points into a pool that died with the old process.
                state = driver.loop.reset_env(state, jax.random.PRNGKey(config.seed))
            log.truncate_after(int(state.env_steps))
        print(f"run directory: {run_dir}", flush=True)
        if people:
            state = people.prepare(state, first_chunk, stop.requested, checkpoints.notes(first_chunk - 1) if resume else None)

        from tqdm import tqdm

        if first_chunk < driver.num_chunks:
            # XLA compiles a chunk when it is first run: say so, or the bar sits at its start in silence.
            print("compiling the first chunk (this can take a minute) ...", flush=True)
        bar = tqdm(total=driver.loop.total_env_steps, initial=int(state.env_steps), unit="step", unit_scale=True,
                   disable=not progress, dynamic_ncols=True)
        score = driver.task_scorer()

        def report(done: ChunkDone) -> None:
            if done.chunk == first_chunk:
                bar.write(f"compiled and ran the first chunk in {done.seconds:.1f} s", file=sys.stdout)
            row = summarize(done.metrics, done.learned)
            row["steps_per_second"] = (row["env_steps"] - bar.n) / done.seconds
            if score is not None:
                row["task_return"] = score(driver.policy_params(done.state))
            log.append(row)
            try:
                check_finite(row, done.chunk, driver.unmeasured(row))
            except RunError as error:
                raise RunError(f"{error}, so its state was not saved. {stopped_diverging(checkpoints)}") from None
            bar.update(int(row["env_steps"]) - bar.n)
            shown = {"steps_per_s": f"{row['steps_per_second']:.3g}", "true_return": f"{judged_return(row):.4g}"}
            if "labels" in row:
                shown["labels"] = int(row["labels"])
            bar.set_postfix(shown)

        try:
            state, saved_chunk, stopped = run_chunks(driver, state, first_chunk, checkpoints, stop, config.run,
                                                     driver.loop.chunk_iterations, report)
            if stopped:
                done = (f"after {saved_chunk + 1} of its {driver.num_chunks} chunks" if saved_chunk >= first_chunk
                        else "before it finished a chunk")
                raise stop.interrupted(f"{done}. {checkpoints.resume_hint()}")
        finally:
            bar.close()
            log.close()
            checkpoints.close()
        title = f"{config.agent} on {config.env.id}" + (f" from {driver.kind.learns_from}" if driver.kind else "")
        rows = log.rows()
        # People answer at their own pace: their run's curve marks when the answers arrived.
        write_atomically(run_dir / "learning_curve.png",
                         lambda path: plot_learning_curve(rows, path, title, mark_labels=people is not None))
        driver.save_outputs(state, run_dir)
        if people and not people.finish(stop.requested):
            raise stop.interrupted(f"after the run's last chunk, while the clips of its last queries were made "
                                   f"for people: rlhf-jax train --resume {run_dir} makes the rest")
        if wandb_run is not None:
            wandb_run.log_image("learning_curve", run_dir / "learning_curve.png")
            if people:
                from rlhf_jax.feedback.store import STORE_FILE, LabelStore

                store = LabelStore(run_dir / STORE_FILE, config.people)
                wandb_run.log_label_counts(store.counts(driver.kind.name))
    return run_dir


def outputs_written(driver: Driver, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds what its run writes after its last chunk: the learning curve and,
    with a learned reward, ``labels.npz`` (:meth:`~rlhf_jax.driver.Driver.save_outputs`)."""
    return (run_dir / "learning_curve.png").is_file() and (driver.learner is None or (run_dir / "labels.npz").is_file())


def evaluate_run(run_dir: str | Path, episodes: int | None = None, seed: int = 0, videos: int = 0,
                 say=print, greedy: bool = False) -> dict:
    """Score the run's latest policy on whole true episodes (the agent's evaluation protocol),
    sampled as in training or, ``greedy``, by its most likely action; write the first
    ``videos`` of them as MP4s (:mod:`rlhf_jax.episode_video`) and the result as ``eval.json``.
    ``say`` shows the score (as JSON) before anything is written, so a write that fails (a
    read-only or full disk) stops with a :class:`RunError` but loses no score."""
    from rlhf_jax import episode_video

    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    num_envs = episodes or config.run.eval_episodes
    if videos:
        episode_video.check_video_request(config.env.id, videos, num_envs)
    driver = Driver(config)
    _, state = driver.restore_latest(run_dir)
    env = make(dataclasses.replace(scoring_env_config(config), num_envs=num_envs))
    max_steps = scoring_steps(config, env.spec)
    act = functools.partial(driver.agent.make_policy(driver.agent_config, env.spec), greedy=greedy)
    params, key = driver.policy_params(state), jax.random.PRNGKey(seed)
    score = jax.jit(lambda params, key: evaluate(act, params, env, key, max_steps))(params, key)
    finished, mean_return = int(score.episodes), score.mean_return()
    result = {
        "env": config.env.id, "agent": config.agent, "env_steps": int(state.env_steps),
        "episodes": finished, "mean_true_return": None if math.isnan(mean_return) else mean_return,
        "greedy": greedy,
    }
    say(json.dumps(result, indent=2))
    try:
        if videos:
            # The same key and environment as the score: the videos show episodes it counted.
            learned = driver.learned_reward(state)  # None on the true reward: no r-hat panel
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
