"""The RLHF loop with IBT in place of pairwise preferences (the IBT paper, sections 4-5).

The same shape as :mod:`rlhf_jax.pipeline`, with whole annotated episodes instead of
labelled pairs:

1. before RL the untrained policy plays; clips of ``ibt.episode_length`` steps are cut
   from its rollouts (never across a restart) and the first ``initial_episodes`` of them
   are annotated by the synthetic annotator (:mod:`rlhf_jax.reward.annotators`);
2. each chunk runs the agent's iterations on equation 2's reward, ``U(x_{t+1}) - U(x_t)``
   scaled to ``ibt.normalized_std``, and cuts clips from the steps taken;
3. the episodes the schedule asks for by now (rate ~ c / (T + c), as for labels) are
   drawn at random from the recent clips and annotated on the device;
   (or, given a host ``labeler``, sent to people, whose marks are stored when they arrive);
4. the utility takes ``fit_episodes_per_env_step`` episodes' worth of Adam steps on
   Algorithm 1's loss, and the reward's scale is renewed on recent clips.

Metrics besides the true return: ``labels`` (annotated episodes), ``ibt_loss`` and
``reward_correlation``, the correlation of U's rise with the annotator's progress signal on
recent clips.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.config import ExperimentConfig
from rlhf_jax.reward import ibt
from rlhf_jax.reward.annotators import progress_increments, synthetic_marks
from rlhf_jax.reward.data import Segments, empty_segments
from rlhf_jax.reward.people import AsyncLabeler, HostLabels, Query, wait_for_answers
from rlhf_jax.reward.schedule import labels_due
from rlhf_jax.pipeline import play_untrained, record_and_cut
from rlhf_jax.reward.segments import Recent, empty_recent
from rlhf_jax.trainer import AgentRun, compile_chunk

SCORE_CLIPS = 64  # recent clips the reward is scored (and scaled) on each chunk


class Annotated(NamedTuple):
    """Annotated episodes: the dataset D of Algorithm 1."""

    obs: jax.Array  # [C, T, *obs_shape]
    marks: jax.Array  # [C, T] int32 in {-1, 0, +1}
    count: jax.Array  # () int32


class IBTRunState(NamedTuple):
    runner: Any
    model: ibt.IBTState
    recent: Recent
    clips: Segments  # recent clips: where episodes to annotate come from
    annotated: Annotated
    key: jax.Array
    episodes_asked: jax.Array  # () int32

    @property
    def env_steps(self):
        return self.runner.env_steps


class IBTTraining(AgentRun):
    """Everything compiled for one IBT run; driven by ``rlhf-jax train`` like the others."""

    def __init__(self, config: ExperimentConfig, labeler: AsyncLabeler | None = None, members: int = 1):
        """``labeler``: people (or any host-side annotator, :mod:`rlhf_jax.reward.people`) in place
        of the synthetic annotator on the device; it marks every episode, the initial ones too."""
        super().__init__(config, config.env, members)
        self.ibt = config.ibt
        self.host = HostLabels(labeler) if labeler is not None else None
        spec = self.env.spec
        length = self.ibt.episode_length
        steps_per_env = self.steps_per_iteration // self.env.num_envs
        self.window = length + steps_per_env
        self.clips_per_iteration = max(1, round(self.steps_per_iteration / length))
        self.total_env_steps = self.total_iterations * self.steps_per_iteration
        self.initial_episodes = self.ibt.resolved_initial_episodes
        self.fit_steps = math.ceil(self.ibt.fit_episodes_per_env_step * self.chunk_iterations
                                   * self.steps_per_iteration / self.ibt.batch_episodes)
        self.pretrain_steps = max(1, math.ceil(self.ibt.pretrain_epochs * self.initial_episodes
                                               / self.ibt.batch_episodes))
        self.warm_iterations = (math.ceil(self.ibt.episode_capacity / self.clips_per_iteration)
                                + math.ceil(length / steps_per_env))
        self.max_queries = max(1, int(self.episodes_wanted_per_chunk().max()))
        self.reward_fn = ibt.make_reward_fn(self.ibt, spec)
        self.iteration = self.agent.make_iteration(self.agent_config, self.env, self.reward_fn)
        self._collect = compile_chunk(self._collect_fn, self.loop)
        self._learn = jax.jit(self._learn_fn, donate_argnums=0)
        self._pick = jax.jit(self._pick_fn, static_argnums=2)
        self._store = jax.jit(self._store_fn, donate_argnums=0)
        self._fit_and_score = jax.jit(self._fit_and_score_fn, donate_argnums=0)
        self._pretrain = jax.jit(lambda s: self._rescale_and_score(self._fit(s, self.pretrain_steps)[0])[0])
        self.init_runner = jax.jit(self._init)

    # ----------------------------------------------------------------- schedule
    def episodes_due(self, env_steps: int) -> int:
        return labels_due(env_steps, self.total_env_steps, self.ibt.episodes, self.initial_episodes,
                          self.ibt.annotation_decay_steps)

    def episodes_wanted_per_chunk(self) -> np.ndarray:
        ends = [(c * self.chunk_iterations + self.chunk_length(c)) * self.steps_per_iteration
                for c in range(self.num_chunks)]
        return np.diff([self.initial_episodes] + [self.episodes_due(end) for end in ends]).astype(np.int32)

    # ------------------------------------------------------------ pure pieces
    def _record_and_cut(self, recent, clips, key, transitions):
        return record_and_cut(recent, clips, key, transitions, self.clips_per_iteration)

    def _pick_fn(self, clips: Segments, key, num: int):
        """``num`` recent clips drawn at random: their indices."""
        return jax.random.randint(key, (num,), 0, jnp.maximum(clips.count, 1))

    def _store_fn(self, state: IBTRunState, obs, marks, keep) -> IBTRunState:
        """Append the episodes ``obs [n, T, ...]`` with ``marks [n, T]`` where ``keep [n]``."""
        stored = state.annotated
        capacity = stored.marks.shape[0]
        rows = jnp.where(keep, stored.count + jnp.cumsum(keep) - 1, capacity)  # beyond capacity: dropped
        annotated = Annotated(stored.obs.at[rows].set(obs, mode="drop"), stored.marks.at[rows].set(marks, mode="drop"),
                              jnp.minimum(stored.count + keep.sum(), capacity).astype(jnp.int32))
        return state._replace(annotated=annotated)

    def _annotate(self, state: IBTRunState, key, wanted, num: int) -> IBTRunState:
        """Draw ``num`` recent clips at random, annotate the first ``wanted`` and store them."""
        pick_key, mark_key = jax.random.split(key)
        clips = state.clips
        index = self._pick_fn(clips, pick_key, num)
        increments = progress_increments(self.ibt.annotator, self.env.spec.id, clips.obs[index],
                                         clips.oracle_reward[index])
        marks = synthetic_marks(mark_key, self.ibt.annotator, increments)
        taken = jnp.minimum(wanted, num)
        state = self._store_fn(state, clips.obs[index], marks, jnp.arange(num) < taken)
        return state._replace(episodes_asked=state.episodes_asked + taken)

    def _exchange_with_labeler(self, state: IBTRunState, wanted: int, chunk: int) -> IBTRunState:
        """Send ``wanted`` recent clips to the host annotator; store the marks that have arrived
        (during ``chunk``; -1: before RL)."""
        if wanted:
            key, pick_key = jax.random.split(state.key)
            index = self._pick(state.clips, pick_key, wanted)
            clips = state.clips  # only the chosen clips leave the device
            obs, action, reward = jax.device_get((clips.obs[index], clips.action[index], clips.oracle_reward[index]))
            first = int(state.episodes_asked)
            asked = [Query(first + i, obs[i][None], action[i][None], reward[i][None]) for i in range(wanted)]
            self.host.ask(asked)
            state = state._replace(key=key, episodes_asked=state.episodes_asked + len(asked))
        arrived = self.host.arrived(chunk)
        if arrived:
            queries, arrived = zip(*arrived)
            obs = np.stack([q.obs[0] for q in queries])
            marks = np.stack([a.marks if a.marks is not None else np.zeros(obs.shape[1], np.int32) for a in arrived])
            keep = np.array([a.marks is not None for a in arrived])  # no marks: skipped, never stored
            # Padded to a power of two, so that few batch sizes are ever compiled.
            pad = (1 << (len(arrived) - 1).bit_length()) - len(arrived)
            padding = lambda x: np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
            state = self._store(state, padding(obs), padding(marks.astype(np.int32)), padding(keep))
        return state

    def _fit(self, state: IBTRunState, steps: int) -> tuple[IBTRunState, jax.Array]:
        """``steps`` Adam steps on batches of annotated episodes drawn with replacement."""
        spec, config = self.env.spec, self.ibt

        def step(carry, key):
            model = carry
            pick_key, loss_key = jax.random.split(key)
            index = jax.random.randint(pick_key, (config.batch_episodes,), 0, jnp.maximum(state.annotated.count, 1))
            marks = state.annotated.marks[index]
            valid = jnp.broadcast_to(state.annotated.count > 0, marks.shape)
            return ibt.fit_step(model, config, spec, state.annotated.obs[index], marks, valid, loss_key)

        key, fit_key = jax.random.split(state.key)
        model, losses = jax.lax.scan(step, state.model, jax.random.split(fit_key, steps))
        return state._replace(model=model, key=key), losses.mean()

    def _rescale_and_score(self, state: IBTRunState) -> tuple[IBTRunState, dict]:
        key, score_key = jax.random.split(state.key)
        clips = state.clips
        index = jax.random.randint(score_key, (SCORE_CLIPS,), 0, jnp.maximum(clips.count, 1))
        obs = clips.obs[index]
        model = ibt.update_reward_scale(state.model, self.ibt, self.env.spec, obs)
        rise = ibt.utility_rises(model, self.ibt, self.env.spec, obs).ravel()
        signal = progress_increments(self.ibt.annotator, self.env.spec.id, obs, clips.oracle_reward[index]).ravel()
        x, y = rise - rise.mean(), signal - signal.mean()
        correlation = (x * y).sum() / jnp.sqrt((x * x).sum() * (y * y).sum() + 1e-12)
        metrics = {"labels": state.annotated.count, "reward_correlation": correlation,
                   "marks": jnp.abs(state.annotated.marks).sum()}
        return state._replace(model=model, key=key), metrics

    # ---------------------------------------------------------- compiled steps
    def _init(self, key) -> IBTRunState:
        spec = self.env.spec
        agent_key, model_key, warm_key, ask_key, key = jax.random.split(key, 5)
        runner = self.agent.init_runner(agent_key, self.agent_config, self.env)
        model = ibt.init_ibt(model_key, self.ibt, spec)
        length = self.ibt.episode_length
        state = IBTRunState(
            runner=runner, model=model, recent=empty_recent(spec, self.env.num_envs, self.window),
            clips=empty_segments(spec, self.ibt.episode_capacity, length),
            annotated=Annotated(jnp.zeros((self.ibt.episodes, length, *spec.observation_shape), spec.observation_dtype),
                                jnp.zeros((self.ibt.episodes, length), jnp.int32), jnp.zeros((), jnp.int32)),
            key=key, episodes_asked=jnp.zeros((), jnp.int32))

        clips = play_untrained(self.iteration, runner, model, state.recent, state.clips,
                               jax.random.split(warm_key, self.warm_iterations), self.clips_per_iteration)
        model = ibt.set_input_statistics(model, spec, clips.obs)
        state = state._replace(clips=clips, model=model)
        if self.initial_episodes and self.host is None:  # people mark theirs in `prepare`
            state = self._annotate(state, ask_key, self.initial_episodes, self.initial_episodes)
            state, _ = self._fit(state, self.pretrain_steps)
        return self._rescale_and_score(state)[0]

    def _collect_fn(self, state: IBTRunState):
        key, cut_key = jax.random.split(state.key)
        runner, metrics, transitions = self.iteration(state.runner, state.model)
        recent, clips = self._record_and_cut(state.recent, state.clips, cut_key, transitions)
        return state._replace(runner=runner, recent=recent, clips=clips, key=key), metrics

    def _learn_fn(self, state: IBTRunState, wanted):
        key, ask_key = jax.random.split(state.key)
        return self._fit_and_score_fn(self._annotate(state._replace(key=key), ask_key, wanted, self.max_queries))

    def _fit_and_score_fn(self, state: IBTRunState):
        state, loss = self._fit(state, self.fit_steps)
        state, metrics = self._rescale_and_score(state)
        return state, {**metrics, "ibt_loss": loss}

    def run_chunk(self, state: IBTRunState, chunk: int):
        length = self.chunk_length(chunk)
        state, metrics = self._collect(state, length)
        end_steps = (chunk * self.chunk_iterations + length) * self.steps_per_iteration
        wanted = max(0, self.episodes_due(end_steps) - int(state.episodes_asked))
        if self.host is None:
            state, learn_metrics = self._learn(state, jnp.int32(wanted))
        else:
            state, learn_metrics = self._fit_and_score(self._exchange_with_labeler(state, wanted, chunk))
        learn_metrics["labels_waiting"] = len(self.host.pending) if self.host else 0
        metrics.update({k: np.full(length, v) for k, v in jax.device_get(learn_metrics).items()})
        return state, metrics

    def chunk_inputs(self, chunk: int) -> tuple[int, int]:
        return self.chunk_length(chunk), int(self.episodes_wanted_per_chunk()[chunk])

    def sweep_chunk(self, state: IBTRunState, length: int, wanted):
        """A chunk with the synthetic annotator as a pure function (``run_chunk`` without the host)."""
        state, metrics = jax.lax.scan(lambda s, _: self._collect_fn(s), state, None, length)
        state, learn_metrics = self._learn_fn(state, wanted)
        return state, {**metrics, **{k: jnp.full(length, v) for k, v in learn_metrics.items()}}

    def prepare(self, state: IBTRunState, first_chunk: int) -> IBTRunState:
        """Before the first chunk a run drives: with people, take back the episodes the label
        store still holds; before RL, send the initial episodes, wait for their marks
        (``people.wait_for_initial_labels``) and pretrain on them."""
        if self.host is None:
            return state
        state = state._replace(episodes_asked=jnp.int32(self.host.restore(int(state.episodes_asked))))
        if first_chunk > 0:
            return state
        state = self._exchange_with_labeler(state, max(0, self.initial_episodes - int(state.episodes_asked)), -1)
        if self.config.people.wait_for_initial_labels:
            state = wait_for_answers(self.host, state, lambda s: self._exchange_with_labeler(s, 0, -1))
        return self._pretrain(state)

    def reset_env(self, state: IBTRunState, key) -> IBTRunState:
        return state._replace(runner=super().reset_env(state.runner, key))

    def policy_params(self, state: IBTRunState):
        return state.runner.params

    def save_labels(self, state: IBTRunState, path) -> None:
        """The annotated episodes and their marks, as a NumPy archive."""
        annotated = jax.device_get(state.annotated)
        n = int(annotated.count)
        np.savez_compressed(path, obs=annotated.obs[:n], marks=annotated.marks[:n])
