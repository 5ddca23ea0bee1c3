"""The ring buffer every memory of the library keeps its rows in.

DQN's replay, ACER's trajectories, the recent steps that segments are cut from, the segments
that queries are drawn from, the labels D and IBT's annotated clips each hold arrays whose
leading axis is a capacity ``C``, and one :class:`Ring` that says where the next rows go and
how many hold data. Writes go to rows ``next, next + 1, ...`` mod ``C``, over the oldest; of
more rows than ``C`` written at once, the newest are kept. A row that is not written is sent
to row ``C``, which a scatter with ``mode="drop"`` drops: a masked write stays one traced
program.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Ring(NamedTuple):
    next: jax.Array  # () int32: the row the next write goes to
    size: jax.Array  # () int32: rows that hold data, at most the capacity


def empty_ring() -> Ring:
    return Ring(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def full_ring(capacity: int) -> Ring:
    """Every row holds data and the next write goes over row 0: a batch made whole."""
    return Ring(jnp.zeros((), jnp.int32), jnp.asarray(capacity, jnp.int32))


def advance(ring: Ring, written: jax.Array, capacity: int) -> Ring:
    """The ring after ``written`` rows went in at ``next, next + 1, ...``."""
    written = jnp.asarray(written, jnp.int32)
    return Ring(((ring.next + written) % capacity).astype(jnp.int32),
                jnp.minimum(ring.size + written, capacity).astype(jnp.int32))


def next_rows(ring: Ring, count: int, capacity: int) -> jax.Array:
    """``[count]``: the rows the next ``count`` writes go to (``count <= capacity``)."""
    return (ring.next + jnp.arange(count)) % capacity


def kept_rows(ring: Ring, keep: jax.Array, capacity: int) -> tuple[jax.Array, Ring]:
    """Where the ``keep [n]`` rows of a batch go, in order, and the ring after them.

    Returns ``(rows [n], ring)``: row ``i`` goes to ``next + (kept before i)`` mod ``C``; a row
    not kept, or one of more than ``C`` kept whose place a newer one takes, goes to ``C``
    (dropped by a ``mode="drop"`` scatter, :func:`put`)."""
    place = jnp.cumsum(keep, dtype=jnp.int32) - 1  # among the kept, in order
    total = jnp.sum(keep, dtype=jnp.int32)
    newest = keep & (place >= total - capacity)  # distinct rows mod capacity
    return jnp.where(newest, (ring.next + place) % capacity, capacity), advance(ring, total, capacity)


def put(buffer: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
    """``buffer`` with ``values`` written at ``rows``; rows at the capacity are dropped."""
    return buffer.at[rows].set(values.astype(buffer.dtype), mode="drop")


def age(ring: Ring, rows: jax.Array, capacity: int) -> jax.Array:
    """Writes since each of ``rows`` was written: 0 for the newest, ``size - 1`` for the oldest."""
    return (ring.next - 1 - rows) % capacity


def row_of_age(ring: Ring, ages: jax.Array, capacity: int) -> jax.Array:
    """The row written ``ages`` writes ago: :func:`age`'s inverse."""
    return (ring.next - 1 - ages) % capacity


def oldest_first(ring: Ring, capacity: int) -> jax.Array:
    """``[C]``: the rows in the order they were written, oldest first. Before the ring is full
    the first ``C - size`` of them were never written."""
    return next_rows(ring, capacity, capacity)
