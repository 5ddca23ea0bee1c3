"""The trust-region maths of TRPO (Schulman et al. 2015, "Trust Region Policy Optimization").

TRPO maximises a surrogate objective subject to a bound on the mean KL divergence
between the old and the new policy (section 6, eq. 14):

    maximise_theta  L(theta) = E[ pi_theta(a|s) / pi_old(a|s) A(s, a) ]
    subject to      KL(theta) = E_s[ D_KL(pi_old(.|s) || pi_theta(.|s)) ] <= delta.

Its practical algorithm (appendix C) linearises L and takes the quadratic
approximation of the KL around theta_old, whose Hessian is the Fisher matrix F:

    s = F^{-1} g                         (conjugate gradient on Fisher-vector products)
    full step = sqrt(2 delta / s^T F s) s  (the largest step with 1/2 s^T F s = delta)
    theta = theta_old + decay^k full step  (backtracking until the true KL and L agree)

The pieces here work on *flat* parameter vectors ``[P]`` (``jax.flatten_util.
ravel_pytree`` turns a network's parameters into one); they never build ``F``, which
has ``P^2`` entries, only products ``F v``.

The KL divergences of the two policy families are here too, because TRPO is what
needs them.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp


def conjugate_gradient(
    matvec: Callable[[jax.Array], jax.Array],
    b: chex.Array,
    num_iterations: int = 10,
    residual_tol: float = 1e-10,
) -> jax.Array:
    """Approximately solve ``A x = b`` for a symmetric positive-definite ``A`` given only
    ``matvec(v) = A v`` (Hestenes & Stiefel 1952; Schulman et al. 2015, appendix C).

    Starting from ``x_0 = 0``, ``r_0 = p_0 = b``, each iteration does

        alpha_k = r_k^T r_k / p_k^T A p_k
        x_{k+1} = x_k + alpha_k p_k
        r_{k+1} = r_k - alpha_k A p_k
        beta_k  = r_{k+1}^T r_{k+1} / r_k^T r_k
        p_{k+1} = r_{k+1} + beta_k p_k.

    In exact arithmetic it solves an ``n``-dimensional system in ``n`` iterations; TRPO
    stops after 10, which already gives a good step direction. Once the squared residual
    ``r^T r`` falls below ``residual_tol`` the iterate stops moving (the remaining
    iterations would divide by almost zero).

    Args:
      matvec: ``v -> A v`` for vectors ``[n]``.
      b: ``[n]``.
      num_iterations: how many iterations to run (a static number).
      residual_tol: stop once ``r^T r`` is below this.

    Returns:
      ``[n]``, the approximate solution ``x``.
    """
    chex.assert_rank(b, 1)

    def iteration(_, carry):
        x, r, p, rr = carry
        converged = rr < residual_tol
        ap = matvec(p)
        # Once converged, alpha and beta are 0: x stays put and nothing divides by ~0.
        alpha = jnp.where(converged, 0.0, rr / jnp.where(converged, 1.0, jnp.vdot(p, ap)))
        x = x + alpha * p
        r = r - alpha * ap
        rr_next = jnp.vdot(r, r)
        beta = jnp.where(converged, 0.0, rr_next / jnp.where(converged, 1.0, rr))
        p = r + beta * p
        return x, r, p, jnp.where(converged, rr, rr_next)

    init = (jnp.zeros_like(b), b, b, jnp.vdot(b, b))
    x, *_ = jax.lax.fori_loop(0, num_iterations, iteration, init)
    return x


class Linearization(NamedTuple):
    """A function at one point ``theta``: its value there and its Jacobian ``J`` as two linear maps."""

    outputs: Any  # f(theta), any pytree of arrays
    push_forward: Callable[[jax.Array], Any]  # v [P] -> J v, shaped as the outputs
    pull_back: Callable[[Any], jax.Array]  # u, shaped as the outputs -> J^T u [P]


def linearize(fn: Callable[[jax.Array], Any], params: chex.Array) -> Linearization:
    """``fn`` linearised at ``params`` (``jax.linearize``): one pass of ``fn``, after which
    ``J v`` and ``J^T u`` replay only linear maps. TRPO linearises its policy network once per
    update and takes from it both the policy gradient (``J^T`` of the surrogate's gradient in
    the distribution's parameters) and every Fisher-vector product.

    Args:
      fn: ``theta [P] -> d(theta)``, any pytree of arrays.
      params: ``[P]``, the point.
    """
    chex.assert_rank(params, 1)
    outputs, push_forward = jax.linearize(fn, params)
    transpose = jax.linear_transpose(push_forward, params)
    return Linearization(outputs, push_forward, lambda u: transpose(u)[0])


def fisher_vector_product(
    network: Linearization,
    divergence: Callable[[Any, Any], jax.Array],
    damping: float = 0.0,
) -> Callable[[jax.Array], jax.Array]:
    """``v -> (F + damping I) v``, with ``F`` the Hessian of the mean KL at ``theta_old``
    (Schulman et al. 2015, appendix C.1), as a function to call once per conjugate-gradient
    iteration.

    Write the mean KL as ``KL(theta) = D(d(theta))``: ``d`` maps the parameters to the
    distribution's parameters on the batch (a Gaussian's means and log-stds, a softmax's
    logits) and ``D(d) = E_s[D_KL(pi_old(.|s) || d_s)]``. By the chain rule

        Hessian KL = J^T H J + sum_i (dD/dd_i) (Hessian of d_i),   J = dd/dtheta,  H = Hessian of D,

    and at ``theta_old`` the KL is at its minimum over ``d``, so ``dD/dd = 0`` and the second
    term vanishes: ``F = J^T H J`` exactly there (the Fisher information of the policy, with
    ``H`` the Fisher information of the distribution in its own parameters). So

        F v = J^T (H (J v)):

    a forward-mode product through the network (``J v``), ``H`` applied to it by a
    second-order product in the distribution's few parameters, and a reverse-mode product back
    (``J^T``). With the network linearised once (:func:`linearize`), each product replays only
    the linear maps, with no pass of the nonlinear network, at about half the cost of
    differentiating ``grad KL`` forwards at every iteration. ``F`` itself, with ``P^2``
    entries, is never formed. The ``damping`` (0.1 in Schulman's implementation) keeps
    ``F + damping I`` well conditioned for :func:`conjugate_gradient`.

    Args:
      network: ``d`` linearised at ``theta_old`` (:func:`linearize`).
      divergence: ``(d_old, d) -> D(d)``, a scalar: the mean KL from the old distribution,
        which is passed in as ``d(theta_old)``.
      damping: added multiple of ``v``.

    Returns:
      ``v [P] -> (F + damping I) v [P]``.
    """
    old = jax.lax.stop_gradient(network.outputs)
    hessian_vector = lambda u: jax.jvp(jax.grad(lambda d: divergence(old, d)), (old,), (u,))[1]

    def product(vector):
        return network.pull_back(hessian_vector(network.push_forward(vector))) + damping * vector

    return product


def max_step(step_direction: chex.Array, fisher_step: chex.Array, max_kl: float) -> jax.Array:
    """Scale a step direction ``s`` to the edge of the trust region (Schulman et al. 2015, appendix C):

        beta = sqrt(2 delta / s^T F s),

    so that the quadratic model of the KL, ``1/2 (beta s)^T F (beta s)``, equals ``delta``.

    Args:
      step_direction: ``[P]``, ``s`` (e.g. ``F^{-1} g`` from :func:`conjugate_gradient`).
      fisher_step: ``[P]``, ``F s``.
      max_kl: ``delta``.

    Returns:
      ``[P]``, the full step ``beta s`` (zero if ``s^T F s`` is not positive).
    """
    chex.assert_equal_shape([step_direction, fisher_step])
    shs = jnp.vdot(step_direction, fisher_step)
    beta = jnp.where(shs > 0.0, jnp.sqrt(2.0 * max_kl / jnp.where(shs > 0.0, shs, 1.0)), 0.0)
    return beta * step_direction


class LineSearchResult(NamedTuple):
    """The step :func:`backtracking_line_search` took, and what it measured there."""

    params: jax.Array  # [P], the accepted theta (theta_old if no step was accepted)
    fraction: jax.Array  # decay^k, or 0 if no step was accepted
    surrogate_gain: jax.Array  # L(theta) - L(theta_old) (0 if none was accepted)
    kl: jax.Array  # KL(theta) (0 if none was accepted)


def backtracking_line_search(
    evaluate: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    params: chex.Array,
    full_step: chex.Array,
    max_kl: float,
    num_steps: int = 10,
    decay: float = 0.5,
) -> LineSearchResult:
    """Shrink the step until the true KL and surrogate agree (Schulman et al. 2015, appendix C):

        theta_k = theta_old + decay^k full_step,   k = 0, 1, ..., num_steps - 1,

    and take the first ``theta_k`` with

        KL(theta_k) <= delta   and   L(theta_k) > L(theta_old),

    or stay at ``theta_old`` if none qualifies. The quadratic model that sized
    ``full_step`` is only a model: the real KL can exceed ``delta`` and the real
    surrogate can fall, and this check is what keeps every accepted step inside the
    trust region.

    Args:
      evaluate: ``theta [P] -> (L(theta), KL(theta))``, both scalars.
      params: ``[P]``, ``theta_old``.
      full_step: ``[P]``.
      max_kl: ``delta``.
      num_steps: how many step sizes to try (a static number).
      decay: factor by which each try shrinks the step.

    Returns:
      A :class:`LineSearchResult`: the accepted parameters, ``decay^k``, and the surrogate's
      gain and the KL there, as the search measured them.
    """
    chex.assert_rank(params, 1)
    chex.assert_equal_shape([params, full_step])
    surrogate_old, _ = evaluate(params)
    zero = jnp.zeros((), surrogate_old.dtype)

    def not_done(carry):
        k, accepted, _, _ = carry
        return (k < num_steps) & ~accepted

    def try_step(carry):
        k, _, _, _ = carry
        surrogate, kl = evaluate(params + decay**k * full_step)
        accepted = (kl <= max_kl) & (surrogate > surrogate_old)
        return jnp.where(accepted, k, k + 1), accepted, surrogate - surrogate_old, kl

    k, accepted, gain, kl = jax.lax.while_loop(
        not_done, try_step, (jnp.zeros((), jnp.int32), jnp.zeros((), bool), zero, zero))
    fraction = jnp.where(accepted, decay ** k.astype(params.dtype), 0.0)
    return LineSearchResult(params + fraction * full_step, fraction, jnp.where(accepted, gain, zero),
                            jnp.where(accepted, kl, zero))


def gaussian_kl(mean_p: chex.Array, log_std_p: chex.Array, mean_q: chex.Array, log_std_q: chex.Array) -> jax.Array:
    """KL divergence between diagonal Gaussians, summed over action dimensions:

        D_KL(p || q) = sum_d [ log(sigma_q,d / sigma_p,d)
                               + (sigma_p,d^2 + (mu_p,d - mu_q,d)^2) / (2 sigma_q,d^2) - 1/2 ].

    Args:
      mean_p, log_std_p, mean_q, log_std_q: ``[..., D]`` (log-stds broadcastable).

    Returns:
      ``[...]`` divergences in nats.

    Written with the variances' ratio, ``sigma_p^2 / sigma_q^2 = exp(2 (log sigma_p - log sigma_q))``,
    not ``sigma_p^2`` over ``sigma_q^2``: TRPO's Fisher is this function's second derivative,
    and through ``1 / sigma_q^2`` that derivative passes ``sigma_q^6``, which overflows float32
    once a log-std passes about 14.5 and turns the Fisher's entry from +2 to -2. The policy then
    never moves again (the conjugate gradient's step has ``s^T F s <= 0``).
    """
    chex.assert_equal_shape([mean_p, mean_q])
    variance_ratio = jnp.exp(2.0 * (log_std_p - log_std_q))
    squared_distance = (mean_p - mean_q) ** 2 * jnp.exp(-2.0 * log_std_q)
    per_dim = log_std_q - log_std_p + 0.5 * (variance_ratio + squared_distance) - 0.5
    return jnp.sum(per_dim, axis=-1)


def categorical_kl(logits_p: chex.Array, logits_q: chex.Array) -> jax.Array:
    """KL divergence between softmax distributions:

        D_KL(p || q) = sum_a p(a) (log p(a) - log q(a)).

    Args:
      logits_p, logits_q: ``[..., A]``.

    Returns:
      ``[...]`` divergences in nats.
    """
    chex.assert_equal_shape([logits_p, logits_q])
    log_p, log_q = jax.nn.log_softmax(logits_p, axis=-1), jax.nn.log_softmax(logits_q, axis=-1)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
