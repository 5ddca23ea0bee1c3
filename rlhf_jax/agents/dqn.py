"""DQN (Mnih et al. 2015, "Human-level control through deep reinforcement learning").

Q-learning with a deep network, made stable by experience replay and a target
network (Methods, Algorithm 1). Each parameter update minimises, on a minibatch
(s, a, r, s') ~ U(D) from the replay memory,

    L(theta) = E[ Huber( r + gamma max_a' Q(s', a'; theta^-) - Q(s, a; theta) ) ],

with theta^- a copy of theta taken every C updates; with ``double_q`` the target is
van Hasselt et al.'s r + gamma Q(s', argmax_a' Q(s', a'; theta); theta^-).

**Counting with many environments.** The paper has one environment and counts
"frames", which there are agent steps: one action, repeated over 4 emulator frames
(its 50 million training "frames" are "around 38 days of game experience", i.e.
200 million emulator frames at 60 Hz). With ``num_envs`` environments stepping
together, every count below is in *env steps summed over all environments*: one
vector step adds ``num_envs``. So ``total_env_steps``, the exploration schedule
(epsilon annealed over the first ``exploration_steps`` env steps), ``replay_start``
(learning begins once that many env steps are stored) and ``update_period`` (one
parameter update per ``update_period`` env steps, i.e. per 4 actions the agent
selects) mean what they mean in the paper whatever ``num_envs`` is. An iteration
takes the smallest whole number of vector steps that this ratio allows,
``update_period / gcd(num_envs, update_period)``, then makes ``num_envs /
gcd(num_envs, update_period)`` updates. Only the target network period counts
parameter updates, as the paper's table does (C = 10,000 parameter updates).

**Episode ends** follow the one rule of :mod:`rlhf_jax.ops.episode_ends`
(:func:`td_targets`): a terminal transition's target is r alone; a time-limit one
bootstraps from the observation the step reached, r + gamma max_a' Q(final_obs, a'; theta^-),
not from the next episode's first; EnvPool's reset steps (``action_ignored``) are never
sampled, and a draw that cannot be sampled carries no loss.

**Rewards never go stale.** The replay memory keeps the environment's reward, never a
learned one: every minibatch's reward comes from the *current* reward parameters when
it is sampled (:func:`replay_rewards`), the rule every off-policy agent follows
(:mod:`rlhf_jax.agents.base`).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax import ops, replay
from rlhf_jax.agents.base import RewardFn, Transitions, episode_metrics, iterations_counter, make_train as assemble
from rlhf_jax.agents.options import DQNConfig
from rlhf_jax.envs.core import Discrete, Environment, EnvSpec, EnvState
from rlhf_jax.errors import ConfigError
from rlhf_jax.networks import QHead, torso_for
from rlhf_jax.ops.schedules import learning_rate_in_state


class QNetwork(nn.Module):
    """Nature CNN (pixels) or MLP (vectors), then one linear output per action."""

    spec: EnvSpec
    config: DQNConfig

    @nn.compact
    def __call__(self, obs):
        features = torso_for(self.spec.observation_shape, kind="nature", hidden=self.config.mlp_hidden)(obs)
        return QHead(self.spec.action_space.n)(features)


class Runner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    memory: replay.ReplayState
    env_state: EnvState
    obs: jax.Array
    key: jax.Array
    env_steps: jax.Array
    updates: jax.Array  # parameter updates made so far


def iteration_shape(config: DQNConfig, num_envs: int) -> tuple[int, int]:
    """(vector steps, parameter updates) per iteration: one update per ``update_period`` env steps."""
    common = math.gcd(num_envs, config.update_period)
    return config.update_period // common, num_envs // common


def env_steps_per_iteration(config: DQNConfig, env: Environment) -> int:
    vector_steps, _ = iteration_shape(config, env.num_envs)
    return vector_steps * env.num_envs


num_iterations = iterations_counter(env_steps_per_iteration)


def make_optimizer(config: DQNConfig) -> optax.GradientTransformation:
    """DeepMind's RMSProp (see :class:`DQNConfig`). The scale matters: eps = 0.01 is small
    next to the variance of a summed gradient, but would dominate that of the mean and
    turn RMSProp into plain SGD with step lr / 0.1."""
    return optax.chain(
        optax.scale(config.batch_size),
        learning_rate_in_state(lambda lr: optax.rmsprop(lr, decay=config.rms_decay, eps=config.rms_eps, centered=True),
                               config.learning_rate),
    )


def _check_env(config: DQNConfig, env: Environment) -> None:
    if not isinstance(env.action_space, Discrete):
        raise ConfigError(f"DQN needs discrete actions; {env.spec.id} has {env.action_space}")
    if config.replay_capacity < 2 * env.num_envs:
        raise ConfigError(f"dqn.replay_capacity={config.replay_capacity} must hold at least 2 steps "
                          f"of env.num_envs={env.num_envs} environments")


def init_runner(key, config: DQNConfig, env: Environment) -> Runner:
    _check_env(config, env)
    net_key, env_key, key = jax.random.split(key, 3)
    env_state, timestep = env.reset(env_key)
    spec = env.spec
    params = QNetwork(spec, config).init(net_key, timestep.obs[:1])
    memory = replay.init(config.replay_capacity, env.num_envs, spec.observation_shape,
                         spec.observation_dtype, replay.frame_stack(spec), replay.keeps_final_obs(spec))
    zero = jnp.zeros((), jnp.int32)
    return Runner(params, params, make_optimizer(config).init(params), memory, env_state, timestep.obs, key, zero, zero)


def make_policy(config: DQNConfig, spec: EnvSpec):
    """``act(params, obs, key, greedy=False, epsilon=config.eval_epsilon) -> action``:
    epsilon-greedy in Q; ``greedy=True``, as every agent's policy takes it, is ``epsilon=0``."""
    network = QNetwork(spec, config)

    def act(params, obs, key, *, greedy: bool = False, epsilon=config.eval_epsilon):
        return ops.epsilon_greedy(key, network.apply(params, obs), 0.0 if greedy else epsilon)

    return act


