"""Choosing which pairs of segments to ask about (Christiano et al. section 2.2.4, appendix A).

"We sample a large number of pairs of trajectory segments of length k, use each reward
predictor in our ensemble to predict which segment will be preferred from each pair,
and then select those trajectories for which the predictions have the highest variance
across ensemble members", drawing "a factor 10 more clip pair candidates than we
ultimately present". The "random" method (the paper's ablation, and the only choice
without an ensemble) keeps candidates as drawn.
"""
from __future__ import annotations

from typing import Callable, Literal

import chex
import jax
import jax.numpy as jnp

from rlhf_jax.reward.data import Segments

# (obs [P, k, *obs_shape], action [P, k, *action_shape]) -> [M, P] summed predicted reward
MemberReturnsFn = Callable[[jax.Array, jax.Array], jax.Array]
METHODS = ("disagreement", "random")


def candidate_pairs(key: jax.Array, segments: Segments, num: int) -> tuple[jax.Array, jax.Array]:
    """``num`` pairs of distinct valid rows, uniformly over ordered pairs: ``int32 [num]`` each.

    Needs ``segments.ring.size >= 2``; with fewer the indices mean nothing, so callers
    check the count first.
    """
    key_1, key_2 = jax.random.split(key)
    index_1 = jax.random.randint(key_1, (num,), 0, segments.ring.size)
    # Uniform over the count - 1 other rows: draw among them, then step over index_1.
    index_2 = jax.random.randint(key_2, (num,), 0, segments.ring.size - 1)
    index_2 = index_2 + (index_2 >= index_1)
    return index_1.astype(jnp.int32), index_2.astype(jnp.int32)


def returns_of_rows(returns_fn: MemberReturnsFn, segments: Segments, *rows: jax.Array,
                    whole_buffer: bool | None = None) -> list[jax.Array]:
    """``returns_fn`` (``[M, ...]`` per segment) of ``segments``' rows, one ``[M, R_i, ...]`` per
    index array ``rows[i]`` (``int32 [R_i]``).

    Rows repeat: candidates are drawn with replacement from a buffer that may hold fewer
    segments than are drawn. When it holds no more than all the rows together, every
    segment is scored once, in one pass over the whole buffer, and the rows are gathered
    from it; otherwise each index array is scored as drawn, in a pass of its own.
    ``whole_buffer`` overrides that choice: the two ways agree only up to rounding, so a
    caller whose results must not depend on an optional set of rows decides without them.
    """
    if whole_buffer is None:
        whole_buffer = segments.capacity <= sum(r.shape[0] for r in rows)
    if whole_buffer:
        every = returns_fn(segments.obs, segments.action)
        return [every[:, r] for r in rows]
    return [returns_fn(segments.obs[r], segments.action[r]) for r in rows]


def preference_variance(
    member_return_1: chex.Array, member_return_2: chex.Array, random_answer_prob: chex.Numeric
) -> jax.Array:
    """Variance across members of each member's predicted preference (equation 1 with the
    paper's 10% chance that the overseer answers at random, section 2.2.3):

        P_m[s1 > s2] = (1 - eps) sigmoid(R1_m - R2_m) + eps / 2,   R_m = sum_t r_m(o_t, a_t).

    Args:
      member_return_1, member_return_2: ``[M, P]`` each member's return of each segment.
      random_answer_prob: ``eps``.

    Returns:
      ``[P]`` the variance (``1/M`` normalised) across the ``M`` members.
    """
    chex.assert_rank(member_return_1, 2)
    chex.assert_equal_shape([member_return_1, member_return_2])
    sigmoid = jax.nn.sigmoid(member_return_1 - member_return_2)
    prob = (1.0 - random_answer_prob) * sigmoid + 0.5 * random_answer_prob
    return jnp.var(prob, axis=0)


def select_queries(
    key: jax.Array,
    segments: Segments,
    member_returns_fn: MemberReturnsFn,
    num_queries: int,
    candidates_factor: int = 10,
    method: Literal["disagreement", "random"] = "disagreement",
    random_answer_prob: float = 0.1,
) -> tuple[jax.Array, jax.Array]:
    """Pairs to ask about: ``int32 [num_queries]`` row indices of segment 1 and segment 2.

    Draws ``candidates_factor * num_queries`` pairs with :func:`candidate_pairs` (with
    ``key`` itself), then keeps the ``num_queries`` whose :func:`preference_variance` is
    largest ("disagreement"), or the first ``num_queries`` ("random"; the ensemble is
    not consulted). The members' returns of the candidates come from :func:`returns_of_rows`.
    """
    if method not in METHODS:
        raise ValueError(f"query selection method must be one of {METHODS}, got {method!r}")
    if num_queries < 1 or candidates_factor < 1:
        raise ValueError(f"select_queries needs num_queries and candidates_factor >= 1, got "
                         f"{num_queries} and {candidates_factor}")
    num = candidates_factor * num_queries
    index_1, index_2 = candidate_pairs(key, segments, num)
    if method == "random":
        return index_1[:num_queries], index_2[:num_queries]

    # Both segments of every pair in one batch, or every segment held, each once.
    (returns,) = returns_of_rows(member_returns_fn, segments, jnp.concatenate([index_1, index_2]))
    chex.assert_shape(returns, (None, 2 * num))
    variance = preference_variance(returns[:, :num], returns[:, num:], random_answer_prob)
    _, keep = jax.lax.top_k(variance, num_queries)
    return index_1[keep], index_2[keep]
