"""The ensemble of reward predictors and how it is fit (Christiano et al. 2017, section 2.2.3).

    * "We fit an ensemble of predictors, each trained on |D| triples sampled from D
      with replacement. The estimate r̂ is defined by independently normalizing each
      of these predictors and then averaging the results."
    * "A fraction of 1/e of the data is held out to be used as a validation set for
      each predictor. We use l2 regularization and adjust the regularization
      coefficient to keep the validation loss between 1.1 and 1.5 times the training
      loss."

The M members are one stack of parameters (every leaf has a leading axis M), and one
program trains and evaluates all of them, the members written out one after another
(:func:`over_members`), not vmapped: on XLA:CPU a convolution vmapped over members is a
grouped convolution, several times slower than the members' convolutions one by one.
Everything is pure;
``config`` and ``spec`` are static (hashable frozen dataclasses), so e.g.

    fit_fn = jax.jit(fit, static_argnums=(1, 2, 5))   # config, spec, num_steps

and :class:`EnsembleState` is a plain pytree that ``lax.scan`` carries and orbax saves.

Typical round, after new labels arrive::

    state, _ = fit(state, config, spec, labels, key, num_steps)
    train, val = validation_losses(state, config, spec, labels, key, max_rows)
    state = state._replace(l2=adapt_l2(state.l2, train, val, config))
    state = update_normalization(state, config, spec, segments.obs, segments.action, mask)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax.envs.core import EnvSpec, clip_action
from rlhf_jax.networks import is_atari_frames
from rlhf_jax.ops.schedules import learning_rate_in_state
from rlhf_jax.reward.config import RewardModelConfig
from rlhf_jax.reward.data import Labels, action_shape_dtype
from rlhf_jax.reward.networks import RewardCNN, input_statistics, reward_network_for
from rlhf_jax.reward.preference import preference_loss, target_loss

STD_FLOOR = 1e-6  # a member that outputs a constant would otherwise divide by zero


class EnsembleState(NamedTuple):
    """The reward ensemble of ``M`` members, each leaf stacked over a leading member axis:
    what :func:`init_ensemble` makes, :func:`fit` trains, and :func:`normalized_reward`
    reads. Members share nothing but their inputs' standardisation."""

    params: Any  # every leaf [M, ...]
    batch_stats: Any  # every leaf [M, ...]; {} when the network has no batch norm
    opt_state: Any  # every leaf [M, ...]
    l2: jax.Array  # [M] float32: each member's l2 coefficient
    norm_mean: jax.Array  # [M] float32: member m's mean reward on recent steps
    norm_std: jax.Array  # [M] float32: and its standard deviation
    step: jax.Array  # int32: gradient steps taken
    # Vector observations are standardised before the MLP (not in the paper): CartPole's
    # angle winds to +-100 rad once the pole has fallen, and inputs of that size saturate
    # the preference likelihood, whose 10% noise floor then leaves no gradient.
    obs_mean: jax.Array  # [*observation_shape] float32 (0 for Atari frames)
    obs_std: jax.Array  # [*observation_shape] float32 (1 for Atari frames)


# --- The networks, one member at a time (callers run them over members) --------------


def over_members(fn, *stacked):
    """``fn`` on each member's slice of ``stacked``, the results stacked on a new leading axis.

    Every leaf of the pytrees ``stacked`` leads with the member axis M (parameters, batch
    statistics, optimiser states, per-member rows and keys); member m's call sees leaf[m]
    of each. Arguments shared by all members are closed over by ``fn``. The result equals
    ``jax.vmap(fn)(*stacked)`` but the M calls are written out one after another in the
    traced program: XLA:CPU runs a convolution vmapped over members (a grouped
    convolution) and its gradient several times slower than the M convolutions apart:
    written out, the Atari reward CNN's fit (3 members, 64 pairs) ran 3.0x as fast on 2
    shared cores (``benchmarks/reward_fit.py``: median of 5 alternating rounds, [2.0, 5.3]),
    and the MLP's as fast as vmapped (0.98x, [0.75, 1.29]).
    """
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(stacked)}
    if len(sizes) != 1:
        raise ValueError(f"over_members: leaves disagree on the member axis: sizes {sorted(sizes)}")
    (members,) = sizes
    outputs = [fn(*jax.tree.map(lambda leaf, m=m: leaf[m], stacked)) for m in range(members)]
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *outputs)


