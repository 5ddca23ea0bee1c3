"""rlhf_jax: agents trained from human (or synthetic) feedback, as pure JAX functions."""

__version__ = "0.1.0"
