"""Clips for people (rlhf_jax.feedback.clips): frames for each back end, and MP4 files every browser plays."""
import dataclasses
import functools
import os
import shutil
import stat
import subprocess

import imageio_ffmpeg
import numpy as np
import pytest

from rlhf_jax.envs import ENV_IDS, EnvConfig, make
from rlhf_jax.errors import ConfigError
from rlhf_jax.feedback import clips

# imageio_ffmpeg's readers start ffmpeg by fork + exec, which JAX warns about in its
# multithreaded process; the child execs at once, so nothing can deadlock.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork.. was called:RuntimeWarning")


@functools.cache
def spec_of(env_id):
    return make(EnvConfig(id=env_id, num_envs=1)).spec


def decode(path):
    """(metadata, frames uint8 [k, H, W, 3]) of a video file, read back with ffmpeg."""
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    frames = np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])
    return meta, frames


def ffmpeg_probe(path) -> str:
    """What ffmpeg says about a file's streams (it exits 1 for want of an output file; that is fine)."""
    done = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)], capture_output=True)
    return done.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def opengl():
    """MuJoCo tests need headless OpenGL (Mesa's or a GPU's EGL, or OSMesa)."""
    try:
        context = clips._gl_context(64, 64)
    except Exception as error:  # no libEGL / libOSMesa on this machine
        pytest.skip(f"no headless OpenGL for MuJoCo (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): {error}")
    context.free()


# ------------------------------------------------------------------------------------
# Observations, written by hand
# ------------------------------------------------------------------------------------


def cartpole_obs(k):
    """The cart sweeps from x = -1.5 to 1.5 while the pole tips over."""
    x = np.linspace(-1.5, 1.5, k)
    return np.stack([x, np.ones(k), np.linspace(-0.2, 0.2, k), np.zeros(k)], 1).astype(np.float32)


def minatar_obs(k):
    obs = np.zeros((k, 10, 10, 4), np.float32)
    for t in range(k):
        obs[t, 9, t % 10, 0] = 1  # the paddle moves right
        obs[t, 2, :, 3] = 1  # a row of bricks
    return obs


def pong_obs(k):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (k, 84, 84, 4), dtype=np.uint8)


def hopper_obs(k):
    """Hopper standing (z = 1.25), bending its thigh, moving forward at 2 m/s."""
    obs = np.zeros((k, 11), np.float32)
    obs[:, 0] = 1.25
    obs[:, 2] = np.linspace(0.0, -0.6, k)
    obs[:, 5] = 2.0
    return obs


# ------------------------------------------------------------------------------------
# One clip per back end, decoded again
# ------------------------------------------------------------------------------------

CASES = {
    "gymnax/CartPole-v1": (cartpole_obs, 10, (400, 600)),
    "gymnax/Breakout-MinAtar": (minatar_obs, 5, (10 * clips.MINATAR_CELL,) * 2),
    "envpool/Pong-v5": (pong_obs, 6, (84 * clips.ATARI_SCALE,) * 2),
    "mjx/Hopper-v5": (hopper_obs, 4, clips.MUJOCO_SIZE),
}


@pytest.mark.parametrize("env_id", list(CASES))
def test_clip_plays_back(env_id, tmp_path, request):
    if env_id.startswith("mjx/"):
        request.getfixturevalue("opengl")
    spec = spec_of(env_id)
    make_obs, k, (height, width) = CASES[env_id]
    obs = make_obs(k)

    frames = clips.render_frames(spec, obs)
    assert frames.shape == (k, height, width, 3) and frames.dtype == np.uint8
    assert height % 2 == 0 and width % 2 == 0
    assert all(np.any(frame != frame[0, 0]) for frame in frames), "a blank frame"
    assert not np.array_equal(frames[0], frames[-1]), "different observations gave the same picture"

    path = clips.render_clip(spec, obs, tmp_path / "clip.mp4")
    assert path == tmp_path / "clip.mp4" and sorted(os.listdir(tmp_path)) == ["clip.mp4"]
    meta, decoded = decode(path)
    assert meta["codec"] == "h264" and meta["fps"] == pytest.approx(spec.fps)
    assert tuple(meta["size"]) == (width, height)
    assert decoded.shape == frames.shape
    assert np.abs(decoded.astype(np.float32) - frames).mean() < 12, "the video does not show the frames"
    count, seconds = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert count == k
    assert seconds == pytest.approx(k / spec.fps, abs=0.5 / spec.fps + 1e-3)
    assert "yuv420p" in ffmpeg_probe(path)
    data = path.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat"), "the index is not at the front (+faststart)"


