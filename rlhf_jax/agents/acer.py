"""ACER: actor-critic with experience replay (Wang et al. 2016, arXiv 1611.01224, Algorithms 1-3).

**An iteration** (Algorithm 1). ``num_envs`` environments take ``num_steps`` (k = 20)
steps; the trajectories, with the behaviour policy's distribution mu(.|x_t) at every step,
go into a replay memory on the device. Then come one on-policy update on them and
K ~ Poisson(r) replayed updates (r = ``replay_ratio``, 4 in the paper), each on
``num_envs`` trajectories drawn uniformly from the memory (one per environment, as the
paper's threads each replay one). Replay waits until ``replay_start`` env steps are stored.

**The Poisson count under jit.** K is drawn from the runner's key when the iteration
begins. Called, the iteration runs its updates in ``lax.fori_loop(0, 1 + K, ...)`` whose
bound is traced, which JAX lowers to a ``while_loop``: an iteration costs its K updates,
where a fixed maximum masked down to K would cost the maximum every time. Under ``vmap``
over seeds the loop runs until the largest K among them, the others' extra steps
discarded. XLA:CPU runs the Nature CNN's gradient about six times slower inside a loop
(jax-ml/jax#12868), so a host that dispatches iterations one at a time reads K first and
calls the iteration with its 1 + K updates written out, one program per count
(:class:`~rlhf_jax.agents.base.DrawnCountIteration`; the same updates, keys and results up
to rounding). Update 0 reads the trajectories just stored, so one update function serves
both the on-policy and the replayed kind.

**Each update** (Algorithm 2, discrete; 3, continuous), on trajectories of length k:

* Retrace targets from the current network, backwards from Q_ret = V(x_k)
  (:func:`rlhf_jax.ops.retrace_targets`), c_t = min(1, rho_t), rho_t = pi(a_t|x_t)/mu(a_t|x_t);
* the critic regresses Q(x_t, a_t) on Q_ret;
* the policy gradient is truncated importance sampling with bias correction, c = 10
  (:func:`rlhf_jax.ops.truncated_is_policy_objective`), plus an entropy bonus;
* the efficient trust region: g, the gradient of that objective with respect to the
  policy's distribution statistics, and k, the gradient of KL(pi_avg || pi), give
  z = g - max(0, (k.g - delta) / ||k||^2) k (:func:`rlhf_jax.ops.trust_region_projection`),
  back-propagated through the network; the average network follows
  theta_avg <- alpha theta_avg + (1 - alpha) theta after every update.

The statistics are the logits of a softmax policy and (mean, log std) of a Gaussian one.
The paper names the probability vector for discrete actions; logits are its natural
parameters, and with them k . z is exactly the first-order change of the KL divergence
(a step along the probability simplex's normal, which the softmax ignores, no longer
counts against delta).

**Continuous actions** (section 5): a diagonal Gaussian policy (state-independent
log std) and a stochastic dueling network Q~(x, a) = V(x) + A(x, a) - (1/n) sum_i A(x, u_i),
u_i ~ pi(.|x), n = ``sdn_samples``. The policy term uses the Q_opc target (Retrace with
c_t = 1); Q_ret truncates with c_t = min(1, rho_t)^(1/d), d the action dimension; the bias
correction uses one action a' ~ pi weighted [1 - c/rho(a')]_+; V learns from
V_target = min(1, rho_t)(Q_ret - Q~(x_t, a_t)) + V(x_t).

**Episode ends** follow the one rule of :mod:`rlhf_jax.ops.episode_ends`
(:func:`critic_targets`): a terminated step's target is r_t alone, a truncated one's
r_t + gamma V(final_obs_t), with V(x) = sum_a pi(a|x) Q(x, a) (the value head of the
stochastic dueling network for continuous actions) at the observation the step reached,
and neither carries anything back from the next episode. EnvPool's reset steps
(``action_ignored``) carry no loss.

**The memory** keeps whole observations, k + 1 per trajectory (the last one to
bootstrap from): fine for vector observations, though Atari frames would fit more
trajectories stored once each, as :mod:`rlhf_jax.replay` stores them for DQN. Where a
step can restart a copy itself (gymnax, MJX) it also keeps each step's ``final_obs``
(:func:`rlhf_jax.replay.keeps_final_obs`); on EnvPool that is the next observation.
It keeps the environment's reward, never a learned one: every update, the on-policy
one included, computes its rewards from the stored transitions under the current
reward parameters (:func:`relabel_rewards`), the rule every off-policy agent follows
(:mod:`rlhf_jax.agents.base`).
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax import ops, replay
from rlhf_jax.agents.base import (DrawnCountIteration, RewardFn, Transitions, env_step, episode_metrics,
                                  iterations_counter, make_train as assemble, rollout_rewards)
from rlhf_jax.agents.options import ACERConfig
from rlhf_jax.config_base import decay_horizon
from rlhf_jax.envs.core import Box, Environment, EnvSpec, EnvState, TimeStep
from rlhf_jax.errors import ConfigError
from rlhf_jax.networks import apply_time_major, orthogonal_dense, torso_for
from rlhf_jax.ops import ring
from rlhf_jax.ops.ring import Ring, empty_ring


# --------------------------------------------------------------------------- networks


class DiscreteActorCritic(nn.Module):
    """A shared torso with two heads (the paper's Atari network): policy logits and Q-values.
    ``obs [..., *obs_shape] -> (logits [..., A], q [..., A])``."""

    spec: EnvSpec
    config: ACERConfig

    @nn.compact
    def __call__(self, obs):
        n = self.spec.action_space.n
        features = torso_for(self.spec.observation_shape, kind=self.config.network, hidden=self.config.mlp_hidden)(obs)
        return orthogonal_dense(n, 0.01)(features), orthogonal_dense(n, 1.0)(features)


class GaussianActorCritic(nn.Module):
    """A Gaussian policy and a stochastic dueling critic, each on a torso of its own.

    ``policy(obs) -> (mean, log_std)``, each ``[..., D]``; ``critic(obs, actions [..., K, D])
    -> (V [...], A [..., K])``, the advantage head seeing the critic's features beside the action.
    """

    spec: EnvSpec
    config: ACERConfig

    def setup(self):
        dim = self.spec.action_space.shape[0]
        torso = lambda: torso_for(self.spec.observation_shape, kind=self.config.network, hidden=self.config.mlp_hidden)
        self.policy_torso = torso()
        self.mean_head = orthogonal_dense(dim, 0.01)
        self.log_std = self.param("log_std", nn.initializers.constant(self.config.log_std_init), (dim,))
        self.critic_torso = torso()
        self.value_head = orthogonal_dense(1, 1.0)
        self.advantage_hidden = orthogonal_dense(self.config.mlp_hidden[-1], math.sqrt(2.0))
        self.advantage_head = orthogonal_dense(1, 1.0)

    def policy(self, obs):
        mean = self.mean_head(self.policy_torso(obs))
        return mean, jnp.broadcast_to(self.log_std, mean.shape)

    def value(self, obs):
        """V(x) alone: what a time-limit end bootstraps from."""
        return self.value_head(self.critic_torso(obs))[..., 0]

    def critic(self, obs, actions):
        features = self.critic_torso(obs)
        value = self.value_head(features)[..., 0]
        features = jnp.broadcast_to(features[..., None, :], actions.shape[:-1] + features.shape[-1:])
        hidden = nn.relu(self.advantage_hidden(jnp.concatenate([features, actions], axis=-1)))
        return value, self.advantage_head(hidden)[..., 0]

    def __call__(self, obs, actions):
        return self.policy(obs), self.critic(obs, actions)


def make_network(config: ACERConfig, spec: EnvSpec) -> nn.Module:
    if isinstance(spec.action_space, Box):
        return GaussianActorCritic(spec, config)
    return DiscreteActorCritic(spec, config)


# ----------------------------------------------------------------------------- memory


class Trajectories(NamedTuple):
    """``num_envs`` trajectories of k steps, time-major (a leading slot axis in the memory)."""

    obs: jax.Array  # [k + 1, N, *obs_shape]: x_0 .. x_k, the last to bootstrap from
    action: jax.Array  # [k, N] int or [k, N, D]: a_t as sampled (before clipping to the bounds)
    # [k, N]: in the memory the environment's (timestep.reward); an update replaces it by the
    # agent's reward under the current reward params (relabel_rewards).
    reward: jax.Array
    terminated: jax.Array  # [k, N] bool
    truncated: jax.Array  # [k, N] bool
    action_ignored: jax.Array  # [k, N] bool: an EnvPool reset step
    final_obs: Optional[jax.Array]  # [k, N, *obs_shape] the observation step t reached; None: obs[1:] (EnvPool)
    # mu(.|x_t): log-probabilities [k, N, A] (discrete), or (mean, log_std) [k, N, D] each.
    behaviour: Any

    @property
    def timestep(self) -> TimeStep:
        """The ``TimeStep`` of each step, rebuilt from what the memory keeps (``info={}``), for a
        reward function on replayed transitions (:mod:`rlhf_jax.agents.base`)."""
        final_obs = self.obs[1:] if self.final_obs is None else self.final_obs
        return TimeStep(self.obs[1:], self.reward, self.terminated, self.truncated, final_obs,
                        self.action_ignored, {})


class Memory(NamedTuple):
    data: Trajectories  # every leaf [slots, ...]
    ring: Ring  # the slot the next store writes, and the slots written so far


class Runner(NamedTuple):
    params: Any
    avg_params: Any  # the average network, theta_avg
    opt_state: Any
    memory: Memory
    env_state: EnvState
    obs: jax.Array
    key: jax.Array
    env_steps: jax.Array
    updates: jax.Array  # parameter updates made so far


def env_steps_per_iteration(config: ACERConfig, env: Environment) -> int:
    return config.num_steps * env.num_envs


num_iterations = iterations_counter(env_steps_per_iteration)


def memory_slots(config: ACERConfig, env: Environment) -> int:
    """Iterations' worth of trajectories the memory holds."""
    slots = config.replay_capacity // env_steps_per_iteration(config, env)
    if slots < 1:
        raise ConfigError(f"acer.replay_capacity={config.replay_capacity} holds no trajectory of "
                          f"num_steps={config.num_steps} x num_envs={env.num_envs} env steps")
    if config.replay_ratio > 0 and config.replay_start > slots * env_steps_per_iteration(config, env):
        raise ConfigError(f"acer.replay_start={config.replay_start} exceeds what the memory holds "
                          f"({slots * env_steps_per_iteration(config, env)} env steps): replay would never start")
    return slots


def _store(memory: Memory, trajectories: Trajectories) -> Memory:
    data = jax.tree.map(lambda buffer, x: jax.lax.dynamic_update_index_in_dim(buffer, x, memory.ring.next, 0),
                        memory.data, trajectories)
    slots = jax.tree.leaves(memory.data)[0].shape[0]
    return Memory(data, ring.advance(memory.ring, 1, slots))


def _gather(memory: Memory, slots, envs) -> Trajectories:
    """Trajectory ``(slots[b], envs[b])`` for each b, time-major ``[k(+1), B, ...]``."""
    return jax.tree.map(lambda x: jnp.moveaxis(x[slots, :, envs], 0, 1), memory.data)


def relabel_rewards(config: ACERConfig, reward_fn: RewardFn, batch: Trajectories, reward_params) -> Trajectories:
    """``batch`` with the environment's rewards it holds replaced by the agent's: ``reward_fn``
    under the current ``reward_params`` (:mod:`rlhf_jax.agents.base`: rewards never go stale).

    As a rollout computes them (:func:`rlhf_jax.agents.base.env_step` and ``rollout_rewards``):
    on the action as sampled and the rebuilt ``TimeStep`` (:attr:`Trajectories.timestep`),
    times ``reward_scale``, clipped to ``[-reward_clip, reward_clip]`` (0: no clipping), and
    0 on a reset step.
    """
    reward = rollout_rewards(reward_fn, reward_params, batch.obs[:-1], batch.action, batch.timestep,
                             config.reward_scale, config.reward_clip)
    return batch._replace(reward=reward.astype(batch.reward.dtype))


# ------------------------------------------------------------------------ the agent


def make_optimizer(config: ACERConfig) -> optax.GradientTransformation:
    """RMSProp after clipping, without its step size: the caller scales by a rate that
    decays with env steps (an iteration makes a random number of updates)."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.scale_by_rms(decay=config.rms_decay, eps=config.rms_eps))


def init_runner(key, config: ACERConfig, env: Environment) -> Runner:
    slots = memory_slots(config, env)
    net_key, env_key, key = jax.random.split(key, 3)
    env_state, timestep = env.reset(env_key)
    spec = env.spec
    network = make_network(config, spec)
    k, n = config.num_steps, env.num_envs
    if isinstance(spec.action_space, Box):
        dim = spec.action_space.shape[0]
        params = network.init(net_key, timestep.obs[:1], jnp.zeros((1, 1, dim)))
        action = jnp.zeros((k, n, dim))
        behaviour = (jnp.zeros((k, n, dim)), jnp.zeros((k, n, dim)))
    else:
        params = network.init(net_key, timestep.obs[:1])
        action = jnp.zeros((k, n), jnp.int32)
        behaviour = jnp.zeros((k, n, spec.action_space.n))
    flags = jnp.zeros((k, n), bool)
    obs = jnp.zeros((k + 1, n) + tuple(spec.observation_shape), spec.observation_dtype)
    final_obs = obs[1:] if replay.keeps_final_obs(spec) else None
    one = Trajectories(obs, action, jnp.zeros((k, n)), flags, flags, flags, final_obs, behaviour)
    data = jax.tree.map(lambda x: jnp.zeros((slots,) + x.shape, x.dtype), one)
    memory = Memory(data, empty_ring())
    zero = jnp.zeros((), jnp.int32)
    return Runner(params, params, make_optimizer(config).init(params), memory, env_state, timestep.obs, key, zero, zero)


def _sample_with_behaviour(config: ACERConfig, spec: EnvSpec):
    """``(params, obs, key) -> (action, mu)``: an action from pi and the distribution it came
    from, as the memory stores it."""
    network = make_network(config, spec)

    if isinstance(spec.action_space, Box):
        def sample(params, obs, key):
            mean, log_std = network.apply(params, obs, method=GaussianActorCritic.policy)
            return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape), (mean, log_std)
    else:
        def sample(params, obs, key):
            logits, _ = network.apply(params, obs)
            return jax.random.categorical(key, logits), jax.nn.log_softmax(logits)

    return sample


def make_policy(config: ACERConfig, spec: EnvSpec):
    """``act(params, obs, key, greedy=False) -> action``: sample from pi, or take its mode."""
    network = make_network(config, spec)
    sample = _sample_with_behaviour(config, spec)
    continuous = isinstance(spec.action_space, Box)

    def act(params, obs, key, greedy: bool = False):
        if not greedy:
            return sample(params, obs, key)[0]
        if continuous:
            return network.apply(params, obs, method=GaussianActorCritic.policy)[0]
        return jnp.argmax(network.apply(params, obs)[0], -1)

    return act


# What every update reports (averaged over an iteration's updates).
METRICS = ("loss", "policy_objective", "value_loss", "entropy", "kl_to_average", "trust_region_active")


def critic_targets(config: ACERConfig, batch: Trajectories, q_taken, values, final_values, traces,
                   bootstrap_value) -> jax.Array:
    """Retrace targets Q_ret ``[k, B]`` (:func:`rlhf_jax.ops.retrace_targets`) with the episode
    ends of :func:`rlhf_jax.ops.fold_time_limits`: a terminated step's target is r_t, a truncated
    one's r_t + gamma V(final_obs_t) (``final_values``), and nothing flows back across either.
    ``traces`` c_t = 1 give the Q_opc target."""
    rewards, discounts = ops.fold_time_limits(batch.reward, batch.terminated, batch.truncated, final_values,
                                              config.gamma)
    return ops.retrace_targets(rewards, discounts, q_taken, values, traces, bootstrap_value)


def _trust_region_loss(config: ACERConfig, objective, kl, stats, mask):
    """The policy's loss from the per-state objective J(stats) and KL(pi_avg || pi)(stats).

    g = dJ/dstats and k = dKL/dstats, one vector per state (each state's objective depends
    on its own statistics alone, so the gradient of the sum gives them all); z projects g
    (or is g without a trust region), and -mean_t z . stats back-propagates z through the
    network. Only the states of ``mask`` (:func:`rlhf_jax.ops.loss_mask`) count.
    Returns (loss, fraction of states whose step the trust region shortened).
    """
    def flat(tree):
        return jnp.concatenate([x.reshape(mask.shape + (-1,)) for x in jax.tree.leaves(tree)], axis=-1)

    g = flat(jax.grad(lambda s: jnp.sum(objective(s) * mask))(stats))
    k = flat(jax.grad(lambda s: jnp.sum(kl(s) * mask))(stats))
    z = ops.trust_region_projection(g, k, config.trust_region_delta) if config.trust_region else g
    active = ops.masked_mean((jnp.sum(k * g, -1) > config.trust_region_delta).astype(jnp.float32), mask)
    loss = -ops.masked_mean(jnp.sum(jax.lax.stop_gradient(z) * flat(stats), -1), mask)
    return loss, active


def make_loss(config: ACERConfig, spec: EnvSpec):
    """``loss(params, avg_params, batch, key) -> (loss, metrics)`` of one ACER update."""
    network = make_network(config, spec)
    c = config.truncation
    apply = functools.partial(apply_time_major, network.apply)  # [T, N, ...] observations

    def value_of(logits, q):  # V(x) = sum_a pi(a|x) Q(x, a)
        return jax.lax.stop_gradient(jnp.sum(jax.nn.softmax(logits) * q, -1))

    def discrete_loss(params, avg_params, batch: Trajectories, key):
        del key
        logits, q = apply(params, batch.obs)  # [k+1, B, A]
        avg_logits = jax.lax.stop_gradient(apply(avg_params, batch.obs[:-1])[0])
        log_pi = jax.nn.log_softmax(logits)
        values = value_of(logits, q)
        final_values = values[1:] if batch.final_obs is None else value_of(*apply(params, batch.final_obs))
        take = lambda x: jnp.take_along_axis(x, batch.action[..., None], -1)[..., 0]
        q_t, v_t = q[:-1], values[:-1]
        q_taken = take(q_t)
        log_rho = jax.lax.stop_gradient(log_pi[:-1] - batch.behaviour)  # [k, B, A]
        q_ret = critic_targets(config, batch, q_taken, v_t, final_values, ops.retrace_traces(take(log_rho)),
                               values[-1])
        mask = ops.loss_mask(batch.action_ignored)
        critic_loss = 0.5 * ops.masked_mean((q_ret - q_taken) ** 2, mask)

        def objective(stats):
            log_pi_t = jax.nn.log_softmax(stats)
            j = ops.truncated_is_policy_objective(
                take(log_pi_t), take(log_rho), q_ret - v_t,
                log_pi_t, log_rho, q_t - v_t[..., None], jnp.exp(log_pi_t), c)
            return j + config.entropy_coef * ops.entropy(stats)

        kl = lambda stats: ops.categorical_kl(avg_logits, stats)
        policy_loss, active = _trust_region_loss(config, objective, kl, logits[:-1], mask)
        metrics = {
            "policy_objective": ops.masked_mean(objective(logits[:-1]), mask),
            "value_loss": critic_loss,
            "entropy": ops.masked_mean(ops.entropy(logits[:-1]), mask),
            "kl_to_average": ops.masked_mean(kl(logits[:-1]), mask),
            "trust_region_active": active,
        }
        return policy_loss + config.value_coef * critic_loss, metrics

    def gaussian_loss(params, avg_params, batch: Trajectories, key):
        policy = lambda p, obs: network.apply(p, obs, method=GaussianActorCritic.policy)
        mean, log_std = policy(params, batch.obs)  # [k+1, B, D]
        avg_mean, avg_log_std = jax.lax.stop_gradient(policy(avg_params, batch.obs[:-1]))
        dim = mean.shape[-1]
        # a' (index 0) and u_1..u_n ~ pi(.|x), for every x including the bootstrap x_k.
        noise = jax.random.normal(key, mean.shape[:-1] + (1 + config.sdn_samples, dim))
        samples = jax.lax.stop_gradient(mean[..., None, :] + jnp.exp(log_std)[..., None, :] * noise)
        alt = samples[:-1, :, 0]
        # The critic sees [a_t, a', u_1..u_n] at every x_t (at x_k, a' stands in for a_k).
        taken = jnp.concatenate([batch.action, samples[-1:, :, 0]], axis=0)
        value, advantage = network.apply(params, batch.obs, jnp.concatenate([taken[..., None, :], samples], -2),
                                         method=GaussianActorCritic.critic)
        sampled = advantage[..., 2:]
        q_taken = ops.stochastic_dueling_q(value, advantage[..., 0], sampled)[:-1]
        q_alt = ops.stochastic_dueling_q(value, advantage[..., 1], sampled)[:-1]
        v_t = value[:-1]
        mu_mean, mu_log_std = batch.behaviour
        log_prob = ops.gaussian_log_prob
        log_rho = jax.lax.stop_gradient(log_prob(mean[:-1], log_std[:-1], batch.action)
                                        - log_prob(mu_mean, mu_log_std, batch.action))
        log_rho_alt = jax.lax.stop_gradient(log_prob(mean[:-1], log_std[:-1], alt) - log_prob(mu_mean, mu_log_std, alt))
        bootstrap = jax.lax.stop_gradient(value[-1])
        v_sg = jax.lax.stop_gradient(v_t)
        final_values = jax.lax.stop_gradient(
            value[1:] if batch.final_obs is None
            else network.apply(params, batch.final_obs, method=GaussianActorCritic.value))
        q_ret = critic_targets(config, batch, q_taken, v_sg, final_values, ops.retrace_traces(log_rho, dim), bootstrap)
        q_opc = critic_targets(config, batch, q_taken, v_sg, final_values, jnp.ones_like(log_rho), bootstrap)
        v_target = ops.truncated_value_target(q_ret, jax.lax.stop_gradient(q_taken), v_sg, log_rho)
        mask = ops.loss_mask(batch.action_ignored)
        critic_loss = 0.5 * ops.masked_mean((q_ret - q_taken) ** 2 + (v_target - v_t) ** 2, mask)
        q_alt = jax.lax.stop_gradient(q_alt)

        def objective(stats):
            m, s = stats
            j = ops.truncated_is_policy_objective(
                log_prob(m, s, batch.action), log_rho, q_opc - v_sg,
                log_prob(m, s, alt)[..., None], log_rho_alt[..., None], (q_alt - v_sg)[..., None],
                jnp.ones_like(log_rho_alt)[..., None], c)
            return j + config.entropy_coef * ops.gaussian_entropy(s)

        kl = lambda stats: ops.gaussian_kl(avg_mean, avg_log_std, *stats)
        stats = (mean[:-1], log_std[:-1])
        policy_loss, active = _trust_region_loss(config, objective, kl, stats, mask)
        metrics = {
            "policy_objective": ops.masked_mean(objective(stats), mask),
            "value_loss": critic_loss,
            "entropy": ops.masked_mean(ops.gaussian_entropy(log_std[:-1]), mask),
            "kl_to_average": ops.masked_mean(kl(stats), mask),
            "trust_region_active": active,
        }
        return policy_loss + config.value_coef * critic_loss, metrics

    return gaussian_loss if isinstance(spec.action_space, Box) else discrete_loss


def make_iteration(config: ACERConfig, env: Environment, reward_fn: RewardFn) -> DrawnCountIteration:
    """``iteration(runner, reward_params) -> (runner, metrics, transitions)``: k steps of every
    environment into the memory, one on-policy update and K ~ Poisson(r) replayed ones.
    ``reward_params`` give every update's rewards (:func:`relabel_rewards`); the true
    reward (``env_reward``) needs none. The iteration's ``count(runner)`` is its 1 + K, and
    ``with_count(count)`` the iteration with that many updates written out (module docstring).

    Jit it with ``donate_argnums=0`` so the memory is updated in place.
    """
    spec = env.spec
    slots = memory_slots(config, env)
    sample_action = _sample_with_behaviour(config, spec)
    loss_fn = make_loss(config, spec)
    optimizer = make_optimizer(config)
    per_iteration = env_steps_per_iteration(config, env)
    decay_steps = decay_horizon(config.lr_decay_env_steps, config.total_env_steps)
    learning_rate = ops.linear_schedule(config.learning_rate, 0.0, max(1, decay_steps))
    n = env.num_envs
    keep_final_obs = replay.keeps_final_obs(spec)

    def rollout_step(carry, _):
        params, env_state, obs, key = carry
        key, act_key = jax.random.split(key)
        action, behaviour = sample_action(params, obs, act_key)
        env_state, timestep = env_step(env, env_state, action)
        return (params, env_state, timestep.obs, key), (obs, action, behaviour, timestep)

    def make_update(memory: Memory, key, rate, reward_params):
        """Update ``i`` on trajectories from ``memory``, their rewards recomputed under
        ``reward_params`` (:func:`relabel_rewards`)."""

        def update(i, carry):
            params, avg_params, opt_state, sums = carry
            slot_key, env_key, loss_key = jax.random.split(jax.random.fold_in(key, i), 3)
            # Update 0 learns from the trajectories just stored, the others from the whole memory.
            latest = ring.row_of_age(memory.ring, 0, slots)
            rows = jnp.where(i == 0, latest, jax.random.randint(slot_key, (n,), 0, memory.ring.size))
            envs = jnp.where(i == 0, jnp.arange(n), jax.random.randint(env_key, (n,), 0, n))
            batch = relabel_rewards(config, reward_fn, _gather(memory, rows, envs), reward_params)
            (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, avg_params, batch, loss_key)
            step, opt_state = optimizer.update(grads, opt_state, params)
            params = jax.tree.map(lambda p, u: p - rate * u, params, step)
            # theta_avg <- alpha theta_avg + (1 - alpha) theta
            avg_params = optax.incremental_update(params, avg_params, 1.0 - config.average_decay)
            sums = {name: sums[name] + value for name, value in dict(metrics, loss=loss).items()}
            return params, avg_params, opt_state, sums

        return update

    def count(runner: Runner) -> jax.Array:
        """1 + K: the updates of the iteration from ``runner``. K ~ Poisson(r), and 0 until the
        memory, with this iteration's trajectories, holds ``replay_start`` env steps."""
        stored = ring.advance(runner.memory.ring, 1, slots).size * per_iteration
        replays = jax.random.poisson(jax.random.split(runner.key)[1], config.replay_ratio)
        return (1 + jnp.where(stored >= config.replay_start, replays, 0)).astype(jnp.int32)

    def run(runner: Runner, reward_params, written_out: int | None):
        """The iteration; its updates in a loop of the drawn count, or ``written_out`` of them
        (which must be that count) as straight-line code."""
        updates = count(runner)
        key = jax.random.split(runner.key)[0]
        carry = (runner.params, runner.env_state, runner.obs, key)
        (_, env_state, obs, key), steps = jax.lax.scan(rollout_step, carry, None, config.num_steps)
        observations, actions, behaviour, timesteps = steps
        trajectories = Trajectories(jnp.concatenate([observations, obs[None]]), actions, timesteps.reward,
                                    timesteps.terminated, timesteps.truncated, timesteps.action_ignored,
                                    timesteps.final_obs if keep_final_obs else None, behaviour)
        memory = _store(runner.memory, trajectories)
        key, update_key = jax.random.split(key)
        update = make_update(memory, update_key, learning_rate(runner.env_steps), reward_params)
        sums = {name: jnp.zeros(()) for name in METRICS}
        carry = (runner.params, runner.avg_params, runner.opt_state, sums)
        if written_out is None:
            carry = jax.lax.fori_loop(0, updates, update, carry)  # a traced bound: a while loop
        else:
            for i in range(written_out):
                carry = update(i, carry)
        params, avg_params, opt_state, sums = carry
        env_steps = runner.env_steps + per_iteration
        metrics = {name: total / updates for name, total in sums.items()}  # means over the updates
        metrics.update(env_steps=env_steps, replay_updates=updates - 1, **episode_metrics(timesteps.info))
        transitions = Transitions(observations, actions, timesteps.reward, timesteps.done)
        runner = Runner(params, avg_params, opt_state, memory, env_state, obs, key, env_steps,
                        runner.updates + updates)
        return runner, metrics, transitions

    def with_count(updates: int):
        """The iteration with its ``updates``, the count :func:`count` draws, written out."""
        return lambda runner, reward_params=None: run(runner, reward_params, updates)

    return DrawnCountIteration(lambda runner, reward_params=None: run(runner, reward_params, None), count, with_count)


make_train = assemble(init_runner, make_iteration, num_iterations)
