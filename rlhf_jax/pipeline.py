"""The RLHF loop of Christiano et al. 2017 (section 2.2): agent, reward model and labeler joined.

The paper runs three asynchronous processes: the policy learns from the predicted reward
r̂, pairs of its segments go to a labeler, and the predictor is fitted to the labels.
Here they take turns inside compiled chunks, and nothing but labels ever needs to cross to
the host:

1. before RL, the untrained policy plays and its segments get the first labels (25% of
   the budget, 500 on Atari), on which the predictor is pretrained (200 epochs on Atari);
2. each chunk then runs the agent's iterations with ``reward_fn`` = the ensemble's
   normalised reward, recording the steps taken and cutting segments from them;
3. the labels the schedule asks for by now are queried (disagreement selection over 10x
   as many candidate pairs) and answered by the synthetic oracle on the device;
4. the ensemble takes a step of fitting per 10 env steps' worth of pairs, adapts its l2
   coefficients, and renormalises on the recent segments.

``RLHFTraining`` is an :class:`rlhf_jax.trainer.AgentRun` like ``Training`` (``init_runner``,
``run_chunk``, chunk counts), so ``rlhf-jax train`` drives, logs and checkpoints both alike;
its "runner" is the whole :class:`RLHFState`, labels and buffers included.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.config import ExperimentConfig
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.reward import ensemble as reward_model
from rlhf_jax.reward.config import resolve
from rlhf_jax.reward.data import Labels, Segments, empty_labels, empty_segments
from rlhf_jax.reward.labelers import add_labels, oracle_answers
from rlhf_jax.reward.people import AsyncLabeler, HostLabels, Query, wait_for_answers
from rlhf_jax.reward.queries import candidate_pairs, select_queries
from rlhf_jax.reward.schedule import labels_due
from rlhf_jax.reward.segments import Recent, cut_segments, empty_recent, record
from rlhf_jax.trainer import AgentRun, compile_chunk

# Fresh pairs drawn each chunk to score the reward model against the oracle.
EVAL_PAIRS = 256
# Steps of recent segments the normalisation statistics are taken over.
NORMALIZATION_STEPS = 4_096


def record_and_cut(recent: Recent, segments: Segments, key, transitions, num: int) -> tuple[Recent, Segments]:
    """Record an iteration's steps in ``recent`` and cut ``num`` new segments from it."""
    recent = record(recent, transitions.obs, transitions.action, transitions.oracle_reward, transitions.done)
    return recent, cut_segments(recent, segments, key, num)


def play_untrained(iteration, runner, reward_params, recent: Recent, segments: Segments, keys, num: int) -> Segments:
    """Before RL: the untrained policy plays ``len(keys)`` iterations (its parameters put back
    after every one) and ``num`` segments are cut from each; returns the segments."""
    def play(carry, key):
        playing, recent, segments = carry
        playing, _, transitions = iteration(playing, reward_params)
        playing = playing._replace(params=runner.params, opt_state=runner.opt_state)
        recent, segments = record_and_cut(recent, segments, key, transitions, num)
        return (playing, recent, segments), None

    (_, _, segments), _ = jax.lax.scan(play, (runner, recent, segments), keys)
    return segments


class RLHFState(NamedTuple):
    runner: Any  # the agent's whole state
    ensemble: reward_model.EnsembleState
    recent: Recent  # the last steps of every environment, to cut segments from
    segments: Segments  # recent segments: where query candidates come from
    labels: Labels  # the database D
    key: jax.Array
    labels_asked: jax.Array  # int32: queries put to the labeler so far

    @property
    def env_steps(self):
        return self.runner.env_steps


