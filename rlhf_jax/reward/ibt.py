"""Inter-temporal Bradley-Terry (IBT): a utility learned from progress and regress marks
inside episodes (DeepMind Interactive Agents Team 2022, section 4, appendix A.3).

An annotated episode is ``T`` frames ``x_0 .. x_{T-1}`` with one mark per frame,
``y_t`` in {+1 progress, -1 regress, 0 none}, and a ``valid`` mask (episodes of a batch
are padded to one length). A network ``U`` gives each frame a utility; for every pair
``t1 <= t2`` of one episode, Algorithm 1's loss is

    only +1 marks between t1 and t2:   -log sigmoid(U(t2) - U(t1))
    only -1 marks between:             -log sigmoid(U(t1) - U(t2))
    no marks between:                  C (U(t2) - U(t1))^2
    marks of both signs:               ignored,

and the agent's reward is the utility's rise (section 5, equation 2):

    r_t = U(x_{t+1}) - U(x_t).

**What "between" means here.** A mark on frame ``t`` says that frame ``t`` shows progress
(or regress) against the frame before it: people mark the moment they *see* it. So the
marks between ``t1`` and ``t2`` are those on frames ``t1 < t <= t2``; the mark on ``t1``
itself is not between, since ``U(t1)`` has already seen frame ``t1``. A pair ``t1 = t2``
has no marks between and costs ``C * 0 = 0``, so only pairs ``t1 < t2`` are counted.
With equation 2 the mark on frame ``t + 1`` then belongs to the action ``a_t`` that
led to it, the same step whose reward it shapes; the synthetic annotator
(:mod:`rlhf_jax.reward.annotators`) marks frame ``t + 1`` for the transition ``t -> t + 1``.

The loss is the mean over the counted pairs (all ``t1 < t2`` of valid frames whose marks
are not of both signs) of the whole batch. Every pair at once costs ``O(T^2)`` memory;
:func:`sampled_ibt_loss` draws pairs for long episodes instead.

Two utility networks: :class:`UtilityMLP` (feed-forward, on the current observation or
frame stack: what the agents' stateless ``reward_fn`` can use) and :class:`UtilityLSTM`
(an LSTM over per-step features: the utility of the history ``x_{0:t}``, as in the
paper, for fitting and scoring whole episodes). The baseline of appendix A.5,
an autoregressive annotation model, is :class:`AnnotationLSTM`.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax.envs.core import EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.networks import is_atari_frames, orthogonal_dense, torso_for
from rlhf_jax.ops.schedules import learning_rate_in_state
from rlhf_jax.reward.config import IBTConfig
from rlhf_jax.reward.networks import input_statistics

# ----------------------------------------------------------------------- the loss


def _marks_between(marks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``[T, T]`` counts of +1 and of -1 marks on frames ``t1 < t <= t2`` (row t1, column t2).

    With ``C[t] = sum_{s <= t} [y_s = +1]``, the count is ``C[t2] - C[t1]`` (negative below the
    diagonal, where it is never used).
    """
    positive = jnp.cumsum(marks > 0, axis=-1)
    negative = jnp.cumsum(marks < 0, axis=-1)
    return positive[None, :] - positive[:, None], negative[None, :] - negative[:, None]


def _pair_loss(u1, u2, positive, negative, no_mark_weight):
    """Algorithm 1's loss of pairs, and which pairs count (not marks of both signs)."""
    # -log sigmoid(s (u2 - u1)) = softplus(-s (u2 - u1)), s = +1 (progress only) or -1 (regress only).
    sign = jnp.where(negative == 0, 1.0, 0.0) * (positive > 0) - jnp.where(positive == 0, 1.0, 0.0) * (negative > 0)
    rise = u2 - u1
    loss = jnp.where(sign != 0, jax.nn.softplus(-sign * rise), no_mark_weight * jnp.square(rise))
    counted = (positive == 0) | (negative == 0)
    return jnp.where(counted, loss, 0.0), counted


def ibt_pair_losses(utility: jax.Array, marks: jax.Array, valid: jax.Array, no_mark_weight: float):
    """One episode's loss for every pair: ``([T, T] loss, [T, T] counted)``, row ``t1``, column ``t2``.

    ``counted`` is true for pairs ``t1 < t2`` of valid frames whose marks between are not
    of both signs; ``loss`` is zero elsewhere.
    """
    chex.assert_rank([utility, marks, valid], 1)
    positive, negative = _marks_between(marks)
    loss, counted = _pair_loss(utility[:, None], utility[None, :], positive, negative, no_mark_weight)
    t = jnp.arange(utility.shape[0])
    counted = counted & (t[:, None] < t[None, :]) & valid[:, None] & valid[None, :]
    return jnp.where(counted, loss, 0.0), counted


