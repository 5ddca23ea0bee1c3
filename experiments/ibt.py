"""IBT (inter-temporal Bradley-Terry) against the AR baseline and pairwise preferences:
loss-and-gradient throughput, and reward quality at equal annotation budgets.

    python -m experiments.ibt [--quick] [--skip-throughput] [--skip-quality]

Writes ``experiments/results/ibt.json`` and ``ibt.png`` (``--quick``: ``ibt_quick.*``).

**Part 1, throughput** (JSON ``throughput``). One jitted ``jax.value_and_grad`` of a loss
through its network, for a batch of 96 episodes of T = 100, 300 and 1000 frames of
CartPole-sized observations (4 floats, standard normal) with random marks (+1 and -1 on
10% of the frames each), all frames valid:

* ``mlp_all_pairs``: :class:`UtilityMLP` (64, 64) and :func:`ibt_loss` over every pair
  ``t1 < t2`` (``O(B T^2)`` memory);
* ``mlp_sampled_pairs``: :class:`UtilityMLP` and :func:`sampled_ibt_loss`, 256 pairs per episode;
* ``lstm_all_pairs``: :class:`UtilityLSTM` (64 features, LSTM 64) and :func:`ibt_loss`;
* ``ar_teacher_forced``: the AR baseline :class:`AnnotationLSTM` (64, LSTM 64), teacher-forced
  logits and :func:`annotation_nll` (no pairs: ``O(B T)``).

Per case and T: ``compile_s`` (first call, compile included), ``median_s`` (median of
``timed_calls`` calls, each blocked until ready), ``episodes_per_s = 96 / median_s`` and
``frames_per_s = 96 T / median_s`` (annotated frames through the loss and its gradient),
``pairs`` (pairs scored per call). A case that is not measured says why in ``skipped``
(``--quick`` skips the all-pairs cases at T = 1000, which take seconds per call on 2 cores;
the default run measures them with 3 timed calls, the others with 5; ``--quick`` with 3).

**Part 2, reward quality, offline, equal annotation budgets** (JSON ``quality``). On gymnax
CartPole-v1 and Acrobot-v1:

* *Data.* 64 copies of the environment act for 1,024 steps (held-out: another 32 copies from
  other keys), each copy with its own chance ``eps ~ U(0, 1)`` of a uniformly random action
  and otherwise a simple heuristic (CartPole: push toward the side the pole falls to,
  ``theta + 0.5 theta_dot``; Acrobot: torque along the first joint's swing), so clips show both
  progress and regress. The steps are recorded and cut into 1,024 training clips and 256
  held-out clips of 50 frames as the RLHF loop cuts them (:func:`record`, :func:`cut_segments`):
  each from a uniformly random copy at a uniformly random start where no episode ends inside
  (a clip never spans two episodes), so a clip can be drawn twice (about 5% of CartPole's,
  whose mostly random copies have few 50-step stretches). Each step's ``d_t`` (below) is
  recorded as the clips' oracle reward.
* *Annotator.* :class:`IBTLearner`'s oracle (:func:`synthetic_marks`) with
  ``signal="potential"`` (the built-in :data:`POTENTIALS`), ``threshold`` 0, ``fraction`` 0.2
  (a person marks one event in five), ``noise`` 0.05 (sign flipped); the true progress of
  transition ``t -> t+1`` is ``d_t = phi(x_{t+1}) - phi(x_t)``.
* *Budget.* ``b`` annotated clips (20, 50, 100; ``--quick`` 50 only), the first ``b`` of a
  per-seed shuffle of the training clips. **The number of annotator decisions is the number
  of nonzero marks** on those ``b`` clips, ``L``; the preference model gets exactly ``L``
  preference labels (per seed), each a random pair of distinct 25-step windows of the same
  ``b`` clips (same footage; :class:`PreferenceLearner`'s ``propose`` with random selection),
  answered by its synthetic oracle (:func:`oracle_answers`) on the summed ``d_t`` with
  ``mistake_prob`` = the annotator's noise.
* *Models*, each fit for a fixed number of steps with its own key per seed, the 3 seeds as
  one ``jax.vmap`` (initialised one seed at a time: vmapped orthogonal initialisers can hang
  XLA:CPU, see docs/notes.md). ``ibt``: :class:`IBTLearner` holding the ``b`` annotated clips, its
  ``fit_step`` (:class:`UtilityMLP` (64, 64), every pair, C = 1) in a ``lax.scan``; ``ar``
  (the baseline, not a learner of the loop, so fitted here): :class:`AnnotationLSTM`
  (64, LSTM 64) on teacher-forced NLL over the same clips. Both: Adam at 1e-4 with b1 = 0
  (:class:`IBTConfig`'s, the paper's), batches of 16 clips drawn with replacement from the
  ``b``, inputs standardised by the training clips, 1,000 steps (``--quick`` 200).
  ``preferences``: :class:`PreferenceLearner` with the 3-member ensemble of
  :mod:`rlhf_jax.reward.ensemble` at its defaults (batches of 64 pairs, Adam 3e-4, 1/e of the
  labels held out per member), its ``fit_step`` in a ``lax.scan`` and its ``refresh``
  (adaptive l2, normalisation) after every 100 steps, 600 steps (``--quick`` 200; 600 x 64
  pairs drawn is 38 passes over 1,000 labels). No early stopping: with Adam at 1e-3 (batches of 32) IBT's
  score on CartPole with 100 clips fell from 0.58 after 300 steps to 0.43 after 1,000 and
  0.33 after 3,000, and AR's expected mark fell likewise (presumably the networks learn
  which training transitions happened to be marked); at 1e-4 and 1,000 steps IBT scored
  0.60-0.61 (batches of 16 or 32). The ensemble has its held-out labels and adaptive l2
  against overfitting.
* *Score* (per seed, over all transitions of the held-out clips): Pearson correlation between
  a model's per-step reward and ``d_t``. ``ibt``: ``U(x_{t+1}) - U(x_t)`` (:func:`utility_rises`);
  ``ar_sampled``: the AR model's own sampled mark on frame ``t+1`` (``AnnotationLSTM.sample``,
  the reward of appendix A.5); ``ar_expected``: ``p(+1) - p(-1)`` of that frame given its own
  previous samples (the distribution the sample was drawn from); ``preferences``:
  ``r̂(x_t, a_t)`` (:func:`normalized_reward`, normalised by the last ``refresh``);
  ``annotator_marks``: the annotator's own marks on the held-out clips, i.e. what a model
  that samples marks exactly as the annotator does would score (marks are thinned by
  ``fraction`` and flipped by ``noise``, so well below 1). Correlations are
  :func:`rlhf_jax.reward.learner.pearson`'s.

JSON ``quality``: ``annotator``, ``fit`` (the settings above); ``tasks.<task>``: ``data``
(clip counts, shares of frames marked +1/-1 and of transitions with ``d > 0``/``d < 0``),
``compile_s`` per compiled function, ``seconds``; ``tasks.<task>.budgets.<b>``: ``decisions``
(L per seed), ``preference_labels_answered`` (= L), ``models.<m>``: ``mean`` and ``seeds``
(correlations) and, where there is one, ``final_loss`` per seed (mean of the last 50 steps;
preferences: the last 100-step chunk), ``fit_seconds`` per model (the first budget includes
compiling).

Top level: ``quick``, ``seconds`` (the whole run), ``xla_flags``, ``machine``.

Options (``--help``): ``--tasks``, ``--budgets``, ``--ibt-steps``, ``--ar-steps``,
``--pref-steps``, ``--batch-episodes``, ``--learning-rate``, ``--fraction``, ``--noise``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common import Headline, enable_compilation_cache, ratio
from experiments.common import RESULTS, write_result
from rlhf_jax.cli import whole_number
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.ops.ring import Ring
from rlhf_jax.reward import ensemble, ibt
from rlhf_jax.reward.annotators import AnnotatorConfig, progress_increments
from rlhf_jax.reward.config import PreferenceConfig
from rlhf_jax.reward.data import Segments, empty_segments
from rlhf_jax.reward.ensemble import RewardModelConfig
from rlhf_jax.reward.ibt import IBTConfig
from rlhf_jax.reward.ibt_learner import IBTLearner
from rlhf_jax.reward.labelers import TeacherConfig
from rlhf_jax.reward.learner import Queries, pearson, take_clips
from rlhf_jax.reward.preference_learner import PreferenceLearner
from rlhf_jax.reward.segments import cut_segments, empty_recent, record

# ------------------------------------------------------------------- part 1: throughput

BATCH = 96
LENGTHS = (100, 300, 1000)
PAIR_SAMPLES = 256
OBS_SHAPE = (4,)
CASES = ("mlp_all_pairs", "mlp_sampled_pairs", "lstm_all_pairs", "ar_teacher_forced")


def loss_and_params(case: str, key, obs, marks):
    """``(loss(params, obs, marks, valid, key), params)`` of one case."""
    if case.startswith("mlp"):
        net = ibt.UtilityMLP(OBS_SHAPE)
    elif case.startswith("lstm"):
        net = ibt.UtilityLSTM(OBS_SHAPE)
    else:
        net = ibt.AnnotationLSTM(OBS_SHAPE)
        params = net.init(key, obs[:1, :2], ibt.previous_classes(marks[:1, :2]))

        def ar_loss(params, obs, marks, valid, key):
            del key
            return ibt.annotation_nll(net.apply(params, obs, ibt.previous_classes(marks)), marks, valid)

        return ar_loss, params
    params = net.init(key, obs[:1, :2])
    if case.endswith("sampled_pairs"):
        def loss(params, obs, marks, valid, key):
            return ibt.sampled_ibt_loss(key, net.apply(params, obs), marks, valid, PAIR_SAMPLES)
    else:
        def loss(params, obs, marks, valid, key):
            del key
            return ibt.ibt_loss(net.apply(params, obs), marks, valid)
    return loss, params


def measure_case(case: str, steps: int, calls: int) -> dict:
    key_obs, key_marks, key_init, key_loss = jax.random.split(jax.random.key(0), 4)
    obs = jax.random.normal(key_obs, (BATCH, steps, *OBS_SHAPE))
    marks = jax.random.choice(key_marks, jnp.array([-1, 0, 1], jnp.int32), (BATCH, steps), p=jnp.array([0.1, 0.8, 0.1]))
    valid = jnp.ones((BATCH, steps), bool)
    loss, params = loss_and_params(case, key_init, obs, marks)
    grad_fn = jax.jit(jax.value_and_grad(loss))
    start = time.perf_counter()
    jax.block_until_ready(grad_fn(params, obs, marks, valid, key_loss))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(grad_fn(params, obs, marks, valid, key_loss))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    pairs = BATCH * (PAIR_SAMPLES if "sampled" in case else steps * (steps - 1) // 2 if "pairs" in case else 0)
    return {"compile_s": round(compile_s, 3), "median_s": round(median, 5), "timed_calls": calls,
            "episodes_per_s": round(BATCH / median, 1), "frames_per_s": round(BATCH * steps / median, 1),
            "pairs": pairs}


def throughput(quick: bool) -> dict:
    out = {"batch_episodes": BATCH, "observation_shape": list(OBS_SHAPE), "pair_samples": PAIR_SAMPLES,
           "mark_rate": {"+1": 0.1, "-1": 0.1}, "cases": {}}
    for case in CASES:
        cells = out["cases"].setdefault(case, {})
        for steps in LENGTHS:
            all_pairs = case.endswith("all_pairs")
            if quick and all_pairs and steps >= 1000:
                cells[str(steps)] = {"skipped": "--quick: every pair of 96 x 1000 frames (48M pairs) takes "
                                                "seconds per call on a CPU; the default run measures it"}
            else:
                calls = 3 if quick or (all_pairs and steps >= 1000) else 5
                try:
                    cells[str(steps)] = measure_case(case, steps, calls)
                except Exception as error:  # e.g. out of memory: recorded, not hidden
                    cells[str(steps)] = {"skipped": f"{type(error).__name__}: {str(error)[:300]}"}
            cell = cells[str(steps)]
            if "skipped" in cell:
                print(f"{case:20s} T={steps:5d}  SKIPPED: {cell['skipped']}", flush=True)
            else:
                print(f"{case:20s} T={steps:5d}  {cell['episodes_per_s']:10.1f} episodes/s  "
                      f"{cell['frames_per_s']:12.0f} frames/s  (median {cell['median_s'] * 1e3:.1f} ms of "
                      f"{cell['timed_calls']}, first call {cell['compile_s']:.1f} s)", flush=True)
    return out


# --------------------------------------------------------------- part 2: reward quality

TASKS = {"cartpole": "gymnax/CartPole-v1", "acrobot": "gymnax/Acrobot-v1"}
SEEDS = 3
CLIP = 50
SEGMENT = 25
ROLLOUT_STEPS = 1024
TRAIN_ENVS, HELD_OUT_ENVS = 64, 32
TRAIN_CLIPS, HELD_OUT_CLIPS = 1024, 256


def heuristic(env_id: str, obs):
    if env_id.endswith("CartPole-v1"):
        return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(jnp.int32)
    # Acrobot: torque (+1: action 2, -1: action 0) along the first joint's angular velocity.
    return jnp.where(obs[:, 4] > 0, 2, 0).astype(jnp.int32)


def collect_clips(env_id: str, num_envs: int, key, num_clips: int, annotator: AnnotatorConfig) -> Segments:
    """``num_clips`` clips of ``CLIP`` steps cut as the RLHF loop cuts them (:func:`record`,
    :func:`cut_segments`) from ``ROLLOUT_STEPS`` steps of ``num_envs`` copies; a clip's
    ``oracle_reward`` is the annotator's progress ``d_t`` of each step."""
    env = make(EnvConfig(id=env_id, num_envs=num_envs))
    actions = env.spec.action_space.n

    @jax.jit
    def rollout(key):
        reset_key, eps_key, steps_key, cut_key = jax.random.split(key, 4)
        state, ts = env.reset(reset_key)
        eps = jax.random.uniform(eps_key, (num_envs,))

        def body(carry, key):
            state, obs = carry
            random_key, coin_key = jax.random.split(key)
            random_action = jax.random.randint(random_key, (num_envs,), 0, actions)
            action = jnp.where(jax.random.uniform(coin_key, (num_envs,)) < eps, random_action, heuristic(env_id, obs))
            state, ts = env.step(state, action)
            # d_t up to the observation the step reached, before any auto-reset.
            d = progress_increments(annotator, env_id, jnp.stack([obs, ts.final_obs], axis=1), None)[:, 0]
            return (state, ts.obs), (obs, action, d, ts.done)

        _, steps = jax.lax.scan(body, (state, ts.obs), jax.random.split(steps_key, ROLLOUT_STEPS))
        recent = record(empty_recent(env.spec, num_envs, ROLLOUT_STEPS, CLIP), *steps)
        return cut_segments(recent, empty_segments(env.spec, num_clips, CLIP), cut_key, num_clips)

    return rollout(key)