@pytest.mark.slow
def test_a_clip_can_play_slower_than_real_time(tmp_path):
    """An episode to annotate is slowed down (rlhf_jax.reward.kinds.IBT.clip_fps): 50 CartPole
    steps at CartPole's 50 fps lasted 1 s. The same frames, only timed differently."""
    spec, obs = spec_of("gymnax/CartPole-v1"), cartpole_obs(50)
    path = clips.render_clip(spec, obs, tmp_path / "slow.mp4", fps=5.0)
    meta, decoded = decode(path)
    count, seconds = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert meta["fps"] == pytest.approx(5.0) and count == 50 and seconds == pytest.approx(10.0, abs=0.11)
    assert np.abs(decoded.astype(np.float32) - clips.render_frames(spec, obs)).mean() < 12


# ------------------------------------------------------------------------------------
# What each back end draws
# ------------------------------------------------------------------------------------


def test_cartpole_cart_moves_with_x():
    frames = clips.render_frames(spec_of("gymnax/CartPole-v1"), cartpole_obs(5))
    cart_columns = []
    for frame in frames:
        black = np.all(frame == 0, axis=-1)
        columns = np.flatnonzero(black.sum(0) > 5)  # the cart; the track is a one-pixel line
        cart_columns.append(columns.mean())
    assert np.all(np.diff(cart_columns) > 50), cart_columns


@pytest.mark.parametrize("name, obs", [
    ("Acrobot-v1", [[1, 0, 1, 0, 0, 0], [np.cos(2.0), np.sin(2.0), np.cos(-1.0), np.sin(-1.0), 0.5, 0]]),
    ("Pendulum-v1", [[1, 0, 0], [np.cos(2.5), np.sin(2.5), 1]]),
    ("MountainCar-v0", [[-1.0, 0], [0.4, 0.05]]),
    ("MountainCarContinuous-v0", [[-1.0, 0], [0.4, 0.05]]),
])
def test_classic_control_draws_each_state(name, obs):
    obs = np.asarray(obs, np.float32)
    frames = clips.render_frames(spec_of(f"gymnax/{name}"), obs)
    assert frames.dtype == np.uint8 and frames.shape[0] == 2 and frames.shape[-1] == 3
    assert frames.shape[1] % 2 == 0 and frames.shape[2] % 2 == 0
    assert not np.array_equal(frames[0], frames[1])


def test_classic_control_angles_from_observations():
    t1, t2 = 2.0, -1.0
    acrobot = np.array([[np.cos(t1), np.sin(t1), np.cos(t2), np.sin(t2), 0.5, -0.25]])
    np.testing.assert_allclose(clips._classic_states("Acrobot-v1", acrobot), [[t1, t2, 0.5, -0.25]], atol=1e-12)
    pendulum = np.array([[np.cos(-2.5), np.sin(-2.5), 3.0]])
    np.testing.assert_allclose(clips._classic_states("Pendulum-v1", pendulum), [[-2.5, 3.0]], atol=1e-12)


