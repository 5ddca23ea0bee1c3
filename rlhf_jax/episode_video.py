"""Videos of a policy's true episodes, for ``rlhf-jax eval --video``.

Each recorded episode (:func:`rlhf_jax.evaluation.record_episodes`) becomes
``RUN/eval/episode_<k>.mp4``, drawn and encoded as the clips people label are
(:mod:`rlhf_jax.feedback.clips`), at the environment's real frame rate:

* one frame per step of the episode: frame ``t`` shows the observation ``o_t`` the policy
  acted on, so a video has as many frames as its episode has steps (an episode still
  running at ``run.eval_max_steps`` is shown up to there);
* a caption on every frame: the true return so far, step ``t``'s reward included, so the
  last frame shows the episode's return;
* for a run that learned its reward (preferences or IBT), a panel beside the frame plots
  the learned reward r̂ of every step against the true reward, each on its own axis (r̂'s
  scale is its own), with a cursor at the current step. The panel is drawn once per
  episode with matplotlib; each frame only adds the cursor.

Frames are composed one at a time as the encoder takes them, so a long episode is never
held in memory twice.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Iterator, NamedTuple

import jax
import numpy as np

from rlhf_jax.envs import EnvSpec
from rlhf_jax.errors import ConfigError
from rlhf_jax.evaluation import EpisodeRecording
from rlhf_jax.feedback.clips import check_renderable, render_frames, write_clip

VIDEO_FOLDER = "eval"  # inside the run directory
LEARNED_COLOUR, TRUE_COLOUR = "tab:blue", "tab:orange"
CURSOR_COLOUR = np.array((214, 39, 40), np.uint8)  # red
CURSOR_WIDTH = 2  # pixels


class EpisodeVideo(NamedTuple):
    """One video written: where, and the episode it shows."""

    path: Path
    steps: int  # = its number of frames
    true_return: float


def check_video_request(env_id: str, videos: int, episodes: int) -> None:
    """Refuse, before anything runs, videos that cannot be made: of an environment that
    cannot be drawn, or of more episodes than are scored."""
    try:
        check_renderable(env_id, extra="video")
    except ConfigError as error:
        raise ConfigError(f"--video: {error}") from None
    if videos > episodes:
        raise ConfigError(f"--video {videos}: only {episodes} episodes are scored (--episodes or "
                          f"run.eval_episodes); ask for at most {episodes} videos")


def write_episode_videos(spec: EnvSpec, recording: EpisodeRecording, run_dir: Path) -> list[EpisodeVideo]:
    """One MP4 per recorded copy ``k``: ``run_dir/eval/episode_<k>.mp4`` (module docstring)."""
    recording = jax.device_get(recording)
    videos = []
    for k in range(len(recording.length)):
        episode = episode_of(recording, k)
        frames = episode_frames(render_frames(spec, episode.obs), episode)
        path = write_clip(frames, Path(run_dir) / VIDEO_FOLDER / f"episode_{k}.mp4", spec.fps)
        videos.append(EpisodeVideo(path, len(episode.obs), float(episode.true_return[-1])))
    return videos


# --------------------------------------------------------------------------------------
# Pure functions: an episode's frames
# --------------------------------------------------------------------------------------


class Episode(NamedTuple):
    """One copy's first true episode, on the host: ``L`` steps."""

    obs: np.ndarray  # [L, *observation_shape]
    true_reward: np.ndarray  # [L]
    true_return: np.ndarray  # [L]: so far, step t's reward included
    learned_reward: np.ndarray | None  # [L]; None without a learned reward


def episode_of(recording: EpisodeRecording, k: int) -> Episode:
    """Copy ``k``'s first true episode, cut from a recording on the host."""
    length = int(recording.length[k])
    cut = lambda steps: None if steps is None else np.asarray(steps[:length, k])
    return Episode(cut(recording.obs), cut(recording.true_reward), cut(recording.true_return),
                   cut(recording.learned_reward))


def episode_frames(pictures: np.ndarray, episode: Episode) -> Iterator[np.ndarray]:
    """The video's frames, one at a time: each picture (uint8 ``[L, H, W, 3]``, one per step)
    captioned with the true return so far, with the reward panel beside it where r̂ was recorded."""
    panel = None
    if episode.learned_reward is not None:
        panel = draw_reward_panel(episode.true_reward, episode.learned_reward, height=pictures.shape[1])
    for step, picture in enumerate(pictures):
        frame = with_caption(picture, f"true return {episode.true_return[step]:.6g}")
        yield frame if panel is None else np.concatenate([frame, panel.at(step)], axis=1)


def with_caption(picture: np.ndarray, text: str) -> np.ndarray:
    """``picture`` with ``text`` in its top-left corner, black on a white box (legible on any scene)."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(picture)
    draw = ImageDraw.Draw(image)
    font = _caption_font(picture.shape[0])
    margin = max(2, picture.shape[0] // 80)
    left, top, right, bottom = draw.textbbox((2 * margin, 2 * margin), text, font=font)
    draw.rectangle((left - margin, top - margin, right + margin, bottom + margin), fill="white")
    draw.text((2 * margin, 2 * margin), text, fill="black", font=font)
    return np.asarray(image)


@functools.cache
def _caption_font(picture_height: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=max(10, picture_height // 20))
    except TypeError:  # Pillow before 10.1: one small bitmap font
        return ImageFont.load_default()


@dataclasses.dataclass(frozen=True)
class RewardPanel:
    """The plot of r̂ and the true reward along one episode, drawn once; :meth:`at` adds the cursor."""

    background: np.ndarray  # uint8 [H, W, 3]
    cursor_columns: np.ndarray  # int [L]: the first pixel column of the cursor at each step
    plot_rows: tuple[int, int]  # the rows (top, bottom) the plot area spans

    def at(self, step: int) -> np.ndarray:
        picture = self.background.copy()
        top, bottom = self.plot_rows
        column = self.cursor_columns[step]
        picture[top:bottom, column:column + CURSOR_WIDTH] = CURSOR_COLOUR
        return picture


def draw_reward_panel(true_reward: np.ndarray, learned_reward: np.ndarray, height: int) -> RewardPanel:
    """A square panel ``height`` pixels a side (``height`` even, as H.264 needs): r̂ (left axis)
    and the true reward (right axis) against the step."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    steps = np.arange(len(true_reward))
    with rc_context({"font.size": max(6.0, height / 45)}):
        figure = Figure(figsize=(height / dpi, height / dpi), dpi=dpi)
        canvas = FigureCanvasAgg(figure)
        learned_axis = figure.add_subplot()
        true_axis = learned_axis.twinx()
        learned_axis.plot(steps, learned_reward, color=LEARNED_COLOUR)
        true_axis.plot(steps, true_reward, color=TRUE_COLOUR)
        learned_axis.set_ylabel(r"learned reward $\hat{r}$", color=LEARNED_COLOUR)
        true_axis.set_ylabel("true reward", color=TRUE_COLOUR)
        learned_axis.set_xlabel("step")
        learned_axis.set_xlim(0, max(1, len(steps) - 1))
        figure.tight_layout()
        canvas.draw()
    background = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    # Matplotlib's display coordinates are pixels from the bottom-left corner; the picture's rows run from the top.
    columns = learned_axis.transData.transform(np.stack([steps, np.zeros(len(steps))], axis=1))[:, 0]
    columns = np.clip(np.round(columns).astype(int) - CURSOR_WIDTH // 2, 0, height - CURSOR_WIDTH)
    box = learned_axis.bbox
    return RewardPanel(background, columns, (height - round(box.y1), height - round(box.y0)))
