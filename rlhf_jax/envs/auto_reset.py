"""Pure JAX copies that restart themselves within the step: the episode-end rules every such
adapter shares (gymnax, Brax/MJX-style, and the host Gymnasium one, whose copies restart on
the host), the restart itself, and the user's oracle.

A raw step of the copies gives, per copy, the environment's reward, whether it reached a
terminal state (``terminated``) and whether its time limit is up (``truncated``). Under the
run's :class:`~rlhf_jax.envs.options.EnvConfig` (appendix A of Christiano et al.),
:func:`end_rules` turns them into what :class:`~rlhf_jax.envs.core.TimeStep` carries:

==================================  ==========================================================
``hide_episode_end``                what the agent is told, what the oracle pays
==================================  ==========================================================
False                               ends as they are; a copy restarts at either end
True, ``hidden_end="continue"``     only the time limit ends the agent's episode; a failed
                                    copy runs on, every step in a terminal state costs the
                                    oracle ``termination_penalty``, and the true reward stops
                                    counting at the first failure
True, ``hidden_end="reset"``        a failed copy restarts at once, unannounced (neither
                                    terminated nor truncated for the agent), the oracle pays
                                    the penalty on the failing step, the true episode ends there
==================================  ==========================================================
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rlhf_jax.envs.options import EnvConfig

# oracle(obs, action, next_obs, reward) -> the oracle's reward of one copy's step (a scalar):
# ``obs`` the observation the action was taken on, ``next_obs`` the one it reached (the real one,
# also where the copy then restarts), ``reward`` the environment's own. Pure JAX; adapters vmap it.
Oracle = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


class Ends(NamedTuple):
    """One step's ends and rewards under the episode-end options, each ``[N]``."""

    reward: jax.Array  # the oracle's: TimeStep.reward
    terminated: jax.Array  # the agent's
    truncated: jax.Array  # the agent's
    true_reward: jax.Array  # the unmodified episode's: info["true_reward"]
    true_done: jax.Array  # the unmodified episode ended: info["true_done"]
    failed: jax.Array  # reached a terminal state earlier in this (fixed-length) episode, before a restart
    restart: jax.Array  # the copy starts a new episode now


def end_rules(config: EnvConfig, reward: jax.Array, terminated: jax.Array, truncated: jax.Array,
              failed: jax.Array) -> Ends:
    """The table of the module docstring. ``failed``: the copies that failed earlier in their
    episode (only ``hidden_end="continue"`` lets them run on); store ``ends.failed & ~ends.restart``."""
    if config.hide_episode_end and config.hidden_end == "reset":
        # Appendix A's Atari treatment: the copy restarts at once, the agent is not told
        # (only the time limit of a life that lasts ends its episode), the oracle pays
        # the penalty on the failing step.
        agent_terminated, agent_truncated = jnp.zeros_like(terminated), truncated & ~terminated
        true_reward = reward
        reward = reward - config.termination_penalty * terminated
        true_done = restart = terminated | truncated
    elif config.hide_episode_end:
        # Appendix A: the copy runs on to its time limit; every step in a terminal
        # state costs the oracle `termination_penalty`, and the unmodified return
        # stops counting at the first failure.
        agent_terminated, agent_truncated = jnp.zeros_like(terminated), truncated
        true_reward = jnp.where(failed, 0.0, reward)
        reward = reward - config.termination_penalty * terminated
        failed = failed | terminated
        true_done = restart = truncated
    else:
        agent_terminated, agent_truncated = terminated, truncated & ~terminated
        true_reward = reward
        true_done = restart = terminated | truncated
    return Ends(reward, agent_terminated, agent_truncated, true_reward, true_done, failed, restart)


def restart_where(restart: jax.Array, fresh: Any, old: Any) -> Any:
    """The pytree ``old`` of ``[N, ...]`` leaves with the copies where ``restart`` ``[N]`` taken from ``fresh``."""
    return jax.tree.map(lambda new, kept: jnp.where(restart.reshape((-1,) + (1,) * (kept.ndim - 1)), new, kept),
                        fresh, old)


def restart_ended(restart: jax.Array, key: jax.Array, fresh: Callable[[jax.Array, Any], Any],
                  after: Any) -> tuple[Any, jax.Array]:
    """``(copies, key)``: the pytree ``after`` of ``[N, ...]`` leaves with the copies where ``restart``
    taken from ``fresh(reset_key, after)`` (fresh copies in ``after``'s dtypes), made only when
    some copy restarts, and the key to carry on with."""
    key, reset_key = jax.random.split(key)
    copies = jax.lax.cond(jnp.any(restart), lambda: restart_where(restart, fresh(reset_key, after), after),
                          lambda: after)
    return copies, key


def oracle_reward(oracle: Optional[Oracle], obs: jax.Array, action: jax.Array, next_obs: jax.Array,
                  reward: jax.Array) -> jax.Array:
    """``[N]`` float32: the user's ``oracle`` of each copy's step, or the environment's ``reward`` without one."""
    if oracle is None:
        return reward
    paid = jax.vmap(oracle)(obs, action, next_obs, reward)
    if paid.shape != reward.shape:
        raise ValueError(f"the oracle must return one number per step (a scalar for one copy); "
                         f"vmapped over {reward.shape[0]} copies it returned shape {paid.shape}")
    return paid.astype(jnp.float32)


def step_info(oracle: Optional[Oracle], true_reward: jax.Array, true_done: jax.Array,
              env_reward: jax.Array) -> dict:
    """A step's ``TimeStep.info``: the unmodified episode's reward and end and, where the user's
    ``oracle`` pays the reward, the environment's own beside it."""
    info = {"true_reward": true_reward, "true_done": true_done}
    return info if oracle is None else dict(info, env_reward=env_reward)


def first_step_info(oracle: Optional[Oracle], num_envs: int) -> dict:
    """:func:`step_info` of a reset: nothing paid, nothing ended."""
    zeros = jnp.zeros((num_envs,), jnp.float32)
    return step_info(oracle, zeros, zeros.astype(bool), zeros)


def check_fps(fps: float) -> float:
    if not fps > 0:
        raise ValueError(f"fps must be positive (it sizes the 1.5 s segments and plays clips), got {fps!r}")
    return float(fps)
