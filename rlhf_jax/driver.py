"""The one host driver: every run, ``rlhf-jax train``'s or a sweep's, is a :class:`~rlhf_jax.loop.Loop`
driven from the host one compiled chunk at a time.

:class:`Driver` builds a run from its config: the environment, the reward learner (none on the
environment's reward), the loop and its compiled functions (:class:`CompiledLoop`, where
``run.loop``'s dispatch is applied). With the synthetic labeler (or no labeler) a chunk is one
compiled call of :meth:`Loop.chunk <rlhf_jax.loop.Loop.chunk>` and one read of its metrics.
People plug in at one seam (:class:`~rlhf_jax.people_seam.PeopleSeam`): between a chunk's
iterations and its fitting, queries leave the device and answers come back. The host loop that
runs the chunks, saves and stops is :mod:`rlhf_jax.host_loop`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp

from rlhf_jax.agents import get_agent
from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.config import ExperimentConfig, to_dict
from rlhf_jax.dispatch import dispatch_of, repeat, repeat_drawn
from rlhf_jax.envs import ATARI_NAMES, EnvConfig, make
from rlhf_jax.envs.options import without_run_changes
from rlhf_jax.errors import ConfigError
from rlhf_jax.evaluation import LearnedReward, evaluate
from rlhf_jax.files import write_atomically
from rlhf_jax.head_start import HeadStartFiles
from rlhf_jax.loop import Loop, LoopState
from rlhf_jax.reward.ibt_learner import IBTLearner
from rlhf_jax.reward.kinds import PREFERENCES, feedback_kind
from rlhf_jax.reward.learner import HeadStart, RewardLearner, fitting_blocks
from rlhf_jax.reward.preference_learner import PreferenceLearner


def true_reward_env_config(config: ExperimentConfig) -> EnvConfig:
    """The environment a run on the true reward uses: DQN on Atari ends the agent's
    episode at each lost life (Mnih 2015), unless the config turns that off."""
    env = config.env
    atari = env.id.removeprefix("envpool/") in ATARI_NAMES
    if config.agent == "dqn" and config.dqn.life_loss_ends_episode and atari and not env.hide_episode_end:
        return dataclasses.replace(env, episodic_life=True)
    return env


def make_learner(config: ExperimentConfig, spec, preloaded: int = 0) -> RewardLearner:
    """The reward learner ``config.reward`` names, for an environment of ``spec`` (``preloaded``:
    the answers a dataset gives it at the start, :mod:`rlhf_jax.head_start`)."""
    if feedback_kind(config.reward) is PREFERENCES:
        return PreferenceLearner(config.preferences, config.reward_model, spec, preloaded)
    return IBTLearner(config.ibt, spec, preloaded)


def scoring_env_config(config: ExperimentConfig) -> EnvConfig:
    """Where a run's policy is scored (``rlhf-jax eval``, ``run.score_on_task``): ``run.eval_episodes``
    copies of its environment, seeded apart from training's; with ``run.score_on_task``, the task
    itself, without the run's changes to episode ends, lengths and the oracle (the true reward scores)."""
    env = dataclasses.replace(config.env, num_envs=config.run.eval_episodes, seed=config.env.seed + 10_000)
    return without_run_changes(env) if config.run.score_on_task else env


def scoring_steps(config: ExperimentConfig, spec) -> int:
    """How long a scored play runs: ``run.eval_max_steps``, or one step past the episode limit,
    so that every copy's first episode ends inside it."""
    return config.run.eval_max_steps or spec.max_episode_steps + 1


class CompiledLoop:
    """The loop's functions as the host calls them, each compiled once, under the run's
    dispatch (:mod:`rlhf_jax.dispatch`): with ``"scan"`` a chunk is one compiled call; with
    ``"python"`` its iterations, and the reward model's fitting steps, are dispatched one at a
    time, through the loop's own :meth:`~rlhf_jax.loop.Loop.pretrain` and
    :meth:`~rlhf_jax.loop.Loop.learn` (``via`` this object), so the order of the steps is theirs."""

    def __init__(self, loop: Loop, dispatch: str):
        self.loop, self.dispatch = loop, dispatch
        self.start = jax.jit(loop.start)
        # (state, length) -> (state, metrics of each iteration)
        self.collect = (repeat_drawn(loop.collect, loop.updates_drawn, dispatch) if loop.draws_updates
                        else repeat(loop.collect, dispatch))
        self._ask = jax.jit(loop.ask, static_argnums=2, donate_argnums=0)
        if dispatch == "scan":
            self._init = jax.jit(loop.init)
            self._chunk = jax.jit(loop.chunk, static_argnums=1, donate_argnums=0)
            self._fit_and_refresh = jax.jit(loop.fit_and_refresh, static_argnums=1, donate_argnums=0)
        else:
            self._fit = repeat(loop.fit_one, dispatch)
            self.refresh = jax.jit(loop.refresh, donate_argnums=0)

    def init(self, key, given: HeadStart = HeadStart()):
        """:meth:`Loop.init <rlhf_jax.loop.Loop.init>`: a fresh run, pretrained on the synthetic labeler's initial answers."""
        if self.dispatch == "scan":
            return self._init(key, given)
        return self.loop.pretrain(self.start(key, given), via=self)[0]

    def ask(self, state: LoopState, wanted: int, num: int) -> LoopState:
        """:meth:`Loop.ask <rlhf_jax.loop.Loop.ask>`, alone (under either dispatch)."""
        return self._ask(state, jnp.int32(wanted), num)

    def fit_and_refresh(self, state: LoopState, steps: int) -> tuple[LoopState, dict]:
        """:meth:`Loop.fit_and_refresh <rlhf_jax.loop.Loop.fit_and_refresh>`."""
        if self.dispatch == "scan":
            return self._fit_and_refresh(state, steps)
        losses = []
        for length, count in fitting_blocks(steps, self.loop.learner.refresh_every):
            for _ in range(count):
                state, block = self._fit(state, length)
                losses.append(block)
                state, metrics = self.refresh(state)
        if not losses:
            state, metrics = self.refresh(state)
        loss = jnp.mean(jnp.concatenate(losses)) if losses else jnp.nan
        return state, {**metrics, "reward_fit_loss": loss}

    def chunk(self, state, length: int, wanted: int):
        """:meth:`Loop.chunk <rlhf_jax.loop.Loop.chunk>`: ``(state, metrics of each iteration, metrics of its learning)``."""
        if self.dispatch == "scan":
            return self._chunk(state, length, jnp.int32(wanted))
        state, metrics = self.collect(state, length)
        state, learned = self.loop.learn(state, wanted, via=self)
        return state, metrics, learned


