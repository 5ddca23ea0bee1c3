"""The agents. Each module follows the contract of :mod:`rlhf_jax.agents.base`.

The names in ``__all__`` are what JAX code of your own needs to drive an agent (the examples
in ``examples/`` use them): the agent modules themselves (``from rlhf_jax.agents import a2c``),
each listing its contract in its own ``__all__``, and :func:`env_reward`, the reward function
of RL on the environment's own reward. Importing this package imports no agent and no JAX;
each is loaded on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

AGENTS = ("a2c", "acer", "dqn", "trpo")

__all__ = ["AGENTS", "a2c", "acer", "dqn", "env_reward", "get_agent", "trpo"]


def get_agent(name: str):
    """The agent module called ``name`` (imported on demand)."""
    if name not in AGENTS:
        from rlhf_jax.errors import ConfigError

        raise ConfigError(f"unknown agent {name!r}; known agents: {', '.join(AGENTS)}")
    return importlib.import_module(f"rlhf_jax.agents.{name}")


def __getattr__(name: str) -> Any:
    if name in AGENTS:
        return get_agent(name)
    if name == "env_reward":
        from rlhf_jax.agents.base import env_reward

        globals()[name] = env_reward
        return env_reward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