def test_minatar_colours_cells_by_highest_channel():
    obs = np.zeros((1, 10, 10, 4), np.float32)
    obs[0, 3, 5, 1] = 1
    obs[0, 7, 2, [0, 2]] = 1  # two channels set: the higher one (2) wins
    frame = clips.render_frames(spec_of("gymnax/Breakout-MinAtar"), obs)[0]
    cell = clips.MINATAR_CELL

    def colour(row, col):  # the colours inside one grid cell
        return np.unique(frame[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell].reshape(-1, 3), axis=0)

    np.testing.assert_array_equal(colour(3, 5), clips.MINATAR_PALETTE[[2]])
    np.testing.assert_array_equal(colour(7, 2), clips.MINATAR_PALETTE[[3]])
    np.testing.assert_array_equal(colour(0, 0), [[0, 0, 0]])
    assert (frame.any(-1)).sum() == 2 * cell * cell


def test_atari_shows_newest_frame_in_grey():
    obs = pong_obs(2)
    frames = clips.render_frames(spec_of("envpool/Pong-v5"), obs)
    s = clips.ATARI_SCALE
    for frame, stack in zip(frames, obs):
        np.testing.assert_array_equal(frame[::s, ::s, 0], stack[..., -1])
        np.testing.assert_array_equal(frame[..., 0], frame[..., 2])


def test_mujoco_floor_moves_with_the_observed_velocity(opengl):
    spec = spec_of("mjx/Hopper-v5")
    obs = np.repeat(hopper_obs(1), 3, axis=0)
    obs[:, 5] = 0.0
    still = clips.render_frames(spec, obs)
    assert np.array_equal(still[0], still[2]), "a body at rest should give the same picture"
    obs[:, 5] = 5.0
    moving = clips.render_frames(spec, obs)
    assert np.array_equal(moving[0], still[0]) and not np.array_equal(moving[0], moving[2])


@pytest.mark.parametrize("name", list(clips.MUJOCO_TASKS))
def test_mujoco_pose_from_observation(name, opengl):
    """The task's own observation function (mjx_tasks) of a random state; the pose comes back
    (but for the unobserved x, y, which start at 0), and two states give two pictures."""
    import mujoco
    from mujoco import mjx

    from rlhf_jax.envs.mjx_tasks import TASKS, ModelIndex

    model = clips._mujoco_model(name)
    index = ModelIndex(body={model.body(i).name: i for i in range(model.nbody)})
    rng = np.random.default_rng(1)
    obs, qpos = [], []
    for _ in range(2):
        data = mujoco.MjData(model)
        data.qpos[:] = model.qpos0 + rng.uniform(-0.3, 0.3, model.nq)
        data.qvel[:] = rng.uniform(-1.0, 1.0, model.nv)
        mujoco.mj_forward(model, data)
        obs.append(np.asarray(TASKS[name].obs_fn(index, mjx.put_data(model, data, impl="jax"))))
        qpos.append(data.qpos.copy())
    obs = np.stack(obs)

    rebuilt = clips._mujoco_qpos(name, obs[:1], dt=0.01)[0]
    unobserved = {"Hopper-v5": 1, "Walker2d-v5": 1, "HalfCheetah-v5": 1, "Swimmer-v5": 2, "Ant-v5": 2}.get(name, 0)
    np.testing.assert_allclose(rebuilt[unobserved:], qpos[0][unobserved:], atol=1e-5)
    np.testing.assert_array_equal(rebuilt[:unobserved], 0.0)

    spec = spec_of(f"envpool/{name}")  # same observations as mjx/, and cheap to build
    assert spec.observation_shape == obs.shape[1:]
    frames = clips.render_frames(spec, obs)
    assert frames.shape == (2, *clips.MUJOCO_SIZE, 3) and frames.dtype == np.uint8
    assert frames.std() > 5 and not np.array_equal(frames[0], frames[1])


# ------------------------------------------------------------------------------------
# Errors and atomic writes
# ------------------------------------------------------------------------------------


def test_every_listed_environment_can_be_drawn():
    for env_id in ENV_IDS:
        clips.check_renderable(env_id)


