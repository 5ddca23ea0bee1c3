"""TRPO (Schulman et al. 2015) as Christiano et al. 2017 used it for MuJoCo (appendix A.1).

Each iteration collects ``batch_size`` env steps from ``num_envs`` environments,
estimates advantages with GAE (Schulman et al. 2016; the paper's gamma = 0.995,
lambda = 0.97), and then

1. takes one natural-gradient step on the policy: the gradient ``g`` of the
   surrogate ``L(theta) = mean[pi_theta(a|s) / pi_old(a|s) A] + beta mean[H(pi_theta)]``,
   the direction ``s = F^{-1} g`` by 10 conjugate-gradient iterations on
   Fisher-vector products (from every 5th time step of the batch), scaled to the edge of the
   trust region (mean KL 0.01) and
   shrunk by a backtracking line search until the true KL is inside it and ``L`` has
   improved (:mod:`rlhf_jax.ops.trust_region`);
2. fits a separate value network to the lambda-returns by regression (Adam on the
   squared error, a few epochs of minibatches).

The policy is a diagonal Gaussian with a state-independent log standard deviation
for continuous actions (Schulman et al. 2015, section 8), or a softmax for discrete
ones. Policy and value networks share nothing, so the natural gradient is taken
over the policy's parameters alone.

**The paper's settings.** Appendix A.1 gives gamma, lambda and the entropy bonus:
0.01 (0.001 on Swimmer) *when learning from the reward predictor*; on the true
reward ``entropy_coef`` defaults to 0, and an RLHF config sets it to 0.01. The other
defaults (mean KL 0.01, 10 CG iterations, CG damping 0.1, the Fisher from every 5th
step, 10 halvings in the line search, 5,000 env steps per iteration) are the usual TRPO
settings of Schulman's and Ho & Ermon's (2016) MuJoCo experiments and of OpenAI
Baselines' TRPO, not numbers stated in the paper.

**Episode ends** follow the one rule of :mod:`rlhf_jax.ops.episode_ends` (see
:func:`returns_and_mask`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from rlhf_jax import ops
from rlhf_jax.agents.base import (RewardFn, Transitions, env_step, episode_metrics, final_values, iterations_counter,
                                  make_rollout as base_rollout, make_train as assemble, rollout_rewards)
from rlhf_jax.agents.options import TRPOConfig
from rlhf_jax.envs.core import Box, Environment, EnvSpec, EnvState, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.networks import torso_for
from rlhf_jax.ops.schedules import learning_rate_in_state
from rlhf_jax.ops.trust_region import (
    backtracking_line_search,
    categorical_kl,
    conjugate_gradient,
    fisher_vector_product,
    gaussian_kl,
    linearize,
    max_step,
)


_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


class Policy(nn.Module):
    """``obs -> (mean, log_std)`` (Gaussian) or ``(logits,)`` (softmax): the distribution's parameters."""

    spec: EnvSpec
    config: TRPOConfig

    @nn.compact
    def __call__(self, obs):
        c = self.config
        features = torso_for(self.spec.observation_shape, kind=c.network, hidden=c.policy_hidden,
                             activation=_ACTIVATIONS[c.activation])(obs)
        # A small output gain: the first policy is close to state-independent.
        out = nn.initializers.orthogonal(0.01)
        if isinstance(self.spec.action_space, Box):
            mean = nn.Dense(self.spec.action_space.shape[0], kernel_init=out, name="mean")(features)
            log_std = self.param("log_std", nn.initializers.constant(c.log_std_init), mean.shape[-1:])
            return mean, jnp.broadcast_to(log_std, mean.shape)
        return (nn.Dense(self.spec.action_space.n, kernel_init=out, name="logits")(features),)


class Value(nn.Module):
    """``obs -> V(s)``, a network of its own."""

    spec: EnvSpec
    config: TRPOConfig

    @nn.compact
    def __call__(self, obs):
        c = self.config
        features = torso_for(self.spec.observation_shape, kind=c.network, hidden=c.value_hidden,
                             activation=_ACTIVATIONS[c.activation])(obs)
        return nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(features)[..., 0]


class TargetScale(NamedTuple):
    """The value network's output scale: ``V(s) = mean + std * f(s)`` (0 and 1 unless
    ``normalize_value_targets``)."""

    mean: jax.Array
    std: jax.Array


class Runner(NamedTuple):
    params: Any  # {"policy": ..., "value": ...} and, with normalize_observations, "observations": Moments
    opt_state: Any  # the value network's Adam state (the policy has no optimiser state)
    env_state: EnvState
    obs: jax.Array
    key: jax.Array
    env_steps: jax.Array
    value_scale: TargetScale


def steps_per_env(config: TRPOConfig, env: Environment) -> int:
    """How many steps each environment takes per iteration."""
    return math.ceil(config.batch_size / env.num_envs)


