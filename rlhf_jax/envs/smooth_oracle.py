"""The smooth oracle (``env.oracle=smooth``): another reading of appendix A's penalty.

Appendix A of Christiano et al. 2017 replaces the MuJoCo tasks' early ends "by a penalty which
encourages the parameters to remain in the range", and section 3.1.1 says the tasks' rewards
"are all a quadratic function of the features". The default oracle (``"penalty"``) reads the
first literally: the healthy bonus only while healthy and ``termination_penalty`` on every
unhealthy step, a step at the edge of the range. The paper's public reference implementation
(rl-teacher, ``rl_teacher/envs.py``) writes its tasks another way, which this module gives:
no healthy bonus and no penalty, but on every step a bonus smooth in the very feature the range
is about,

    r_smooth(s, a) = r_task(s, a) - healthy_reward * healthy(s) + bonus(s),

with ``r_task`` Gymnasium's v5 reward (less its torque cost when ``control_cost=False``) and
``bonus`` from :data:`SMOOTH_BONUS`. Only the tasks that end when unhealthy have one. Ant keeps
v5's contact cost, which rl-teacher's Ant drops. Both back ends take the oracle's reward from
:func:`hidden_end_oracle`, which holds both readings.

Where it matters: on InvertedDoublePendulum the penalty oracle pays for swinging the poles over
the top, which a hinge without limits allows, and the runs from labels learned to spin; with
this oracle and 50-step episodes they learned to balance (experiments/log/figure2.md,
"InvertedDoublePendulum with the smooth oracle"). On Hopper,
Walker2d and Ant it was no better than the penalty.
"""
from __future__ import annotations

from typing import Callable

from rlhf_jax.envs.options import EnvConfig
from rlhf_jax.errors import ConfigError


def tip_height(obs):
    """InvertedDoublePendulum-v5's pole tip height ``y = 0.6 cos t1 + 0.6 cos(t1 + t2)`` (poles
    0.6 long, hinged about y), from the observation's ``sin(qpos[1:])`` (``obs[1:3]``) and
    ``cos(qpos[1:])`` (``obs[3:5]``). NumPy or JAX arrays ``[..., 11]``."""
    s1, s2, c1, c2 = obs[..., 1], obs[..., 2], obs[..., 3], obs[..., 4]
    return 0.6 * c1 + 0.6 * (c1 * c2 - s1 * s2)


# rl-teacher's bonus per task, from the v5 observation ([..., obs_dim] -> [...]): the torso's
# height (obs[0] is qpos[1], or Ant's qpos[2]) less an offset, the pendulum's angle squared, the
# double pendulum's tip height. The offsets change no comparison of clips of equal length.
SMOOTH_BONUS: dict[str, Callable] = {
    "Hopper-v5": lambda obs: obs[..., 0] - 1.0,
    "Walker2d-v5": lambda obs: obs[..., 0] - 2.0,
    "Ant-v5": lambda obs: obs[..., 0] - 1.2,
    "InvertedPendulum-v5": lambda obs: -obs[..., 1] ** 2,
    "InvertedDoublePendulum-v5": lambda obs: 10.0 * (tip_height(obs) - 1.0),
}


def check_oracle(name: str, oracle: str, hide_episode_end: bool) -> None:
    """Refuse ``env.oracle=smooth`` where it means nothing, in one line naming the key."""
    if oracle == "smooth" and name not in SMOOTH_BONUS:
        raise ConfigError(f"env.oracle=smooth applies only to the tasks that end when unhealthy "
                          f"({', '.join(SMOOTH_BONUS)}), not {name}; set env.oracle=penalty")
    if oracle == "smooth" and not hide_episode_end:
        raise ConfigError("env.oracle=smooth replaces the penalty of hidden episode ends: "
                          "set env.hide_episode_end=true too")


def smooth_reward(name: str, task_reward, healthy_bonus_paid, obs):
    """``r_smooth`` of the module docstring: ``task_reward - healthy_bonus_paid + bonus(obs)``."""
    return task_reward - healthy_bonus_paid + SMOOTH_BONUS[name](obs)


def hidden_end_oracle(config: EnvConfig, name: str, task_reward, healthy_bonus_paid, unhealthy, obs):
    """The oracle's reward of a MuJoCo task run on past its ends (``hide_episode_end``), for both
    back ends: ``task_reward - termination_penalty * unhealthy`` (``oracle="penalty"``, the task's
    healthy bonus being paid only while healthy), or :func:`smooth_reward` (``oracle="smooth"``)."""
    if config.oracle == "smooth":
        return smooth_reward(name, task_reward, healthy_bonus_paid, obs)
    return task_reward - config.termination_penalty * unhealthy