def test_unknown_environment_is_refused_with_the_list():
    spec = dataclasses.replace(spec_of("gymnax/CartPole-v1"), id="gymnax/Snake-v0")
    with pytest.raises(ConfigError, match=r"cannot draw clips of environment 'gymnax/Snake-v0'.*gymnax/CartPole-v1"):
        clips.render_frames(spec, np.zeros((2, 4), np.float32))
    with pytest.raises(ConfigError, match="cannot draw"):
        clips.check_renderable("envpool/Tetris-v5")


@pytest.mark.parametrize("shape", [(5, 3), (4,), (0, 4), (2, 4, 1)])
def test_wrong_observation_shape_is_refused(shape):
    with pytest.raises(ValueError, match=r"shape \[k, 4\]"):
        clips.render_frames(spec_of("gymnax/CartPole-v1"), np.zeros(shape, np.float32))


def test_write_clip_refuses_frames_it_cannot_encode(tmp_path):
    with pytest.raises(ValueError, match="even"):
        clips.write_clip(np.zeros((2, 33, 48, 3), np.uint8), tmp_path / "odd.mp4", 10)
    with pytest.raises(ValueError, match="uint8"):
        clips.write_clip(np.zeros((2, 32, 48, 3), np.float32), tmp_path / "float.mp4", 10)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fps", [125.0, 1.0 / (0.002 * 4), 15.0])
def test_write_clip_keeps_every_frame_at_the_given_rate(fps, tmp_path):
    frames = np.zeros((60, 480, 480, 3), np.uint8)  # a bar sweeping right
    for t in range(60):
        frames[t, :, 8 * t:8 * t + 8] = 255
    path = clips.write_clip(frames, tmp_path / "sweep.mp4", fps)
    meta, decoded = decode(path)
    assert meta["fps"] == pytest.approx(fps) and len(decoded) == 60
    assert imageio_ffmpeg.count_frames_and_secs(str(path)) == (60, pytest.approx(60 / fps, abs=0.01))
    np.testing.assert_array_equal(decoded[:, 240, ::8, 0] > 127, frames[:, 240, ::8, 0] > 127)


def test_write_clip_encodes_pictures_as_they_come(tmp_path):
    """An iterable of pictures (a long video composed frame by frame) encodes as the array would;
    a picture of another size stops it, leaving nothing behind."""
    frames = np.zeros((6, 32, 48, 3), np.uint8)
    frames[:, 8:24, 8:24] = 200
    path = clips.write_clip((frame for frame in frames), tmp_path / "stream.mp4", 10)
    meta, decoded = decode(path)
    assert decoded.shape == frames.shape and np.abs(decoded.astype(np.float32) - frames).mean() < 12
    with pytest.raises(ValueError, match="every frame must be 32x48 like the first; frame 2 is 32x50"):
        clips.write_clip(iter([frames[0], frames[1], np.zeros((32, 50, 3), np.uint8)]), tmp_path / "mixed.mp4", 10)
    with pytest.raises(ValueError, match="at least one picture"):
        clips.write_clip(iter([]), tmp_path / "empty.mp4", 10)
    assert os.listdir(tmp_path) == ["stream.mp4"]


def test_write_clip_replaces_the_file_whole_or_not_at_all(tmp_path, monkeypatch):
    frames = np.zeros((3, 32, 48, 3), np.uint8)
    frames[:, 8:24, 8:24] = 200
    path = clips.write_clip(frames, tmp_path / "sub" / "a.mp4", 10)
    before = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644

    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: shutil.which("false"))  # an encoder that fails
    with pytest.raises(RuntimeError, match="ffmpeg could not encode a.mp4"):
        clips.write_clip(255 - frames, path, 10)
    assert path.read_bytes() == before and os.listdir(path.parent) == ["a.mp4"]

    monkeypatch.undo()
    clips.write_clip(np.concatenate([frames, 255 - frames]), path, 10)
    assert os.listdir(path.parent) == ["a.mp4"]
    assert imageio_ffmpeg.count_frames_and_secs(str(path))[0] == 6