def env_steps_per_iteration(config: TRPOConfig, env: Environment) -> int:
    return steps_per_env(config, env) * env.num_envs


num_iterations = iterations_counter(env_steps_per_iteration)


def make_value_optimizer(config: TRPOConfig) -> optax.GradientTransformation:
    return learning_rate_in_state(optax.adam, config.value_learning_rate)


def init_runner(key, config: TRPOConfig, env: Environment) -> Runner:
    policy_key, value_key, env_key, key = jax.random.split(key, 4)
    env_state, timestep = env.reset(env_key)
    params = {
        "policy": Policy(env.spec, config).init(policy_key, timestep.obs[:1]),
        "value": Value(env.spec, config).init(value_key, timestep.obs[:1]),
    }
    if config.normalize_observations:
        params["observations"] = ops.init_moments(env.spec.observation_shape)
    opt_state = make_value_optimizer(config).init(params["value"])
    scale = TargetScale(jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32))
    return Runner(params, opt_state, env_state, timestep.obs, key, jnp.zeros((), jnp.int32), scale)


# --- The policy's distribution: one set of functions for both action spaces ----------


def _log_prob(dist, action, continuous: bool):
    if continuous:
        mean, log_std = dist
        return ops.gaussian_log_prob(mean, log_std, action)
    return ops.categorical_log_prob(dist[0], action)


def _entropy(dist, continuous: bool):
    return ops.gaussian_entropy(dist[1]) if continuous else ops.entropy(dist[0])


def _kl(old, new, continuous: bool):
    return gaussian_kl(*old, *new) if continuous else categorical_kl(old[0], new[0])


def network_input(config: TRPOConfig, params, obs):
    """What policy and value read of ``obs``: standardised by the runner's running moments
    (``normalize_observations``), or as it is."""
    if not config.normalize_observations:
        return obs
    return ops.standardize(params["observations"], obs, config.observation_clip, config.observation_min_std)


def make_policy(config: TRPOConfig, spec: EnvSpec):
    """``act(params, obs, key, greedy=False) -> action``: sample from pi, or take its mode."""
    policy = Policy(spec, config)
    continuous = isinstance(spec.action_space, Box)

    def act(params, obs, key, greedy: bool = False):
        dist = policy.apply(params["policy"], network_input(config, params, obs))
        if continuous:
            mean, log_std = dist
            return mean if greedy else mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        logits = dist[0]
        return jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)

    return act


def make_value(config: TRPOConfig, spec: EnvSpec):
    """``value(params, scale, obs) -> V(obs)`` in the returns' units: ``scale.mean + scale.std
    * f(obs)``, with ``f`` the value network and ``params`` the runner's ``params["value"]``."""
    network = Value(spec, config)
    return lambda params, scale, obs: scale.mean + scale.std * network.apply(params, obs)


def returns_and_mask(config: TRPOConfig, rewards, timesteps: TimeStep, values, final_values, bootstrap):
    """Lambda-returns ``G_t`` ``[T, N]`` and the mask of the steps that enter the losses.

    The returns are TD(lambda) returns (:func:`rlhf_jax.ops.lambda_returns`), so that
    ``G_t - V(s_t)`` is GAE(gamma, lambda):

        G_t = r_t + gamma [(1 - lambda) V(s_{t+1}) + lambda G_{t+1}],   G_T = V(s_T),

    with the episode ends of :func:`rlhf_jax.ops.fold_time_limits`: a terminal step's
    return is ``r_t``, a truncated one's ``r_t + gamma V(final_obs_t)`` (``final_values``),
    and nothing flows across either. EnvPool's reset steps (``action_ignored``) are masked out.
    """
    rewards, discounts = ops.fold_time_limits(rewards, timesteps.terminated, timesteps.truncated, final_values,
                                              config.gamma)
    returns = ops.lambda_returns(rewards, discounts, values, bootstrap, config.gae_lambda)
    return returns, ops.loss_mask(timesteps.action_ignored)


def make_rollout(config: TRPOConfig, env: Environment):
    """An iteration's rollout (:func:`rlhf_jax.agents.base.make_rollout`): ``steps_per_env``
    steps of every copy under the current policy."""
    return base_rollout(env, make_policy(config, env.spec), steps_per_env(config, env))


