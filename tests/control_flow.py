"""Where a program's convolutions sit: XLA:CPU runs a CNN's gradient about six times slower inside
a loop or a conditional than in straight-line code (jax-ml/jax#12868), so the Atari iterations keep
their learning out of both, and tests read their jaxprs to hold them to it."""
from jax.extend.core import jaxprs_in_params


def convolutions_by_control_flow(jaxpr, around: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """For each convolution in ``jaxpr`` at any depth, the loops and conditionals around it
    (``while``, ``cond``, and ``scan`` unless unrolled whole, which lowers to straight-line code)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated":
            found.append(around)
        unrolled = eqn.primitive.name == "scan" and eqn.params["unroll"] >= eqn.params["length"]
        control = eqn.primitive.name in ("while", "cond", "scan") and not unrolled
        for inner in jaxprs_in_params(eqn.params):
            found += convolutions_by_control_flow(inner, around + ((eqn.primitive.name,) if control else ()))
    return found