class RLHFTraining(AgentRun):
    """Everything compiled for one preference-learning run."""

    def __init__(self, config: ExperimentConfig, labeler: AsyncLabeler | None = None, members: int = 1):
        """``labeler``: a host-side labeler (people, :mod:`rlhf_jax.reward.people`) in place
        of the synthetic oracle on the device; it answers every label, the initial ones too."""
        # The agent learns from r̂ only: no life-loss episodes or other true-reward helpers.
        super().__init__(config, config.env, members)
        self.host = HostLabels(labeler) if labeler is not None else None
        spec = self.env.spec
        self.prefs = config.preferences
        self.model_config = config.reward_model
        self.settings = resolve(self.prefs, spec)
        self.atari = is_atari_frames(spec.observation_shape)
        if self.model_config.ensemble_size == 1 and self.prefs.selection == "disagreement":
            # One predictor cannot disagree with itself: the paper's "no ensemble" queries at random.
            self.prefs = dataclasses.replace(self.prefs, selection="random")

        self.total_env_steps = self.total_iterations * self.steps_per_iteration
        k = self.settings.segment_length
        steps_per_env = self.steps_per_iteration // self.env.num_envs
        self.window = k + steps_per_env
        # Enough segments to cover each iteration's steps about once.
        self.segments_per_iteration = max(1, round(self.steps_per_iteration / k))
        self.fit_steps = math.ceil(self.prefs.fit_pairs_per_env_step * self.chunk_iterations * self.steps_per_iteration
                                   / self.model_config.batch_size)
        # The most labels any chunk asks for: every chunk's share of the schedule fits.
        self.max_queries = max(1, int(self.labels_wanted_per_chunk().max()))
        warm_iterations = math.ceil(self.prefs.segment_capacity / self.segments_per_iteration) + math.ceil(k / steps_per_env)
        self.warm_iterations = warm_iterations

        self.reward_fn = reward_model.make_reward_fn(self.model_config, spec)
        self.iteration = self.agent.make_iteration(self.agent_config, self.env, self.reward_fn)
        self._init_jit = jax.jit(self._init)
        self._collect = compile_chunk(self._collect_fn, self.loop)
        # On a CPU a CNN's fitting runs one compiled step per dispatch (see trainer.resolve_loop).
        self.fit_from_python = self.loop == "python"
        self._learn = jax.jit(self._learn_fn, donate_argnums=0)
        self._ask_now = jax.jit(self._ask_fn, donate_argnums=0)
        self._fit_one = jax.jit(self._fit_one_fn, donate_argnums=0)
        self._after_fit_and_score = jax.jit(self._after_fit_and_score_fn, donate_argnums=0)
        self._select = jax.jit(self._select_fn)
        self._add_answers = jax.jit(self._add_answers_fn, donate_argnums=0)
        self._fit_and_score = jax.jit(self._fit_and_score_fn, donate_argnums=0)

    # ----------------------------------------------------------------- schedule
    def labels_due(self, env_steps: int) -> int:
        s = self.settings
        if not self.prefs.online:
            return s.labels
        return labels_due(env_steps, self.total_env_steps, s.labels, s.initial_labels, s.label_decay_steps)

    # ----------------------------------------------------------- pure pieces
    def _member_returns(self, ensemble):
        """Each member's summed predicted reward per segment: ``[P, k, ...] -> [M, P]``."""
        def member_returns(obs, action):
            return reward_model.member_returns(ensemble, self.model_config, self.env.spec, obs, action).sum(-1)

        return member_returns

    def _record_and_cut(self, recent, segments, key, transitions):
        return record_and_cut(recent, segments, key, transitions, self.segments_per_iteration)

    def _ask(self, state: RLHFState, key, wanted, num_queries: int) -> RLHFState:
        """Query up to ``num_queries`` pairs (the first ``wanted`` of them) and store the oracle's answers."""
        select_key, answer_key, add_key = jax.random.split(key, 3)
        first, second = select_queries(
            select_key, state.segments, self._member_returns(state.ensemble), num_queries,
            candidates_factor=self.prefs.candidates_factor, method=self.prefs.selection,
            random_answer_prob=self.model_config.random_answer_prob,
        )
        segments = state.segments
        mu, answered = oracle_answers(answer_key, segments.oracle_reward[first], segments.oracle_reward[second],
                                      self.prefs.teacher)
        asked = jnp.arange(num_queries) < wanted
        labels = add_labels(state.labels, segments, first, second, mu, answered & asked, add_key,
                            self.model_config.validation_fraction)
        return state._replace(labels=labels, labels_asked=state.labels_asked + jnp.minimum(wanted, num_queries))

    def _fit_one_fn(self, state: RLHFState) -> RLHFState:
        """One step of fitting every member (:func:`rlhf_jax.reward.ensemble.fit`)."""
        key, fit_key = jax.random.split(state.key)
        ensemble, _ = reward_model.fit(state.ensemble, self.model_config, self.env.spec, state.labels, fit_key, 1)
        return state._replace(ensemble=ensemble, key=key)

    def _fit_in_loop(self, state: RLHFState, num_steps: int) -> RLHFState:
        """``num_steps`` steps of fitting as one compiled loop."""
        return jax.lax.scan(lambda s, _: (self._fit_one_fn(s), None), state, None, num_steps)[0]

    def _fit_from_python(self, state: RLHFState, num_steps: int) -> RLHFState:
        """The same steps, one compiled step per dispatch: for CNNs on a CPU (see trainer.resolve_loop)."""
        for _ in range(num_steps):
            state = self._fit_one(state)
        return state

    def _after_fit(self, state: RLHFState) -> tuple[RLHFState, dict]:
        """Adapt each member's l2 to its validation loss, and renormalise on recent steps."""
        ensemble = state.ensemble
        key, loss_key, norm_key = jax.random.split(state.key, 3)
        train_loss, val_loss = reward_model.validation_losses(ensemble, self.model_config, self.env.spec,
                                                              state.labels, loss_key, self.settings.label_capacity)
        ensemble = ensemble._replace(l2=reward_model.adapt_l2(ensemble.l2, train_loss, val_loss, self.model_config))
        obs, action = self._recent_steps(state.segments, norm_key)
        ensemble = reward_model.update_normalization(ensemble, self.model_config, self.env.spec, obs, action)
        metrics = {"reward_train_loss": jnp.nanmean(train_loss), "reward_val_loss": jnp.nanmean(val_loss),
                   "reward_l2": ensemble.l2.mean()}
        return state._replace(ensemble=ensemble, key=key), metrics

    def _recent_steps(self, segments: Segments, key):
        """A sample of the (obs, action) steps in the recent segments."""
        rows = min(segments.capacity, max(1, NORMALIZATION_STEPS // segments.length))
        index = jax.random.randint(key, (rows,), 0, jnp.maximum(segments.count, 1))
        obs, action = segments.obs[index], segments.action[index]
        return obs.reshape(-1, *obs.shape[2:]), action.reshape(-1, *action.shape[2:])

    def _score_reward(self, state: RLHFState, key) -> dict:
        """The predictor against the oracle on fresh pairs: accuracy and reward correlation."""
        segments = state.segments
        first, second = candidate_pairs(key, segments, EVAL_PAIRS)
        predict = lambda i: reward_model.normalized_reward(state.ensemble, self.model_config, self.env.spec,
                                                           segments.obs[i], segments.action[i])
        predicted_1, predicted_2 = predict(first), predict(second)
        oracle_1, oracle_2 = segments.oracle_reward[first], segments.oracle_reward[second]
        true_diff = oracle_1.sum(-1) - oracle_2.sum(-1)
        decided = true_diff != 0
        agree = jnp.sign(predicted_1.sum(-1) - predicted_2.sum(-1)) == jnp.sign(true_diff)
        # NaN when every fresh pair ties (e.g. a policy that never fails): nothing to score.
        accuracy = jnp.where(decided.any(), jnp.where(decided, agree, False).sum() / jnp.maximum(decided.sum(), 1),
                             jnp.nan)
        x = jnp.concatenate([predicted_1, predicted_2]).ravel()
        y = jnp.concatenate([oracle_1, oracle_2]).ravel()
        x, y = x - x.mean(), y - y.mean()
        correlation = (x * y).sum() / jnp.sqrt((x * x).sum() * (y * y).sum() + 1e-12)
        return {"reward_accuracy": accuracy, "reward_correlation": correlation}

    # ---------------------------------------------------------- compiled steps
    def _init(self, key) -> RLHFState:
        """The compiled part of :meth:`init_runner` (all of it, unless fitting runs from Python)."""
        spec = self.env.spec
        agent_key, model_key, warm_key, ask_key, key = jax.random.split(key, 5)
        runner = self.agent.init_runner(agent_key, self.agent_config, self.env)
        ensemble = reward_model.init_ensemble(model_key, self.model_config, spec)
        k = self.settings.segment_length
        state = RLHFState(
            runner=runner, ensemble=ensemble,
            recent=empty_recent(spec, self.env.num_envs, self.window),
            segments=empty_segments(spec, self.prefs.segment_capacity, k),
            labels=empty_labels(spec, self.settings.label_capacity, k, self.model_config.ensemble_size),
            key=key, labels_asked=jnp.zeros((), jnp.int32),
        )
        segments = play_untrained(self.iteration, runner, ensemble, state.recent, state.segments,
                                  jax.random.split(warm_key, self.warm_iterations), self.segments_per_iteration)
        # `recent` starts afresh with RL; the reward model's inputs are standardised by the
        # untrained policy's steps, once, so that later fits never see their inputs move.
        obs = segments.obs.reshape(-1, *spec.observation_shape)
        ensemble = reward_model.set_input_statistics(ensemble, self.model_config, spec, obs)
        state = state._replace(segments=segments, ensemble=ensemble)
        initial = self.settings.initial_labels
        if initial and self.host is None:  # people answer theirs in `prepare`
            state = self._ask(state, ask_key, initial, initial)
            if not self.fit_from_python:
                state, _ = self._after_fit_and_score_fn(self._fit_in_loop(state, self.pretrain_steps))
        return state

    def init_runner(self, key) -> RLHFState:
        """A fresh run: the untrained policy's segments, the initial labels, pretraining."""
        state = self._init_jit(key)
        if self.fit_from_python and self.settings.initial_labels and self.host is None:
            state, _ = self._after_fit_and_score(self._fit_from_python(state, self.pretrain_steps))
        return state

    def prepare(self, state: RLHFState, first_chunk: int) -> RLHFState:
        """Before the first chunk a run (fresh or resumed) drives: with people, take back the
        queries the label store still holds; before RL, put the initial queries to them,
        wait for their answers (``people.wait_for_initial_labels``) and pretrain on them."""
        if self.host is None:
            return state
        state = state._replace(labels_asked=jnp.int32(self.host.restore(int(state.labels_asked))))
        if first_chunk > 0:
            return state
        state = self._exchange_with_labeler(state, max(0, self.settings.initial_labels - int(state.labels_asked)), -1)
        if self.config.people.wait_for_initial_labels:
            state = wait_for_answers(self.host, state, lambda s: self._exchange_with_labeler(s, 0, -1))
        state, _ = self._after_fit_and_score(self._fit_from_python(state, self.pretrain_steps))
        return state

    @property
    def pretrain_steps(self) -> int:
        """Fitting steps over the initial labels before RL (``pretrain_epochs`` of them; at least one)."""
        epochs_steps = self.settings.pretrain_epochs * self.settings.initial_labels / self.model_config.batch_size
        return max(1, math.ceil(epochs_steps))

    def _collect_fn(self, state: RLHFState):
        """One agent iteration on r̂, its steps recorded and cut into segments."""
        key, cut_key = jax.random.split(state.key)
        runner, metrics, transitions = self.iteration(state.runner, state.ensemble)
        recent, segments = self._record_and_cut(state.recent, state.segments, cut_key, transitions)
        return state._replace(runner=runner, recent=recent, segments=segments, key=key), metrics

    def _ask_fn(self, state: RLHFState, wanted) -> RLHFState:
        """The labels the schedule asks for, answered by the synthetic oracle."""
        key, ask_key = jax.random.split(state.key)
        return self._ask(state._replace(key=key), ask_key, wanted, self.max_queries)

    def _learn_fn(self, state: RLHFState, wanted):
        """The labels the schedule asks for, then fitting; and the predictor's scores."""
        return self._fit_and_score_fn(self._ask_fn(state, wanted))

    def _fit_and_score_fn(self, state: RLHFState):
        return self._after_fit_and_score_fn(self._fit_in_loop(state, self.fit_steps))

    def _after_fit_and_score_fn(self, state: RLHFState):
        state, fit_metrics = self._after_fit(state)
        return self._score(state, fit_metrics)

    def _score(self, state: RLHFState, fit_metrics: dict):
        key, score_key = jax.random.split(state.key)
        metrics = {"labels": state.labels.count, **fit_metrics, **self._score_reward(state, score_key)}
        return state._replace(key=key), metrics

    def _chunk_fn(self, state: RLHFState, wanted, length: int):
        """A chunk with the synthetic oracle as a pure function: ``length`` iterations on r̂,
        then ``wanted`` labels and the fitting."""
        state, metrics = jax.lax.scan(lambda s, _: self._collect_fn(s), state, None, length)
        state, learn_metrics = self._learn_fn(state, wanted)
        return state, (metrics, learn_metrics)

    def chunk_inputs(self, chunk: int) -> tuple[int, int]:
        return self.chunk_length(chunk), int(self.labels_wanted_per_chunk()[chunk])

    def sweep_chunk(self, state: RLHFState, length: int, wanted):
        """:meth:`_chunk_fn` with the chunk's learning metrics repeated per iteration, as ``run_chunk``'s."""
        state, (metrics, learn_metrics) = self._chunk_fn(state, wanted, length)
        return state, {**metrics, **{k: jnp.full(length, v) for k, v in learn_metrics.items()}}

    def _select_fn(self, state: RLHFState):
        """``max_queries`` pairs chosen for a host labeler: their segments, best first."""
        first, second = select_queries(
            jax.random.fold_in(state.key, state.labels_asked), state.segments,
            self._member_returns(state.ensemble), self.max_queries,
            candidates_factor=self.prefs.candidates_factor, method=self.prefs.selection,
            random_answer_prob=self.model_config.random_answer_prob,
        )
        pair = lambda x: jnp.stack([x[first], x[second]], axis=1)
        segments = state.segments
        return pair(segments.obs), pair(segments.action), pair(segments.oracle_reward)

    def _add_answers_fn(self, state: RLHFState, obs, action, oracle_reward, mu, answered):
        """Store host answers ``[max_queries]`` (rows where ``answered`` is false are padding)."""
        n = mu.shape[0]
        pairs = Segments(jnp.concatenate([obs[:, 0], obs[:, 1]]), jnp.concatenate([action[:, 0], action[:, 1]]),
                         jnp.concatenate([oracle_reward[:, 0], oracle_reward[:, 1]]),
                         jnp.int32(2 * n), jnp.int32(0))
        key, add_key = jax.random.split(state.key)
        labels = add_labels(state.labels, pairs, jnp.arange(n), n + jnp.arange(n), mu, answered, add_key,
                            self.model_config.validation_fraction)
        return state._replace(labels=labels, key=key)

    def _exchange_with_labeler(self, state: RLHFState, wanted: int, chunk: int) -> RLHFState:
        """Ask the host labeler for ``wanted`` more labels and store whatever answers arrived
        (during ``chunk``; -1: before RL)."""
        while wanted > 0:  # at most max_queries pairs per selection
            obs, action, oracle_reward = jax.device_get(self._select(state))
            first_id = int(state.labels_asked)
            asked = [Query(first_id + i, obs[i], action[i], oracle_reward[i]) for i in range(min(wanted, len(obs)))]
            self.host.ask(asked)
            state = state._replace(labels_asked=state.labels_asked + len(asked))
            wanted -= len(asked)
        arrived = self.host.arrived(chunk)
        for start in range(0, len(arrived), self.max_queries):
            queries, batch = zip(*arrived[start:start + self.max_queries])
            padding = self.max_queries - len(batch)
            stack = lambda xs: np.concatenate([np.stack(xs), np.zeros((padding, *xs[0].shape), xs[0].dtype)])
            mu = np.array([a.mu if a.mu is not None else 0.0 for a in batch] + [0.0] * padding, np.float32)
            answered = np.array([a.mu is not None for a in batch] + [False] * padding)  # "can't tell": dropped
            state = self._add_answers(state, stack([q.obs for q in queries]), stack([q.action for q in queries]),
                                      stack([q.oracle_reward for q in queries]), mu, answered)
        return state

    # ------------------------------------------------------------ the driver
    def run_chunk(self, state: RLHFState, chunk: int):
        length = self.chunk_length(chunk)
        state, metrics = self._collect(state, length)
        end_steps = (chunk * self.chunk_iterations + length) * self.steps_per_iteration
        wanted = max(0, self.labels_due(end_steps) - int(state.labels_asked))
        if self.host is not None:
            state = self._exchange_with_labeler(state, wanted, chunk)
        if self.fit_from_python:
            if self.host is None:
                state = self._ask_now(state, jnp.int32(wanted))
            state, learn_metrics = self._after_fit_and_score(self._fit_from_python(state, self.fit_steps))
        elif self.host is None:
            state, learn_metrics = self._learn(state, jnp.int32(wanted))
        else:
            state, learn_metrics = self._fit_and_score(state)
        learn_metrics["labels_waiting"] = len(self.host.pending) if self.host else 0
        metrics.update({k: np.full(length, v) for k, v in jax.device_get(learn_metrics).items()})
        return state, metrics

    def labels_wanted_per_chunk(self) -> np.ndarray:
        """What the schedule asks for at the end of each chunk (the synthetic oracle answers all)."""
        ends = [(c * self.chunk_iterations + self.chunk_length(c)) * self.steps_per_iteration
                for c in range(self.num_chunks)]
        due = np.array([self.settings.initial_labels] + [self.labels_due(end) for end in ends])
        return np.diff(due).astype(np.int32)

    def make_train(self):
        """The whole run with the synthetic oracle as one pure function, for ``jit`` and ``vmap``:

            train(key) -> (RLHFState, metrics of every iteration, metrics of every chunk)

        Chunk for chunk the same computation as ``rlhf-jax train`` drives from the host
        (``run_chunk``), so ``jax.vmap(train)`` runs several seeds as one program.
        ``train.from_state(state)`` is the run after :meth:`init_runner`: on a CPU with few
        cores, initialise seeds one at a time and vmap only this, because vmapped orthogonal
        initialisers run batched LAPACK QR kernels that can wait on each other for good
        (seen on 2 cores with jax 0.10.2: every thread idle inside ``lapack_sgeqrf``).
        """
        wanted = self.labels_wanted_per_chunk()
        full = self.total_iterations // self.chunk_iterations  # whole chunks; then a shorter one, if any
        rest = self.total_iterations - full * self.chunk_iterations

        chunk = self._chunk_fn

        def train_from(state):
            state, (metrics, learn_metrics) = jax.lax.scan(
                lambda s, w: chunk(s, w, self.chunk_iterations), state, jnp.asarray(wanted[:full]))
            flatten = lambda x: x.reshape(-1, *x.shape[2:])
            metrics = jax.tree.map(flatten, metrics)
            if rest:
                state, (last, last_learn) = chunk(state, jnp.int32(wanted[-1]), rest)
                metrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), metrics, last)
                learn_metrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), learn_metrics, last_learn)
            return state, metrics, learn_metrics

        def train(key):
            return train_from(self._init(key))

        train.from_state = train_from
        return train

    def reset_env(self, state: RLHFState, key) -> RLHFState:
        return state._replace(runner=super().reset_env(state.runner, key))

    def policy_params(self, state: RLHFState):
        return state.runner.params

    def save_labels(self, state: RLHFState, path) -> None:
        """The labels themselves, with the segments they compare, as a NumPy archive."""
        labels = jax.device_get(state.labels)
        n = int(labels.count)
        np.savez_compressed(path, obs=labels.obs[:n], action=labels.action[:n], mu=labels.mu[:n],
                            oracle_return=labels.oracle_return[:n], holdout=labels.holdout[:n])
