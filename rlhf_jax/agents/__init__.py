"""The agents. Each module follows the contract of :mod:`rlhf_jax.agents.base`."""
from __future__ import annotations

import importlib

AGENTS = ("a2c", "acer", "dqn", "trpo")


def get_agent(name: str):
    """The agent module called ``name`` (imported on demand)."""
    if name not in AGENTS:
        from rlhf_jax.errors import ConfigError

        raise ConfigError(f"unknown agent {name!r}; known agents: {', '.join(AGENTS)}")
    return importlib.import_module(f"rlhf_jax.agents.{name}")
