"""EnvPool's tasks as a Stable-Baselines3 ``VecEnv``, so that the peers SB3 trains play the very
tasks ours play: the reference TRPO on EnvPool's MuJoCo (``experiments/trpo_reference.py``) and
SB3's A2C on EnvPool's Pong (:mod:`benchmarks.agent_throughput`).

EnvPool resets a finished copy on its *next* step, ignoring that step's action; SB3 expects the
step that ends an episode to return the next episode's first observation already, with the last
one in ``info["terminal_observation"]`` and ``info["TimeLimit.truncated"]`` set when the time
limit, not a fall, ended it (SB3 then bootstraps V there). So each finished copy is reset at once.
"""
from __future__ import annotations

import envpool
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv


class EnvPoolVecEnv(VecEnv):
    """``n_envs`` copies of EnvPool's ``task_id`` (e.g. ``InvertedDoublePendulum-v5``,
    ``Pong-v5``); keyword arguments go to ``envpool.make_gymnasium`` (e.g.
    ``ctrl_cost_weight=0.0``, ``reward_clip=False``). Vector observations are cast to float32
    (SB3's default dtype); frames stay uint8, which SB3's CNN policies recognise as images."""

    def __init__(self, task_id: str, n_envs: int, seed: int, **task_options):
        self.pool = envpool.make_gymnasium(task_id, num_envs=n_envs, seed=seed, **task_options)
        space = self.pool.observation_space
        self._frames = np.issubdtype(space.dtype, np.integer)
        observation_space = space if self._frames else spaces.Box(-np.inf, np.inf, space.shape, np.float32)
        super().__init__(n_envs, observation_space, self.pool.action_space)
        self._actions = None

    def _observations(self, observations: np.ndarray) -> np.ndarray:
        return observations if self._frames else observations.astype(np.float32)

    def reset(self) -> np.ndarray:
        observations, _ = self.pool.reset()
        return self._observations(observations)

    def step_async(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        self._actions = actions if isinstance(self.action_space, spaces.Discrete) else (
            actions.astype(np.float64).reshape(self.num_envs, -1))

    def step_wait(self):
        observations, rewards, terminated, truncated, _ = self.pool.step(self._actions)
        observations = self._observations(observations)
        dones = terminated | truncated
        infos = [{} for _ in range(self.num_envs)]
        finished = np.flatnonzero(dones)
        for i in finished:
            infos[i]["terminal_observation"] = observations[i].copy()
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        if finished.size:
            first, _ = self.pool.reset(finished)
            observations[finished] = self._observations(first)
        return observations, rewards.astype(np.float32), dones, infos

    # SB3's VecEnv asks for these; the copies have no per-copy attributes or methods to reach.
    def close(self) -> None:
        self.pool.close()

    def get_attr(self, name, indices=None):
        return [None] * len(self._get_indices(indices))

    def set_attr(self, name, value, indices=None) -> None:
        pass

    def env_method(self, method_name, *args, indices=None, **kwargs):
        return [None] * len(self._get_indices(indices))

    def env_is_wrapped(self, wrapper_class, indices=None):
        return [False] * len(self._get_indices(indices))