def windows(clips: Queries, valid_clips) -> Segments:
    """Every ``SEGMENT``-step window of each clip of ``clips [B, 1, CLIP, ...]`` as segments,
    clip after clip: the rows of the first ``valid_clips`` clips are the valid ones."""
    steps = jnp.arange(CLIP - SEGMENT + 1)[:, None] + jnp.arange(SEGMENT)  # [starts, SEGMENT]
    cut = lambda x: x[:, 0][:, steps].reshape(-1, SEGMENT, *x.shape[3:])
    return Segments(*map(cut, clips), Ring(jnp.int32(0), (valid_clips * len(steps)).astype(jnp.int32)))


def stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@dataclasses.dataclass(frozen=True)
class Settings:
    budgets: tuple[int, ...]
    ibt_steps: int
    ar_steps: int
    pref_steps: int
    pref_chunk_steps: int
    learning_rate: float  # IBT and AR (Adam, b1 = 0, b2 = 0.999, as IBTConfig)
    batch_episodes: int  # IBT and AR: clips per step, drawn with replacement from the budget's
    annotator: AnnotatorConfig


class Compiled:
    """Compiles each function once (ahead of time, so compiling and running are timed apart)."""

    def __init__(self):
        self.executables, self.compile_s = {}, {}

    def __call__(self, name, fn, *args):
        if name not in self.executables:
            start = time.perf_counter()
            self.executables[name] = jax.jit(fn).lower(*args).compile()
            self.compile_s[name] = round(time.perf_counter() - start, 1)
        return self.executables[name](*args)