def replay_rewards(config: DQNConfig, reward_fn: RewardFn, reward_params, batch: replay.Batch) -> jax.Array:
    """The rewards ``[B]`` of replayed transitions: ``reward_fn`` under the current ``reward_params``
    on the stored observations and actions and the rebuilt ``TimeStep`` (:mod:`rlhf_jax.agents.base`),
    clipped to ``[-reward_clip, reward_clip]`` (0: no clipping)."""
    reward = reward_fn(reward_params, batch.obs, batch.action, batch.timestep)
    return jnp.clip(reward, -config.reward_clip, config.reward_clip) if config.reward_clip else reward


def _target(config: DQNConfig, reward, discount, q):
    """``r + discount max_a' Q(s', a'; theta^-)``, or van Hasselt et al.'s with ``double_q``;
    ``q = (Q(s', .; theta^-), Q(s', .; theta))``."""
    target_q, online_q = q
    if config.double_q:
        return ops.double_q_learning_target(reward, discount, online_q, target_q)
    return ops.q_learning_target(reward, discount, target_q)


def td_targets(config: DQNConfig, reward, terminated, truncated, q_next, q_final) -> jax.Array:
    """The targets ``y`` ``[B]`` of a minibatch, with the episode ends of :func:`rlhf_jax.ops.fold_time_limits`:

        y = r + gamma max_a' Q(o_{t+1}, a'; theta^-)       the episode goes on,
        y = r                                               terminated,
        y = r + gamma max_a' Q(final_obs_t, a'; theta^-)   truncated (the time limit),

    (with ``double_q``, ``Q(s, argmax_a' Q(s, a'; theta); theta^-)`` in place of each max).

    Args:
      reward, terminated, truncated: ``[B]``.
      q_next, q_final: ``(Q(s, .; theta^-), Q(s, .; theta))``, each ``[B, A]``, at ``o_{t+1}`` and at
        ``final_obs_t`` (the online values are read only with ``double_q``).
    """
    # V(final_obs): the target without reward or discount.
    final_value = _target(config, jnp.zeros_like(reward), jnp.ones_like(reward), q_final)
    reward, discount = ops.fold_time_limits(reward, terminated, truncated, final_value, config.gamma)
    return _target(config, reward, discount, q_next)


def make_targets(config: DQNConfig, spec: EnvSpec):
    """``targets(params, target_params, batch, reward) -> y [B]``: :func:`td_targets` with the
    network's values at ``o_{t+1}`` and at ``final_obs``. Where the memory keeps no final
    observation (:func:`rlhf_jax.replay.keeps_final_obs`) it is ``o_{t+1}``, valued once."""
    network = QNetwork(spec, config)
    separate_final_obs = replay.keeps_final_obs(spec)

    def targets(params, target_params, batch: replay.Batch, reward):
        def values(obs):
            return network.apply(target_params, obs), network.apply(params, obs) if config.double_q else None

        q_next = values(batch.next_obs)
        q_final = values(batch.final_obs) if separate_final_obs else q_next
        return td_targets(config, reward, batch.terminated, batch.truncated, q_next, q_final)

    return targets


