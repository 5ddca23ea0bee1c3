"""The environment protocol every back end presents.

An environment is a pair of pure functions over a batch of ``num_envs`` copies:

    reset(key)            -> (state, TimeStep)
    step(state, action)   -> (state, TimeStep)

``step`` resets finished copies automatically, so an agent can ``lax.scan`` it for
ever. Everything in a ``TimeStep`` has the batch as its leading axis ``[N, ...]``.

What travels where, each field described here and nowhere else (the agent never has
to read the true reward):

==================  =============  ==================================================================
field               type           meaning
==================  =============  ==================================================================
``obs``             ``[N, *obs]``  ``o_{t+1}``; after an automatic reset, the new episode's first
                                   observation.
``reward``          float32 [N]    the task reward under the chosen modifications: what a synthetic
                                   oracle judges by (appendix A of Christiano et al.).
``terminated``      bool [N]       the agent's episode ended in a terminal state: its return
                                   bootstraps from 0.
``truncated``       bool [N]       the agent's episode was cut by its time limit (and did not
                                   terminate): its return bootstraps from ``V(final_obs)``.
``final_obs``       ``[N, *obs]``  the observation the step reached, before any automatic reset:
                                   ``obs`` where no reset happened. With a hidden end that restarts
                                   a copy (gymnax ``hidden_end="reset"``, a diverged MJX copy) it is
                                   the real last observation while ``obs`` is the new episode's
                                   first. EnvPool resets on the *next* step, so there it always
                                   equals ``obs`` (which is real).
``action_ignored``  bool [N]       EnvPool's reset step: a new game's first frame, the action had no
                                   effect, the reward is 0 and the step carries no loss. Always
                                   False on gymnax and MJX.
``info``            dict           diagnostics only (below); no agent reads episode ends from it.
``done``            property       ``terminated | truncated``: the agent's episode boundary. With
                                   ``hide_episode_end`` it carries no information about the task.
==================  =============  ==================================================================

``info`` holds ``true_reward`` (the unmodified environment's reward), ``true_done``
(the end of an unmodified episode), ``episode_return`` and ``episode_length`` (the
finished true episode's totals wherever ``true_done`` is set), and back-end extras
(Atari's ``lives``; MJX's ``unhealthy``, ``failed``, ``ctrl_cost`` and reward terms).

How an agent treats the ends is one rule for every agent,
:func:`rlhf_jax.ops.episode_ends.fold_time_limits` and
:func:`rlhf_jax.ops.episode_ends.loss_mask`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, NamedTuple, Union

import jax
import jax.numpy as jnp


class TimeStep(NamedTuple):
    """One vector step's result; the fields are described in the module docstring."""

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    action_ignored: jax.Array
    info: dict

    @property
    def done(self) -> jax.Array:
        """The agent's episode boundary."""
        return self.terminated | self.truncated


def first_timestep(obs: jax.Array, info: dict) -> TimeStep:
    """What a reset returns: ``obs`` starts an episode; no reward, no end, nothing ignored.

    ``info`` must hold the keys a step's does (zeros), so a TimeStep can be a scan carry."""
    n = obs.shape[0]
    no = jnp.zeros((n,), bool)
    return TimeStep(obs, jnp.zeros((n,), jnp.float32), no, no, obs, no, info)


@dataclasses.dataclass(frozen=True)
class Discrete:
    """``n`` actions, given as integers in ``[0, n)``."""

    n: int
    shape: tuple = ()

    def __str__(self) -> str:
        return f"Discrete({self.n})"


@dataclasses.dataclass(frozen=True)
class Box:
    """Real-valued actions of ``shape`` inside ``[low, high]``."""

    low: float
    high: float
    shape: tuple

    def __str__(self) -> str:
        return f"Box({self.low:g}, {self.high:g}, {self.shape})"


ActionSpace = Union[Discrete, Box]