def quality_task(task: str, settings: Settings, seed: int) -> dict:
    env_id = TASKS[task]
    spec = make(EnvConfig(id=env_id, num_envs=1)).spec
    annotator = settings.annotator
    train_key, held_key, seeds_key = jax.random.split(jax.random.fold_in(jax.random.key(seed), list(TASKS).index(task)), 3)
    start = time.perf_counter()
    train = collect_clips(env_id, TRAIN_ENVS, train_key, TRAIN_CLIPS, annotator)
    held = collect_clips(env_id, HELD_OUT_ENVS, held_key, HELD_OUT_CLIPS, annotator)
    held_d = held.oracle_reward[:, :-1]  # the progress of the CLIP - 1 transitions inside each held-out clip
    collect_s = time.perf_counter() - start
    if int(held.ring.size) < HELD_OUT_CLIPS or int(train.ring.size) < TRAIN_CLIPS:
        raise RuntimeError(f"{task}: no {CLIP}-step stretch inside an episode to cut clips from")

    max_budget = max(settings.budgets)
    seed_keys = jax.random.split(seeds_key, SEEDS)
    ibt_learner = IBTLearner(IBTConfig(utility="mlp", learning_rate=settings.learning_rate,
                                       batch_episodes=settings.batch_episodes, episodes=max_budget,
                                       episode_length=CLIP, annotator=annotator), spec)

    # Per seed: which clips (a shuffle; budget b takes the first b) and the annotator's marks on them.
    def annotate(key):
        pick_key, mark_key = jax.random.split(jax.random.fold_in(key, 0))
        clips = take_clips(train, jax.random.permutation(pick_key, TRAIN_CLIPS)[:max_budget])
        return clips, ibt_learner.oracle(mark_key, clips)

    clips, marks = jax.vmap(annotate)(seed_keys)  # [S, Bmax, 1, CLIP, ...], [S, Bmax, CLIP]
    train_d = train.oracle_reward[:, :-1]
    data = {"train_clips": int(train.ring.size), "held_out_clips": int(held.ring.size),
            "held_out_transitions": int(held_d.size),
            "share_of_frames_marked_+1": round(float((marks.marks[..., 1:] > 0).mean()), 4),
            "share_of_frames_marked_-1": round(float((marks.marks[..., 1:] < 0).mean()), 4),
            "share_of_transitions_d>0": round(float((train_d > 0).mean()), 4),
            "share_of_transitions_d<0": round(float((train_d < 0).mean()), 4),
            "collect_s": round(collect_s, 1)}
    compiled = Compiled()
    batch = settings.batch_episodes

    # --- IBT: the learner holding the budget's annotated clips; the AR baseline fits the same clips.
    # Initialised one seed at a time: vmapped orthogonal initialisers can hang XLA:CPU.
    ibt_states = stack([ibt_learner.init(jax.random.fold_in(k, 1), train) for k in seed_keys])

    def store_ibt(states, clips, marks, budget):
        def one(state, clips, marks):
            return ibt_learner.store(state, clips, marks._replace(answered=jnp.arange(max_budget) < budget), None)

        return jax.vmap(one)(states, clips, marks)

    def fit_ibt(states, keys, held_obs, held_d):
        def one(state, key):
            state, losses = jax.lax.scan(ibt_learner.fit_step, state, jax.random.split(key, settings.ibt_steps))
            rises = ibt.utility_rises(state.model, ibt_learner.config, spec, held_obs)
            return pearson(rises, held_d), losses[-50:].mean()

        return jax.vmap(one)(states, keys)

    ar_net = ibt.AnnotationLSTM(tuple(spec.observation_shape), hidden=(64,), lstm_size=64)
    optimizer = optax.adam(settings.learning_rate, b1=0.0, b2=0.999)
    ar_params = stack([ar_net.init(jax.random.fold_in(k, 2), jnp.zeros((1, 2, *spec.observation_shape)),
                                   jnp.zeros((1, 2), jnp.int32)) for k in seed_keys])

    def fit_ar(params, states, keys, held_obs, held_d):
        def one(params, state, key):
            annotated, model = state.annotated, state.model
            standardize = lambda obs: (obs - model.obs_mean) / model.obs_std  # IBT's: by the training clips

            def loss_fn(params, index):
                marks = annotated.marks[index]
                logits = ar_net.apply(params, standardize(annotated.obs[index]), ibt.previous_classes(marks))
                return ibt.annotation_nll(logits, marks, jnp.ones(marks.shape, bool))

            def step(carry, key):
                params, opt_state = carry
                index = jax.random.randint(key, (batch,), 0, annotated.ring.size)
                loss, grads = jax.value_and_grad(loss_fn)(params, index)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), loss

            fit_key, sample_key = jax.random.split(key)
            (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)),
                                               jax.random.split(fit_key, settings.ar_steps))
            held = standardize(held_obs)
            sampled = ar_net.apply(params, held, sample_key, method=ibt.AnnotationLSTM.sample)
            # The same logits the sampler drew from: teacher-forced on its own samples.
            p = jax.nn.softmax(ar_net.apply(params, held, ibt.previous_classes(sampled)))
            expected = p[..., 1] - p[..., 2]
            return (pearson(sampled[:, 1:].astype(jnp.float32), held_d), pearson(expected[:, 1:], held_d),
                    losses[-50:].mean())

        return jax.vmap(one)(params, states, keys)

    # --- preferences: as many answered pairs of windows of the same clips as the annotator's marks.
    decisions_all = {b: np.asarray((marks.marks[:, :b] != 0).sum((1, 2))) for b in settings.budgets}
    capacity = int(max(d.max() for d in decisions_all.values()))
    teacher = TeacherConfig(mistake_prob=annotator.noise, tie_gap=annotator.threshold)
    pref_learner = PreferenceLearner(PreferenceConfig(labels=capacity, segment_length=SEGMENT, selection="random",
                                                      candidates_factor=1, teacher=teacher), RewardModelConfig(), spec)
    pref_states = stack([pref_learner.init(jax.random.fold_in(k, 3), train) for k in seed_keys])
    chunks = settings.pref_steps // settings.pref_chunk_steps

    def fit_preferences(states, clips, budget, decisions, keys, train, held_obs, held_action, held_d):
        def one(state, clips, decisions, key):
            propose_key, oracle_key, store_key, fit_key = jax.random.split(key, 4)
            pairs = pref_learner.propose(state, windows(clips, budget), propose_key, capacity)
            answers = pref_learner.oracle(oracle_key, pairs)
            answers = answers._replace(answered=answers.answered & (jnp.arange(capacity) < decisions))
            state = pref_learner.store(state, pairs, answers, store_key)

            def chunk(state, key):  # pref_chunk_steps steps, then refresh: the adaptive l2, the normalisation
                fit_key, refresh_key = jax.random.split(key)
                steps = jax.random.split(fit_key, settings.pref_chunk_steps)
                state, losses = jax.lax.scan(pref_learner.fit_step, state, steps)
                return pref_learner.refresh(state, train, refresh_key)[0], losses.mean()

            state, losses = jax.lax.scan(chunk, state, jax.random.split(fit_key, chunks))
            reward = ensemble.normalized_reward(state.ensemble, pref_learner.model, spec, held_obs, held_action)
            return pearson(reward, held_d), losses[-1], state.labels.ring.size

        return jax.vmap(one)(states, clips, decisions, keys)

    # The annotator's own marks on the held-out clips: the ceiling for a model that outputs marks.
    held_clips = take_clips(held, jnp.arange(HELD_OUT_CLIPS))
    ceiling = [float(pearson(ibt_learner.oracle(jax.random.fold_in(k, 9), held_clips).marks[:, 1:], held_d))
               for k in seed_keys]

    def cell(values, losses=None):
        values = [round(float(v), 4) for v in values]
        out = {"mean": round(float(np.mean(values)), 4), "seeds": values}
        if losses is not None:
            out["final_loss"] = [round(float(v), 4) for v in losses]
        return out

    result = {"env_id": env_id, "data": data, "budgets": {}}
    fit_start = time.perf_counter()
    for budget in settings.budgets:
        cell_start = time.perf_counter()
        budget_arr = jnp.int32(budget)
        keys = jnp.stack([jax.random.fold_in(k, 100 + budget) for k in seed_keys])
        fit_keys = jax.vmap(lambda k: jax.random.split(k, 3))(keys)  # [S, 3]
        seconds = {}

        clock = time.perf_counter()
        annotated = compiled("store_ibt", store_ibt, ibt_states, clips, marks, budget_arr)
        ibt_corr, ibt_final = jax.device_get(
            compiled("ibt", fit_ibt, annotated, fit_keys[:, 0], held.obs, held_d))
        seconds["ibt"] = time.perf_counter() - clock

        clock = time.perf_counter()
        ar_sampled, ar_expected, ar_final = jax.device_get(
            compiled("ar", fit_ar, ar_params, annotated, fit_keys[:, 1], held.obs, held_d))
        seconds["ar"] = time.perf_counter() - clock

        clock = time.perf_counter()
        decisions = decisions_all[budget]
        pref_corr, pref_final, answered = jax.device_get(compiled(
            "preferences", fit_preferences, pref_states, clips, budget_arr, jnp.asarray(decisions, jnp.int32),
            fit_keys[:, 2], train, held.obs[:, :-1], held.action[:, :-1], held_d))
        seconds["preferences"] = time.perf_counter() - clock

        out = result["budgets"][str(budget)] = {
            "decisions": [int(v) for v in decisions],
            "preference_labels_answered": [int(v) for v in answered],
            "models": {
                "ibt": cell(ibt_corr, ibt_final),
                "ar_sampled": cell(ar_sampled, ar_final),
                "ar_expected": cell(ar_expected),
                "preferences": cell(pref_corr, pref_final),
                "annotator_marks": cell(ceiling),
            },
            "seconds": round(time.perf_counter() - cell_start, 1),
            "fit_seconds": {m: round(v, 1) for m, v in seconds.items()},  # first budget: compiling included
        }
        print(f"{task} {budget:4d} clips, decisions {decisions.tolist()}: "
              + ", ".join(f"{m} {c['mean']:+.3f}" for m, c in out["models"].items())
              + f"  ({out['seconds']} s: " + ", ".join(f"{m} {v:.0f}" for m, v in seconds.items()) + ")", flush=True)
    result["seconds"] = round(time.perf_counter() - fit_start, 1)
    result["compile_s"] = compiled.compile_s
    print(f"{task}: compiling took {compiled.compile_s} s", flush=True)
    return result


