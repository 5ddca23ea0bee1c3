"""The eight MuJoCo tasks of Christiano et al. (2017, section 3.1.1) as pure JAX functions over MJX.

Ids are ``mjx/<Name>-v5``: Hopper, Walker2d, Swimmer, HalfCheetah, Ant, Reacher,
InvertedPendulum and InvertedDoublePendulum. Each task loads the XML model that
Gymnasium ships and reproduces Gymnasium's v5 observation, reward, termination,
frame skip, reset noise and time limit; the formulas are quoted in the docstrings
of the functions that compute them.

How a step works (``MjxEnv._step``), for a batch of ``num_envs`` copies:

1. clip the action to the actuators' ``ctrlrange`` (MuJoCo clamps ``ctrl`` there
   anyway, since every actuator of these models is ``ctrllimited``) and run
   ``frame_skip`` MJX steps (Ant also runs ``rne_postconstraint`` for the
   contact forces, as Gymnasium's ``mj_rnePostConstraint``);
2. compute the v5 observation and the reward split into terms
   (:class:`RewardTerms`), and whether the new state is healthy;
3. combine the terms under the options of appendix A (``control_cost``,
   ``hide_episode_end``, ``termination_penalty``, ``oracle``) into ``TimeStep.reward``,
   ``TimeStep.terminated`` / ``truncated`` and the unmodified episode's
   ``info["true_reward"]`` (the task's reward: without the torque cost where
   ``control_cost`` removed it, as the paper's tasks) / ``info["true_done"]``;
4. reset the copies whose (agent-visible) episode ended, with fresh reset noise.
   The returned observation of such a copy is the first one of its new episode;
   the last observation of the old one is ``TimeStep.final_obs``.

Deviations from Gymnasium, all deliberate:

* The control cost is computed from the action as given (as Gymnasium does),
  while the simulation sees the action clipped to ``ctrlrange`` (as MuJoCo does).
* Reacher's target is drawn uniformly from the disc of radius 0.2 directly
  rather than by rejection sampling from the square; the distribution is the same.
* A copy whose simulation diverges (a non-finite ``qpos``/``qvel``) is treated
  as terminated, gets reward 0 on that step and is reset. Gymnasium would carry
  NaNs on (or end the episode, for the tasks whose health check sees them).
* With ``hide_episode_end`` the true episode's statistics (``episode_return``,
  ``episode_length``, added by the base class) run over the fixed-length episode;
  the return equals the unmodified episode's because ``true_reward`` is 0 after
  the copy first fails, but the length is the time limit. With ``hidden_end="reset"``
  a failed copy restarts at once instead, unannounced, and its true episode ends there.

How close to Gymnasium (MuJoCo's C engine, float64) this is, measured from the
same ``(qpos, qvel)`` and action over one step:

* Without contacts, and for Hopper and Walker2d with contacts, observations and
  rewards agree to better than 1e-4 in float32 (Hopper ~6e-6, Walker2d ~6e-5).
* HalfCheetah in contact: up to ~3e-4 in a joint velocity in float32 (large contact
  accelerations times float32 rounding); with ``jax_enable_x64`` it agrees to ~3e-6.
* Ant in contact differs by up to ~1e-2 in velocities per step, in float32 and
  float64 alike: MJX orients a contact's tangent frame differently from MuJoCo's C
  engine, and with the models' pyramidal friction cones the friction force depends
  on that orientation (for the planar robots the two frames agree or differ by 90
  degrees, which maps the 4-sided pyramid onto itself, so they are unaffected). Given the
  same state, MJX's ``cfrc_ext`` matches MuJoCo's, so Ant keeps Gymnasium's default
  105-number observation with the contact forces, and the contact cost.

Compile time (XLA on CPU compiles MJX slowly) shaped two choices: the RK4
integrator is a loop around one ``mjx.forward`` rather than ``mjx.step``'s four
unrolled copies, and an automatic reset computes only what the first observation
needs (see ``MjxEnv._fresh_copy``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlhf_jax.extras import require

# Imported when an mjx/ id is asked for (rlhf_jax.envs.make): without the mujoco extra, one line.
require("an mjx/ environment", "mujoco", "mujoco", "mujoco.mjx")
import mujoco  # noqa: E402

# mujoco-mjx prints a notice to stdout when its optional Warp back end is missing; keep it
# out of our commands' output (`rlhf-jax envs` is read by scripts).
with contextlib.redirect_stdout(io.StringIO()):
    from mujoco import mjx

from rlhf_jax.envs.core import MUJOCO_SEGMENT_FPS, Box, EnvSpec, EnvState, Environment, TimeStep, first_timestep
from rlhf_jax.envs.options import EnvConfig, reject_options
from rlhf_jax.envs.smooth_oracle import check_oracle, hidden_end_oracle

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# Observations: f(model index, data) -> 1-D array, for one copy.
# --------------------------------------------------------------------------------------


class ModelIndex(NamedTuple):
    """Static facts about the model that observation and reward functions look up."""

    body: dict  # body name -> body id


def obs_hopper_walker(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """Hopper-v5 / Walker2d-v5: ``concat(qpos[1:], clip(qvel, -10, 10))``."""
    return jnp.concatenate([d.qpos[1:], jnp.clip(d.qvel, -10.0, 10.0)])


def obs_skip_x(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """HalfCheetah-v5: ``concat(qpos[1:], qvel)`` (the x position is left out)."""
    return jnp.concatenate([d.qpos[1:], d.qvel])


def obs_skip_xy(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """Swimmer-v5: ``concat(qpos[2:], qvel)`` (the x, y position is left out)."""
    return jnp.concatenate([d.qpos[2:], d.qvel])


def ant_contact_forces(d: mjx.Data) -> jax.Array:
    """Ant-v5's ``contact_forces``: ``clip(cfrc_ext, -1, 1)``, shape (nbody, 6)."""
    # cfrc_ext belongs to MJX's JAX implementation (d._impl); reading it as d.cfrc_ext
    # is deprecated. The environment always uses impl="jax".
    return jnp.clip(d._impl.cfrc_ext, -1.0, 1.0)


