"""Video clips of trajectory segments, for people to watch and compare in a browser.

People label segments by watching them (Christiano et al. 2017, appendix B), so each
segment of observations becomes a short MP4 file:

    frames = render_frames(spec, obs)        # uint8 [k, H, W, 3], one picture per observation
    write_clip(frames, path, fps=spec.fps)   # H.264 MP4, replaced atomically (frames: an array or an iterable)
    render_clip(spec, obs, path)             # both, at the environment's real frame rate (or fps=)

``obs`` is a NumPy array ``[k, *spec.observation_shape]`` (one segment of one copy), and
``spec`` the :class:`rlhf_jax.envs.EnvSpec` of the environment that produced it. Clips
are drawn from the observations alone, so anything saved with a query can be rendered
again later, in another process, without the simulator's state.

The files play in every browser: H.264 video in ``yuv420p`` (the only chroma layout
all decoders accept), with the index at the front (``-movflags +faststart``) so playback
starts before the whole file has arrived, and frame sizes rounded to even numbers (H.264
needs them). Encoding uses the ffmpeg that the ``imageio-ffmpeg`` package ships (with
libx264), so no system ffmpeg is needed. A clip is written under a temporary name in
the destination folder and then renamed, so a web server never serves half a file.

How each back end is drawn:

* gymnax classic control (CartPole, Acrobot, Pendulum, MountainCar,
  MountainCarContinuous): Gymnasium's own pygame renderers, fed the state recovered
  from the observation (Acrobot's and Pendulum's angles from their cosines and
  sines), as gymnax's visualiser does from a gymnax state. Pendulum's torque arrow is
  not drawn: the observation does not hold the action.
* gymnax MinAtar: each cell of the 10x10 grid takes the colour of its highest set
  channel (black where none is set), blown up to ``MINATAR_CELL`` pixels a side.
* EnvPool Atari: the newest of the four stacked 84x84 grey frames, blown up
  ``ATARI_SCALE`` times (what the agent saw, after EnvPool's preprocessing).
* MuJoCo (``mjx/...`` and ``envpool/...``; the two share Gymnasium's v5 observations):
  the joint positions are rebuilt from the observation and drawn with MuJoCo's own
  renderer, from the XML model the task loads. The observations of the locomotion
  tasks leave out the horizontal position; it is rebuilt by integrating the
  observed velocity from 0 at the segment's first frame, and the camera follows
  the body, so the floor's checkerboard shows how fast it moves. All eight tasks
  (``MUJOCO_TASKS``) can be drawn: Reacher's observation holds the target's
  position, Ant's everything but its x, y.

Headless rendering, chosen through environment variables that this module sets only
when the user has not:

* ``MUJOCO_GL`` (MuJoCo): ``egl`` by default. With an NVIDIA GPU and its driver, EGL
  renders on the GPU; without one, Mesa's EGL renders in software (llvmpipe), which
  works on CPU-only machines: about 0.07 s per 480x480 frame on 2 busy CPU cores, so
  some 5 s for a 60-frame Hopper clip (classic control, MinAtar and Atari take well
  under a second per clip, most of it encoding).
  ``osmesa`` is the pure-software alternative for machines without a usable EGL
  (Debian/Ubuntu package ``libosmesa6``); ``MUJOCO_EGL_DEVICE_ID`` picks the GPU. The
  back end is read when a MuJoCo clip is rendered, not when ``mujoco`` is first
  imported (``mujoco.Renderer`` would fix it at that import, which training does long
  before any clip is made), so the order of imports does not matter.
* ``SDL_VIDEODRIVER=dummy`` and ``SDL_AUDIODRIVER=dummy`` (pygame, for classic
  control): no screen, and no sound device probed.

Clips are rendered one at a time per process for classic control (pygame is not
thread-safe; a lock guards the cached Gymnasium environments); MuJoCo clips each get
their own OpenGL context, made and freed in the calling thread.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import subprocess
import tempfile
import threading
from fractions import Fraction
from pathlib import Path
from typing import Callable

# Headless defaults (see the module docstring). pygame reads its two when first imported
# (by Gymnasium's classic-control renderers); MUJOCO_GL is read by _gl_context.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from rlhf_jax.envs import ATARI_NAMES, ENV_IDS, EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.extras import require

CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
MINATAR_CELL = 24  # pixels per side of one MinAtar grid cell
ATARI_SCALE = 4  # 84x84 -> 336x336
MUJOCO_SIZE = (480, 480)  # (height, width) of MuJoCo frames, as Gymnasium's default
# Drawn in software (Mesa's llvmpipe), Gymnasium's render settings cost most of a frame's
# time for little to see at MUJOCO_SIZE: a 4096x4096 shadow map (1024 looks the same) and
# 4 samples per pixel of anti-aliasing (without, edges are hardly rougher; twice as fast).
MUJOCO_SHADOW_SIZE = 1024
MUJOCO_MULTISAMPLES = 0

# Colour of a MinAtar cell by 1 + its highest set channel; 0 (nothing set) is black.
MINATAR_PALETTE = np.array(
    [
        (0, 0, 0), (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
        (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212),
    ],
    np.uint8,
)


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def render_frames(spec: EnvSpec, obs) -> np.ndarray:
    """One RGB picture per observation: ``obs [k, *spec.observation_shape]`` -> uint8 ``[k, H, W, 3]``.

    ``H`` and ``W`` are even. Raises :class:`ConfigError` for an environment this module
    cannot draw and ``ValueError`` for observations of the wrong shape.
    """
    draw = _drawer(spec.id)
    obs = np.asarray(obs)
    expected = tuple(spec.observation_shape)
    if obs.ndim != len(expected) + 1 or tuple(obs.shape[1:]) != expected or obs.shape[0] < 1:
        raise ValueError(
            f"{spec.id}: observations for a clip must have shape [k, {', '.join(map(str, expected))}] "
            f"with k >= 1 (one segment of one environment copy); got shape {tuple(obs.shape)}"
        )
    return _even_size(draw(spec, obs))


def write_clip(frames, path, fps: float) -> Path:
    """Encode ``frames`` as an H.264 MP4 at ``fps`` (libx264's default quality, CRF 23, and one
    frame per frame: none dropped or repeated).

    ``frames`` is uint8 ``[k, H, W, 3]`` (``k >= 1``, ``H`` and ``W`` even), or any iterable of
    uint8 ``[H, W, 3]`` pictures of one size: they go to the encoder as they come, so a long
    video (a whole evaluation episode) is never held in memory whole.

    The file appears at ``path`` complete or not at all: it is written under a hidden
    temporary name in the same folder (created if missing), then renamed over ``path``.
    Returns ``path`` as a :class:`Path`.
    """
    import imageio_ffmpeg

    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError("frames must hold at least one picture (k >= 1)")
    height, width = _picture_size(first)
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = Fraction(float(fps)).limit_denominator(1001)  # e.g. 125.00000000000001 -> 125
    command = [
        imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-nostdin", "-loglevel", "error",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-framerate", str(rate), "-i", "-",
        # The output rate again: left to itself, ffmpeg encodes e.g. 480x480 at 125 fps as 120
        # fps, dropping frames.
        "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-r", str(rate), "-movflags", "+faststart", "-f", "mp4",
    ]
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(descriptor)
    try:
        # ffmpeg's messages go to a file, not a pipe: a pipe nobody reads while frames are
        # written could fill up and stop both processes.
        with tempfile.TemporaryFile() as messages:
            # close_fds=False lets Python start ffmpeg with posix_spawn rather than fork, which JAX
            # warns about in its multithreaded processes (descriptors that Python opens are not
            # inheritable anyway, PEP 446).
            encoder = subprocess.Popen(command + [partial], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=messages, close_fds=False)
            try:
                for index, frame in enumerate(itertools.chain([first], frames)):
                    if _picture_size(frame) != (height, width):
                        raise ValueError(f"every frame must be {height}x{width} like the first; frame {index} is "
                                         f"{np.shape(frame)[0]}x{np.shape(frame)[1]}")
                    encoder.stdin.write(np.ascontiguousarray(frame).tobytes())
            except BrokenPipeError:
                pass  # ffmpeg stopped reading: its exit status and messages say why
            except BaseException:
                encoder.kill()
                raise
            finally:
                with contextlib.suppress(BrokenPipeError):
                    encoder.stdin.close()
                status = encoder.wait()
            messages.seek(0)
            message = messages.read().decode(errors="replace").strip()
        if status != 0:
            raise RuntimeError(f"ffmpeg could not encode {path.name} (exit status {status}): {message}")
        os.chmod(partial, 0o644)  # mkstemp makes it private; a web server may run as another user
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
    return path


def _picture_size(frame) -> tuple[int, int]:
    """``(H, W)`` of one picture to encode; a ``ValueError`` for one that H.264 cannot take."""
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [k, H, W, 3] (or uint8 [H, W, 3] pictures); got a picture of "
                         f"{frame.dtype} {tuple(frame.shape)}")
    height, width = frame.shape[:2]
    if height % 2 or width % 2:
        raise ValueError(f"H.264 needs an even frame height and width; got {height}x{width}")
    return height, width


def render_clip(spec: EnvSpec, obs, path, fps: float | None = None) -> Path:
    """Render ``obs`` (``[k, *spec.observation_shape]``) and write it to ``path`` at ``fps``
    frames a second (default ``spec.fps``, the environment's real pace)."""
    return write_clip(render_frames(spec, obs), path, spec.fps if fps is None else fps)


def check_renderable(env_id: str, extra: str = "people") -> None:
    """Raise :class:`ConfigError` now, rather than at the first clip, if ``env_id`` cannot be drawn,
    or its clips need a package that is not installed (``extra`` of rlhf_jax installs them:
    ``people`` for a run's clips, ``video`` for evaluation videos)."""
    _drawer(env_id)
    backend, _, name = env_id.partition("/")
    modules = ["imageio_ffmpeg", *(["pygame"] if backend == "gymnax" and name in CLASSIC_CONTROL else [])]
    require(f"drawing {env_id}", extra, *modules)


# --------------------------------------------------------------------------------------
# Which drawer for which environment
# --------------------------------------------------------------------------------------


def _drawer(env_id: str) -> Callable[[EnvSpec, np.ndarray], np.ndarray]:
    draw = _find_drawer(env_id)
    if draw is None:
        drawable = ", ".join(known for known in ENV_IDS if _find_drawer(known) is not None)
        raise ConfigError(f"cannot draw clips of environment {env_id!r}; clips can be made for: {drawable}")
    return draw


def _find_drawer(env_id: str) -> Callable[[EnvSpec, np.ndarray], np.ndarray] | None:
    backend, _, name = env_id.partition("/")
    if backend == "gymnax" and name in CLASSIC_CONTROL:
        return _draw_classic_control
    if backend == "gymnax" and name.endswith("-MinAtar"):
        return _draw_minatar
    if backend == "envpool" and name in ATARI_NAMES:
        return _draw_atari
    if backend in ("envpool", "mjx") and name in MUJOCO_TASKS:
        return _draw_mujoco
    return None


def _even_size(frames: np.ndarray) -> np.ndarray:
    """Repeat the last row / column where the height / width is odd (H.264 needs even sizes)."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frames


# --------------------------------------------------------------------------------------
# gymnax classic control: Gymnasium's pygame renderers
# --------------------------------------------------------------------------------------


def _classic_states(name: str, obs: np.ndarray) -> np.ndarray:
    """Gymnasium's ``state`` vector for each gymnax observation ``obs [k, d]`` of task ``name``.

    CartPole and MountainCar observe their state. Acrobot observes
    ``(cos t1, sin t1, cos t2, sin t2, dt1, dt2)`` and its state is ``(t1, t2, dt1, dt2)``;
    Pendulum observes ``(cos theta, sin theta, theta_dot)`` and its state is ``(theta, theta_dot)``.
    """
    obs = obs.astype(np.float64)
    if name == "Acrobot-v1":
        return np.stack([np.arctan2(obs[:, 1], obs[:, 0]), np.arctan2(obs[:, 3], obs[:, 2]), obs[:, 4], obs[:, 5]], 1)
    if name == "Pendulum-v1":
        return np.stack([np.arctan2(obs[:, 1], obs[:, 0]), obs[:, 2]], 1)
    return obs


_classic_lock = threading.Lock()


@functools.cache
def _classic_env(name: str):
    """One Gymnasium environment per task, reused for every clip (pygame starts once)."""
    import gymnasium

    env = gymnasium.make(name, render_mode="rgb_array").unwrapped
    env.reset(seed=0)
    return env


def _draw_classic_control(spec: EnvSpec, obs: np.ndarray) -> np.ndarray:
    name = spec.id.partition("/")[2]
    states = _classic_states(name, obs)
    with _classic_lock:
        env = _classic_env(name)
        if hasattr(env, "last_u"):
            env.last_u = None  # Pendulum: no torque arrow, the observation holds no action
        frames = []
        for state in states:
            env.state = state
            frames.append(env.render())
    return np.stack(frames).astype(np.uint8, copy=False)


# --------------------------------------------------------------------------------------
# MinAtar and Atari: the grids and frames the agent sees, blown up
# --------------------------------------------------------------------------------------


def _draw_minatar(spec: EnvSpec, obs: np.ndarray) -> np.ndarray:
    channels = obs.shape[-1]
    if channels >= len(MINATAR_PALETTE):
        raise ConfigError(f"{spec.id}: {channels} channels, but the palette has colours for {len(MINATAR_PALETTE) - 1}")
    set_ = obs > 0.5
    # 1 + the highest set channel, 0 where no channel is set.
    colour = np.where(set_.any(-1), channels - np.argmax(set_[..., ::-1], axis=-1), 0)
    image = MINATAR_PALETTE[colour]  # [k, 10, 10, 3]
    return np.repeat(np.repeat(image, MINATAR_CELL, axis=1), MINATAR_CELL, axis=2)


def _draw_atari(spec: EnvSpec, obs: np.ndarray) -> np.ndarray:
    # AtariEnv hands over EnvPool's [4, 84, 84] stacks transposed to [84, 84, 4]; EnvPool
    # shifts the stack each step and puts the newest frame last.
    if obs.ndim != 4 or obs.shape[-1] > obs.shape[1]:
        raise ValueError(f"{spec.id}: expected channel-last stacks [k, 84, 84, 4], got {tuple(obs.shape)}")
    newest = obs[..., -1].astype(np.uint8, copy=False)
    big = np.repeat(np.repeat(newest, ATARI_SCALE, axis=1), ATARI_SCALE, axis=2)
    return np.repeat(big[..., None], 3, axis=-1)


# --------------------------------------------------------------------------------------
# MuJoCo: joint positions from observations, drawn by MuJoCo
# --------------------------------------------------------------------------------------


def _integrate(velocity: np.ndarray, dt: float) -> np.ndarray:
    """Positions from velocities ``[k]`` sampled every ``dt``, starting at 0 (trapezoid rule)."""
    steps = 0.5 * (velocity[1:] + velocity[:-1]) * dt
    return np.concatenate([[0.0], np.cumsum(steps)])


def _qpos_skip_x(obs, nq, dt):
    """Hopper, Walker2d, HalfCheetah: ``obs = (qpos[1:], qvel, ...)``, x rebuilt from ``qvel[0]``."""
    x = _integrate(obs[:, nq - 1], dt)
    return np.concatenate([x[:, None], obs[:, : nq - 1]], axis=1)


def _qpos_skip_xy(obs, nq, dt):
    """Swimmer, Ant: ``obs = (qpos[2:], qvel, ...)``, x and y rebuilt from ``qvel[0:2]``
    (world-frame velocities of Swimmer's slide joints and of Ant's free joint)."""
    x = _integrate(obs[:, nq - 2], dt)
    y = _integrate(obs[:, nq - 1], dt)
    return np.concatenate([x[:, None], y[:, None], obs[:, : nq - 2]], axis=1)


def _qpos_whole(obs, nq, dt):
    """InvertedPendulum: ``obs = (qpos, qvel)``."""
    return obs[:, :nq]


def _qpos_double_pendulum(obs, nq, dt):
    """InvertedDoublePendulum: ``obs = (qpos[0], sin(qpos[1:3]), cos(qpos[1:3]), ...)``."""
    return np.stack([obs[:, 0], np.arctan2(obs[:, 1], obs[:, 3]), np.arctan2(obs[:, 2], obs[:, 4])], axis=1)


def _qpos_reacher(obs, nq, dt):
    """Reacher: ``obs = (cos(qpos[:2]), sin(qpos[:2]), qpos[2:4] (the target), ...)``."""
    return np.stack([np.arctan2(obs[:, 2], obs[:, 0]), np.arctan2(obs[:, 3], obs[:, 1]), obs[:, 4], obs[:, 5]], axis=1)


@dataclasses.dataclass(frozen=True)
class _MujocoView:
    """How to draw one MuJoCo task: its pose from observations, and the camera."""

    qpos: Callable[[np.ndarray, int, float], np.ndarray]  # (obs [k, d], nq, dt) -> qpos [k, nq]
    distance: float  # camera distance from the point it looks at
    lookat: tuple = (0.0, 0.0, 0.0)  # the point looked at (x and y follow the body with `follow`)
    elevation: float = -20.0  # degrees; negative looks down
    azimuth: float = 90.0  # degrees; 90 looks along +y, at the x-z plane the planar robots move in
    follow: bool = False  # keep the robot's centre of mass at the centre of the picture


MUJOCO_TASKS = {
    "Hopper-v5": _MujocoView(_qpos_skip_x, distance=3.0, lookat=(0.0, 0.0, 1.15), follow=True),
    "Walker2d-v5": _MujocoView(_qpos_skip_x, distance=4.0, lookat=(0.0, 0.0, 1.15), follow=True),
    "HalfCheetah-v5": _MujocoView(_qpos_skip_x, distance=4.0, lookat=(0.0, 0.0, 0.4), follow=True),
    "Swimmer-v5": _MujocoView(_qpos_skip_xy, distance=5.0, elevation=-60.0, follow=True),
    "Ant-v5": _MujocoView(_qpos_skip_xy, distance=5.0, lookat=(0.0, 0.0, 0.5), elevation=-30.0, follow=True),
    "Reacher-v5": _MujocoView(_qpos_reacher, distance=0.9, elevation=-90.0),
    "InvertedPendulum-v5": _MujocoView(_qpos_whole, distance=2.5, lookat=(0.0, 0.0, 0.3), elevation=-10.0),
    "InvertedDoublePendulum-v5": _MujocoView(_qpos_double_pendulum, distance=4.0, lookat=(0.0, 0.0, 0.6),
                                            elevation=-10.0),
}


def _mujoco_qpos(name: str, obs: np.ndarray, dt: float) -> np.ndarray:
    """MuJoCo joint positions ``[k, nq]`` of task ``name`` for observations ``obs [k, d]``
    sampled every ``dt`` seconds (x and y, where unobserved, integrated from 0)."""
    return MUJOCO_TASKS[name].qpos(obs.astype(np.float64), _mujoco_model(name).nq, dt)


@functools.cache
def _mujoco_model(name: str):
    """The task's Gymnasium XML model, compiled once per process (read-only afterwards)."""
    from rlhf_jax.envs.mjx_tasks import TASKS, load_gymnasium_model

    model = load_gymnasium_model(TASKS[name].xml)
    model.vis.quality.shadowsize = min(int(model.vis.quality.shadowsize), MUJOCO_SHADOW_SIZE)
    model.vis.quality.offsamples = min(int(model.vis.quality.offsamples), MUJOCO_MULTISAMPLES)
    height, width = MUJOCO_SIZE
    model.vis.global_.offheight = max(int(model.vis.global_.offheight), height)
    model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), width)
    return model


