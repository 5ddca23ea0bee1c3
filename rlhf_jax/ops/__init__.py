"""Pure RL maths: returns, losses, distributions, exploration, schedules, shuffles, running
moments, and the ring buffer every memory keeps its rows in.

Every function is a small pure function over arrays that ``jax.jit`` and
``jax.vmap`` accept, with its paper's equation in the docstring and ``chex``
shape checks. Two conventions hold throughout:

* sequences are **time-major**, ``[T, ...]``;
* a **discount carries the done mask**: ``discount_t = gamma * (1 - done_t)``; a
  time-limit end is folded into the reward first (:mod:`rlhf_jax.ops.episode_ends`).
"""
from rlhf_jax.ops.acer import (
    retrace_targets,
    retrace_traces,
    stochastic_dueling_q,
    truncated_is_policy_objective,
    truncated_value_target,
    trust_region_projection,
)
from rlhf_jax.ops.distributions import categorical_log_prob, entropy, gaussian_entropy, gaussian_log_prob
from rlhf_jax.ops.episode_ends import fold_time_limits, loss_mask, masked_mean
from rlhf_jax.ops.exploration import epsilon_greedy
from rlhf_jax.ops.policy_gradient import actor_critic_loss, policy_gradient_loss
from rlhf_jax.ops.returns import gae_advantages, lambda_returns, n_step_returns
from rlhf_jax.ops.ring import Ring, empty_ring, full_ring
from rlhf_jax.ops.running_moments import Moments, init_moments, merge_moments, standardize
from rlhf_jax.ops.schedules import linear_schedule
from rlhf_jax.ops.shuffle import permutation
from rlhf_jax.ops.trust_region import (
    backtracking_line_search,
    categorical_kl,
    conjugate_gradient,
    fisher_vector_product,
    gaussian_kl,
    Linearization,
    linearize,
    max_step,
)
from rlhf_jax.ops.value_learning import double_q_learning_target, huber_loss, q_learning_loss, q_learning_target

__all__ = [
    "actor_critic_loss",
    "backtracking_line_search",
    "categorical_kl",
    "categorical_log_prob",
    "conjugate_gradient",
    "double_q_learning_target",
    "entropy",
    "epsilon_greedy",
    "fold_time_limits",
    "fisher_vector_product",
    "gae_advantages",
    "gaussian_entropy",
    "gaussian_kl",
    "gaussian_log_prob",
    "huber_loss",
    "init_moments",
    "lambda_returns",
    "linear_schedule",
    "linearize",
    "Linearization",
    "loss_mask",
    "masked_mean",
    "max_step",
    "merge_moments",
    "Moments",
    "n_step_returns",
    "permutation",
    "policy_gradient_loss",
    "q_learning_loss",
    "q_learning_target",
    "retrace_targets",
    "Ring",
    "empty_ring",
    "full_ring",
    "retrace_traces",
    "standardize",
    "stochastic_dueling_q",
    "truncated_is_policy_objective",
    "truncated_value_target",
    "trust_region_projection",
]
