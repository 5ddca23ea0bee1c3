"""``rlhf-jax fit-reward DATASET_DIR``: a reward model fitted offline to a label dataset.

The dataset's kind says which model: preferences fit the preference reward model (the
ensemble of equation 1), IBT marks the IBT utility (Algorithm 1). The answers go into the
learner's state exactly as a run started from the dataset (``preferences.labels_from`` or
``ibt.marks_from``) puts them (:mod:`rlhf_jax.head_start`), and the model is fitted by the
learner's own steps, as a run fits it: ``fit_step`` again and again (preferences: one Adam
step of every member on equation 1; IBT: one Adam step on Algorithm 1's loss over a batch of
marked clips), and ``refresh`` after every block of them, as a run refreshes (preferences:
about every ``reward_model.l2_adapt_every`` steps, each member's l2 adapted to its validation
loss on the labels it holds out, and r̂ normalised on the dataset's segments; IBT: after every
epoch, U's rise rescaled on the dataset's clips). What it fits is saved with
:func:`rlhf_jax.reward.saved_model.save`, its kind recorded, for a run of the same kind to
start from with ``reward_model.init_from``.

The settings are the source run's (the config saved with the dataset, less the keys that name
files: a dataset never chooses what is read here), with the command line's ``key=value``
overrides: ``reward_model.*`` or ``ibt.*`` (its architecture must then be the one of the runs
that start from it), ``seed``. The environment must stay the dataset's. A model that is not
finite is never written, and nothing is written over an existing file.
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

from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build, to_dict, without_local_files
from rlhf_jax.config_base import parse_mapping
from rlhf_jax.dispatch import dispatch_of, repeat_over
from rlhf_jax.driver import make_learner
from rlhf_jax.envs import make
from rlhf_jax.errors import ConfigError, RunError
from rlhf_jax.files import refuse_to_overwrite, write_atomically
from rlhf_jax import label_datasets
from rlhf_jax.head_start import HeadStartFiles
from rlhf_jax.ops.ring import full_ring
from rlhf_jax.reward import saved_model
from rlhf_jax.replay import frame_stack
from rlhf_jax.reward.data import LabelledPairs, MarkedClips, Segments, action_shape_dtype, stacks_on_host
from rlhf_jax.reward.learner import fitting_blocks

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
    info = label_datasets.read_info(dataset_dir)
    kind = info.feedback
    if not info.rows:
        raise ConfigError(f"{dataset_dir} holds no {kind.answers}: nothing to fit")
    if info.run_config:  # a file's text, trusted no more than the file: it never names what is read here
        base = without_local_files(parse_mapping(info.run_config, f"{dataset_dir}: the config it was made with"))
    else:
        base = {**DEFAULT_EXPERIMENT, "env": to_dict(info.env)}
    data = apply_overrides(base, list(overrides))
    data.update(reward=kind.reward, labeler="synthetic")
    section = data.setdefault(kind.section_name, {})
    budget_key = kind.budget_key.split(".")[1]
    budget = max(int(section.get(budget_key, info.rows) or info.rows), info.rows)
    section.update({kind.answers_key.split(".")[1]: str(dataset_dir), budget_key: budget},
                   **kind.offline_settings(info.rows))
    data.setdefault("run", {})["dir"] = ""
    return build(ExperimentConfig, data)


def dataset_clips(answers: LabelledPairs | MarkedClips, stack: int, capacity: int, spec, key) -> Segments:
    """Up to ``capacity`` of the dataset's segments (both of every pair; IBT: every clip), at
    random, as the clips a run's learner is initialised on (input statistics) and refreshed on."""
    if isinstance(answers, MarkedClips):
        count = answers.obs.shape[0]
        pick = np.sort(np.asarray(jax.random.permutation(key, count))[:min(count, capacity)])
        obs = np.asarray(answers.obs)[pick]
        shape, dtype = action_shape_dtype(spec)
        action = np.zeros((*obs.shape[:2], *shape), dtype)  # IBT datasets keep no actions; IBT reads none
    else:
        count = answers.frames.shape[0] * 2
        pick = np.sort(np.asarray(jax.random.permutation(key, count))[:min(count, capacity)])
        label, side = pick // 2, pick % 2
        obs = stacks_on_host(answers.frames[label, side][:, None], answers.restart[label, side][:, None], stack)[:, 0]
        action = answers.action[label, side]
    reward = np.zeros(action.shape[:2], np.float32)  # the oracle's per-step rewards are not in a dataset
    return Segments(obs, action, reward, full_ring(len(pick)))


