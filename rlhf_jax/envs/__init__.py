"""One environment protocol over three back ends; ``make(EnvConfig(id=...))`` builds any of them.

Ids are ``<backend>/<name>``:

* ``gymnax/...``  classic control and MinAtar, pure JAX (vmap over seeds works);
* ``envpool/...`` Atari through EnvPool's XLA interface, and EnvPool's C MuJoCo
  (the CPU back end for MuJoCo);
* ``mjx/...``     MuJoCo tasks in pure JAX over ``mujoco.mjx`` (the accelerator back end).
"""
from __future__ import annotations

from rlhf_jax.envs.core import Box, Discrete, Environment, EnvSpec, EnvState, TimeStep, check_action
from rlhf_jax.envs.options import ATARI_NAMES, ENV_IDS, GYMNAX_NAMES, MUJOCO_NAMES, EnvConfig

def make(config: EnvConfig | str, members: int = 1) -> Environment:
    """Build the environment named by ``config.id`` (a bare id string takes default options).

    ``members``: how many runs of a sweep share it. JAX environments are vmapped over the
    runs as they are; EnvPool (Atari and MuJoCo) builds one pool for all of them
    (:func:`rlhf_jax.envs.envpool_envs.shared_by_members`)."""
    if isinstance(config, str):
        config = EnvConfig(id=config)  # an unknown id fails here, listing the known ones
    backend, name = config.backend, config.name
    # Back ends are imported on demand: each pulls in a heavy library.
    if backend == "gymnax":
        from rlhf_jax.envs.gymnax_envs import GymnaxEnv

        return GymnaxEnv(name, config)
    if backend == "envpool":
        from rlhf_jax.envs.envpool_envs import AtariEnv, MujocoPoolEnv

        return AtariEnv(name, config, members) if name in ATARI_NAMES else MujocoPoolEnv(name, config, members)
    from rlhf_jax.envs.mjx_tasks import make_mjx

    return make_mjx(name, config)


__all__ = [
    "Box", "Discrete", "ENV_IDS", "EnvConfig", "EnvSpec", "EnvState", "Environment", "TimeStep",
    "check_action", "make",
]
