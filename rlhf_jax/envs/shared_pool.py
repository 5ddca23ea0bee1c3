"""Host environments shared by a sweep's members: one pool of ``members x N`` copies, each member
stepping its own ``N`` under ``jax.vmap``.

An environment whose copies live on the host (EnvPool's pools, a Gymnasium vector env) is one
object, not a value: ``vmap`` over a sweep's runs cannot give each run its own. The runs share one
pool of all their copies instead, and :func:`shared_by_members` turns the pool's call into a
function of one member's copies that joins the members' inputs into one call under ``vmap``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


def shared_by_members(call, members: int):
    """``call(handle, *inputs) -> (handle, outputs)`` of a pool of ``members x N`` environments,
    as a function of one member's ``N`` that works under ``jax.vmap`` over the members:

        member_call(handle [H], *inputs [N, ...]) -> (handle, outputs [N, ...])

    Vmapped, the members' inputs (each ``[members, N, ...]``; a reset's key, which the pool
    ignores, is joined alike) become one call of the pool, and its outputs
    (``[members x N, ...]``) are split among them; every member gets the new handle.
    Unbatched, a member alone cannot drive the shared pool: that form is only traced for its
    shapes (``custom_vmap`` needs them), and returns zeros.
    """
    def split(x):  # [members x N, ...] -> [members, N, ...]
        return x.reshape(members, x.shape[0] // members, *x.shape[1:])

    def pool_inputs(inputs):  # [members, N, ...] -> [members x N, ...]
        return [x.reshape(-1, *x.shape[2:]) for x in inputs]

    @custom_vmap
    def member_call(handle, *inputs):
        joined_shapes = [jax.ShapeDtypeStruct((members, *x.shape), x.dtype) for x in inputs]
        _, outputs = jax.eval_shape(lambda h, *xs: call(h, *pool_inputs(xs)), handle, *joined_shapes)
        return handle, jax.tree.map(lambda x: jnp.zeros((x.shape[0] // members, *x.shape[1:]), x.dtype), outputs)

    @member_call.def_vmap
    def joined(axis_size, in_batched, handle, *inputs):
        if axis_size != members:
            raise ValueError(f"a pool shared by {members} members was vmapped over {axis_size}")
        if in_batched[0]:
            handle = handle[0]  # the same pool for every member
        inputs = [x if batched else jnp.broadcast_to(x, (members, *x.shape)) for x, batched in zip(inputs, in_batched[1:])]
        handle, outputs = call(handle, *pool_inputs(inputs))
        outputs = jax.tree.map(split, outputs)
        handles = jnp.broadcast_to(handle, (members, *handle.shape))
        return (handles, outputs), (True, jax.tree.map(lambda _: True, outputs))

    return member_call
