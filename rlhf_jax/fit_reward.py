"""``rlhf-jax fit-reward DATASET_DIR``: a preference reward model fitted offline to a label dataset.

The labels go into the label database exactly as a run started with
``preferences.labels_from=DATASET_DIR`` puts them (:mod:`rlhf_jax.head_start`), and the model
is fitted by the learner's own steps, as a run fits it: ``fit_step`` (one Adam step of every
member on equation 1) again and again, and ``refresh`` after every epoch (each member's l2
adapted to its validation loss on the labels it holds out, and r̂ normalised on the
dataset's segments). What it fits is saved with :func:`rlhf_jax.reward.saved_model.save`,
for a run to start from with ``reward_model.init_from``.

The settings are the source run's (the config saved with the dataset), with the command
line's ``key=value`` overrides: ``reward_model.*`` (its architecture must then be the one
of the runs that start from it), ``seed``. The environment must stay the dataset's.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.checkpoints import write_atomically
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build, to_dict
from rlhf_jax.config_base import parse_yaml
from rlhf_jax.envs import make
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback import label_dataset
from rlhf_jax.head_start import HeadStartFiles
from rlhf_jax.reward import saved_model
from rlhf_jax.replay import frame_stack
from rlhf_jax.reward.data import LabelledPairs, Segments, stacks_on_host
from rlhf_jax.trainer import make_learner, resolve_loop

EPOCHS = 200  # over the dataset: the paper's Atari pretraining (appendix A.2), about a CartPole run's fitting


class FitResult(NamedTuple):
    path: Path  # the saved model
    steps: int
    train_loss: float
    val_loss: float


def default_out(dataset_dir: str | Path) -> Path:
    """Beside the dataset, not in it: ``<dataset>-reward_model.npz``."""
    dataset = Path(dataset_dir).resolve()
    return dataset.with_name(f"{dataset.name}-reward_model.npz")


def fit_config(dataset_dir: str | Path, overrides: list[str]) -> ExperimentConfig:
    """The experiment a fit runs as: the dataset's source run (else the built-in default on the
    dataset's environment) with ``overrides``, its labels from the dataset, every one held."""
    info = label_dataset.read_info(dataset_dir)
    if info.kind != "compare":
        raise ConfigError(f"{dataset_dir} holds IBT marks: fit-reward fits the preference reward model")
    if not info.rows:
        raise ConfigError(f"{dataset_dir} holds no labels: nothing to fit")
    base = parse_yaml(info.run_config) if info.run_config else {**DEFAULT_EXPERIMENT, "env": to_dict(info.env)}
    data = apply_overrides(base, list(overrides))
    prefs = data.setdefault("preferences", {})
    budget = max(int(prefs.get("labels", info.rows) or info.rows), info.rows)
    data.update(reward="preferences", labeler="synthetic")
    prefs.update(labels_from=str(dataset_dir), labels=budget, initial_labels=-1, label_capacity=info.rows,
                 score_pairs=0)  # no per-step oracle rewards to score against, only returns
    data.setdefault("run", {})["dir"] = ""
    return build(ExperimentConfig, data)


def dataset_clips(pairs: LabelledPairs, stack: int, capacity: int, key) -> Segments:
    """Up to ``capacity`` of the labelled segments, at random, as the clips a run's learner is
    initialised on (input statistics) and renormalised on."""
    count = pairs.frames.shape[0] * 2
    pick = np.sort(np.asarray(jax.random.permutation(key, count))[:min(count, capacity)])
    label, side = pick // 2, pick % 2
    obs = stacks_on_host(pairs.frames[label, side][:, None], pairs.restart[label, side][:, None], stack)[:, 0]
    action = pairs.action[label, side]
    reward = np.zeros(action.shape[:2], np.float32)  # the oracle's per-step rewards are not in a dataset
    return Segments(obs, action, reward, count=jnp.int32(len(pick)), next=jnp.int32(0))


def fit_reward(dataset_dir: str | Path, out: str | Path | None = None, overrides: list[str] = (),
               epochs: int = EPOCHS, steps: int = 0, say=print) -> FitResult:
    """Fit the reward model to the dataset in ``dataset_dir`` for ``steps`` steps (0: ``epochs``
    passes over its labels) and save it to ``out`` (default :func:`default_out`)."""
    config = fit_config(dataset_dir, overrides)
    out = Path(out) if out else default_out(dataset_dir)
    if not out.parent.is_dir():
        raise ConfigError(f"{out.parent} does not exist: the directory for {out.name} must")
    spec = make(dataclasses.replace(config.env, num_envs=1)).spec
    head = HeadStartFiles(config, spec)
    learner = make_learner(config, spec, head.preloaded)
    labels = head.preloaded
    batch = config.reward_model.batch_size
    per_epoch = max(1, math.ceil(labels / batch))
    total = steps or max(1, math.ceil(epochs * labels / batch))
    key = jax.random.PRNGKey(config.seed)
    init_key, clips_key, key = jax.random.split(key, 3)
    given = head.arrays()
    clips = dataset_clips(given.answers, frame_stack(spec), config.preferences.segment_capacity, clips_key)
    start = jax.jit(lambda key, clips, given: learner.head_start(learner.init(key, clips), given,
                                                                 jax.random.fold_in(key, 1)))
    state = start(init_key, clips, given)
    refresh = jax.jit(learner.refresh)
    if resolve_loop(config.run.loop, spec) == "python":  # CNNs on a CPU: one step a dispatch (trainer.resolve_loop)
        one = jax.jit(learner.fit_step)

        def fit(state, keys):
            losses = []
            for step_key in keys:
                state, loss = one(state, step_key)
                losses.append(loss)
            return state, jnp.stack(losses)
    else:
        fit = jax.jit(lambda state, keys: jax.lax.scan(learner.fit_step, state, keys))
    say(f"fitting {config.reward_model.ensemble_size} reward models to {labels} labels of {config.env.id}: "
        f"{total} steps of {batch} pairs", flush=True)
    done, began, metrics, last_said = 0, time.perf_counter(), {}, 0.0
    while done < total:
        size = min(per_epoch, total - done)
        key, fit_key, refresh_key = jax.random.split(key, 3)
        state, losses = fit(state, jax.random.split(fit_key, size))
        state, metrics = refresh(state, clips, refresh_key)
        done += size
        if done == total or time.perf_counter() - last_said > 10:
            last_said = time.perf_counter()
            say(f"step {done}/{total}: fit loss {float(jnp.mean(losses)):.4f}, train loss "
                f"{float(metrics['reward_train_loss']):.4f}, validation loss {float(metrics['reward_val_loss']):.4f} "
                f"({time.perf_counter() - began:.0f} s)", flush=True)
    ensemble = learner.reward_params(state)
    train_loss, val_loss = float(metrics["reward_train_loss"]), float(metrics["reward_val_loss"])
    info = saved_model.ModelInfo(
        env=to_dict(config.env), observation_shape=tuple(spec.observation_shape),
        architecture=saved_model.architecture(config.reward_model), labels=labels, dataset=str(dataset_dir),
        steps=total, train_loss=train_loss, val_loss=val_loss)
    try:
        write_atomically(out, lambda path: saved_model.save(path, ensemble, info))
    except OSError as error:
        raise ConfigError(f"cannot write {out}: {error}") from None
    return FitResult(out, total, train_loss, val_loss)
