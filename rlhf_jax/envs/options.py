"""Options shared by every back end, including the papers' modifications (Christiano et al. appendix A)."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Literal

from rlhf_jax.config_base import INT32_MAX, check_fields, in_range, non_negative, positive
from rlhf_jax.errors import ConfigError
from rlhf_jax.envs.registry import factory_of, registered_ids


# The environments every back end offers, by the names their libraries give them.
GYMNAX_NAMES = (
    "CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0",
    "Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar",
)
ATARI_NAMES = ("BeamRider-v5", "Breakout-v5", "Enduro-v5", "Pong-v5", "Qbert-v5", "Seaquest-v5", "SpaceInvaders-v5")
MUJOCO_NAMES = (
    "Hopper-v5", "Walker2d-v5", "Swimmer-v5", "HalfCheetah-v5",
    "Ant-v5", "Reacher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5",
)

ENV_IDS = (
    tuple(f"gymnax/{n}" for n in GYMNAX_NAMES)
    + tuple(f"envpool/{n}" for n in ATARI_NAMES + MUJOCO_NAMES)
    + tuple(f"mjx/{n}" for n in MUJOCO_NAMES)
)


# Copies stepped together (evaluation's copies too, one episode each).
MAX_ENVS = 65_536


def unknown_id_message(env_id: str, known: tuple[str, ...]) -> str:
    """One line for an ``env.id`` nobody offers: the known ids whose names are nearest (a typo, a
    wrong case, or the right name under another back end, the id's own back end first), where the
    whole list is, and how to add a task of one's own."""
    backend, _, name = env_id.rpartition("/")
    by_name: dict[str, list[str]] = {}
    for k in known:
        by_name.setdefault(k.rpartition("/")[2].lower(), []).append(k)
    near = [k for n in difflib.get_close_matches(name.lower(), list(by_name), n=2, cutoff=0.7) for k in by_name[n]]
    near = sorted(near, key=lambda k: k.rpartition("/")[0] != backend)[:3]
    guess = f" (did you mean {' or '.join(repr(k) for k in near)}?)" if near else ""
    return (f"unknown environment id {env_id!r}{guess}; `rlhf-jax envs` lists every known id, and "
            f"rlhf_jax.envs.register(id, factory) adds one of your own (docs/your-own-task.md)")


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    # "<backend>/<name>", e.g. gymnax/CartPole-v1, envpool/Pong-v5, mjx/Hopper-v5; `rlhf-jax envs` lists them.
    # Or an id registered with rlhf_jax.envs.register (an environment of your own, envs/registry.py).
    id: str = "gymnax/CartPole-v1"
    num_envs: int = positive(16, MAX_ENVS)
    # EnvPool seeds its pool when it is built; the JAX back ends use the key given to reset instead.
    seed: int = in_range(0, 0, 2**30)  # EnvPool takes an int32, and evaluation adds 10,000
    # Appendix A: no variable-length episodes. The agent sees no life loss or termination
    # (Atari: one continuous game; MuJoCo and gymnax: fixed-length episodes), and the
    # oracle's reward pays `termination_penalty` for every step spent in a state that
    # would have ended the episode (for Atari: every life lost, except in Pong).
    hide_episode_end: bool = False
    termination_penalty: float = non_negative(1.0)
    # MuJoCo only, with hide_episode_end: how the oracle keeps the robot in its healthy range.
    # "penalty": the healthy bonus only while healthy, termination_penalty on every unhealthy
    # step; "smooth": neither, but a bonus smooth in the height (or the pendulum's angle) on
    # every step, as the paper's reference implementation writes its tasks (envs/smooth_oracle.py).
    oracle: Literal["penalty", "smooth"] = "penalty"
    # gymnax and MuJoCo, with hide_episode_end: "continue" runs a failed copy on to its time
    # limit (appendix A's MuJoCo treatment); "reset" restarts it at once without telling the
    # agent and the oracle pays the penalty once (the Atari treatment: one continuous
    # episode). CartPole needs "reset": a fallen pole spins far outside the states worth
    # learning about. On InvertedPendulum it made a fall too cheap (experiments/log/figure2.md,
    # "InvertedPendulum's stuck seed").
    hidden_end: Literal["continue", "reset"] = "continue"
    # EnvPool MuJoCo only, with hidden_end="reset" and oracle="penalty": which step of a fall pays
    # termination_penalty. "failing": the step whose result ends the task, whose observation
    # (what r̂ reads) is still the last healthy one. "restart": the next step, the pool's
    # restart, whose observation is the failed state; the agent is not told that its action
    # there was ignored, so r̂ is read and paid there like on any step (experiments/log/figure2.md,
    # "Under the restart the penalty sits on the last upright step").
    penalty_step: Literal["failing", "restart"] = "failing"
    # Atari only: paint the score (and BeamRider's enemy count, Enduro's speedometer) black.
    hide_score: bool = False
    # Atari only: a lost life ends the agent's episode (DQN on the true reward), the game goes on.
    episodic_life: bool = False
    # Atari only: up to this many no-op actions at the start of each game (Mnih et al. 2015).
    noop_max: int = non_negative(30, 10_000)
    # MuJoCo only: False removes the torque (control) cost from the reward, as appendix A does.
    control_cost: bool = True
    # 0 keeps the task's own limit.
    max_episode_steps: int = non_negative(0, INT32_MAX)

    def __post_init__(self):
        if self.id not in ENV_IDS and factory_of(self.id) is None:
            raise ConfigError(unknown_id_message(self.id, ENV_IDS + registered_ids()))
        check_fields(self)
        if self.penalty_step != "failing":
            mujoco = self.backend == "envpool" and self.name in MUJOCO_NAMES
            if not (mujoco and self.hide_episode_end and self.hidden_end == "reset" and self.oracle == "penalty"):
                raise ConfigError(f"env.penalty_step={self.penalty_step!r} applies only to EnvPool MuJoCo with "
                                  f"env.hide_episode_end=true, env.hidden_end=reset and env.oracle=penalty "
                                  f"(here {self.id}, hide_episode_end={self.hide_episode_end}, "
                                  f"hidden_end={self.hidden_end}, oracle={self.oracle}); set env.penalty_step=failing")

    @property
    def backend(self) -> str:
        return self.id.split("/", 1)[0] if "/" in self.id else ""

    @property
    def name(self) -> str:
        return self.id.split("/", 1)[1] if "/" in self.id else self.id


def without_run_changes(config: EnvConfig) -> EnvConfig:
    """The task ``config`` trains on as its library defines it, where the true reward scores a
    policy: episode ends visible, the task's own length and oracle, the penalty where it falls."""
    return dataclasses.replace(config, hide_episode_end=False, max_episode_steps=0, oracle="penalty",
                               penalty_step="failing")


# How a run steps its environment, not what the environment is: labels made on one run's
# environment apply to another's whatever these say.
HOW_RUN = ("num_envs", "seed")


def task_mismatch(made_on: EnvConfig, used_on: EnvConfig) -> str | None:
    """How environment ``used_on`` differs from ``made_on`` in what it is (its id and every
    option but :data:`HOW_RUN`), as ``"env.<key>: <made_on's> there, <used_on's> here"``; None if not at all."""
    for field in dataclasses.fields(EnvConfig):
        before, now = getattr(made_on, field.name), getattr(used_on, field.name)
        if field.name not in HOW_RUN and before != now:
            return f"env.{field.name}: {before} there, {now} here"
    return None


def reject_options(config: EnvConfig, backend: str, **defaults) -> None:
    """Refuse options that do not apply to a back end, naming them, instead of ignoring them."""
    for field, default in defaults.items():
        if getattr(config, field) != default:
            # The value may come from the config file (the built-in default restarts a failing
            # copy), so say what to write, not what to leave.
            value = str(default).lower() if isinstance(default, bool) else default
            raise ConfigError(
                f"env.{field}={getattr(config, field)!r} does not apply to the {backend} back end "
                f"({config.id}); set env.{field}={value}"
            )