def ibt_loss(utility: jax.Array, marks: jax.Array, valid: jax.Array, no_mark_weight: float = 1.0) -> jax.Array:
    """Algorithm 1 over every pair of every episode: the mean over counted pairs.

    Args:
      utility: ``[B, T]`` U of each frame. marks: ``[B, T]`` in {-1, 0, +1}. valid: ``[B, T]`` bool.
      no_mark_weight: C, the weight of the no-annotation loss.
    """
    loss, counted = jax.vmap(ibt_pair_losses, in_axes=(0, 0, 0, None))(utility, marks, valid, no_mark_weight)
    return loss.sum() / jnp.maximum(counted.sum(), 1)


def sampled_ibt_loss(key: jax.Array, utility: jax.Array, marks: jax.Array, valid: jax.Array,
                     num_pairs: int, no_mark_weight: float = 1.0) -> jax.Array:
    """:func:`ibt_loss` on ``num_pairs`` pairs per episode, each drawn uniformly among the
    pairs ``t1 < t2`` of its valid frames (a prefix): ``O(B * num_pairs)`` memory instead of
    ``O(B * T^2)``, for long episodes. Its mean is over the sampled pairs that count, so it
    tracks :func:`ibt_loss` when episodes are equally long (tested); otherwise it weighs
    episodes equally where :func:`ibt_loss` weighs pairs."""
    chex.assert_rank([utility, marks, valid], 2)
    batch, steps = utility.shape
    length = valid.sum(-1)[:, None]
    key_1, key_2 = jax.random.split(key)
    # Two distinct frames, uniformly: the second among the other length - 1, stepping over the first.
    one = jax.random.randint(key_1, (batch, num_pairs), 0, jnp.maximum(length, 1))
    other = jax.random.randint(key_2, (batch, num_pairs), 0, jnp.maximum(length - 1, 1))
    other = other + (other >= one)
    first, second = jnp.minimum(one, other), jnp.maximum(one, other)
    take = lambda x, i: jnp.take_along_axis(x, jnp.minimum(i, steps - 1), axis=-1)
    positive = jnp.cumsum(marks > 0, axis=-1)
    negative = jnp.cumsum(marks < 0, axis=-1)
    loss, counted = _pair_loss(take(utility, first), take(utility, second),
                               take(positive, second) - take(positive, first),
                               take(negative, second) - take(negative, first), no_mark_weight)
    counted = counted & (length >= 2)
    return jnp.where(counted, loss, 0.0).sum() / jnp.maximum(counted.sum(), 1)


def utility_reward(utility_now: jax.Array, utility_next: jax.Array) -> jax.Array:
    """Equation 2: ``r_t = U(x_{t+1}) - U(x_t)``."""
    return utility_next - utility_now


# ---------------------------------------------------------------------- networks


class _FrameFeatures(nn.Module):
    """Features of each frame: the reward MLP's hidden layers of leaky ReLUs or, on Atari
    frame stacks, the Nature CNN. ``__call__(obs [..., *obs_shape]) -> [..., F]``."""

    observation_shape: Sequence[int]
    hidden: Sequence[int]
    slope: float

    @nn.compact
    def __call__(self, obs):
        leading = obs.shape[: obs.ndim - len(self.observation_shape)]
        x = obs.reshape((-1, *self.observation_shape))
        if is_atari_frames(self.observation_shape):
            x = torso_for(self.observation_shape)(x)
        else:
            x = x.astype(jnp.float32).reshape(x.shape[0], -1)
            for features in self.hidden:
                x = nn.leaky_relu(orthogonal_dense(features, math.sqrt(2.0))(x), negative_slope=self.slope)
        return x.reshape((*leading, x.shape[-1]))


class UtilityMLP(nn.Module):
    """U(x_t) of the current observation: frame features and a scalar head.

    ``__call__(obs [..., *obs_shape]) -> [...]`` over any leading axes.
    """

    observation_shape: Sequence[int]
    hidden: Sequence[int] = (64, 64)
    slope: float = 0.01

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = _FrameFeatures(self.observation_shape, self.hidden, self.slope)(obs)
        return orthogonal_dense(1, 1.0)(x)[..., 0]