def clip_action(space: ActionSpace, action: jax.Array) -> jax.Array:
    """The action as the environment takes it: a continuous one clipped into ``space``'s
    bounds (a Gaussian policy's draw can fall outside them), a discrete one as it is."""
    return jnp.clip(action, space.low, space.high) if isinstance(space, Box) else action


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static facts about an environment, known before anything is traced."""

    id: str
    backend: str
    num_envs: int
    observation_shape: tuple
    observation_dtype: str
    action_space: ActionSpace
    # Simulated frames per second of real time: turns "1.5 s segments" into steps
    # (unless segment_fps says otherwise) and sets the frame rate of clips shown to people.
    fps: float
    max_episode_steps: int
    # The frame rate the paper counted a task's "1.5 s" segments at, where it is not ``fps``
    # (0: ``fps``): the MuJoCo tasks, :data:`MUJOCO_SEGMENT_FPS`.
    segment_fps: float = 0.0


# Appendix A.1: "We compare trajectory segments that last 1.5 seconds, which varies from 15 to
# 60 timesteps depending on the task." Seconds of the clips as they were shown, not of simulated
# time: 1.5 s of Hopper's simulated time (8 ms a step) is 188 steps, of Reacher's (20 ms) 75,
# more than its 50-step episode. These are the frame rates of the clips in the public reference
# implementation (github.com/nottombrown/rl-teacher, rl_teacher/envs.py), which give exactly
# the paper's range: 15 steps (Reacher, the pendulums) to 60 (Hopper, Swimmer).
MUJOCO_SEGMENT_FPS = {
    "Reacher-v5": 10.0, "HalfCheetah-v5": 20.0, "Hopper-v5": 40.0, "Walker2d-v5": 30.0,
    "Swimmer-v5": 40.0, "Ant-v5": 20.0, "InvertedPendulum-v5": 10.0, "InvertedDoublePendulum-v5": 10.0,
}


class EnvState(NamedTuple):
    """The back end's own state plus the running totals of the true episode."""

    inner: Any
    episode_return: jax.Array
    episode_length: jax.Array


def check_action(spec: EnvSpec, action: jax.Array) -> None:
    """Fail at trace time, with what was expected, on an action of the wrong shape or dtype."""
    space = spec.action_space
    expected_shape = (spec.num_envs,) + tuple(space.shape)
    if isinstance(space, Discrete):
        kind_ok, kind = jnp.issubdtype(action.dtype, jnp.integer), "an integer dtype"
    else:
        kind_ok, kind = jnp.issubdtype(action.dtype, jnp.floating), "a floating dtype"
    if tuple(action.shape) != expected_shape or not kind_ok:
        raise TypeError(
            f"{spec.id}: action must have shape {expected_shape} (num_envs={spec.num_envs}, "
            f"action space {space}) and {kind}; got shape {tuple(action.shape)} "
            f"and dtype {action.dtype}"
        )


class Environment(abc.ABC):
    """Base of every back end: action checks and true-episode statistics.

    A back end implements ``_reset(key) -> (inner, TimeStep)`` and
    ``_step(inner, action) -> (inner, TimeStep)``, filling every typed field, with
    ``true_reward`` and ``true_done`` in ``info``; this class adds ``episode_return``
    and ``episode_length``.
    """

    spec: EnvSpec
    # Whether the copies live in this process, outside JAX (EnvPool's pools, a Gymnasium vector
    # env): ``vmap`` cannot give each run of a sweep its own, so the runs share one set of
    # ``members x num_envs`` copies (the factory's ``members``) and step it together.
    copies_on_host: ClassVar[bool] = False

    @abc.abstractmethod
    def _reset(self, key: jax.Array):
        ...

    @abc.abstractmethod
    def _step(self, inner: Any, action: jax.Array):
        ...

    @property
    def num_envs(self) -> int:
        return self.spec.num_envs

    @property
    def observation_shape(self) -> tuple:
        return self.spec.observation_shape

    @property
    def action_space(self) -> ActionSpace:
        return self.spec.action_space

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        inner, timestep = self._reset(key)
        # Strong types, as a step returns them: gymnax's Pendulum resets `last_u` to a weakly
        # typed 0.0, and a state whose types change after one step makes jit compile every
        # chunk function a second time (10 s for TRPO on Pendulum).
        inner = jax.tree.map(lambda x: jnp.asarray(x, x.dtype), inner)
        zeros = jnp.zeros((self.num_envs,), jnp.float32)
        info = dict(timestep.info, episode_return=zeros, episode_length=zeros.astype(jnp.int32))
        state = EnvState(inner, zeros, zeros.astype(jnp.int32))
        return state, timestep._replace(info=info)

    def step(self, state: EnvState, action: jax.Array) -> tuple[EnvState, TimeStep]:
        check_action(self.spec, action)
        inner, timestep = self._step(state.inner, action)
        info = timestep.info
        episode_return = state.episode_return + info["true_reward"]
        episode_length = state.episode_length + 1
        finished = info["true_done"]
        info = dict(info, episode_return=episode_return, episode_length=episode_length)
        state = EnvState(
            inner,
            jnp.where(finished, 0.0, episode_return),
            jnp.where(finished, 0, episode_length),
        )
        return state, timestep._replace(info=info)

