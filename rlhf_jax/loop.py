"""The RLHF loop of Christiano et al. 2017 (section 2.2), for any reward learner, as pure functions.

The paper runs three asynchronous processes: the policy learns from the predicted reward
r̂, clips of its play go to a labeler, and the predictor is fitted to the answers. Here
they take turns inside compiled chunks, and nothing but queries and answers ever needs to
cross to the host. The same loop serves preferences between segments and IBT's marks
inside clips: everything that differs is the :class:`~rlhf_jax.reward.learner.RewardLearner`.

1. :meth:`Loop.start`: the untrained policy plays (its parameters put back after every
   iteration) and its clips initialise the learner (input statistics); a run given a head
   start (:class:`~rlhf_jax.reward.learner.HeadStart`: a dataset's answers, a fitted model)
   takes it here;
2. :meth:`Loop.collect`: one agent iteration on the learned reward, its steps recorded and
   cut into clips;
3. :meth:`Loop.ask`: the answers the schedule wants by now are proposed and given by the
   synthetic labeler on the device (people answer from the host instead: :meth:`propose`
   and :meth:`store` are that seam);
4. :meth:`Loop.fit` and :meth:`Loop.refresh`: the learner's fitting steps (its share of the
   chunk's env steps), then its normalisation and scores.

:meth:`Loop.chunk` is 2 scanned over a chunk's iterations, then 3 and 4 (:meth:`learn`);
:meth:`Loop.make_train` is the whole run as one function of a key, for ``jit`` and ``vmap``.
On the environment's own reward (no learner) the same class is just the agent: its state the
agent's runner, a chunk its iterations. The host driver (:mod:`rlhf_jax.driver`) calls these same
functions, one compiled chunk at a time.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.agents.base import DrawnCountIteration, env_reward
from rlhf_jax.errors import ConfigError
from rlhf_jax.reward.data import Segments, empty_segments
from rlhf_jax.reward.learner import HeadStart, Queries, RewardLearner, fitting_blocks
from rlhf_jax.reward.segments import Recent, cut_segments, empty_recent, record


class LoopState(NamedTuple):
    runner: Any  # the agent's whole state
    learner: Any  # the learner's: its model and the answers it holds
    recent: Recent  # the last steps of every environment, to cut clips from
    clips: Segments  # recent clips: where queries come from
    key: jax.Array
    asked: jax.Array  # int32: queries put to the labeler so far

    @property
    def env_steps(self):
        return self.runner.env_steps


class TrainFunctions(NamedTuple):
    """:meth:`Loop.make_train`'s two pure functions: the whole run from a key, and the run from
    an initialised state."""

    whole: Callable  # (key, given=HeadStart()) -> (LoopState, iteration metrics, chunk metrics)
    from_state: Callable  # (LoopState) -> the same


class Loop:
    """One agent on one environment, and the reward learner it learns from (``None``: the
    environment's own reward): the loop's pure functions and its sizes.

    On the true reward the loop's state is the agent's runner itself and a chunk is its
    iterations alone; with a learner it is a :class:`LoopState`."""

    def __init__(self, agent, agent_config, env, learner: RewardLearner | None, chunk_env_steps: int):
        """``chunk_env_steps``: env steps per chunk, rounded down to whole iterations (at least one)."""
        self.agent, self.agent_config, self.env, self.learner = agent, agent_config, env, learner
        reward_fn = env_reward if learner is None else learner.reward_fn
        self.iteration = agent.make_iteration(agent_config, env, reward_fn)
        self.steps_per_iteration = agent.env_steps_per_iteration(agent_config, env)
        self.total_iterations = agent.num_iterations(agent_config, env)
        self.chunk_iterations = max(1, min(self.total_iterations, chunk_env_steps // self.steps_per_iteration))
        self.num_chunks = math.ceil(self.total_iterations / self.chunk_iterations)
        self.total_env_steps = self.total_iterations * self.steps_per_iteration
        if learner is None:
            self.wanted = np.zeros(self.num_chunks, np.int32)
            return
        k = learner.clip_length
        steps_per_env = self.steps_per_iteration // env.num_envs
        self.window = k + steps_per_env
        # Enough clips to cover each iteration's steps about once.
        self.clips_per_iteration = max(1, round(self.steps_per_iteration / k))
        if self.clips_per_iteration > learner.clip_capacity:
            raise ConfigError(f"one iteration of {self.steps_per_iteration} env steps (env.num_envs={env.num_envs}) "
                              f"cuts {self.clips_per_iteration} clips of {k} steps, more than the "
                              f"{learner.clip_capacity} recent clips kept (preferences.segment_capacity, "
                              f"ibt.episode_capacity): keep more, or take fewer steps per iteration")
        # Before RL: enough play to fill the clip buffer.
        self.warm_iterations = math.ceil(learner.clip_capacity / self.clips_per_iteration) + math.ceil(k / steps_per_env)
        self.fit_steps = learner.fit_steps(self.chunk_iterations * self.steps_per_iteration)
        self.wanted = self._wanted_per_chunk()
        # The most answers any chunk asks for: every chunk's share of the schedule fits.
        self.max_queries = max(1, int(self.wanted.max()))

    def runner_of(self, state):
        """The agent's runner in the loop's ``state``."""
        return state if self.learner is None else state.runner

    def reset_env(self, state, key):
        """``state`` with its environments freshly reset (after restoring an EnvPool run, whose pool died)."""
        runner = self.runner_of(state)
        env_state, timestep = self.env.reset(key)
        runner = runner._replace(env_state=env_state, obs=timestep.obs)
        return runner if self.learner is None else state._replace(runner=runner)

    # -------------------------------------------------------------- the schedule
    def chunk_length(self, chunk: int) -> int:
        return min(self.chunk_iterations, self.total_iterations - chunk * self.chunk_iterations)

    def due_after(self, chunk: int) -> int:
        """Answers the schedule wants by the end of ``chunk`` (-1: before RL)."""
        if chunk < 0:
            return self.learner.budget.initial_asked
        end = (chunk * self.chunk_iterations + self.chunk_length(chunk)) * self.steps_per_iteration
        return self.learner.budget.due(end, self.total_env_steps)

    def _wanted_per_chunk(self) -> np.ndarray:
        """New answers each chunk asks for (a synthetic labeler answers all it is asked)."""
        due = [self.due_after(chunk) for chunk in range(-1, self.num_chunks)]
        return np.diff(due).astype(np.int32)

    # ------------------------------------------------------------ pure functions
    def _record_and_cut(self, recent: Recent, clips: Segments, key, transitions) -> tuple[Recent, Segments]:
        recent = record(recent, transitions.obs, transitions.action, transitions.oracle_reward, transitions.done)
        return recent, cut_segments(recent, clips, key, self.clips_per_iteration)

    def start(self, key, given: HeadStart = HeadStart()) -> LoopState:
        """A fresh run before any answer asked (on the true reward: the agent's runner): the agent,
        and the learner initialised on the untrained policy's clips (it plays ``warm_iterations``
        iterations, its parameters put back after each), then given its head start, if any
        (``given``'s arrays)."""
        if self.learner is None:
            return self.agent.init_runner(key, self.agent_config, self.env)
        spec = self.env.spec
        agent_key, learner_key, warm_key, key = jax.random.split(key, 4)
        runner = self.agent.init_runner(agent_key, self.agent_config, self.env)
        recent = empty_recent(spec, self.env.num_envs, self.window)
        clips = empty_segments(spec, self.learner.clip_capacity, self.learner.clip_length)
        # The untrained policy's reward does not matter: its parameters are put back unchanged.
        untrained_reward = self.learner.reward_params(self.learner.init(learner_key, clips))

        def play(carry, key):
            playing, recent, clips = carry
            playing, _, transitions = self.iteration(playing, untrained_reward)
            playing = playing._replace(params=runner.params, opt_state=runner.opt_state)
            recent, clips = self._record_and_cut(recent, clips, key, transitions)
            return (playing, recent, clips), None

        (_, _, clips), _ = jax.lax.scan(play, (runner, recent, clips), jax.random.split(warm_key, self.warm_iterations))
        learner = self.learner.init(learner_key, clips)
        if not given.empty:  # its own key, derived: a run given nothing draws exactly as before
            learner = self.learner.head_start(learner, given, jax.random.fold_in(learner_key, 1))
        # `recent` starts afresh with RL.
        return LoopState(runner, learner, recent, clips, key, jnp.zeros((), jnp.int32))

    @property
    def draws_updates(self) -> bool:
        """Whether the agent's iteration draws how many updates it makes (:class:`DrawnCountIteration`)."""
        return isinstance(self.iteration, DrawnCountIteration)

    def updates_drawn(self, state) -> jax.Array:
        """The count of updates the next iteration from ``state`` draws (only where :attr:`draws_updates`)."""
        return self.iteration.count(self.runner_of(state))

    def collect(self, state: LoopState, updates: int | None = None) -> tuple[LoopState, dict]:
        """One agent iteration on the learned reward, its steps recorded and cut into clips (on
        the true reward: the iteration alone). ``updates`` (static): the count
        :meth:`updates_drawn` gives, for the iteration with its updates written out."""
        iteration = self.iteration if updates is None else self.iteration.with_count(updates)
        if self.learner is None:
            return iteration(state)[:2]
        key, cut_key = jax.random.split(state.key)
        runner, metrics, transitions = iteration(state.runner, self.learner.reward_params(state.learner))
        recent, clips = self._record_and_cut(state.recent, state.clips, cut_key, transitions)
        return state._replace(runner=runner, recent=recent, clips=clips, key=key), metrics

    def propose(self, state: LoopState, num: int) -> tuple[LoopState, Queries]:
        """``num`` queries from the recent clips, best first (``num`` static)."""
        key, propose_key = jax.random.split(state.key)
        return state._replace(key=key), self.learner.propose(state.learner, state.clips, propose_key, num)

    def store(self, state: LoopState, queries: Queries, answers) -> LoopState:
        """Store answers to ``queries`` (rows the answers do not count are dropped)."""
        key, store_key = jax.random.split(state.key)
        return state._replace(learner=self.learner.store(state.learner, queries, answers, store_key), key=key)

    def ask(self, state: LoopState, wanted, num: int) -> LoopState:
        """``num`` queries proposed, the first ``wanted`` of them answered by the synthetic labeler and stored."""
        state, queries = self.propose(state, num)
        key, oracle_key = jax.random.split(state.key)
        answers = self.learner.oracle(oracle_key, queries)
        asked = jnp.arange(num) < wanted
        answers = answers._replace(answered=answers.answered & asked)
        state = self.store(state._replace(key=key), queries, answers)
        return state._replace(asked=state.asked + jnp.minimum(wanted, num))

    def fit_one(self, state: LoopState) -> tuple[LoopState, jax.Array]:
        key, fit_key = jax.random.split(state.key)
        learner, loss = self.learner.fit_step(state.learner, fit_key)
        return state._replace(learner=learner, key=key), loss

    def fit(self, state: LoopState, steps: int) -> tuple[LoopState, jax.Array]:
        """``steps`` (static) fitting steps as one compiled loop; their mean loss."""
        state, losses = jax.lax.scan(lambda s, _: self.fit_one(s), state, None, steps)
        return state, losses.mean()

    def refresh(self, state: LoopState) -> tuple[LoopState, dict]:
        key, refresh_key = jax.random.split(state.key)
        learner, metrics = self.learner.refresh(state.learner, state.clips, refresh_key)
        return state._replace(learner=learner, key=key), metrics

    def fit_and_refresh(self, state: LoopState, steps: int) -> tuple[LoopState, dict]:
        """``steps`` (static) fitting steps in blocks, each followed by a refresh
        (:func:`~rlhf_jax.reward.learner.fitting_blocks`): the last refresh's metrics, and
        the mean loss of every step (NaN for none)."""
        blocks = fitting_blocks(steps, self.learner.refresh_every)
        if not blocks:
            state, metrics = self.refresh(state)
            return state, {**metrics, "reward_fit_loss": jnp.float32(jnp.nan)}
        total_loss = 0.0
        for length, count in blocks:
            def block(state, _, length=length):
                state, loss = self.fit(state, length)
                state, metrics = self.refresh(state)
                return state, (loss, metrics)

            state, (losses, metrics) = jax.lax.scan(block, state, None, count)
            total_loss = total_loss + losses.sum() * length
        return state, {**jax.tree.map(lambda x: x[-1], metrics), "reward_fit_loss": total_loss / steps}

    def learn(self, state: LoopState, wanted, via=None) -> tuple[LoopState, dict]:
        """The end of a chunk: ``wanted`` answers from the synthetic labeler, fitting, refresh
        (on the true reward: nothing). ``via``: whose ``ask`` and ``fit_and_refresh`` take these
        steps (default: this loop's pure functions; the host's may dispatch them one at a time,
        :class:`rlhf_jax.driver.CompiledLoop`)."""
        if self.learner is None:
            return state, {}
        via = via or self
        return via.fit_and_refresh(via.ask(state, wanted, self.max_queries), self.fit_steps)

    def chunk(self, state: LoopState, length: int, wanted) -> tuple[LoopState, dict, dict]:
        """``length`` (static) iterations on the learned reward, then :meth:`learn`:
        ``(state, metrics of every iteration, metrics of the chunk's learning)``."""
        state, metrics = jax.lax.scan(lambda s, _: self.collect(s), state, None, length)
        state, learned = self.learn(state, wanted)
        return state, metrics, learned

    def pretrain(self, state: LoopState, via=None) -> tuple[LoopState, dict]:
        """Before RL: the initial answers from the synthetic labeler (those a dataset did not
        give), and fitting on every answer held (on the true reward: nothing). ``via``: whose
        ``ask``, ``fit_and_refresh`` and ``refresh`` take these steps, as in :meth:`learn`."""
        if self.learner is None:
            return state, {}
        via, budget = via or self, self.learner.budget
        if budget.initial_asked:
            state = via.ask(state, budget.initial_asked, budget.initial_asked)
        if budget.initial_asked or budget.preloaded:
            return via.fit_and_refresh(state, self.learner.pretrain_steps)
        return via.refresh(state)

    def init(self, key, given: HeadStart = HeadStart()) -> LoopState:
        """A fresh run with the synthetic labeler: :meth:`start`, then :meth:`pretrain`."""
        return self.pretrain(self.start(key, given))[0]

    def make_train(self) -> "TrainFunctions":
        """The whole run with the synthetic labeler as pure functions, for ``jit`` and ``vmap``:

            whole(key, given=HeadStart()) -> (LoopState, metrics of every iteration, metrics of every chunk)
            from_state(state) -> the same, from the state :meth:`init` returns

        Chunk for chunk the computation ``rlhf-jax train`` drives from the host, so
        ``jax.vmap(whole)`` runs several seeds as one program. On a CPU with few cores,
        initialise seeds one at a time and vmap only ``from_state``, because vmapped orthogonal
        initialisers run batched LAPACK QR kernels that can wait on each other for good (seen on
        2 cores with jax 0.10.2).
        """
        full = self.total_iterations // self.chunk_iterations  # whole chunks; then a shorter one, if any
        rest = self.total_iterations - full * self.chunk_iterations

        def train_from(state):
            state, (metrics, learned) = jax.lax.scan(
                lambda s, w: (lambda s, m, l: (s, (m, l)))(*self.chunk(s, self.chunk_iterations, w)),
                state, jnp.asarray(self.wanted[:full]))
            metrics = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics)
            if rest:
                state, last, last_learned = self.chunk(state, rest, jnp.int32(self.wanted[-1]))
                metrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), metrics, last)
                learned = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), learned, last_learned)
            return state, metrics, learned

        def whole(key, given: HeadStart = HeadStart()):
            return train_from(self.init(key, given))

        return TrainFunctions(whole, train_from)