def make_rollout_with_inputs(config: TRPOConfig, env: Environment):
    """The rollout as the iteration takes it: ``rollout(params, env_state, obs, key) ->
    ((params, env_state, obs, key), (observations, inputs, actions, timesteps))``, ``inputs``
    being each observation as the policy read it when it acted (:func:`network_input`).

    With ``observation_moments="every_step"`` the moments take in each step's observations,
    every copy's, before the policy acts on them, as Stable-Baselines3's ``VecNormalize``
    does, and the returned ``params`` hold the moments so grown; otherwise one set of
    moments reads the whole rollout and ``params`` come back as they went in."""
    num_steps = steps_per_env(config, env)
    if not (config.normalize_observations and config.observation_moments == "every_step"):
        plain = make_rollout(config, env)

        def rollout(params, env_state, obs, key):
            (env_state, obs, key), (observations, actions, timesteps) = plain(params, env_state, obs, key)
            return (params, env_state, obs, key), (observations, network_input(config, params, observations),
                                                   actions, timesteps)

        return rollout
    act = make_policy(config, env.spec)

    def step(carry, _):
        params, env_state, obs, key = carry
        params = {**params, "observations": ops.merge_moments(params["observations"], obs)}
        key, act_key = jax.random.split(key)
        action = act(params, obs, act_key)
        env_state, timestep = env_step(env, env_state, action)
        return (params, env_state, timestep.obs, key), (obs, network_input(config, params, obs), action, timestep)

    return lambda params, env_state, obs, key: jax.lax.scan(step, (params, env_state, obs, key), None, num_steps)


def make_policy_step(config: TRPOConfig, spec: EnvSpec):
    """``step(policy_params, observations, actions, advantages, mask) -> (policy_params, metrics)``:
    one natural-gradient step with a line search (Schulman et al. 2015, appendix C) on a batch
    ``[T, N, ...]`` of the policy's (standardised) inputs, its actions and their advantages,
    the steps of ``mask`` alone entering the means. Pure, so it can be set against another
    implementation's step on that implementation's own batch."""
    policy = Policy(spec, config)
    continuous = isinstance(spec.action_space, Box)
    for option, on, what in (("kl_per_action_dimension", config.kl_per_action_dimension, "KL"),
                             ("entropy_per_action_dimension", config.entropy_per_action_dimension, "entropy")):
        if on and not continuous:
            raise ConfigError(f"trpo.{option}: {spec.id} has discrete actions; "
                              f"the option divides a Gaussian's {what} by its action's dimensions")
    # The KL of the whole action, or per action dimension (kl_per_action_dimension); the same
    # for the entropy the bonus is paid on (entropy_per_action_dimension).
    action_dims = spec.action_space.shape[0] if continuous else 1
    kl_unit = action_dims if config.kl_per_action_dimension else 1
    entropy_bonus = config.entropy_coef / (action_dims if config.entropy_per_action_dimension else 1)

    def mean_kl(mask):
        """``(d_old, d) -> `` the mean KL from the old distribution over the steps of ``mask``."""
        return lambda old, new: ops.masked_mean(_kl(old, new, continuous), mask) / kl_unit

    def fisher_sample(network, flat_old, unravel, observations, mask):
        """The linearised network and the mask the Fisher-vector products average over: the whole
        batch's, or every ``fisher_subsample``-th time step's (a pass of the policy on those alone)."""
        k = config.fisher_subsample
        if k == 1:
            return network, mask
        # Every k-th time step of every copy ([T, N, ...] -> [ceil(T / k), N, ...]), as Baselines
        # takes every 5th step of its one environment. Striding the flattened batch instead would,
        # with N a multiple of k, keep one copy alone.
        sample_obs = observations[::k]
        return linearize(lambda flat: policy.apply(unravel(flat), sample_obs), flat_old), mask[::k]

    def step(policy_params, observations, actions, advantages, mask):
        flat_old, unravel = ravel_pytree(policy_params)
        dist_of = lambda flat: policy.apply(unravel(flat), observations)
        mean_kl_from = mean_kl(mask)
        network = linearize(dist_of, flat_old)  # the one pass of the network at theta_old
        old_dist = network.outputs
        fisher_network, fisher_mask = fisher_sample(network, flat_old, unravel, observations, mask)
        fvp = fisher_vector_product(fisher_network, mean_kl(fisher_mask), config.cg_damping)
        old_log_prob = _log_prob(old_dist, actions, continuous)

        def surrogate(dist):
            ratio = jnp.exp(_log_prob(dist, actions, continuous) - old_log_prob)
            entropy = jnp.broadcast_to(_entropy(dist, continuous), mask.shape)
            return ops.masked_mean(ratio * advantages, mask) + entropy_bonus * ops.masked_mean(entropy, mask)

        def surrogate_and_kl(flat):  # one pass of the network for both
            dist = dist_of(flat)
            return surrogate(dist), mean_kl_from(old_dist, dist)

        gradient = network.pull_back(jax.grad(surrogate)(old_dist))  # g = J^T dL/dd, the chain rule
        direction = conjugate_gradient(fvp, gradient, config.cg_iterations)
        full_step = max_step(direction, fvp(direction), config.max_kl)
        search = backtracking_line_search(surrogate_and_kl, flat_old, full_step, config.max_kl,
                                          config.line_search_steps, config.line_search_decay)
        metrics = {
            "surrogate_gain": search.surrogate_gain, "kl": search.kl, "step_fraction": search.fraction,
            "entropy": ops.masked_mean(jnp.broadcast_to(_entropy(old_dist, continuous), mask.shape), mask),
        }
        return unravel(search.params), metrics

    return step