def obs_ant(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """Ant-v5: ``concat(qpos[2:], qvel, clip(cfrc_ext[1:], -1, 1).flatten())`` (105 numbers).

    ``cfrc_ext`` comes from MJX's ``rne_postconstraint``, run after the frame skip
    as Gymnasium runs ``mj_rnePostConstraint``. Right after a reset it is all zeros,
    as in Gymnasium (``mj_forward`` does not compute it).
    """
    return jnp.concatenate([d.qpos[2:], d.qvel, ant_contact_forces(d)[1:].ravel()])


def reacher_fingertip_to_target(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """Reacher-v5's ``get_body_com("fingertip") - get_body_com("target")`` (3-vector of body ``xpos``)."""
    return d.xpos[ix.body["fingertip"]] - d.xpos[ix.body["target"]]


def obs_reacher(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """Reacher-v5: ``concat(cos(qpos[:2]), sin(qpos[:2]), qpos[2:], qvel[:2], (fingertip - target)[:2])``."""
    theta = d.qpos[:2]
    vec = reacher_fingertip_to_target(ix, d)
    return jnp.concatenate([jnp.cos(theta), jnp.sin(theta), d.qpos[2:], d.qvel[:2], vec[:2]])


def obs_qpos_qvel(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """InvertedPendulum-v5: ``concat(qpos, qvel)``."""
    return jnp.concatenate([d.qpos, d.qvel])


def obs_double_pendulum(ix: ModelIndex, d: mjx.Data) -> jax.Array:
    """InvertedDoublePendulum-v5:
    ``concat(qpos[:1], sin(qpos[1:]), cos(qpos[1:]), clip(qvel, -10, 10), clip(qfrc_constraint, -10, 10)[:1])``.
    """
    return jnp.concatenate([
        d.qpos[:1],
        jnp.sin(d.qpos[1:]),
        jnp.cos(d.qpos[1:]),
        jnp.clip(d.qvel, -10.0, 10.0),
        jnp.clip(d.qfrc_constraint, -10.0, 10.0)[:1],
    ])


# --------------------------------------------------------------------------------------
# Rewards: f(task, model index, data before, data after, action) -> RewardTerms, for one copy.
# --------------------------------------------------------------------------------------


class RewardTerms(NamedTuple):
    """One step's reward, split so the options can drop parts of it.

    Gymnasium's v5 reward is ``reward - ctrl_cost``. ``reward`` already holds the
    healthy (alive) bonus, which v5 pays only while healthy, and every other term
    (Ant's contact cost included). ``healthy`` is False where Gymnasium would
    terminate (always True for tasks that never terminate). ``extras`` go to ``info``.
    """

    reward: jax.Array
    ctrl_cost: jax.Array
    healthy: jax.Array
    extras: dict


def control_cost(weight: float, action: jax.Array) -> jax.Array:
    """``ctrl_cost_weight * sum(action**2)``, Gymnasium's ``control_cost`` (Reacher's ``-reward_ctrl``)."""
    return weight * jnp.sum(jnp.square(action))


def healthy_hopper(d: mjx.Data) -> jax.Array:
    """Hopper-v5's ``is_healthy``: with ``z, angle = qpos[1:3]`` and ``state = concat(qpos, qvel)[2:]``,
    ``all(-100 < state < 100) and 0.7 < z and -0.2 < angle < 0.2``.
    """
    z, angle = d.qpos[1], d.qpos[2]
    state = jnp.concatenate([d.qpos, d.qvel])[2:]
    healthy_state = jnp.all((-100.0 < state) & (state < 100.0))
    return healthy_state & (0.7 < z) & (z < jnp.inf) & (-0.2 < angle) & (angle < 0.2)


def healthy_walker(d: mjx.Data) -> jax.Array:
    """Walker2d-v5's ``is_healthy``: with ``z, angle = qpos[1:3]``, ``0.8 < z < 2 and -1 < angle < 1``."""
    z, angle = d.qpos[1], d.qpos[2]
    return (0.8 < z) & (z < 2.0) & (-1.0 < angle) & (angle < 1.0)


def healthy_ant(d: mjx.Data) -> jax.Array:
    """Ant-v5's ``is_healthy``: ``all(isfinite(concat(qpos, qvel))) and 0.2 <= qpos[2] <= 1``."""
    finite = jnp.all(jnp.isfinite(d.qpos)) & jnp.all(jnp.isfinite(d.qvel))
    return finite & (0.2 <= d.qpos[2]) & (d.qpos[2] <= 1.0)


def reward_forward_walker(task, ix, before, after, action) -> RewardTerms:
    """Hopper-v5, Walker2d-v5 (and, with no healthy term, HalfCheetah-v5):
    ``forward_reward_weight * x_velocity + healthy_reward * is_healthy - ctrl_cost_weight * sum(action**2)``
    with ``x_velocity = (qpos[0] after - qpos[0] before) / dt``.
    """
    x_velocity = (after.qpos[0] - before.qpos[0]) / task.dt
    healthy = task.healthy_fn(after) if task.healthy_fn is not None else jnp.array(True)
    reward = task.forward_reward_weight * x_velocity + task.healthy_reward * healthy
    return RewardTerms(
        reward=reward,
        ctrl_cost=control_cost(task.ctrl_cost_weight, action),
        healthy=healthy,
        extras={"x_velocity": x_velocity, "x_position": after.qpos[0]},
    )


def reward_swimmer(task, ix, before, after, action) -> RewardTerms:
    """Swimmer-v5: ``forward_reward_weight * x_velocity - ctrl_cost_weight * sum(action**2)``
    with ``(x_velocity, y_velocity) = (qpos[0:2] after - qpos[0:2] before) / dt``.
    """
    xy_velocity = (after.qpos[:2] - before.qpos[:2]) / task.dt
    return RewardTerms(
        reward=task.forward_reward_weight * xy_velocity[0],
        ctrl_cost=control_cost(task.ctrl_cost_weight, action),
        healthy=jnp.array(True),
        extras={"x_velocity": xy_velocity[0], "y_velocity": xy_velocity[1], "x_position": after.qpos[0]},
    )


def reward_ant(task, ix, before, after, action) -> RewardTerms:
    """Ant-v5: ``x_velocity + healthy_reward * is_healthy - 0.5 * sum(action**2) - 5e-4 * sum(clip(cfrc_ext, -1, 1)**2)``.

    ``(x_velocity, y_velocity) = (xpos[torso] after - xpos[torso] before)[:2] / dt``,
    with ``xpos`` the body position MuJoCo last computed (Gymnasium's
    ``data.body(1).xpos``); the contact cost sums over all bodies.
    """
    torso = 1  # Ant-v5's main_body
    xy_velocity = (after.xpos[torso, :2] - before.xpos[torso, :2]) / task.dt
    healthy = healthy_ant(after)
    contact_cost = task.contact_cost_weight * jnp.sum(jnp.square(ant_contact_forces(after)))
    reward = task.forward_reward_weight * xy_velocity[0] + task.healthy_reward * healthy - contact_cost
    return RewardTerms(
        reward=reward,
        ctrl_cost=control_cost(task.ctrl_cost_weight, action),
        healthy=healthy,
        extras={
            "x_velocity": xy_velocity[0],
            "y_velocity": xy_velocity[1],
            "x_position": after.qpos[0],
            "contact_cost": contact_cost,
        },
    )


def reward_reacher(task, ix, before, after, action) -> RewardTerms:
    """Reacher-v5: ``-norm(fingertip - target) - sum(action**2)`` (body positions after the step)."""
    distance = jnp.linalg.norm(reacher_fingertip_to_target(ix, after))
    return RewardTerms(
        reward=-distance,
        ctrl_cost=control_cost(task.ctrl_cost_weight, action),
        healthy=jnp.array(True),
        extras={"distance": distance},
    )


def reward_inverted_pendulum(task, ix, before, after, action) -> RewardTerms:
    """InvertedPendulum-v5: ``1`` while ``all(isfinite(obs)) and abs(qpos[1]) <= 0.2``, else ``0``
    (and the episode terminates). There is no control cost.
    """
    obs = obs_qpos_qvel(ix, after)
    healthy = jnp.all(jnp.isfinite(obs)) & (jnp.abs(obs[1]) <= 0.2)
    return RewardTerms(
        reward=task.healthy_reward * healthy,
        ctrl_cost=jnp.zeros(()),
        healthy=healthy,
        extras={},
    )


def reward_double_pendulum(task, ix, before, after, action) -> RewardTerms:
    """InvertedDoublePendulum-v5: ``10 * (y > 1) - (0.01 * x**2 + (y - 2)**2) - (1e-3 * v1**2 + 5e-3 * v2**2)``.

    ``x, _, y = site_xpos[0]`` (the pole tip), ``v1, v2 = qvel[1:3]``; the episode
    terminates when ``y <= 1``. There is no control cost.
    """
    x, y = after.site_xpos[0, 0], after.site_xpos[0, 2]
    v1, v2 = after.qvel[1], after.qvel[2]
    healthy = y > 1.0
    distance_penalty = 0.01 * x**2 + (y - 2.0) ** 2
    velocity_penalty = 1e-3 * v1**2 + 5e-3 * v2**2
    return RewardTerms(
        reward=task.healthy_reward * healthy - distance_penalty - velocity_penalty,
        ctrl_cost=jnp.zeros(()),
        healthy=healthy,
        extras={},
    )


# --------------------------------------------------------------------------------------
# Reset noise: f(task, key, init_qpos, init_qvel) -> (qpos, qvel), for one copy.
# --------------------------------------------------------------------------------------


def reset_uniform(task, key, qpos0, qvel0):
    """Hopper, Walker2d, Swimmer, InvertedPendulum (v5):
    ``qpos = init_qpos + U(-s, s)``, ``qvel = init_qvel + U(-s, s)`` with ``s = reset_noise_scale``.
    """
    s = task.reset_noise_scale
    k1, k2 = jax.random.split(key)
    qpos = qpos0 + jax.random.uniform(k1, qpos0.shape, minval=-s, maxval=s)
    qvel = qvel0 + jax.random.uniform(k2, qvel0.shape, minval=-s, maxval=s)
    return qpos, qvel


def reset_uniform_normal(task, key, qpos0, qvel0):
    """HalfCheetah, Ant, InvertedDoublePendulum (v5):
    ``qpos = init_qpos + U(-s, s)``, ``qvel = init_qvel + s * N(0, 1)`` with ``s = reset_noise_scale``.
    """
    s = task.reset_noise_scale
    k1, k2 = jax.random.split(key)
    qpos = qpos0 + jax.random.uniform(k1, qpos0.shape, minval=-s, maxval=s)
    qvel = qvel0 + s * jax.random.normal(k2, qvel0.shape)
    return qpos, qvel


def reset_reacher(task, key, qpos0, qvel0):
    """Reacher-v5: ``qpos = init_qpos + U(-0.1, 0.1)`` except ``qpos[-2:] = goal``, a point
    drawn uniformly from the disc ``norm(goal) < 0.2``; ``qvel = init_qvel + U(-0.005, 0.005)``
    except ``qvel[-2:] = 0``.

    Gymnasium draws the goal by rejection from the square ``U(-0.2, 0.2)**2``; drawing
    radius ``0.2 * sqrt(u)`` and a uniform angle gives the same distribution.
    """
    k1, k2, k3, k4 = jax.random.split(key, 4)
    qpos = qpos0 + jax.random.uniform(k1, qpos0.shape, minval=-0.1, maxval=0.1)
    radius = 0.2 * jnp.sqrt(jax.random.uniform(k2, ()))
    angle = jax.random.uniform(k3, (), minval=-jnp.pi, maxval=jnp.pi)
    goal = radius * jnp.stack([jnp.cos(angle), jnp.sin(angle)])
    qpos = qpos.at[-2:].set(goal)
    qvel = qvel0 + jax.random.uniform(k4, qvel0.shape, minval=-0.005, maxval=0.005)
    qvel = qvel.at[-2:].set(0.0)
    return qpos, qvel


# --------------------------------------------------------------------------------------
# The task table.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MjxTask:
    """Per-task constants: Gymnasium v5's defaults for one environment."""

    name: str
    xml: str  # file in gymnasium/envs/mujoco/assets
    frame_skip: int
    max_episode_steps: int
    obs_fn: Callable
    reward_fn: Callable
    reset_fn: Callable
    terminates: bool  # True where Gymnasium ends the episode when unhealthy
    healthy_fn: Optional[Callable] = None  # used by reward_forward_walker
    reset_noise_scale: float = 0.0
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 0.0
    healthy_reward: float = 0.0
    contact_cost_weight: float = 0.0
    needs_contact_forces: bool = False  # run rne_postconstraint for cfrc_ext
    # What a reset computes besides qpos/qvel, for the first observation and the next
    # step's "before" quantities: "nothing", "kinematics" (body and site positions)
    # or "forward" (everything mj_forward computes). See MjxEnv._fresh_copy.
    reset_computes: str = "nothing"
    # Filled in from the model by MjxEnv:
    dt: float = 0.0


TASKS = {
    t.name: t
    for t in [
        MjxTask("Hopper-v5", "hopper.xml", frame_skip=4, max_episode_steps=1000,
                obs_fn=obs_hopper_walker, reward_fn=reward_forward_walker, reset_fn=reset_uniform,
                terminates=True, healthy_fn=healthy_hopper, reset_noise_scale=5e-3,
                ctrl_cost_weight=1e-3, healthy_reward=1.0),
        MjxTask("Walker2d-v5", "walker2d_v5.xml", frame_skip=4, max_episode_steps=1000,
                obs_fn=obs_hopper_walker, reward_fn=reward_forward_walker, reset_fn=reset_uniform,
                terminates=True, healthy_fn=healthy_walker, reset_noise_scale=5e-3,
                ctrl_cost_weight=1e-3, healthy_reward=1.0),
        MjxTask("Swimmer-v5", "swimmer.xml", frame_skip=4, max_episode_steps=1000,
                obs_fn=obs_skip_xy, reward_fn=reward_swimmer, reset_fn=reset_uniform,
                terminates=False, reset_noise_scale=0.1, ctrl_cost_weight=1e-4),
        MjxTask("HalfCheetah-v5", "half_cheetah.xml", frame_skip=5, max_episode_steps=1000,
                obs_fn=obs_skip_x, reward_fn=reward_forward_walker, reset_fn=reset_uniform_normal,
                terminates=False, reset_noise_scale=0.1, ctrl_cost_weight=0.1),
        MjxTask("Ant-v5", "ant.xml", frame_skip=5, max_episode_steps=1000,
                obs_fn=obs_ant, reward_fn=reward_ant, reset_fn=reset_uniform_normal,
                terminates=True, reset_noise_scale=0.1, ctrl_cost_weight=0.5, healthy_reward=1.0,
                contact_cost_weight=5e-4, needs_contact_forces=True,
                reset_computes="kinematics"),  # the reward's x velocity reads the torso's xpos
        MjxTask("Reacher-v5", "reacher.xml", frame_skip=2, max_episode_steps=50,
                obs_fn=obs_reacher, reward_fn=reward_reacher, reset_fn=reset_reacher,
                terminates=False, ctrl_cost_weight=1.0,
                reset_computes="kinematics"),  # the observation reads fingertip and target xpos
        MjxTask("InvertedPendulum-v5", "inverted_pendulum.xml", frame_skip=2, max_episode_steps=1000,
                obs_fn=obs_qpos_qvel, reward_fn=reward_inverted_pendulum, reset_fn=reset_uniform,
                terminates=True, reset_noise_scale=0.01, healthy_reward=1.0),
        MjxTask("InvertedDoublePendulum-v5", "inverted_double_pendulum.xml", frame_skip=5,
                max_episode_steps=1000, obs_fn=obs_double_pendulum, reward_fn=reward_double_pendulum,
                reset_fn=reset_uniform_normal, terminates=True, reset_noise_scale=0.1,
                healthy_reward=10.0, reset_computes="forward"),  # the observation holds qfrc_constraint
    ]
}

MJX_TASKS: tuple = tuple(TASKS)


def gymnasium_asset_path(xml: str) -> str:
    """Path of one of the XML models Gymnasium ships."""
    import gymnasium

    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", xml)


def load_gymnasium_model(xml: str) -> mujoco.MjModel:
    """Compile one of Gymnasium's XML models. MuJoCo's compiler warnings (half_cheetah.xml's
    deprecated ``settotalmass``) go to this module's logger instead of stdout and a
    ``MUJOCO_LOG.TXT`` in the working directory."""
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: logger.info("MuJoCo, loading %s: %s", xml, message))
    try:
        return mujoco.MjModel.from_xml_path(gymnasium_asset_path(xml))
    finally:
        mujoco.set_mju_user_warning(previous)


def same_dtypes(new, old):
    """``new`` with the dtypes of ``old``, leaf by leaf, so MJX data can be a loop carry
    (with ``jax_enable_x64``, MJX's collision returns int64 contact ids where ``make_data`` has int32)."""
    return jax.tree.map(lambda x, y: x.astype(y.dtype), new, old)


def quat_integrate(quat: jax.Array, omega: jax.Array, h) -> jax.Array:
    """Turn the unit quaternion ``quat`` by the body-frame angular velocity ``omega`` for time ``h``:
    ``quat * (cos(h|w|/2), sin(h|w|/2) w/|w|)``, normalised (MuJoCo's ``mju_quatIntegrate``)."""
    speed = jnp.linalg.norm(omega)
    axis = omega / jnp.maximum(speed, 1e-15)
    half_angle = 0.5 * h * speed
    w1, v1 = quat[0], quat[1:]
    w2, v2 = jnp.cos(half_angle), jnp.sin(half_angle) * axis
    product = jnp.concatenate([
        (w1 * w2 - jnp.dot(v1, v2))[None],
        w1 * v2 + w2 * v1 + jnp.cross(v1, v2),
    ])
    return product / jnp.linalg.norm(product)


# --------------------------------------------------------------------------------------
# The environment.
# --------------------------------------------------------------------------------------


class MjxState(NamedTuple):
    """A batch of copies: MJX data plus episode bookkeeping, all with leading axis ``num_envs``.

    ``failed`` (only used with ``hide_episode_end``) marks copies that have been in
    a state where the unmodified episode would have terminated.
    """

    data: mjx.Data
    steps: jax.Array  # int32, steps taken in the current (agent-visible) episode
    failed: jax.Array  # bool
    key: jax.Array  # one PRNG key for the batch, for reset noise


class MjxEnv(Environment):
    """A batch of ``config.num_envs`` copies of one task; see the module docstring."""

    def __init__(self, task: MjxTask, config: EnvConfig):
        reject_options(config, "mjx", hide_score=False, episodic_life=False, noop_max=30)
        check_oracle(task.name, config.oracle, config.hide_episode_end)
        self.config = config
        self.mj_model = load_gymnasium_model(task.xml)
        self.model = mjx.put_model(self.mj_model, impl="jax")
        self.task = dataclasses.replace(task, dt=float(self.mj_model.opt.timestep) * task.frame_skip)
        self.index = ModelIndex(body={self.mj_model.body(i).name: i for i in range(self.mj_model.nbody)})
        # Gymnasium's init_qpos / init_qvel: the state of a fresh MjData.
        self.init_qpos = jnp.asarray(self.mj_model.qpos0)
        self.init_qvel = jnp.zeros((self.mj_model.nv,))
        self.template = mjx.make_data(self.model, impl="jax")
        self._index_joints()

        low, high = self.mj_model.actuator_ctrlrange.T
        if not (np.all(low == low[0]) and np.all(high == high[0])):
            raise ValueError(f"{task.name}: actuators have different control ranges")
        self.ctrl_low, self.ctrl_high = float(low[0]), float(high[0])
        self.max_episode_steps = config.max_episode_steps or task.max_episode_steps

        obs_dim = jax.eval_shape(functools.partial(task.obs_fn, self.index), self.template).shape[0]
        self.spec = EnvSpec(
            id=f"mjx/{task.name}",
            backend="mjx",
            num_envs=config.num_envs,
            observation_shape=(obs_dim,),
            observation_dtype="float32",
            action_space=Box(self.ctrl_low, self.ctrl_high, (self.mj_model.nu,)),
            fps=1.0 / self.task.dt,
            max_episode_steps=self.max_episode_steps,
            segment_fps=MUJOCO_SEGMENT_FPS[task.name],
        )

    def _index_joints(self):
        """Where each joint's coordinates sit in qpos / qvel, for ``_integrate_positions``."""
        m = self.mj_model
        if m.na:
            raise NotImplementedError("actuator activations are not supported")
        hinge_qpos, hinge_dof, self._free_joints = [], [], []
        for j in range(m.njnt):
            kind, qa, va = m.jnt_type[j], int(m.jnt_qposadr[j]), int(m.jnt_dofadr[j])
            if kind in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)):
                hinge_qpos.append(qa)
                hinge_dof.append(va)
            elif kind == int(mujoco.mjtJoint.mjJNT_FREE):
                self._free_joints.append((qa, va))
            else:
                raise NotImplementedError(f"joint type {kind} is not supported")
        self._hinge_qpos = np.array(hinge_qpos, np.int32)
        self._hinge_dof = np.array(hinge_dof, np.int32)

    # ---- one copy ----

    def _physics(self, data: mjx.Data, ctrl: jax.Array) -> mjx.Data:
        """``frame_skip`` MuJoCo steps with ``ctrl`` applied (Gymnasium's ``do_simulation``)."""
        data = data.replace(ctrl=ctrl.astype(data.ctrl.dtype))
        if self.mj_model.opt.integrator == int(mujoco.mjtIntegrator.mjINT_RK4):
            timestep = self._rk4_timestep
        else:
            timestep = lambda d: same_dtypes(mjx.step(self.model, d), d)
        data = jax.lax.fori_loop(0, self.task.frame_skip, lambda _, d: timestep(d), data)
        if self.task.needs_contact_forces:
            data = mjx.rne_postconstraint(self.model, data)
        return data

    def _rk4_timestep(self, d0: mjx.Data) -> mjx.Data:
        """One MuJoCo timestep with the classic Runge-Kutta 4 integrator, as ``mj_step`` with ``integrator="RK4"``.

        Stage ``i`` evaluates the forward dynamics at ``(q_i, v_i)``, giving ``a_i``:
        ``(q_1, v_1) = (q, v)``; ``q_{i+1} = q (+) c_i dt v_i``, ``v_{i+1} = v + c_i dt a_i``
        with ``c = (1/2, 1/2, 1)``. Then ``v' = v + dt sum_i b_i a_i`` and
        ``q' = q (+) dt sum_i b_i v_i`` with ``b = (1/6, 1/3, 1/3, 1/6)``; ``(+)``
        is MuJoCo's position integration (quaternions for free joints). The other
        fields of the result (body positions, contact forces, ...) are those of the
        last stage, as in MuJoCo.

        This is what ``mjx.step`` computes too; writing the four stages as a loop
        around one ``mjx.forward`` instead of four copies of it cuts the compile
        time of a task's step by more than half.
        """
        dt = self.mj_model.opt.timestep
        next_fraction = jnp.array([0.5, 0.5, 1.0, 1.0])  # the last entry is unused
        weight = jnp.array([1.0, 2.0, 2.0, 1.0]) / 6.0

        def stage(i, carry):
            d, vel_sum, acc_sum = carry
            d = same_dtypes(mjx.forward(self.model, d), d)
            vel_sum = vel_sum + weight[i] * d.qvel
            acc_sum = acc_sum + weight[i] * d.qacc
            h = next_fraction[i] * dt
            d = d.replace(qpos=self._integrate_positions(d0.qpos, d.qvel, h), qvel=d0.qvel + h * d.qacc)
            return d, vel_sum, acc_sum

        zeros = jnp.zeros_like(d0.qvel)
        d, vel_sum, acc_sum = jax.lax.fori_loop(0, 4, stage, (d0, zeros, zeros))
        return d.replace(
            qpos=self._integrate_positions(d0.qpos, vel_sum, dt),
            qvel=d0.qvel + dt * acc_sum,
            time=d0.time + dt,
            qacc_warmstart=d.qacc,
        )

    def _integrate_positions(self, qpos: jax.Array, qvel: jax.Array, h) -> jax.Array:
        """MuJoCo's ``mj_integratePos``: ``q + h v`` for hinge and slide joints; a free joint
        moves by ``h v[:3]`` and turns its quaternion by ``h |w|`` about ``w = v[3:6]`` (body frame)."""
        qpos = qpos.at[self._hinge_qpos].add(h * qvel[self._hinge_dof])
        for qa, va in self._free_joints:
            position = qpos[qa : qa + 3] + h * qvel[va : va + 3]
            quat = quat_integrate(qpos[qa + 3 : qa + 7], qvel[va + 3 : va + 6], h)
            qpos = qpos.at[qa : qa + 7].set(jnp.concatenate([position, quat]))
        return qpos

    def _fresh_copy(self, key: jax.Array) -> mjx.Data:
        """Gymnasium's ``reset``: ``mj_resetData``, add reset noise, ``set_state`` (which runs ``mj_forward``).

        Only what the task's first observation and next reward read besides
        ``qpos``/``qvel`` is computed (``task.reset_computes``): nothing, the body
        and site positions (``mjx.kinematics``) or everything (``mjx.forward``).
        The other derived fields keep ``mjx.make_data``'s zeros until the next step,
        which starts with a full ``mjx.forward``, so the physics is unchanged. A
        reset costs a few percent of a step to run but would otherwise be a large
        part of the step's compile time.
        """
        qpos, qvel = self.task.reset_fn(self.task, key, self.init_qpos, self.init_qvel)
        data = self.template.replace(qpos=qpos, qvel=qvel)
        if self.task.reset_computes == "forward":
            return mjx.forward(self.model, data)
        if self.task.reset_computes == "kinematics":
            return mjx.kinematics(self.model, data)
        assert self.task.reset_computes == "nothing", self.task.reset_computes
        return data

    def _obs(self, data: mjx.Data) -> jax.Array:
        return self.task.obs_fn(self.index, data).astype(jnp.float32)

    # ---- the batch ----

    def _fresh_batch(self, key: jax.Array):
        keys = jax.random.split(key, self.num_envs)
        data = jax.vmap(self._fresh_copy)(keys)
        return data, jax.vmap(self._obs)(data)

    def _reset(self, key: jax.Array):
        key, reset_key = jax.random.split(key)
        data, obs = self._fresh_batch(reset_key)
        n = self.num_envs
        inner = MjxState(data, jnp.zeros((n,), jnp.int32), jnp.zeros((n,), bool), key)
        false = jnp.zeros((n,), bool)
        zeros = jnp.zeros((n,), jnp.float32)
        # The same info keys as a step's (zeros), so a TimeStep can be a scan carry.
        extras = jax.eval_shape(self._reward_terms, data, data, jnp.zeros((n, self.mj_model.nu), jnp.float32)).extras
        info = self._info(
            true_reward=zeros, true_done=false, unhealthy=false, failed=false,
            ctrl_cost=zeros, extras={k: zeros for k in extras},
        )
        return inner, first_timestep(obs, info)

    @staticmethod
    def _info(*, true_reward, true_done, unhealthy, failed, ctrl_cost, extras) -> dict:
        return {
            "true_reward": true_reward.astype(jnp.float32),
            "true_done": true_done,
            "unhealthy": unhealthy,  # the unmodified episode ends (or would end) here; a diverged copy too
            "failed": failed,  # hide_episode_end: has been where the unmodified episode ends
            "ctrl_cost": ctrl_cost.astype(jnp.float32),
            **{k: jnp.asarray(v, jnp.float32) for k, v in extras.items()},
        }

    def _reward_terms(self, before: mjx.Data, after: mjx.Data, action: jax.Array) -> RewardTerms:
        return jax.vmap(lambda b, a, u: self.task.reward_fn(self.task, self.index, b, a, u))(before, after, action)

    def state_from_qpos_qvel(self, qpos, qvel, key: Optional[jax.Array] = None) -> EnvState:
        """Host-side: a state for ``step`` whose copies sit at ``(qpos, qvel)``, like Gymnasium's ``set_state``.

        ``qpos`` / ``qvel`` have shape ``(nq,)`` / ``(nv,)`` (the same state for every
        copy) or ``(num_envs, nq)`` / ``(num_envs, nv)``. The derived quantities come
        from MuJoCo's own ``mj_forward``, as in Gymnasium; each copy starts a new
        episode. ``key`` seeds later reset noise.
        """
        n = self.num_envs
        qpos = np.broadcast_to(np.asarray(qpos, np.float64), (n, self.mj_model.nq))
        qvel = np.broadcast_to(np.asarray(qvel, np.float64), (n, self.mj_model.nv))
        copies = []
        for i in range(n):
            d = mujoco.MjData(self.mj_model)
            d.qpos[:], d.qvel[:] = qpos[i], qvel[i]
            mujoco.mj_forward(self.mj_model, d)
            copies.append(mjx.put_data(self.mj_model, d, impl="jax"))
        # Stacked on the host and with make_data's dtypes, so the arrays look like the
        # output of reset (uncommitted, same types) and a jitted step does not recompile.
        data = jax.tree.map(
            lambda t, *xs: jnp.asarray(np.stack([np.asarray(x) for x in xs]), t.dtype), self.template, *copies
        )
        key = jnp.asarray(np.asarray(jax.random.PRNGKey(0) if key is None else key))
        inner = MjxState(data, jnp.zeros((n,), jnp.int32), jnp.zeros((n,), bool), key)
        return EnvState(inner, jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.int32))

    def _step(self, inner: MjxState, action: jax.Array):
        task, config = self.task, self.config
        action = jnp.asarray(action, jnp.float32)
        ctrl = jnp.clip(action, self.ctrl_low, self.ctrl_high)
        before = inner.data
        after = jax.vmap(self._physics)(before, ctrl)
        terms = self._reward_terms(before, after, action)
        obs = jax.vmap(self._obs)(after)

        diverged = ~(jnp.all(jnp.isfinite(after.qpos), axis=1) & jnp.all(jnp.isfinite(after.qvel), axis=1))
        terminated = (~terms.healthy if task.terminates else jnp.zeros_like(diverged)) | diverged
        steps = inner.steps + 1
        at_limit = steps >= self.max_episode_steps

        # The task's reward: Gymnasium's v5 reward, without its torque cost if the option
        # removed it (appendix A); 0 on a step where the simulation diverged.
        task_reward = jnp.where(diverged, 0.0, terms.reward - terms.ctrl_cost * config.control_cost)
        oracle = task_reward
        restarts = config.hide_episode_end and config.hidden_end == "reset"
        if config.hide_episode_end:
            # Fixed-length episodes: the simulation runs on after failure; the oracle pays
            # the penalty for every step in a terminal state (or, with oracle="smooth", its
            # smooth bonus: hidden_end_oracle); the unmodified evaluation
            # stops counting once the copy has failed.
            # A diverged copy restarts unannounced (final_obs keeps what it reached).
            agent_terminated, agent_truncated = jnp.zeros_like(at_limit), at_limit
            oracle = hidden_end_oracle(config, task.name, task_reward, task.healthy_reward * terms.healthy,
                                       terminated, obs)
            true_reward = jnp.where(inner.failed, 0.0, task_reward)
            failed = inner.failed | terminated
            true_done = at_limit
            reset = at_limit | diverged
            if restarts:
                # Or the copy restarts at once where it failed, unannounced; only the time limit
                # of a life that lasts ends the agent's episode.
                agent_truncated = at_limit & ~terminated
                true_reward, failed = task_reward, jnp.zeros_like(inner.failed)
                true_done = reset = terminated | at_limit
        else:
            agent_terminated, agent_truncated = terminated, at_limit & ~terminated
            failed = jnp.zeros_like(inner.failed)
            true_reward = task_reward
            true_done = reset = terminated | at_limit
        done = agent_terminated | agent_truncated
        # The time limit counts from the agent's episode start, or from a hidden restart.
        life_over = reset if restarts else done
        oracle = jnp.where(diverged, 0.0, oracle)

        key, reset_key = jax.random.split(inner.key)

        def with_resets(args):
            data, obs = args
            fresh_data, fresh_obs = self._fresh_batch(reset_key)
            pick = lambda new, old: jnp.where(reset.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
            return jax.tree.map(pick, fresh_data, data), pick(fresh_obs, obs)

        # Only compute fresh copies on steps where some copy needs one.
        next_data, next_obs = jax.lax.cond(jnp.any(reset), with_resets, lambda args: args, (after, obs))
        next_inner = MjxState(
            data=next_data,
            steps=jnp.where(life_over, 0, steps),
            failed=failed & ~done,
            key=key,
        )
        info = self._info(
            true_reward=true_reward, true_done=true_done, unhealthy=terminated,
            failed=failed, ctrl_cost=terms.ctrl_cost, extras=terms.extras,
        )
        ignored = jnp.zeros_like(done)
        return next_inner, TimeStep(next_obs, oracle.astype(jnp.float32), agent_terminated, agent_truncated, obs,
                                    ignored, info)


def make_mjx(name: str, config: EnvConfig) -> MjxEnv:
    """The task ``name`` (e.g. ``"Hopper-v5"``, or ``"mjx/Hopper-v5"``) as a batch of ``config.num_envs`` copies."""
    name = name.split("/", 1)[1] if name.startswith("mjx/") else name
    if name not in TASKS:
        raise ValueError(f"unknown MJX task {name!r}; choose one of {', '.join(MJX_TASKS)}")
    return MjxEnv(TASKS[name], config)
