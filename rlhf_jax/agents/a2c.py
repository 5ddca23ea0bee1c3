"""A2C: the synchronous form of A3C (Mnih et al. 2016) as Christiano et al. 2017 used it (appendix A.2).

``num_envs`` environments step together for ``n`` steps; the n-step returns of
Algorithm S3 train a shared torso with a softmax policy (or a Gaussian one for
continuous actions) and a linear value, with one RMSProp optimiser (what the
shared statistics of A3C become when the workers are synchronous).

**Episode ends** follow the one rule of :mod:`rlhf_jax.ops.episode_ends` (see
:func:`n_step_targets`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax import ops
from rlhf_jax.agents.base import (RewardFn, Transitions, episode_metrics, final_values, iterations_counter,
                                  make_rollout, make_train as assemble, rollout_rewards)
from rlhf_jax.agents.options import A2CConfig
from rlhf_jax.config_base import decay_horizon
from rlhf_jax.envs.core import Box, Environment, EnvSpec, EnvState, TimeStep
from rlhf_jax.networks import GaussianPolicyValueHead, PolicyValueHead, apply_time_major, torso_for
from rlhf_jax.ops.schedules import learning_rate_in_state

# The agent contract (rlhf_jax.agents.base), and the pieces a sweep of your own reads.
__all__ = [
    "A2CConfig", "ActorCritic", "Runner", "env_steps_per_iteration", "init_runner", "make_iteration",
    "make_optimizer", "make_policy", "make_train", "n_step_targets", "num_iterations",
]

class ActorCritic(nn.Module):
    """The policy (softmax, or Gaussian for boxes) and the value, on one torso or two."""

    spec: EnvSpec
    config: A2CConfig

    @nn.compact
    def __call__(self, obs):
        torso = lambda: torso_for(self.spec.observation_shape, kind=self.config.network, hidden=self.config.mlp_hidden)
        features = torso()(obs)
        if isinstance(self.spec.action_space, Box):
            head = GaussianPolicyValueHead(self.spec.action_space.shape[0], self.config.log_std_init)
        else:
            head = PolicyValueHead(self.spec.action_space.n)
        *policy, value = head(features)
        if not self.config.shared_torso:
            # The value comes from a torso of its own; the head's value output goes unused.
            value = nn.Dense(1)(torso()(obs))[..., 0]
        return (*policy, value)


class Runner(NamedTuple):
    """All state of a run, a pytree: stack runners to vmap over runs (the sweep example does)."""

    params: Any
    opt_state: Any
    env_state: EnvState
    obs: jax.Array
    key: jax.Array
    env_steps: jax.Array


def env_steps_per_iteration(config: A2CConfig, env: Environment) -> int:
    """Env steps of one iteration: ``num_steps`` on each of ``env.num_envs`` environments."""
    return config.num_steps * env.num_envs


num_iterations = iterations_counter(env_steps_per_iteration)


def make_optimizer(config: A2CConfig, env: Environment) -> optax.GradientTransformation:
    """Clipped RMSProp whose learning rate lives in the state (``opt_state[1].hyperparams``),
    decayed linearly to zero: runs differing only in ``learning_rate`` share one program."""
    decay_env_steps = decay_horizon(config.lr_decay_env_steps, config.total_env_steps)
    decay_steps = decay_env_steps // env_steps_per_iteration(config, env)
    # RMSProp at a rate held in the state (a sweep vmaps over it), decayed linearly to 0.
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        learning_rate_in_state(lambda lr: optax.rmsprop(lr, decay=config.rms_decay, eps=config.rms_eps),
                               config.learning_rate),
        optax.scale_by_schedule(optax.linear_schedule(1.0, 0.0, max(1, decay_steps))),
    )


def init_runner(key: jax.Array, config: A2CConfig, env: Environment) -> Runner:
    """A fresh run: initial parameters, optimiser state (holding ``config.learning_rate``),
    and environments reset with ``key``."""
    net_key, env_key, key = jax.random.split(key, 3)
    env_state, timestep = env.reset(env_key)
    params = ActorCritic(env.spec, config).init(net_key, timestep.obs[:1])
    opt_state = make_optimizer(config, env).init(params)
    return Runner(params, opt_state, env_state, timestep.obs, key, jnp.zeros((), jnp.int32))


def make_policy(config: A2CConfig, spec: EnvSpec):
    """``act(params, obs, key, greedy=False) -> action``: sample from pi, or take its mode."""
    network = ActorCritic(spec, config)
    space = spec.action_space

    def act(params, obs, key, greedy: bool = False):
        out = network.apply(params, obs)
        if isinstance(space, Box):
            mean, log_std, _ = out
            return mean if greedy else mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        logits, _ = out
        return jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)

    return act


def n_step_targets(config: A2CConfig, rewards, timesteps: TimeStep, final_values, bootstrap):
    """Algorithm S3's n-step returns ``R_t`` ``[T, N]`` and the mask of the steps that carry a loss.

    ``R_t = r_t + gamma R_{t+1}`` back from ``R_T = V(s_T)``, with the episode ends of
    :func:`rlhf_jax.ops.fold_time_limits`: a terminal step's return is ``r_t``, a
    truncated one's ``r_t + gamma V(final_obs_t)`` (``final_values``), and nothing flows
    across either. EnvPool's reset steps (``action_ignored``) are masked out.
    """
    rewards, discounts = ops.fold_time_limits(rewards, timesteps.terminated, timesteps.truncated, final_values,
                                              config.gamma)
    return ops.n_step_returns(rewards, discounts, bootstrap), ops.loss_mask(timesteps.action_ignored)


def make_iteration(config: A2CConfig, env: Environment, reward_fn: RewardFn):
    """``iteration(runner, reward_params) -> (runner, metrics, transitions)``: ``num_steps`` on
    every environment, rewards from ``reward_fn``, then one update (Algorithm S3). Pure, so
    ``jax.lax.scan`` repeats it and ``jax.vmap`` runs it over stacked runners."""
    network = ActorCritic(env.spec, config)
    optimizer = make_optimizer(config, env)
    rollout = make_rollout(env, make_policy(config, env.spec), config.num_steps)
    continuous = isinstance(env.spec.action_space, Box)

    def loss_fn(params, obs, actions, returns, mask):
        out = apply_time_major(network.apply, params, obs)
        if continuous:
            mean, log_std, values = out
            log_pi_a = ops.gaussian_log_prob(mean, log_std, actions)
            entropy = ops.gaussian_entropy(log_std)
        else:
            logits, values = out
            log_pi_a = ops.categorical_log_prob(logits, actions)
            entropy = ops.entropy(logits)
        return ops.actor_critic_loss(
            log_pi_a, entropy, values, returns, entropy_coef=config.entropy_coef, value_coef=config.value_coef,
            mask=mask,
        )

    def iteration(runner: Runner, reward_params=None):
        (env_state, obs, key), (observations, actions, timesteps) = rollout(
            runner.params, runner.env_state, runner.obs, runner.key
        )
        rewards = rollout_rewards(reward_fn, reward_params, observations, actions, timesteps,
                                  config.reward_scale, config.reward_clip)
        value_of = lambda o: network.apply(runner.params, o)[-1]  # both heads return the value last
        returns, mask = n_step_targets(config, rewards, timesteps, final_values(value_of, timesteps), value_of(obs))
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            runner.params, observations, actions, returns, mask
        )
        updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
        params = optax.apply_updates(runner.params, updates)
        env_steps = runner.env_steps + env_steps_per_iteration(config, env)
        metrics = {"loss": loss, **parts, "env_steps": env_steps, **episode_metrics(timesteps.info)}
        transitions = Transitions(observations, actions, timesteps.reward, timesteps.done)
        return Runner(params, opt_state, env_state, obs, key, env_steps), metrics, transitions

    return iteration


make_train = assemble(init_runner, make_iteration, num_iterations)