def _network(config: RewardModelConfig, spec: EnvSpec) -> nn.Module:
    return reward_network_for(spec, config)


def _has_batch_stats(network: nn.Module) -> bool:
    return isinstance(network, RewardCNN) and network.batch_norm


def _optimizer(config: RewardModelConfig) -> optax.GradientTransformation:
    return learning_rate_in_state(optax.adam, config.learning_rate)


def _flatten_steps(config: RewardModelConfig, spec: EnvSpec, obs: jax.Array, action: jax.Array):
    """``[..., *obs_shape]``, ``[..., *action_shape]`` -> ``[N, ...]`` each, and the leading shape:
    the network's inputs, with the action clipped into the bounds where ``config.clip_actions``
    says so, or zero where ``config.reads_action`` is off (the one place r̂ reads an action:
    acting, fitting and scoring alike)."""
    if config.clip_actions:
        action = clip_action(spec.action_space, action)
    if not config.reads_action:
        action = jnp.zeros_like(action)
    obs_ndim = len(spec.observation_shape)
    leading = obs.shape[: obs.ndim - obs_ndim]
    chex.assert_shape(obs, leading + tuple(spec.observation_shape))
    action_shape, _ = action_shape_dtype(spec)
    chex.assert_shape(action, leading + action_shape)
    return obs.reshape((-1,) + obs.shape[len(leading):]), action.reshape((-1,) + action_shape), leading


def _predict(network, params, batch_stats, obs, action) -> jax.Array:
    """One member's r̂ in evaluation mode: no dropout, batch norm's running averages."""
    variables = {"params": params, "batch_stats": batch_stats} if _has_batch_stats(network) else {"params": params}
    return network.apply(variables, obs, action, train=False)


def _predict_train(network, params, batch_stats, obs, action, key):
    """One member's r̂ in training mode (dropout on, batch statistics), and its new batch stats."""
    if _has_batch_stats(network):
        rewards, updates = network.apply(
            {"params": params, "batch_stats": batch_stats}, obs, action, train=True,
            rngs={"dropout": key}, mutable=["batch_stats"],
        )
        return rewards, updates["batch_stats"]
    return network.apply({"params": params}, obs, action, train=True, rngs={"dropout": key}), batch_stats