def make_iteration(config: TRPOConfig, env: Environment, reward_fn: RewardFn):
    value = Value(env.spec, config)
    value_in_units = make_value(config, env.spec)
    value_optimizer = make_value_optimizer(config)
    rollout = make_rollout_with_inputs(config, env)
    update_policy = make_policy_step(config, env.spec)
    if env_steps_per_iteration(config, env) < config.value_minibatches:
        raise ConfigError(f"trpo.batch_size ({config.batch_size}) must be at least trpo.value_minibatches "
                          f"({config.value_minibatches})")

    def update_value(value_params, opt_state, observations, returns, mask, key, scale: TargetScale):
        """Regression of V on the returns: ``value_epochs`` passes of ``value_minibatches`` Adam
        steps, fitting ``f(s)`` to ``(G - scale.mean) / scale.std``."""
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # [T, N, ...] -> [T*N, ...]
        observations, returns, mask = flat(observations), flat(returns), flat(mask)
        returns = (returns - scale.mean) / scale.std
        size = returns.shape[0] // config.value_minibatches

        def loss_fn(params, obs, target, weight):
            return ops.masked_mean(0.5 * (value.apply(params, obs) - target) ** 2, weight)

        def minibatch_step(carry, index):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, observations[index], returns[index], mask[index])
            updates, opt_state = value_optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        def epoch(carry, key):
            # A fresh shuffle each epoch; the few steps beyond size * minibatches wait for the next one.
            order = ops.permutation(key, returns.shape[0])[: size * config.value_minibatches]
            return jax.lax.scan(minibatch_step, carry, order.reshape(config.value_minibatches, size))

        (value_params, opt_state), losses = jax.lax.scan(
            epoch, (value_params, opt_state), jax.random.split(key, config.value_epochs)
        )
        return value_params, opt_state, losses[-1].mean()

    def iteration(runner: Runner, reward_params=None):
        (params, env_state, obs, key), (observations, acted_on, actions, timesteps) = rollout(
            runner.params, runner.env_state, runner.obs, runner.key
        )
        rewards = rollout_rewards(reward_fn, reward_params, observations, actions, timesteps, config.reward_scale)
        key, value_key = jax.random.split(key)
        scale = runner.value_scale
        # V as the rollout's value network gives it: on each step as the policy read it, on the
        # observations beyond the rollout by the moments at its end (before a batch joins them, below)
        value_of = lambda inputs: value_in_units(runner.params["value"], scale, inputs)
        read = lambda o: network_input(config, params, o)
        values = value_of(acted_on)
        returns, mask = returns_and_mask(config, rewards, timesteps, values,
                                         final_values(lambda o: value_of(read(o)), timesteps), value_of(read(obs)))
        advantages = returns - values
        if config.normalize_advantages:
            mean = ops.masked_mean(advantages, mask)
            std = jnp.sqrt(ops.masked_mean((advantages - mean) ** 2, mask))
            advantages = (advantages - mean) / (std + 1e-8)

        moments = config.observation_moments if config.normalize_observations else None
        inputs = acted_on
        if moments == "before_update":
            params = {**params, "observations": ops.merge_moments(params["observations"], observations)}
            inputs = network_input(config, params, observations)
        policy_params, policy_metrics = update_policy(params["policy"], inputs, actions, advantages, mask)
        if config.normalize_value_targets:
            mean = ops.masked_mean(returns, mask)
            scale = TargetScale(mean, jnp.maximum(jnp.sqrt(ops.masked_mean((returns - mean) ** 2, mask)), 1e-6))
        value_params, opt_state, value_loss = update_value(
            params["value"], runner.opt_state, inputs, returns, mask, value_key, scale
        )
        if moments == "after_update":
            params = {**params, "observations": ops.merge_moments(params["observations"], observations)}
        env_steps = runner.env_steps + env_steps_per_iteration(config, env)
        metrics = {**policy_metrics, "value_loss": value_loss, "env_steps": env_steps,
                   **episode_metrics(timesteps.info)}
        transitions = Transitions(observations, actions, timesteps.reward, timesteps.done)
        params = {**params, "policy": policy_params, "value": value_params}
        return Runner(params, opt_state, env_state, obs, key, env_steps, scale), metrics, transitions

    return iteration


make_train = assemble(init_runner, make_iteration, num_iterations)
