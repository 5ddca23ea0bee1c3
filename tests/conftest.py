"""Shared test set-up: a persistent XLA compilation cache, because compiling is most of a test's time on 2 cores."""
import os
from pathlib import Path

import jax

CACHE = Path(os.environ.get("RLHF_JAX_TEST_CACHE", Path(__file__).resolve().parent.parent / ".cache" / "jax"))
jax.config.update("jax_compilation_cache_dir", str(CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
