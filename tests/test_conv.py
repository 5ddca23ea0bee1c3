import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from rlhf_jax.ops import conv as fast


@pytest.mark.parametrize("size,channels,kernel,stride,batch", [(84, 4, 7, 3, 5), (26, 3, 5, 2, 3), (11, 2, 3, 1, 4),
                                                              (10, 2, 3, 3, 2)])
def test_gradients_are_xlas_own_maths_in_chunks_and_blocks(size, channels, kernel, stride, batch, monkeypatch):
    monkeypatch.setattr(fast, "GRAD_CHUNK", 2)  # several chunks, the last one short
    x = jax.random.normal(jax.random.key(0), (batch, size, size, channels))
    w = jax.random.normal(jax.random.key(1), (kernel, kernel, channels, 6))
    plain = lambda x, w: lax.conv_general_dilated(x, w, (stride, stride), "VALID",
                                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))
    ours = lambda x, w: fast.conv(x, w, (stride, stride), "VALID")
    y, back = jax.vjp(plain, x, w)
    grad = jax.random.normal(jax.random.key(2), y.shape)
    np.testing.assert_array_equal(ours(x, w), y)
    for theirs, mine in zip(back(grad), jax.vjp(ours, x, w)[1](grad)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-4 * float(jnp.abs(theirs).max()))


def test_unsupported_convolutions_are_an_error():
    x, w = jnp.zeros((1, 8, 8, 2)), jnp.zeros((3, 3, 2, 4))
    with pytest.raises(ValueError, match="only VALID"):
        fast.conv(x, w, (1, 1), "SAME")
    with pytest.raises(ValueError, match="only VALID"):
        fast.conv(x, w, (1, 1), "VALID", rhs_dilation=(2, 2))