def losses_of(metrics: dict, losses) -> tuple[float, float]:
    """``(training loss, validation loss)`` after a refresh: the preference learner's, measured
    on the labels each member trains on and holds out; IBT holds none out, so its training
    loss is the epoch's mean fitting loss and its validation loss NaN."""
    if "reward_train_loss" in metrics:
        return float(metrics["reward_train_loss"]), float(metrics["reward_val_loss"])
    return float(jnp.mean(losses)), math.nan


def fit_reward(dataset_dir: str | Path, out: str | Path | None = None, overrides: list[str] = (),
               epochs: int = EPOCHS, steps: int = 0, say=print) -> FitResult:
    """Fit the reward model to the dataset in ``dataset_dir`` for ``steps`` steps (0: ``epochs``
    passes over its labels) and save it to ``out`` (default :func:`default_out`)."""
    config = fit_config(dataset_dir, overrides)
    out = Path(out) if out else default_out(dataset_dir)
    if not out.parent.is_dir():
        raise ConfigError(f"{out.parent} does not exist: the directory for {out.name} must")
    refuse_to_overwrite(out, "give --out a new path")
    spec = make(dataclasses.replace(config.env, num_envs=1)).spec
    head = HeadStartFiles(config, spec, dataset_named=f"the dataset {dataset_dir}")  # the key is not the user's
    learner = make_learner(config, spec, head.preloaded)
    labels = head.preloaded
    batch = learner.batch_size
    per_epoch = max(1, math.ceil(labels / batch))
    total = steps or max(1, math.ceil(epochs * labels / batch))
    key = jax.random.PRNGKey(config.seed)
    init_key, clips_key, key = jax.random.split(key, 3)
    given = head.arrays()
    clips = dataset_clips(given.answers, frame_stack(spec), learner.clip_capacity, spec, clips_key)
    start = jax.jit(lambda key, clips, given: learner.head_start(learner.init(key, clips), given,
                                                                 jax.random.fold_in(key, 1)))
    state = start(init_key, clips, given)
    refresh = jax.jit(learner.refresh)
    fit = repeat_over(learner.fit_step, dispatch_of(config.run.loop, spec))  # (state, keys) -> (state, losses)
    kind = head.kind
    say(f"fitting {kind.fitted(config)} to {labels} {kind.answers} of {config.env.id}: {total} steps of {batch} "
        f"{kind.batch_unit}", flush=True)
    done, began, last_said = 0, time.perf_counter(), 0.0
    # Refreshed as a run refreshes (preferences: l2 adapted every reward_model.l2_adapt_every
    # steps); a learner whose refresh adapts nothing, after every epoch.
    blocks = [size for size, count in fitting_blocks(total, learner.refresh_every or per_epoch) for _ in range(count)]
    for size in blocks:
        key, fit_key, refresh_key = jax.random.split(key, 3)
        state, losses = fit(state, jax.random.split(fit_key, size))
        state, metrics = refresh(state, clips, refresh_key)
        done += size
        train_loss, val_loss = losses_of(metrics, losses)
        if done == total or time.perf_counter() - last_said > 10:
            last_said = time.perf_counter()
            say(f"step {done}/{total}: fit loss {float(jnp.mean(losses)):.4f}, train loss {train_loss:.4f}"
                + (f", validation loss {val_loss:.4f}" if not math.isnan(val_loss) else "")
                + f" ({time.perf_counter() - began:.0f} s)", flush=True)
    model = learner.reward_params(state)
    if not all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(model)):
        raise RunError(f"the fitted model is not finite after {total} steps (train loss {train_loss}), so nothing "
                       f"was written: fit again with a smaller learning rate, or look at the dataset's observations")
    info = saved_model.ModelInfo(
        env=to_dict(config.env), observation_shape=tuple(spec.observation_shape),
        architecture=kind.architecture_of(kind.model_config(config)), labels=labels, dataset=str(dataset_dir),
        steps=total, train_loss=train_loss, val_loss=val_loss, kind=kind.name)
    try:
        write_atomically(out, lambda path: saved_model.save(path, model, info))
    except OSError as error:
        raise ConfigError(f"cannot write {out}: {error}") from None
    return FitResult(out, total, train_loss, val_loss)