class UtilityLSTM(nn.Module):
    """U(x_{0:t}) of the history: per-frame features, an LSTM, a scalar head.

    ``__call__(obs [B, T, *obs_shape]) -> [B, T]``.
    """

    observation_shape: Sequence[int]
    hidden: Sequence[int] = (64,)
    lstm_size: int = 64
    slope: float = 0.01

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = _FrameFeatures(self.observation_shape, self.hidden, self.slope)(obs)
        x = nn.RNN(nn.OptimizedLSTMCell(self.lstm_size))(x)
        return orthogonal_dense(1, 1.0)(x)[..., 0]


# Classes of the annotation models: index 0 none, 1 progress, 2 regress.
MARK_OF_CLASS = jnp.array([0, 1, -1], jnp.int32)


def class_of_mark(marks: jax.Array) -> jax.Array:
    return jnp.where(marks > 0, 1, jnp.where(marks < 0, 2, 0))


class AnnotationLSTM(nn.Module):
    """The autoregressive (AR) annotation model of appendix A.5, the IBT paper's baseline:
    at each frame an LSTM sees the frame's features and the previous frame's annotation
    (one-hot over none / progress / regress) and predicts the current one, three ways.

    Trained on people's marks with the previous *true* mark fed in (teacher forcing, loss
    :func:`annotation_nll`); as a reward model it feeds in its own previous *sampled*
    mark (:func:`sample_annotations`), and the sampled mark (+1, -1 or 0) is the reward.

    ``__call__(obs [B, T, *obs_shape], previous_class [B, T] int) -> logits [B, T, 3]``.
    """

    observation_shape: Sequence[int]
    hidden: Sequence[int] = (64,)
    lstm_size: int = 64
    slope: float = 0.01

    def setup(self):
        self.features = _FrameFeatures(self.observation_shape, self.hidden, self.slope)
        self.cell = nn.OptimizedLSTMCell(self.lstm_size)
        self.head = orthogonal_dense(3, 1.0)

    def __call__(self, obs, previous_class):
        x = jnp.concatenate([self.features(obs), jax.nn.one_hot(previous_class, 3)], axis=-1)
        carry = self.cell.initialize_carry(jax.random.PRNGKey(0), x[:, 0].shape)
        def step(cell, carry, x_t):
            return cell(carry, x_t)
        _, out = nn.scan(step, variable_broadcast="params", split_rngs={"params": False},
                         in_axes=1, out_axes=1)(self.cell, carry, x)
        return self.head(out)

    def sample(self, obs, key):
        """Marks ``[B, T]`` sampled frame by frame, each conditioned on the one before."""
        features = self.features(obs)
        batch = obs.shape[0]
        carry = self.cell.initialize_carry(jax.random.PRNGKey(0), (batch, features.shape[-1] + 3))

        def step(module, state, x_t, key_t):
            carry, previous = state
            carry, out = module.cell(carry, jnp.concatenate([x_t, jax.nn.one_hot(previous, 3)], axis=-1))
            drawn = jax.random.categorical(key_t, module.head(out))
            return (carry, drawn), drawn

        keys = jax.random.split(key, features.shape[1])
        _, drawn = nn.scan(step, variable_broadcast="params", split_rngs={"params": False},
                           in_axes=(1, 0), out_axes=1)(self, (carry, jnp.zeros((batch,), jnp.int32)),
                                                        features, keys)
        return MARK_OF_CLASS[drawn]


def previous_classes(marks: jax.Array) -> jax.Array:
    """Teacher forcing's inputs: the class of the previous frame's mark (none before frame 0)."""
    classes = class_of_mark(marks)
    return jnp.concatenate([jnp.zeros_like(classes[:, :1]), classes[:, :-1]], axis=1)


def annotation_nll(logits: jax.Array, marks: jax.Array, valid: jax.Array) -> jax.Array:
    """The AR model's loss: mean negative log-probability of each valid frame's true mark."""
    log_p = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(log_p, class_of_mark(marks)[..., None], axis=-1)[..., 0]
    return jnp.where(valid, nll, 0.0).sum() / jnp.maximum(valid.sum(), 1)


# ------------------------------------------------------------- fitting, and the reward


class IBTState(NamedTuple):
    params: Any
    opt_state: Any
    obs_mean: jax.Array  # inputs are standardised by the untrained policy's observations
    obs_std: jax.Array
    reward_std: jax.Array  # () the std of U's rise on recent steps (the agent's reward scale)


def utility_network(config: IBTConfig, spec: EnvSpec) -> nn.Module:
    if config.utility == "lstm":
        return UtilityLSTM(tuple(spec.observation_shape), config.hidden[:1], config.lstm_size, config.leaky_relu_slope)
    return UtilityMLP(tuple(spec.observation_shape), config.hidden, config.leaky_relu_slope)


