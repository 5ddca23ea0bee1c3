"""The one ring buffer (rlhf_jax.ops.ring): its rows and counters worked out by hand."""
import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.ops import ring
from rlhf_jax.ops.ring import Ring, empty_ring, full_ring


def state(ring_: Ring) -> tuple[int, int]:
    return int(ring_.next), int(ring_.size)


def test_advance_wraps_next_and_caps_size():
    r = empty_ring()
    r = ring.advance(r, 3, 5)
    assert state(r) == (3, 3)
    r = ring.advance(r, 4, 5)
    assert state(r) == (2, 5)  # 7 written: next wrapped to 2, size capped at 5
    assert state(full_ring(5)) == (0, 5)


def test_kept_rows_compacts_the_kept_in_order_and_drops_the_rest_to_the_capacity():
    rows, after = ring.kept_rows(Ring(jnp.int32(4), jnp.int32(4)), jnp.array([True, False, True, True]), 5)
    np.testing.assert_array_equal(rows, [4, 5, 0, 1])  # 5: dropped
    assert state(after) == (2, 5)


def test_kept_rows_keeps_the_newest_capacity_of_more():
    rows, after = ring.kept_rows(Ring(jnp.int32(2), jnp.int32(3)), jnp.ones(7, bool), 3)
    # 7 rows from row 2: the first 4 would be overwritten by the last 3, so they are dropped.
    np.testing.assert_array_equal(rows, [3, 3, 3, 3, 0, 1, 2])
    assert state(after) == (0, 3)
    buffer = ring.put(jnp.zeros(3, jnp.int32), rows, jnp.arange(7))
    np.testing.assert_array_equal(buffer, [4, 5, 6])  # written one by one would leave the same


def test_put_writes_distinct_rows_and_drops_the_capacity():
    buffer = ring.put(jnp.zeros(4), jnp.array([2, 4, 0]), jnp.array([1.0, 9.0, 3.0]))
    np.testing.assert_array_equal(buffer, [3.0, 0.0, 1.0, 0.0])


def test_age_and_row_of_age_are_inverse_and_count_back_from_the_newest():
    r = Ring(jnp.int32(1), jnp.int32(4))  # rows 1, 2, 3 then 0 written: 0 is the newest
    np.testing.assert_array_equal(ring.age(r, jnp.arange(4), 4), [0, 3, 2, 1])
    np.testing.assert_array_equal(ring.row_of_age(r, jnp.arange(4), 4), [0, 3, 2, 1])
    np.testing.assert_array_equal(ring.oldest_first(r, 4), [1, 2, 3, 0])


def test_a_ring_travels_through_jit_as_two_int32_scalars():
    after = jax.jit(lambda r: ring.advance(r, 2, 3))(empty_ring())
    assert after.next.dtype == after.size.dtype == jnp.int32 and state(after) == (2, 2)