def make_loss(config: DQNConfig, spec: EnvSpec):
    """``loss(params, target_params, batch, reward) -> (loss, mean Q)``: the DQN loss, Huber(y - Q(s, a; theta))
    as :func:`rlhf_jax.ops.q_learning_loss` has it, averaged over the draws that could be sampled
    (``batch.mask``), so nothing else (a reset step, say) ever carries loss."""
    network = QNetwork(spec, config)
    targets = make_targets(config, spec)

    def loss(params, target_params, batch: replay.Batch, reward):
        q = network.apply(params, batch.obs)
        target = jax.lax.stop_gradient(targets(params, target_params, batch, reward))
        q_taken = jnp.take_along_axis(q, batch.action[:, None], -1)[:, 0]
        return ops.masked_mean(ops.huber_loss(target - q_taken, config.huber_delta), batch.mask), q.mean()

    return loss


def make_iteration(config: DQNConfig, env: Environment, reward_fn: RewardFn):
    """``iteration(runner, reward_params) -> (runner, metrics, transitions)``: a few vector steps into the
    replay memory, then (once ``replay_start`` env steps are in) their share of updates, each on a
    minibatch whose rewards ``reward_params`` give (:func:`replay_rewards`).

    Jit it with ``donate_argnums=0`` so the replay memory is updated in place.
    """
    _check_env(config, env)
    loss_fn = make_loss(config, env.spec)
    optimizer = make_optimizer(config)
    act = make_policy(config, env.spec)
    epsilon = ops.linear_schedule(config.epsilon_start, config.epsilon_end, config.exploration_steps)
    vector_steps, num_updates = iteration_shape(config, env.num_envs)

    def env_step(carry, _):
        params, memory, env_state, obs, key, env_steps = carry
        key, act_key = jax.random.split(key)
        action = act(params, obs, act_key, epsilon=epsilon(env_steps))
        env_state, timestep = env.step(env_state, action)
        memory = replay.add(memory, obs, action, timestep)
        carry = (params, memory, env_state, timestep.obs, key, env_steps + env.num_envs)
        return carry, (timestep.info, Transitions(obs, action, timestep.reward, timestep.done))

    def make_update(memory, reward_params):
        def update(carry, key):
            params, target_params, opt_state, updates = carry
            batch = replay.sample(memory, key, config.batch_size)
            reward = replay_rewards(config, reward_fn, reward_params, batch)
            (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, target_params, batch, reward)
            step, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, step)
            updates = updates + 1
            # theta^- <- theta after every C-th update (Algorithm 1: "every C steps reset Q^ = Q").
            target_params = optax.periodic_update(params, target_params, updates, config.target_update_period)
            return (params, target_params, opt_state, updates), (loss, q_mean)

        return update

    def iteration(runner: Runner, reward_params=None):
        carry = (runner.params, runner.memory, runner.env_state, runner.obs, runner.key, runner.env_steps)
        (_, memory, env_state, obs, key, env_steps), (info, transitions) = jax.lax.scan(
            env_step, carry, None, vector_steps, unroll=True)
        key, update_key = jax.random.split(key)
        learner = (runner.params, runner.target_params, runner.opt_state, runner.updates)

        # The steps above and the updates run unrolled, and the updates are kept or dropped by a
        # select, not a conditional: XLA:CPU runs a CNN's gradient inside a loop or a conditional
        # about six times slower than in straight-line code (jax-ml/jax#12868). An iteration holds
        # few of each (``iteration_shape``); the updates computed before learning begins (the first
        # ``replay_start`` env steps) are dropped.
        keys = jax.random.split(update_key, num_updates)
        learned, (losses, q_means) = jax.lax.scan(make_update(memory, reward_params), learner, keys, unroll=True)
        learning = env_steps >= config.replay_start
        params, target_params, opt_state, updates = jax.tree.map(
            lambda new, old: jnp.where(learning, new, old), learned, learner)
        loss, q_mean = jnp.where(learning, losses.mean(), 0.0), jnp.where(learning, q_means.mean(), 0.0)
        metrics = {"loss": loss, "q_mean": q_mean, "epsilon": epsilon(env_steps), "env_steps": env_steps,
                   "updates": updates, **episode_metrics(info)}
        runner = Runner(params, target_params, opt_state, memory, env_state, obs, key, env_steps, updates)
        return runner, metrics, transitions

    return iteration


make_train = assemble(init_runner, make_iteration, num_iterations)
