"""Environments of your own, by id: ``register(id, factory)`` and ``env.id=<id>`` works everywhere.

A factory is the one function that builds your environment from the run's
:class:`~rlhf_jax.envs.options.EnvConfig`:

    factory(config: EnvConfig, members: int) -> Environment

``config.id`` is the registered id, ``config.num_envs`` the copies to step, ``config.seed``
(host environments) the pool's seed, ``config.max_episode_steps`` a time limit to impose (0: the
environment's own), and the appendix A options (``hide_episode_end``...) those the adapter
implements; an adapter refuses the options it does not. ``members`` is how many runs of a sweep
will share the environment: a pure JAX one ignores it (they are vmapped over it as they are), a
host one steps ``members x num_envs`` copies (:mod:`rlhf_jax.envs.gymnasium_envs`).

The config is the one place a run's environment is named, so everything built from it follows:
training, scoring (``run.eval_episodes`` copies, another seed), sweeps, resumed runs, the env id
a label dataset records. A registration lives in the process that made it; for ``rlhf-jax train``
and ``rlhf-jax sweep`` in a shell, a package declares its factories as entry points of the group
:data:`ENTRY_POINT_GROUP`, named by their ids, and they are found by id when a config names one:

    [project.entry-points."rlhf_jax.envs"]
    "mytasks/Reach-v0" = "mytasks.envs:make_reach"

Ids are ``<prefix>/<name>``; the built-in back ends' prefixes (``gymnax``, ``envpool``, ``mjx``)
stay theirs. This module imports no JAX: configs are checked without it.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Optional

from rlhf_jax.errors import ConfigError

if TYPE_CHECKING:
    from rlhf_jax.envs.core import Environment

Factory = Callable[[Any, int], "Environment"]  # (an EnvConfig, members); options.py imports this module

ENTRY_POINT_GROUP = "rlhf_jax.envs"
BUILT_IN_PREFIXES = ("gymnax", "envpool", "mjx")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

_FACTORIES: dict[str, Factory] = {}


def check_id(env_id: str) -> None:
    """Refuse an id that is not ``<prefix>/<name>`` or whose prefix is a built-in back end's."""
    if not isinstance(env_id, str) or not _ID.fullmatch(env_id):
        raise ConfigError(f"an environment id is '<prefix>/<name>' (letters, digits, '_', '.', '-'), "
                          f"e.g. 'mytasks/Reach-v0'; got {env_id!r}")
    if env_id.split("/", 1)[0] in BUILT_IN_PREFIXES:
        raise ConfigError(f"{env_id!r}: the prefixes {', '.join(BUILT_IN_PREFIXES)} name the built-in back "
                          f"ends; register your environment under a prefix of your own")


def register(env_id: str, factory: Factory) -> None:
    """Make ``env_id`` a valid ``env.id``, built by ``factory(config, members)``.

    Registering an id again replaces its factory (a notebook cell run twice)."""
    check_id(env_id)
    if not callable(factory):
        raise TypeError(f"register({env_id!r}, ...): the factory must be callable, got {factory!r}")
    _FACTORIES[env_id] = factory


def unregister(env_id: str) -> None:
    """Forget ``env_id`` (a test's clean-up); an id never registered is ignored."""
    _FACTORIES.pop(env_id, None)


def registered_ids() -> tuple[str, ...]:
    """The ids registered in this process, sorted (entry points not yet looked up are not among them)."""
    return tuple(sorted(_FACTORIES))


def _from_entry_points(env_id: str) -> Optional[Factory]:
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP, name=env_id):
        factory = entry.load()
        register(env_id, factory)
        return factory
    return None


def factory_of(env_id: str) -> Optional[Factory]:
    """The factory of ``env_id``: registered in this process, or else an installed package's
    entry point of that name (loaded, then registered); None if neither."""
    factory = _FACTORIES.get(env_id)
    if factory is None and isinstance(env_id, str) and _ID.fullmatch(env_id) \
            and env_id.split("/", 1)[0] not in BUILT_IN_PREFIXES:
        factory = _from_entry_points(env_id)
    return factory
