"""`rlhf-jax eval --video`: MP4s of the scored true episodes, one frame per step, the true
return written on every frame, and for a learned reward a panel of r̂ against the true reward."""
import json

import imageio_ffmpeg
import numpy as np
import pytest

from rlhf_jax.cli import main
from rlhf_jax.feedback import clips
from small_runs import SMALL_LEARNERS, SMALL_RUN

# imageio_ffmpeg's readers start ffmpeg by fork + exec, which JAX warns about in its
# multithreaded process; the child execs at once, so nothing can deadlock.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork.. was called:RuntimeWarning")

# The built-in default (A2C on CartPole) made as small as the loop tests of test_rlhf make it,
# with the same length so that they share compiled programs. The policy barely learns, so
# episodes are short (about 10-40 steps).
SMALL = ["run.tensorboard=false", *SMALL_RUN]
LEARNERS = {"env": ["reward=env"], **SMALL_LEARNERS}
CARTPOLE_HEIGHT, CARTPOLE_WIDTH = 400, 600  # Gymnasium's CartPole pictures


def train(tmp_path_factory, reward: str):
    run_dir = tmp_path_factory.mktemp("video") / reward
    assert main(["train", f"run.dir={run_dir}", *SMALL, *LEARNERS[reward]]) == 0
    return run_dir


@pytest.fixture(scope="module")
def true_reward_run(tmp_path_factory):
    return train(tmp_path_factory, "env")


@pytest.fixture(scope="module", params=["preferences", "ibt"])
def learned_reward_run(tmp_path_factory, request):
    return train(tmp_path_factory, request.param)


def decode(path):
    """The frames of a video file, uint8 [k, H, W, 3], read back with ffmpeg."""
    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)["size"]
    return np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])


def evaluate_with_videos(run_dir, *options) -> dict:
    assert main(["eval", str(run_dir), *options]) == 0
    return json.loads((run_dir / "eval.json").read_text())


@pytest.mark.slow
def test_a_video_has_one_frame_per_step_and_the_return_so_far_on_each(true_reward_run):
    result = evaluate_with_videos(true_reward_run, "--episodes", "2", "--video", "2")
    videos = result["videos"]
    assert [v["path"] for v in videos] == [str(true_reward_run / "eval" / f"episode_{k}.mp4") for k in (0, 1)]
    # The videos show the episodes that were scored: CartPole pays 1 a step, so each return is
    # its episode's length, and the score is their mean.
    assert result["mean_true_return"] == pytest.approx(np.mean([v["true_return"] for v in videos]))
    for video in videos:
        frames = decode(video["path"])
        assert len(frames) == video["steps"] == video["true_return"]  # one frame per step
        assert imageio_ffmpeg.count_frames_and_secs(video["path"])[0] == video["steps"]
        assert frames.shape[1:] == (CARTPOLE_HEIGHT, CARTPOLE_WIDTH, 3)  # the scene alone: no panel
        # The caption, dark text in the scene's white top-left corner, shows the return so far.
        corner = frames[:, :CARTPOLE_HEIGHT // 10, :CARTPOLE_WIDTH // 4].astype(int)
        assert (corner.min(axis=(1, 2, 3)) < 100).all(), "a frame has no caption"
        assert np.abs(corner[0] - corner[-1]).mean() > 1, "the return written on the first and last frame is the same"


@pytest.mark.slow
def test_a_learned_reward_run_gets_the_reward_panel_with_a_moving_cursor(learned_reward_run):
    video = evaluate_with_videos(learned_reward_run, "--episodes", "1", "--video")["videos"][0]
    frames = decode(video["path"])
    assert len(frames) == video["steps"] == video["true_return"]
    # A square panel beside the scene, as high as it.
    assert frames.shape[1:] == (CARTPOLE_HEIGHT, CARTPOLE_WIDTH + CARTPOLE_HEIGHT, 3)
    panel = frames[:, :, CARTPOLE_WIDTH:].astype(int)
    red = (panel[..., 0] > 170) & (panel[..., 1] < 100) & (panel[..., 2] < 100)  # the cursor
    columns = [np.nonzero(red[t].any(axis=0))[0].mean() for t in (0, len(frames) - 1)]
    assert columns[0] < CARTPOLE_HEIGHT / 3 < 2 * CARTPOLE_HEIGHT / 3 < columns[1], columns


def test_an_environment_that_cannot_be_drawn_is_refused_in_one_line(true_reward_run, monkeypatch, capsys):
    before = (true_reward_run / "eval.json").read_text() if (true_reward_run / "eval.json").exists() else None
    monkeypatch.setattr(clips, "_find_drawer", lambda env_id: None)
    assert main(["eval", str(true_reward_run), "--video"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("rlhf-jax eval: error: --video: cannot draw clips of environment 'gymnax/CartPole-v1'")
    assert error.count("\n") == 1
    # Refused before anything was scored: eval.json is as it was.
    assert ((true_reward_run / "eval.json").read_text() if before is not None else None) == before


def test_more_videos_than_scored_episodes_are_refused(true_reward_run, capsys):
    assert main(["eval", str(true_reward_run), "--episodes", "2", "--video", "3"]) == 2
    assert "--video 3: only 2 episodes are scored" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", str(true_reward_run), "--video", "0"])
    assert "argument --video" in capsys.readouterr().err