def quality(settings: Settings, tasks) -> dict:
    out = {"seeds": SEEDS, "clip_length": CLIP, "segment_length": SEGMENT, "budgets": list(settings.budgets),
           "annotator": dataclasses.asdict(settings.annotator),
           "fit": {"ibt_steps": settings.ibt_steps, "ar_steps": settings.ar_steps, "pref_steps": settings.pref_steps,
                   "pref_chunk_steps": settings.pref_chunk_steps, "ibt_ar_learning_rate": settings.learning_rate,
                   "ibt_ar_batch_episodes": settings.batch_episodes,
                   "pref_batch_pairs": RewardModelConfig().batch_size},
           "tasks": {}}
    for task in tasks:
        out["tasks"][task] = quality_task(task, settings, seed=0)
    return out


# ----------------------------------------------------------------------- report

MODELS = ("ibt", "ar_sampled", "ar_expected", "preferences", "annotator_marks")


def table(result: dict) -> str:
    lines = []
    if "throughput" in result:
        lines += ["| case | T | episodes/s | frames/s | median ms |", "| --- | --- | --- | --- | --- |"]
        for case, cells in result["throughput"]["cases"].items():
            for steps, cell in cells.items():
                if "skipped" in cell:
                    lines.append(f"| {case} | {steps} | skipped | | {cell['skipped'][:60]} |")
                else:
                    lines.append(f"| {case} | {steps} | {cell['episodes_per_s']:.1f} | {cell['frames_per_s']:.0f} "
                                 f"| {cell['median_s'] * 1e3:.1f} |")
        lines.append("")
    if "quality" in result:
        lines += ["| task | clips | decisions | " + " | ".join(MODELS) + " |", "| --- |" + " --- |" * (len(MODELS) + 2)]
        for task, cells in result["quality"]["tasks"].items():
            for budget, cell in cells["budgets"].items():
                row = [f"{cell['models'][m]['mean']:+.3f} ({', '.join(f'{v:+.2f}' for v in cell['models'][m]['seeds'])})"
                       for m in MODELS]
                lines.append(f"| {task} | {budget} | {'/'.join(map(str, cell['decisions']))} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(result.get("quality", {}).get("tasks", {}))
    columns = ("throughput" in result) + len(tasks)
    if not columns:
        return
    fig, axes = plt.subplots(1, columns, figsize=(4.3 * columns, 3.6), squeeze=False)
    axes = list(axes[0])
    if "throughput" in result:
        ax = axes.pop(0)
        for case, cells in result["throughput"]["cases"].items():
            points = [(int(t), c["frames_per_s"]) for t, c in cells.items() if "skipped" not in c]
            if points:
                ax.plot(*zip(*points), marker="o", label=case)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(LENGTHS, [str(t) for t in LENGTHS])
        ax.set_xlabel("episode length T (batch of 96)")
        ax.set_ylabel("annotated frames/s (loss + gradient)")
        ax.set_title("throughput")
        ax.legend(fontsize=7)
    for ax, task in zip(axes, tasks):
        cells = result["quality"]["tasks"][task]["budgets"]
        budgets = sorted(int(b) for b in cells)
        for model in MODELS:
            means = [cells[str(b)]["models"][model]["mean"] for b in budgets]
            spread = [np.std(cells[str(b)]["models"][model]["seeds"]) for b in budgets]
            style = {"linestyle": "--", "color": "k"} if model == "annotator_marks" else {}
            ax.errorbar(budgets, means, yerr=spread, marker="o", capsize=3, label=model, **style)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("annotated clips of 50 steps")
        ax.set_title(f"{task}: preference labels = nonzero marks", fontsize=10)
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.0)
    if tasks:
        axes[0].set_ylabel(f"Pearson r with true progress (mean of {SEEDS} seeds)")
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="budget 50 only, 200 fitting steps, no all-pairs T=1000, 3 timed calls: ~3 minutes on 2 CPU cores")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--budgets", default="", help="annotated clips per cell, comma-separated (default 20,50,100)")
    parser.add_argument("--ibt-steps", type=whole_number(0), default=0, help="default 1000 (--quick 200)")
    parser.add_argument("--ar-steps", type=whole_number(0), default=0, help="default 1000 (--quick 200)")
    parser.add_argument("--pref-steps", type=whole_number(0), default=0, help="default 600 (--quick 200); rounded down to a multiple of 100")
    parser.add_argument("--batch-episodes", type=whole_number(1), default=16, help="IBT's and AR's clips per step")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="IBT's and AR's Adam step (IBTConfig's)")
    parser.add_argument("--fraction", type=float, default=0.2, help="the annotator's chance of marking an event")
    parser.add_argument("--noise", type=float, default=0.05, help="the annotator's chance of flipping a mark")
    args = parser.parse_args(argv)
    unknown = [task for task in args.tasks.split(",") if task not in TASKS]
    if unknown:  # before the throughput part's minutes, not after them
        parser.error(f"--tasks: unknown task {unknown[0]!r}; the tasks are {', '.join(TASKS)}")
    try:
        budgets = tuple(whole_number(1)(b) for b in args.budgets.split(",")) if args.budgets else ()
    except argparse.ArgumentTypeError as error:
        parser.error(f"--budgets: each {error}")
    enable_compilation_cache()
    quick = args.quick
    start = time.perf_counter()
    result: dict = {"quick": quick}
    if not args.skip_throughput:
        result["throughput"] = throughput(quick)
    if not args.skip_quality:
        steps = 200 if quick else 1000
        pref_steps = args.pref_steps or (200 if quick else 600)
        chunk = min(100, pref_steps)
        settings = Settings(
            budgets=budgets or ((50,) if quick else (20, 50, 100)),
            ibt_steps=args.ibt_steps or steps, ar_steps=args.ar_steps or steps,
            pref_steps=pref_steps // chunk * chunk, pref_chunk_steps=chunk,
            learning_rate=args.learning_rate, batch_episodes=args.batch_episodes,
            annotator=AnnotatorConfig(signal="potential", threshold=0.0, fraction=args.fraction, noise=args.noise))
        result["quality"] = quality(settings, args.tasks.split(","))
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    print(table(result))
    name = "ibt_quick" if quick else "ibt"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(result, RESULTS / f"{name}.png")
    write_result(name, result, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: each IBT loss at the longest episodes measured against the AR baseline's,
    and, per task at the largest budget, the rewards' correlation with true progress."""
    rows = []
    throughput = result.get("throughput", {})  # either part may be skipped
    cases = throughput.get("cases", {})
    titles = {"mlp_all_pairs": "MLP, every pair",
              "mlp_sampled_pairs": f"MLP, {throughput.get('pair_samples')} sampled pairs/episode",
              "lstm_all_pairs": "LSTM, every pair"}
    for case, title in titles.items():
        measured = [t for t, cell in cases.get(case, {}).items() if "frames_per_s" in cell]
        if not measured:
            continue
        t = max(measured, key=int)
        ours = cases[case][t]["frames_per_s"]
        peer = cases["ar_teacher_forced"].get(t, {}).get("frames_per_s")
        rows.append(Headline(f"IBT loss+grad, frames/s, {title}, T = {t} (peer: AR baseline, teacher-forced)",
                             ours, peer, ratio(ours, peer)))
    for task, cell in result.get("quality", {}).get("tasks", {}).items():
        if not cell["budgets"]:
            continue
        budget = max(cell["budgets"], key=int)
        models = cell["budgets"][budget]["models"]
        ibt_r, ar_r, preferences_r = (models[m]["mean"] for m in ("ibt", "ar_sampled", "preferences"))
        rows.append(Headline(f"IBT reward, Pearson r with true progress, {task}, {budget} clips "
                             "(peer: AR sampled mark)", ibt_r, ar_r))
        rows.append(Headline(f"Preference ensemble reward, Pearson r, {task}, same decisions (peer: IBT)",
                             preferences_r, ibt_r))
    return rows


if __name__ == "__main__":
    main()
