"""What every agent shares: how rewards reach it, and the shape of a training run.

**Rewards.** An agent never reads the environment's reward by itself; it calls

    reward_fn(reward_params, obs, action, timestep) -> reward [num_envs]

on transitions (``obs`` and ``action`` before the step, ``timestep`` after it; the leading
axis is the batch, one vector step's environments or a whole rollout's steps).
The preference model ignores ``timestep`` and returns r̂(o, a); the true reward is
the function :func:`env_reward`, which returns ``timestep.reward``: ``timestep`` is
in the signature so that the true reward fits it too. A reward that needs the next observation (IBT, equation 2) reads
``timestep.final_obs``, the true successor even where the copy restarted, and returns
0 where ``timestep.action_ignored``. Replayed transitions rebuild a ``TimeStep`` from
what they stored (``info={}``), so a reward function reads only its typed fields
(:mod:`rlhf_jax.envs.core`).

**Off-policy agents: rewards never go stale.** A learned reward is refit while the agent
trains, so a reward computed when a step was taken is soon a reward of a model that is
gone. Every off-policy agent (DQN, ACER) therefore recomputes r̂ from the *current*
reward parameters when it samples its replay, calling ``reward_fn`` on the stored
observations and actions and the rebuilt ``TimeStep``; its replay stores observations,
actions and the environment's own step results (``timestep.reward``, the episode ends,
``final_obs`` where it differs from the next stored observation), never learned rewards.

**Training.** Each agent module provides

    init_runner(key, config, env) -> Runner              # all state of a run: a pytree
    make_iteration(config, env, reward_fn)
        -> iteration(runner, reward_params) -> (runner, metrics, transitions)
    num_iterations(config, env) -> int
    env_steps_per_iteration(config, env) -> int
    make_policy(config, env_spec) -> act(params, obs, key) -> action   # for evaluation
    make_train(config, env, reward_fn) -> train(key, reward_params=None) -> (runner, metrics)

An iteration that draws how many updates it makes (ACER's 1 + K, K ~ Poisson(r)) is a
:class:`DrawnCountIteration`: called, it is the same ``iteration``; a host may also read the
count first and run the iteration with its updates written out.

``transitions`` (:class:`Transitions`) are the steps the iteration took, which the
RLHF loop cuts segments from; whoever does not need them drops them, and XLA then
never materialises them. ``train`` is ``lax.scan`` over iterations, one function that ``jax.jit`` and
``jax.vmap`` accept whole. The command line runs the same ``iteration`` in compiled
chunks instead, to show progress and checkpoint between them; the RLHF loop does the
same with fresh reward parameters for every chunk.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlhf_jax.envs.core import Environment, TimeStep, clip_action

RewardFn = Callable[[Any, jax.Array, jax.Array, TimeStep], jax.Array]


def env_reward(reward_params, obs, action, timestep: TimeStep) -> jax.Array:
    """The environment's own reward: RL on the true (or oracle's) reward."""
    del reward_params, obs, action
    return timestep.reward


def env_step(env: Environment, env_state, action):
    """One environment step as every agent takes it: a continuous action is clipped into the
    action space's bounds (:func:`rlhf_jax.envs.core.clip_action`). Everything else keeps
    the action as sampled: the agent's losses, and the learned reward, which clips it or
    not as its config says (``RewardModelConfig.clip_actions``).

    Returns ``(env_state, timestep)``.
    """
    return env.step(env_state, clip_action(env.spec.action_space, action))


def make_rollout(env: Environment, act: Callable, num_steps: int):
    """An on-policy rollout: ``num_steps`` steps of every copy, each action ``act(params, obs,
    key)`` under parameters that stay fixed throughout.

    ``rollout(params, env_state, obs, key) -> ((env_state, obs, key), (observations,
    actions, timesteps))``, each output ``[num_steps, num_envs, ...]``;
    ``observations`` are those the actions were chosen on, ``actions`` as sampled
    (:func:`env_step` clips them for the environment).
    """

    def step(carry, _):
        params, env_state, obs, key = carry
        key, act_key = jax.random.split(key)
        action = act(params, obs, act_key)
        env_state, timestep = env_step(env, env_state, action)
        return (params, env_state, timestep.obs, key), (obs, action, timestep)

    def rollout(params, env_state, obs, key):
        (_, env_state, obs, key), outputs = jax.lax.scan(step, (params, env_state, obs, key), None, num_steps)
        return (env_state, obs, key), outputs

    return rollout


def final_values(value_fn: Callable[[jax.Array], jax.Array], timesteps: TimeStep) -> jax.Array:
    """``V(final_obs_t)`` of a rollout ``[T, num_envs]``, as the time-limit rule
    (:func:`rlhf_jax.ops.fold_time_limits`) reads it: only where a step was truncated.

    The pass of the network over ``final_obs`` runs only when some step of the rollout was
    truncated; otherwise the result is zeros, which the rule never reads. A time limit ends
    few rollouts (Pong's is 27,000 steps), and that pass is one more forward pass over the
    whole rollout: a quarter of an A2C update on Atari. (Under ``vmap`` the condition becomes a
    select and both sides run, as before.)
    """
    shape = jax.eval_shape(value_fn, timesteps.final_obs)
    return jax.lax.cond(jnp.any(timesteps.truncated), value_fn, lambda _: jnp.zeros(shape.shape, shape.dtype),
                        timesteps.final_obs)


def rollout_rewards(reward_fn: RewardFn, reward_params, obs, action, timestep: TimeStep,
                    reward_scale: float = 1.0, reward_clip: float = 0.0) -> jax.Array:
    """The rewards of a whole rollout ``[T, num_envs]`` in one call of ``reward_fn``, times
    ``reward_scale``, then clipped to ``[-reward_clip, reward_clip]`` (0: no clipping).

    The rewards never steer the actions of the rollout they belong to, so an on-policy agent
    asks for them after its steps: a learned reward then runs as one batch of ``T x num_envs``
    rows instead of ``T`` small ones inside the sequential loop. A step whose action was
    ignored (EnvPool's reset step) earns 0 whatever the reward function says, as the
    environment's own reward is: r̂ of a step that joins two episodes means nothing.
    """
    leading = action.shape[:2]
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    reward = reward_fn(reward_params, flat(obs), flat(action), jax.tree.map(flat, timestep))
    reward = jnp.where(timestep.action_ignored, 0.0, reward.reshape(leading) * reward_scale)
    return jnp.clip(reward, -reward_clip, reward_clip) if reward_clip else reward


@dataclasses.dataclass(frozen=True)
class DrawnCountIteration:
    """An agent's ``iteration(runner, reward_params=None) -> (runner, metrics, transitions)``
    that draws how many updates it makes, in two forms that compute the same.

    Called, it draws the count and runs its updates in a loop with a traced bound: one program
    for ``jit``, ``vmap`` and ``scan``. XLA:CPU runs a convolution's gradient about six times
    slower inside a loop than in straight-line code (jax-ml/jax#12868), so a host that
    dispatches iterations one at a time (:func:`rlhf_jax.dispatch.repeat_drawn`) reads the
    count first, ``count(runner)`` (the very draw the call makes), and calls
    ``with_count(count)``: the iteration with that many updates written out, one program per count.
    """

    traced: Callable  # (runner, reward_params=None) -> (runner, metrics, transitions)
    count: Callable  # (runner) -> int32 scalar: the updates the iteration from runner makes
    with_count: Callable  # (count: int) -> the iteration with exactly ``count`` updates written out

    def __call__(self, runner, reward_params=None):
        return self.traced(runner, reward_params)


class Transitions(NamedTuple):
    """The steps one iteration took, time-major ``[T, num_envs, ...]``."""

    obs: jax.Array  # o_t, the observation the action was chosen on
    action: jax.Array  # a_t, as the policy drew it (the environment took it clipped: env_step)
    oracle_reward: jax.Array  # timestep.reward: what a synthetic oracle judges by (never the agent)
    done: jax.Array  # the agent's episode ended right after this step: TimeStep.done


def episode_metrics(info: dict) -> dict:
    """Sums and counts of the true episodes that finished in a rollout of ``info`` arrays ``[T, N]``.

    Sums, not means, so that chunks and seeds can be added up before dividing.
    """
    finished = info["true_done"]
    return {
        "episodes": finished.sum(),
        "episode_return_sum": jnp.where(finished, info["episode_return"], 0.0).sum(),
        "episode_length_sum": jnp.where(finished, info["episode_length"], 0).sum(),
    }


def iterations_counter(env_steps_per_iteration):
    """An agent module's ``num_iterations(config, env)`` from its ``env_steps_per_iteration``:
    the whole iterations in ``config.total_env_steps``, at least one."""

    def num_iterations(config, env) -> int:
        return max(1, config.total_env_steps // env_steps_per_iteration(config, env))

    return num_iterations


def make_train(init_runner, make_iteration, num_iterations):
    """Assemble an agent module's ``make_train`` from its three parts (see the module docstring)."""

    def agent_make_train(config, env, reward_fn: RewardFn = env_reward):
        iteration = make_iteration(config, env, reward_fn)
        iterations = num_iterations(config, env)

        def train(key, reward_params=None):
            runner = init_runner(key, config, env)
            return jax.lax.scan(lambda r, _: iteration(r, reward_params)[:2], runner, None, iterations)

        return train

    return agent_make_train
