"""The Python API: train a run and load one back, as ``rlhf-jax train`` and ``rlhf-jax eval`` do.

``rlhf_jax.train`` and ``rlhf_jax.load_run`` are this module's, loaded when first used (importing
``rlhf_jax`` imports no JAX):

    import jax
    import rlhf_jax

    run_dir = rlhf_jax.train("configs/a2c_cartpole.yaml", ["a2c.total_env_steps=200000"])
    run = rlhf_jax.load_run(run_dir)
    env = run.make_env(num_envs=8)
    state, timestep = env.reset(jax.random.PRNGKey(0))
    action = run.policy(timestep.obs, jax.random.PRNGKey(1))
    print(run.metrics[-1]["episode_return"], run.learned_reward)

A config is an :class:`~rlhf_jax.config.ExperimentConfig`, a nested dict of its keys, a YAML
file, or nothing (the built-in default experiment); overrides are ``key=value`` words, as on the
command line. Every one is checked before anything runs: a mistake is a
:class:`~rlhf_jax.errors.ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build, read_yaml, to_dict
from rlhf_jax.errors import ConfigError

if TYPE_CHECKING:
    from rlhf_jax.envs import Environment
    from rlhf_jax.evaluation import LearnedReward

ConfigLike = ExperimentConfig | Mapping[str, Any] | str | Path | None


def resolve_config(config: ConfigLike = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """The :class:`~rlhf_jax.config.ExperimentConfig` that ``config`` and the ``key=value``
    ``overrides`` make: ``config`` an ExperimentConfig, a nested dict of keys, the path of a
    YAML file, or ``None`` for the built-in default experiment (``rlhf_jax/configs/default.yaml``,
    what ``rlhf-jax train`` runs given no file)."""
    words = None if isinstance(overrides, str) else list(overrides)
    if words is None or any(not isinstance(word, str) for word in words):
        raise ConfigError(f"overrides must be a list of 'key=value' strings, got {overrides!r}")
    if isinstance(config, ExperimentConfig):
        if not words:
            return config
        data = to_dict(config)
    elif config is None:
        data = DEFAULT_EXPERIMENT
    elif isinstance(config, (str, Path)):
        data = read_yaml(config)
    elif isinstance(config, Mapping):
        data = dict(config)
    else:
        raise ConfigError(f"a config is an ExperimentConfig, a dict, a YAML file's path or None, "
                          f"got {type(config).__name__}")
    return build(ExperimentConfig, apply_overrides(data, words))


def train(config: ConfigLike = None, overrides: Iterable[str] = (), *, resume: str | Path | None = None,
          progress: bool = True) -> Path:
    """Train a run to its end, as ``rlhf-jax train`` does, and return its directory (read it
    with :func:`load_run`).

    ``config`` and ``overrides`` as in :func:`resolve_config`; the run's directory is
    ``run.dir``, or ``runs/<name>-<date>-<time>``. ``resume``: continue the run saved in that
    directory instead (give no config then). ``progress``: draw the progress bar. A run that
    has to stop raises :class:`~rlhf_jax.errors.RunError` (its last checkpoint intact) and one
    interrupted by Ctrl-C or SIGTERM :class:`~rlhf_jax.errors.Interrupted`, as the command
    line's (:func:`rlhf_jax.trainer.train`)."""
    from rlhf_jax import trainer

    if resume is not None:
        if config is not None or list(overrides):
            raise ConfigError("resume continues a run with its saved config: give no config or overrides")
        return trainer.train(resume=resume, progress=progress)
    return trainer.train(resolve_config(config, overrides), progress=progress)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, as jax.jit hashes it
class Policy:
    """A run's policy: ``policy(obs, key) -> action`` for a batch of observations ``[n, *obs_shape]``.

    ``act`` is the agent's ``act(params, obs, key, greedy=False)`` (its ``make_policy``;
    ``greedy=True`` takes the policy's mode, Q's argmax for DQN, whose ``act`` also takes
    ``epsilon=``) and ``params`` the trained parameters. A policy is a pure function of its inputs: ``jax.jit(policy)``
    compiles it."""

    act: Callable
    params: Any

    def __call__(self, obs, key):
        return self.act(self.params, obs, key)


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """A run as :func:`load_run` reads it from its directory: its newest checkpoint, config and metrics.

    - ``directory``: the run directory;
    - ``config``: the :class:`~rlhf_jax.config.ExperimentConfig` it was trained with (``config.yaml``);
    - ``env_steps`` and ``chunk``: how far the loaded checkpoint is (a finished run's last
      chunk is its chunks' count - 1);
    - ``policy``: the trained :class:`Policy`;
    - ``learned_reward``: the reward the run learned (preferences or IBT), as a
      :class:`~rlhf_jax.evaluation.LearnedReward`: r̂ = ``fn(params, obs, action, timestep)``
      (a ``rlhf_jax.agents.base.RewardFn``); ``None`` on the environment's reward;
    - ``metrics``: ``metrics.csv``, one row per chunk, each a dict by column name
      (``env_steps``, ``episode_return``, the losses, ``labels``...);
    - ``state``: the whole restored state, for the :class:`~rlhf_jax.driver.Driver`'s functions.
    """

    directory: Path
    config: ExperimentConfig
    env_steps: int
    chunk: int
    policy: Policy
    learned_reward: LearnedReward | None
    metrics: list[dict[str, float]]
    state: Any = dataclasses.field(repr=False)

    def make_env(self, num_envs: int = 1, seed: int | None = None) -> Environment:
        """The run's environment (``config.env``) with ``num_envs`` copies, for :attr:`policy`
        to act in (``env.reset(key)``, ``env.step(state, action)``: :mod:`rlhf_jax.envs`)."""
        from rlhf_jax.envs import make

        env = dataclasses.replace(self.config.env, num_envs=num_envs,
                                  seed=self.config.env.seed if seed is None else seed)
        return make(env)


def load_run(run_dir: str | Path) -> Run:
    """Read the run in ``run_dir`` (one ``rlhf-jax train`` or :func:`train` wrote): its config,
    its newest intact checkpoint's policy and learned reward, and its metrics. A directory
    that holds no run, or a run without a checkpoint yet, is a
    :class:`~rlhf_jax.errors.ConfigError` naming the path."""
    from rlhf_jax.driver import Driver
    from rlhf_jax.metrics_log import MetricsLog
    from rlhf_jax.run_dir import load_run_config

    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    saved = run_dir / "checkpoints"
    if not (saved.is_dir() and any(path.name.isdigit() for path in saved.iterdir())):
        raise ConfigError(f"{run_dir} has no checkpoint yet: nothing to load (a run saves its first after "
                          f"run.checkpoint_every_minutes or run.checkpoint_every_updates, and at its end)")
    driver = Driver(config)
    chunk, state = driver.restore_latest(run_dir)
    act = driver.agent.make_policy(driver.agent_config, driver.env.spec)
    return Run(
        directory=run_dir, config=config, env_steps=int(state.env_steps), chunk=int(chunk),
        policy=Policy(act, driver.policy_params(state)), learned_reward=driver.learned_reward(state),
        metrics=MetricsLog(run_dir, tensorboard=False).rows(), state=state,
    )