def _gl_context(width: int, height: int):
    """An OpenGL context for offscreen rendering, of the kind ``MUJOCO_GL`` names (read now)."""
    backend = os.environ.get("MUJOCO_GL", "egl").strip().lower()
    if backend == "egl":
        from mujoco.egl import GLContext
    elif backend == "osmesa":
        from mujoco.osmesa import GLContext
    elif backend in ("glfw", "glx", "cgl", "wgl"):  # a desktop with a display
        from mujoco.glfw import GLContext
    else:
        raise ConfigError(f"MUJOCO_GL={backend!r} cannot render clips: use egl (GPU or Mesa) or osmesa (software)")
    return GLContext(width, height)


def _draw_mujoco(spec: EnvSpec, obs: np.ndarray) -> np.ndarray:
    import mujoco

    name = spec.id.partition("/")[2]
    view = MUJOCO_TASKS[name]
    model = _mujoco_model(name)
    qpos = _mujoco_qpos(name, obs, 1.0 / spec.fps)
    data = mujoco.MjData(model)
    camera = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(model, camera)
    camera.distance, camera.elevation, camera.azimuth = view.distance, view.elevation, view.azimuth
    height, width = MUJOCO_SIZE
    viewport = mujoco.MjrRect(0, 0, width, height)
    pixels = np.empty((height, width, 3), np.uint8)
    frames = np.empty((len(qpos), height, width, 3), np.uint8)

    context = _gl_context(width, height)
    render_context = None
    try:
        context.make_current()
        render_context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, render_context)
        scene = mujoco.MjvScene(model, maxgeom=1000)
        options = mujoco.MjvOption()
        for i, q in enumerate(qpos):
            data.qpos[:] = q
            mujoco.mj_forward(model, data)
            camera.lookat[:] = view.lookat
            if view.follow:
                camera.lookat[:2] = data.subtree_com[1, :2]  # body 1 is the root of the robot
            mujoco.mjv_updateScene(model, data, options, None, camera, mujoco.mjtCatBit.mjCAT_ALL, scene)
            mujoco.mjr_render(viewport, scene, render_context)
            mujoco.mjr_readPixels(pixels, None, viewport, render_context)
            frames[i] = pixels[::-1]  # OpenGL's rows run bottom to top
    finally:
        if render_context is not None:
            render_context.free()
        context.free()
    return frames
