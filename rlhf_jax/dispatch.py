"""How a run's repeated steps reach the device (``run.loop``), decided here and only here.

* ``"scan"``: the steps are one compiled ``lax.scan``, a single call from the host.
* ``"python"``: a Python loop calls one compiled step per dispatch. XLA:CPU runs convolution
  gradients inside a loop about ten times slower than outside one (jax-ml/jax#12868), so
  Atari's CNNs train faster this way on a CPU; the steps, keys and values are those of the
  scan, up to rounding. An iteration that draws how many updates it makes (ACER's 1 + K) has
  its count read first and runs with its updates written out (:func:`repeat_drawn`).
* ``"auto"`` (the default): ``"python"`` for Atari frames on a CPU, ``"scan"`` elsewhere.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlhf_jax.networks import is_atari_frames


def dispatch_of(option: str, spec) -> str:
    """``run.loop`` resolved for an environment of ``spec``: ``"scan"`` or ``"python"``."""
    if option != "auto":
        return option
    return "python" if is_atari_frames(spec.observation_shape) and jax.default_backend() == "cpu" else "scan"


def repeat(step, dispatch: str):
    """``run(state, length) -> (state, outputs stacked over the steps)`` from ``step(state) -> (state, output)``:
    one compiled ``lax.scan``, or a Python loop over one compiled step (``length`` static, ``state`` donated)."""
    if dispatch == "scan":
        return jax.jit(lambda state, length: jax.lax.scan(lambda s, _: step(s), state, None, length),
                       static_argnums=1, donate_argnums=0)
    one = jax.jit(step, donate_argnums=0)
    return lambda state, length: one_by_one(lambda s, _: one(s), state, range(length))


def repeat_drawn(step, count, dispatch: str):
    """:func:`repeat` for ``step(state, updates=None)`` whose iteration draws its count of updates
    (:class:`rlhf_jax.agents.base.DrawnCountIteration`), ``count(state)`` being that draw. A Python
    loop reads each step's count first and calls the step compiled for it, its updates written
    out (one program per count met, compiled when first met); a scan runs the drawn loop."""
    if dispatch == "scan":
        return repeat(step, dispatch)
    count = jax.jit(count)
    compiled = {}

    def one(state, _):
        updates = int(count(state))
        if updates not in compiled:
            compiled[updates] = jax.jit(functools.partial(step, updates=updates), donate_argnums=0)
        return compiled[updates](state)

    return lambda state, length: one_by_one(one, state, range(length))


def repeat_over(step, dispatch: str):
    """``run(state, xs) -> (state, outputs stacked)`` from ``step(state, x) -> (state, output)``,
    over the leading axis of ``xs``: one compiled ``lax.scan``, or one compiled step per ``x``."""
    if dispatch == "scan":
        return jax.jit(lambda state, xs: jax.lax.scan(step, state, xs))
    one = jax.jit(step)
    return lambda state, xs: one_by_one(one, state, xs)


def one_by_one(step, state, xs):
    """``step(state, x)`` for each ``x`` from the host, its outputs stacked as a scan stacks them."""
    outputs = []
    for x in xs:
        state, output = step(state, x)
        outputs.append(output)
    return state, jax.tree.map(lambda *ys: jnp.stack(ys), *outputs)