class Driver:
    """A run's agent, environment, reward learner (none on the environment's reward) and
    loop, compiled, as the host drives them chunk by chunk: what ``rlhf-jax train``, a sweep's
    groups, ``rlhf-jax eval`` and the benchmarks build from a config."""

    def __init__(self, config: ExperimentConfig, members: int = 1):
        """``members``: the runs of a sweep that will share this one's environment (``envs.make``)."""
        self.config = config
        self.agent = get_agent(config.agent)
        self.agent_config = getattr(config, config.agent)
        self.kind = feedback_kind(config.reward)  # None on the environment's reward
        learned = self.kind is not None
        # A learned reward's agent never sees life-loss episodes or other true-reward helpers.
        self.env = make(config.env if learned else true_reward_env_config(config), members)
        # A dataset's labels and a fitted reward model to start from: checked now, read at the start.
        self.head_start = HeadStartFiles(config, self.env.spec) if learned else None
        self.learner = make_learner(config, self.env.spec, self.head_start.preloaded) if learned else None
        steps_per_iteration = self.agent.env_steps_per_iteration(self.agent_config, self.env)
        if self.agent_config.total_env_steps < steps_per_iteration:
            raise ConfigError(f"{config.agent}.total_env_steps={self.agent_config.total_env_steps} is less than one "
                              f"iteration: at least {steps_per_iteration} env steps here "
                              f"(env.num_envs={self.env.num_envs})")
        self.loop = Loop(self.agent, self.agent_config, self.env, self.learner, config.run.chunk_env_steps)
        self.compiled = CompiledLoop(self.loop, dispatch_of(config.run.loop, self.env.spec))
        self.people = None  # a PeopleSeam, once people are attached

    @property
    def num_chunks(self) -> int:
        return self.loop.num_chunks

    def init(self, key):
        """A fresh run's state from ``key``; with the synthetic labeler, pretrained on its initial
        answers (with people, :meth:`PeopleSeam.prepare <rlhf_jax.people_seam.PeopleSeam.prepare>`
        asks them). A head start (:mod:`rlhf_jax.head_start`) is read here, unless the run is only
        traced for its shapes."""
        if self.learner is None:
            return self.compiled.init(key)
        given = self.head_start.arrays(abstract=isinstance(key, jax.core.Tracer))
        return self.compiled.start(key, given) if self.people else self.compiled.init(key, given)

    def abstract_state(self):
        """The shapes and dtypes of a run's state, to restore a checkpoint into."""
        return jax.eval_shape(self.init, jax.random.PRNGKey(0))

    def restore_latest(self, run_dir: Path):
        """The newest checkpoint of ``run_dir``: (its chunk, its state)."""
        return Checkpoints(run_dir, config=to_dict(self.config)).restore(self.abstract_state())

    def run_chunk(self, state, chunk: int):
        """Chunk ``chunk``: ``(state, metrics of each iteration, metrics of its learning)``."""
        length = self.loop.chunk_length(chunk)
        if self.people is None:
            return self.compiled.chunk(state, length, int(self.loop.wanted[chunk]))
        return self.people.chunk(state, chunk, length)

    def policy_params(self, state):
        return self.loop.runner_of(state).params

    def learned_reward(self, state) -> LearnedReward | None:
        """The reward the run learned, as of ``state``: none on the environment's reward."""
        if self.learner is None:
            return None
        return LearnedReward(self.learner.reward_fn, self.learner.reward_params(state.learner))

    def optimizer_states(self) -> dict[str, str]:
        """Where the optimiser state of each config section the run uses lives in its state:
        a path prefix, as ``jax.tree_util.keystr`` writes paths (``""``: the whole state)."""
        if self.learner is None:
            return {self.config.agent: ""}
        return {self.config.agent: ".runner", self.kind.model_section: ".learner"}

    def unmeasured(self, row: dict) -> set[str]:
        """The losses in a chunk's ``row`` that a NaN leaves unmeasured rather than diverged: the
        learner's, and the fitting loss of a run that fits nothing (``fit_pairs_per_env_step=0``)."""
        if self.kind is None:
            return set()
        return self.kind.unmeasured(row) | ({"reward_fit_loss"} if self.loop.fit_steps == 0 else set())

    def save_outputs(self, state, run_dir: Path) -> None:
        """What a finished run writes besides its checkpoints and metrics: with a learned
        reward, the answers it learned from, with their clips (``labels.npz``)."""
        if self.learner is not None:
            write_atomically(run_dir / "labels.npz", lambda path: self.kind.save_answers(state.learner, path))

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
