"""How the suite compiles, in its own processes and in those its tests start: one persistent
XLA compilation cache, and XLA flags that compile faster.

Compiling is most of the suite's time on 2 cores. LLVM at optimisation level 1 (not 3) and
XLA's older loop emitters compiled the RLHF loop's programs about a third faster (its start,
learning step and chunk on CartPole: 24 s against 36 s), and ran them to the same values bit
for bit at the same speed; the whole suite took 1,234 s instead of 1,985 s. Level 0 compiles
faster still but rounds differently and runs twice as slowly, so it is not used. Benchmarks
and runs keep XLA's defaults: only tests take these. jaxlib 0.11 has no flag for the older
emitters, and XLA stops at a flag it does not know, so there the suite takes level 1 alone.
"""
import os
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("RLHF_JAX_TEST_CACHE", ROOT / ".cache" / "jax"))


def older_emitters() -> tuple[str, ...]:
    """The flag for XLA's older loop emitters, where this jaxlib (before 0.11) still has it."""
    major, minor = (int(part) for part in version("jaxlib").split(".")[:2])
    return ("--xla_cpu_use_fusion_emitters=false",) if (major, minor) < (0, 11) else ()


XLA_FLAGS = ("--xla_backend_optimization_level=1", *older_emitters())


def xla_flags(*extra: str) -> str:
    """The suite's XLA flags, then those this process was given, then ``extra``: where two set
    one flag, the later wins (XLA reads them in order)."""
    return " ".join(dict.fromkeys([*XLA_FLAGS, *os.environ.get("XLA_FLAGS", "").split(), *extra]))


def child_environment(*xla_extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this suite's cache and XLA flags (and
    ``xla_extra``), and this checkout first on the import path."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": xla_flags(*xla_extra),
            "JAX_COMPILATION_CACHE_DIR": str(CACHE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def configure_this_process() -> None:
    """The flags and the cache in this process: called before JAX starts its CPU backend."""
    os.environ["XLA_FLAGS"] = xla_flags()
    import jax

    jax.config.update("jax_compilation_cache_dir", str(CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