def _optimizer(config: IBTConfig) -> optax.GradientTransformation:
    return learning_rate_in_state(lambda lr: optax.adam(lr, b1=config.adam_b1, b2=0.999), config.learning_rate)


def init_ibt(key: jax.Array, config: IBTConfig, spec: EnvSpec) -> IBTState:
    network = utility_network(config, spec)
    dummy = jnp.zeros((1, 2, *spec.observation_shape), spec.observation_dtype)
    params = network.init(key, dummy)
    shape = () if is_atari_frames(spec.observation_shape) else tuple(spec.observation_shape)
    return IBTState(params, _optimizer(config).init(params), jnp.zeros(shape), jnp.ones(shape), jnp.ones(()))


def set_input_statistics(state: IBTState, spec: EnvSpec, obs: jax.Array) -> IBTState:
    """Standardise inputs by these observations' mean and std (vector observations only)."""
    if is_atari_frames(spec.observation_shape):
        return state
    # IBT keeps a small floor: on experiments/ibt.py's CartPole clips (random and heuristic
    # play) a floor of 0.1 squeezed the pole angle and lowered IBT's correlation with the
    # true progress from 0.46 to 0.32 (20 clips).
    mean, std = input_statistics(spec.observation_shape, obs, std_floor=1e-3)
    return state._replace(obs_mean=mean, obs_std=std)


def utilities(state: IBTState, config: IBTConfig, spec: EnvSpec, episodes: jax.Array) -> jax.Array:
    """U of every frame of ``episodes [B, T, *obs_shape]``: ``[B, T]``."""
    if not is_atari_frames(spec.observation_shape):
        episodes = (episodes - state.obs_mean) / state.obs_std
    return utility_network(config, spec).apply(state.params, episodes)


def fit_step(state: IBTState, config: IBTConfig, spec: EnvSpec, episodes: jax.Array, marks: jax.Array,
             valid: jax.Array, key: jax.Array) -> tuple[IBTState, jax.Array]:
    """One Adam step on :func:`ibt_loss` (or :func:`sampled_ibt_loss`) of a batch of episodes."""
    def loss_fn(params):
        u = utilities(state._replace(params=params), config, spec, episodes)
        if config.pair_samples:
            return sampled_ibt_loss(key, u, marks, valid, config.pair_samples, config.no_mark_weight)
        return ibt_loss(u, marks, valid, config.no_mark_weight)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = _optimizer(config).update(grads, state.opt_state, state.params)
    return state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state), loss


def utility_rises(state: IBTState, config: IBTConfig, spec: EnvSpec, episodes: jax.Array) -> jax.Array:
    """Equation 2 along recorded episodes: ``U(x_{t+1}) - U(x_t)``, ``[B, T - 1]``, unscaled."""
    u = utilities(state, config, spec, episodes)
    return utility_reward(u[:, :-1], u[:, 1:])


def update_reward_scale(state: IBTState, config: IBTConfig, spec: EnvSpec, episodes: jax.Array) -> IBTState:
    """The agent's reward is U's rise over its std on ``episodes``: no mean is taken off, since
    the sign of a rise (progress or regress) is what the marks taught."""
    return state._replace(reward_std=utility_rises(state, config, spec, episodes).std() + 1e-8)


def make_reward_fn(config: IBTConfig, spec: EnvSpec):
    """Equation 2 as agents take a reward (:mod:`rlhf_jax.agents.base`), feed-forward utility only:

        reward_fn(state: IBTState, obs, action, timestep) = s (U(x_{t+1}) - U(x_t)) / std,

    with ``x_{t+1} = timestep.final_obs``: the observation the step reached, also where the
    copy then restarted (an episode end, seen or hidden). On EnvPool's reset step
    (``timestep.action_ignored``) the step joins two episodes, and its reward is 0.
    """
    if config.utility != "mlp":
        raise ConfigError("the agents' reward needs ibt.utility=mlp: an LSTM's utility depends on the whole "
                          "history, which a per-step reward function does not carry")

    def reward_fn(state: IBTState, obs, action, timestep) -> jax.Array:
        del action
        pair = jnp.stack([obs, timestep.final_obs.astype(obs.dtype)], axis=1)  # [N, 2, *obs_shape]
        rise = utility_rises(state, config, spec, pair)[:, 0]
        return jnp.where(timestep.action_ignored, 0.0, config.normalized_std * rise / state.reward_std)

    return reward_fn