def _kernel_sq_norm(params) -> jax.Array:
    """Sum of squared weights, kernels only: biases and batch-norm scales are not shrunk."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return sum(jnp.sum(jnp.square(x)) for path, x in leaves if getattr(path[-1], "key", None) == "kernel")


# --- State ------------------------------------------------------------------------


def init_ensemble(key: jax.Array, config: RewardModelConfig, spec: EnvSpec) -> EnsembleState:
    """M members initialised from M different keys, stacked along a leading axis."""
    network, optimizer = _network(config, spec), _optimizer(config)
    action_shape, action_dtype = action_shape_dtype(spec)
    obs = jnp.zeros((1, *spec.observation_shape), spec.observation_dtype)
    action = jnp.zeros((1, *action_shape), action_dtype)

    def init_member(member_key):
        variables = network.init({"params": member_key}, obs, action, train=False)
        params = variables["params"]
        return params, variables.get("batch_stats", {}), optimizer.init(params)

    members = config.ensemble_size
    # One member after another, not vmapped: vmapped orthogonal initialisers are batched
    # LAPACK QRs, and two of them side by side deadlocked XLA:CPU on 2 cores (jax 0.10.2:
    # each waits in ParallelBatchMap for pool threads that the other holds).
    inits = [init_member(member_key) for member_key in jax.random.split(key, members)]
    params, batch_stats, opt_state = jax.tree.map(lambda *xs: jnp.stack(xs), *inits)
    # The "no regularization" ablation keeps l2 at zero for good.
    l2 = config.l2_init if config.adapt_l2 else 0.0
    return EnsembleState(
        params=params,
        batch_stats=batch_stats,
        opt_state=opt_state,
        l2=jnp.full((members,), l2, jnp.float32),
        norm_mean=jnp.zeros((members,), jnp.float32),
        norm_std=jnp.ones((members,), jnp.float32),
        step=jnp.zeros((), jnp.int32),
        obs_mean=jnp.zeros(spec.observation_shape, jnp.float32),
        obs_std=jnp.ones(spec.observation_shape, jnp.float32),
    )


def set_input_statistics(state: EnsembleState, config: RewardModelConfig, spec: EnvSpec, obs: jax.Array) -> EnsembleState:
    """Fix the MLP's input standardisation to the mean and std of ``obs`` ``[..., *obs_shape]``
    (the untrained policy's steps, before any fitting; Atari frames are left as they are)."""
    if is_atari_frames(spec.observation_shape):
        return state
    mean, std = input_statistics(spec.observation_shape, obs, config.input_std_floor)
    return state._replace(obs_mean=mean, obs_std=std)


def _standardize(state: EnsembleState, spec: EnvSpec, obs: jax.Array) -> jax.Array:
    if is_atari_frames(spec.observation_shape):
        return obs  # uint8 frames: the CNN scales them
    return (obs - state.obs_mean) / state.obs_std


# --- Rewards ----------------------------------------------------------------------


def member_returns(
    state: EnsembleState, config: RewardModelConfig, spec: EnvSpec, obs: jax.Array, action: jax.Array
) -> jax.Array:
    """Each member's raw (unnormalised) per-step reward r̂_m(o, a), evaluation mode.

    Args:
      obs: ``[..., *observation_shape]``, any leading axes (e.g. pairs x steps).
      action: ``[..., *action_shape]`` with the same leading axes.

    Returns:
      ``[M, ...]``: one reward per member and step (nothing is summed).
    """
    network = _network(config, spec)
    obs, action, leading = _flatten_steps(config, spec, _standardize(state, spec, obs), action)
    rewards = over_members(lambda params, batch_stats: _predict(network, params, batch_stats, obs, action),
                           state.params, state.batch_stats)
    return rewards.reshape((config.ensemble_size,) + leading)


def _expand(per_member: jax.Array, ndim: int) -> jax.Array:
    """``[M]`` -> ``[M, 1, ..., 1]`` to broadcast against ``[M, ...]`` of rank ``ndim``."""
    return per_member.reshape(per_member.shape + (1,) * (ndim - 1))


def normalized_reward(
    state: EnsembleState, config: RewardModelConfig, spec: EnvSpec, obs: jax.Array, action: jax.Array
) -> jax.Array:
    """The ensemble's estimate (section 2.2.3): each member normalised, then averaged,

        r̂(o, a) = 1/M sum_m  s (r̂_m(o, a) - mean_m) / std_m,

    with ``s`` = :meth:`RewardModelConfig.reward_std` and ``mean_m``, ``std_m`` from
    :func:`update_normalization`. Returns ``[...]``, the leading axes of ``obs``.
    """
    return average_normalized(state, config, spec, member_returns(state, config, spec, obs, action))


def average_normalized(state: EnsembleState, config: RewardModelConfig, spec: EnvSpec, rewards: jax.Array) -> jax.Array:
    """:func:`normalized_reward` from the members' rewards ``[M, ...]`` (:func:`member_returns`)."""
    mean, std = _expand(state.norm_mean, rewards.ndim), _expand(state.norm_std, rewards.ndim)
    return jnp.mean(config.reward_std(spec) * (rewards - mean) / std, axis=0)


def make_reward_fn(config: RewardModelConfig, spec: EnvSpec):
    """The learned reward as agents take it (:mod:`rlhf_jax.agents.base`):

        reward_fn(reward_params: EnsembleState, obs, action, timestep) -> [num_envs],

    r̂ of :func:`normalized_reward`; ``timestep`` (the environment's reward) is ignored.
    """

    def reward_fn(reward_params: EnsembleState, obs, action, timestep) -> jax.Array:
        del timestep
        return normalized_reward(reward_params, config, spec, obs, action)

    return reward_fn


def update_normalization(
    state: EnsembleState,
    config: RewardModelConfig,
    spec: EnvSpec,
    obs: jax.Array,
    action: jax.Array,
    mask: jax.Array | None = None,
) -> EnsembleState:
    """Set each member's ``norm_mean``/``norm_std`` to its reward's mean and standard
    deviation over a batch of recent steps (e.g. every step of the segment buffer), so
    that "normalizing each of these predictors" gives zero mean and the paper's std.

    ``mask`` (broadcastable to ``obs``'s leading axes, e.g. ``[S, 1]`` for the rows of a
    ring buffer below its ``count``) marks valid steps; with none valid the old
    statistics are kept. The std is floored at ``STD_FLOOR``.
    """
    return normalization_from(state, member_returns(state, config, spec, obs, action), mask)


def normalization_from(state: EnsembleState, rewards: jax.Array, mask: jax.Array | None = None) -> EnsembleState:
    """:func:`update_normalization` from the members' rewards ``[M, ...]`` (:func:`member_returns`)."""
    members = rewards.shape[0]
    weights = jnp.ones(rewards.shape[1:], jnp.float32) if mask is None else jnp.broadcast_to(mask, rewards.shape[1:])
    weights = weights.astype(jnp.float32).reshape(-1)
    rewards = rewards.reshape(members, -1)
    total = weights.sum()
    mean = (rewards * weights).sum(axis=1) / jnp.maximum(total, 1.0)
    variance = (jnp.square(rewards - mean[:, None]) * weights).sum(axis=1) / jnp.maximum(total, 1.0)
    std = jnp.maximum(jnp.sqrt(variance), STD_FLOOR)
    seen = total > 0
    return state._replace(
        norm_mean=jnp.where(seen, mean, state.norm_mean), norm_std=jnp.where(seen, std, state.norm_std)
    )


# --- Fitting ----------------------------------------------------------------------


def sample_training_rows(
    key: jax.Array, holdout_column: jax.Array, count: jax.Array, batch_size: int
) -> tuple[jax.Array, jax.Array]:
    """``batch_size`` label rows drawn uniformly WITH replacement among one member's
    training rows: ``row < count`` and not ``holdout_column[row]``.

    Over |D| draws this is the bootstrap resample of the paper ("|D| triples sampled
    from D with replacement"); drawing fresh rows every step keeps the shapes fixed as
    D grows. The j-th training row is found by a search in the running count of
    training rows, so the cost is O(C + batch log C), not O(C x batch).

    Returns:
      ``(rows [batch_size] int32, num_training_rows int32)``. With no training row the
      rows are meaningless (row C - 1) and the caller must mask them out.
    """
    capacity = holdout_column.shape[0]
    training = (jnp.arange(capacity) < count) & ~holdout_column
    running = jnp.cumsum(training.astype(jnp.int32))  # running[r] = training rows in 0..r
    num_rows = running[-1]
    j = jax.random.randint(key, (batch_size,), 0, jnp.maximum(num_rows, 1))
    rows = jnp.searchsorted(running, j, side="right")  # first r with running[r] = j + 1
    return jnp.minimum(rows, capacity - 1).astype(jnp.int32), num_rows


def _pair_losses(config: RewardModelConfig, rewards: jax.Array, labels: Labels, rows: jax.Array) -> jax.Array:
    """Per-pair loss from per-step rewards ``[B, 2, k]`` of the label ``rows``."""
    returns = rewards.sum(axis=-1)  # R^i = sum_t r̂(o^i_t, a^i_t)
    if config.loss == "target":
        oracle = labels.oracle_return[rows]
        return target_loss(returns[:, 0], returns[:, 1], oracle[:, 0], oracle[:, 1])
    return preference_loss(returns[:, 0], returns[:, 1], labels.mu[rows], config.random_answer_prob)


def _weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    return (values * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def _train_step(config: RewardModelConfig, spec: EnvSpec, state: EnsembleState, labels: Labels, key: jax.Array):
    """One Adam step of every member on its own minibatch; members without data keep their state."""
    network, optimizer = _network(config, spec), _optimizer(config)
    members = config.ensemble_size
    sample_key, dropout_key = jax.random.split(key)
    dropout_keys = jax.random.split(dropout_key, members)
    if config.bootstrap:
        # Each member resamples its own training rows.
        keys = jax.random.split(sample_key, members)
        rows, num_rows = jax.vmap(sample_training_rows, in_axes=(0, 1, None, None))(
            keys, labels.holdout, labels.ring.size, config.batch_size
        )
        weights = jnp.broadcast_to((num_rows > 0)[:, None], (members, config.batch_size)).astype(jnp.float32)
    else:
        # No bagging: all members see the same rows (drawn among all valid ones); each
        # member's held-out rows get zero weight, so validation stays honest.
        nobody = jnp.zeros((labels.capacity,), bool)
        shared, _ = sample_training_rows(sample_key, nobody, labels.ring.size, config.batch_size)
        rows = jnp.broadcast_to(shared, (members, config.batch_size))
        valid = jnp.arange(labels.capacity)[shared] < labels.ring.size
        weights = (valid[None] & ~labels.holdout[shared].T).astype(jnp.float32)

    def member_step(params, batch_stats, opt_state, l2, rows, weights, key):
        # Both segments of every pair go through the network as one batch.
        obs = _standardize(state, spec, labels.observations(rows))  # [B, 2, k, *obs_shape]
        action = labels.action[rows]
        flat_obs, flat_action, leading = _flatten_steps(config, spec, obs, action)

        def loss_fn(params):
            rewards, new_stats = _predict_train(network, params, batch_stats, flat_obs, flat_action, key)
            data_loss = _weighted_mean(_pair_losses(config, rewards.reshape(leading), labels, rows), weights)
            return data_loss + l2 * _kernel_sq_norm(params), (data_loss, new_stats)

        (_, (data_loss, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new = (optax.apply_updates(params, updates), new_stats, new_opt_state)
        # Masking, not control flow: an empty buffer leaves the member exactly as it was.
        has_data = weights.sum() > 0
        kept = jax.tree.map(lambda n, o: jnp.where(has_data, n, o), new, (params, batch_stats, opt_state))
        return kept, data_loss, has_data

    (params, batch_stats, opt_state), losses, has_data = over_members(
        member_step,
        state.params, state.batch_stats, state.opt_state, state.l2, rows, weights, dropout_keys
    )
    state = state._replace(
        params=params, batch_stats=batch_stats, opt_state=opt_state,
        step=state.step + jnp.any(has_data).astype(jnp.int32),
    )
    return state, (losses, has_data)


def fit(
    state: EnsembleState,
    config: RewardModelConfig,
    spec: EnvSpec,
    labels: Labels,
    key: jax.Array,
    num_steps: int,
) -> tuple[EnsembleState, dict]:
    """``num_steps`` (static) gradient steps of every member, as one ``lax.scan``.

    Each step, member m draws ``batch_size`` rows with replacement among its training
    rows (:func:`sample_training_rows`; with ``bootstrap=False`` all members share the
    rows) and takes an Adam step on

        mean over its rows of loss(pair)  +  l2_m * sum ||W||^2   (kernels only),

    with loss the cross-entropy of :func:`rlhf_jax.reward.preference.preference_loss`
    (``config.loss="target"``: :func:`~rlhf_jax.reward.preference.target_loss`),
    dropout on and batch-norm statistics updated. A member with no training row is
    left unchanged.

    ``num_steps=1`` takes the step without a loop: XLA:CPU runs convolution gradients
    many times slower inside loops, so on CPU drive the CNN from Python, one compiled
    step per call (as :mod:`rlhf_jax.trainer` does for CNN agents).

    Returns:
      ``(state, metrics)``; ``metrics["loss"]`` ``[M]`` is each member's data loss (no
      l2 term) averaged over the steps that had data (0 if none did).
    """
    chex.assert_shape(labels.holdout, (labels.capacity, config.ensemble_size))

    def body(state, step_key):
        return _train_step(config, spec, state, labels, step_key)

    if num_steps == 1:
        state, (losses, has_data) = body(state, key)
        losses, has_data = losses[None], has_data[None]
    else:
        state, (losses, has_data) = jax.lax.scan(body, state, jax.random.split(key, num_steps))
    weights = has_data.astype(jnp.float32)  # [num_steps, M]
    return state, {"loss": (losses * weights).sum(0) / jnp.maximum(weights.sum(0), 1.0)}


def validation_losses(
    state: EnsembleState,
    config: RewardModelConfig,
    spec: EnvSpec,
    labels: Labels,
    key: jax.Array,
    max_rows: int,
) -> tuple[jax.Array, jax.Array]:
    """Each member's mean loss on its training rows and on its held-out rows.

    Evaluated alike for both (evaluation mode: no dropout, running batch-norm averages;
    no l2 term), so their ratio measures overfitting only. At most ``max_rows`` (static)
    label rows are scored:

    * while the ring holds at most ``max_rows`` labels, every one of them, once (exact);
    * past that, a uniform random sample of ``max_rows`` of them, with replacement, shared
      by all members; each member weights it by its own split.

    Rows go through the network ``batch_size`` pairs at a time, so memory does not grow
    with ``max_rows``, and only as many batches as hold a valid row are scored: the cost
    follows the labels held, up to ``max_rows``, not the buffer's capacity (3,000 on Atari).

    Returns:
      ``(train_loss [M], val_loss [M])``. A member with no held-out (or no training)
      row in the sample gets NaN there; :func:`adapt_l2` leaves its l2 alone.
    """
    chex.assert_shape(labels.holdout, (labels.capacity, config.ensemble_size))
    network = _network(config, spec)
    batch, count = config.batch_size, labels.ring.size
    size = min(max_rows, labels.capacity)
    exact = count <= size
    nobody = jnp.zeros((labels.capacity,), bool)
    sampled, _ = sample_training_rows(key, nobody, count, size)
    rows = jnp.where(exact, jnp.arange(size, dtype=jnp.int32), sampled)
    chunks = -(-size // batch)
    padded = jnp.concatenate([rows, jnp.zeros((chunks * batch - size,), jnp.int32)]).reshape(chunks, batch)
    # Exact: rows are in order, so the first ceil(count / batch) batches hold every valid one.
    scored = jnp.where(exact, jnp.minimum(-(-count // batch), chunks), chunks)

    def add_chunk(i, sums):  # sums: (train_sum, train_n, val_sum, val_n), each [M]
        chunk_rows = padded[i]
        obs, action, leading = _flatten_steps(
            config, spec, _standardize(state, spec, labels.observations(chunk_rows)), labels.action[chunk_rows])

        def member_losses(params, batch_stats):  # [batch]
            rewards = _predict(network, params, batch_stats, obs, action).reshape(leading)
            return _pair_losses(config, rewards, labels, chunk_rows)

        losses = over_members(member_losses, state.params, state.batch_stats)  # [M, batch]
        valid = ((i * batch + jnp.arange(batch)) < size) & (chunk_rows < count)
        held_out = labels.holdout[chunk_rows].T  # [M, batch]
        train_w = (valid[None] & ~held_out).astype(jnp.float32)
        val_w = (valid[None] & held_out).astype(jnp.float32)
        train_sum, train_n, val_sum, val_n = sums
        return (train_sum + (losses * train_w).sum(1), train_n + train_w.sum(1),
                val_sum + (losses * val_w).sum(1), val_n + val_w.sum(1))

    zeros = jnp.zeros((config.ensemble_size,), jnp.float32)
    train_sum, train_n, val_sum, val_n = jax.lax.fori_loop(0, scored, add_chunk, (zeros, zeros, zeros, zeros))
    mean_or_nan = lambda total, n: jnp.where(n > 0, total / jnp.maximum(n, 1.0), jnp.nan)
    return mean_or_nan(train_sum, train_n), mean_or_nan(val_sum, val_n)


def adapt_l2(l2: jax.Array, train_loss: jax.Array, val_loss: jax.Array, config: RewardModelConfig) -> jax.Array:
    """The adaptive l2 rule (section 2.2.3), per member: keep the validation loss
    between ``l2_low`` (1.1) and ``l2_high`` (1.5) times the training loss:

        val > l2_high * train  ->  l2 * l2_factor   (overfitting: regularise more)
        val < l2_low  * train  ->  l2 / l2_factor   (underfitting: regularise less)
        otherwise              ->  l2.

    A member whose losses are not finite (no held-out rows yet: NaN from
    :func:`validation_losses`) keeps its l2. With ``adapt_l2=False`` (the "no
    regularization" ablation) l2 is 0 throughout.
    """
    chex.assert_equal_shape([l2, train_loss, val_loss])
    if not config.adapt_l2:
        return jnp.zeros_like(l2)
    more = val_loss > config.l2_high * train_loss
    less = val_loss < config.l2_low * train_loss
    adapted = jnp.where(more, l2 * config.l2_factor, jnp.where(less, l2 / config.l2_factor, l2))
    known = jnp.isfinite(train_loss) & jnp.isfinite(val_loss)
    return jnp.where(known, adapted, l2)
