"""Videos of evaluation episodes: the frames an env renders, with its instruction and the outcome drawn on them,
written as mp4 by the ffmpeg that ``imageio-ffmpeg`` ships (no system ffmpeg).

    reset (video episode) -> EpisodeVideo(first frame) -> add(render()) after every step -> episode ends
    -> EvalOutput.write_video: <eval dir>/videos/<task>__init<k>__<success|failure>.mp4

An episode of length L gives L + 1 frames: its first observation and one after each step.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sfengine.engine.messages import EpisodeStats
from sfengine.evaluation.episode_queue import SINGLE_TASK

log = logging.getLogger(__name__)

FPS = 20  # LIBERO's control rate; gymnasium envs are recorded at the same rate


class EpisodeVideo:
    """The frames of one episode, resized to ``size`` x ``size``."""

    def __init__(self, size: int, caption: str, first_frame: np.ndarray | None):
        self.size, self.caption = size, caption
        self.frames: list[np.ndarray] = []
        self.add(first_frame)

    def add(self, frame: np.ndarray | None) -> None:
        if frame is None:
            raise RuntimeError("the env's render() returned no frame; build it with render_mode='rgb_array'")
        from PIL import Image

        image = Image.fromarray(np.ascontiguousarray(frame[..., :3], dtype=np.uint8))
        if image.size != (self.size, self.size):
            image = image.resize((self.size, self.size), Image.BILINEAR)
        self.frames.append(np.asarray(image))

    def write(self, path: Path, outcome: str) -> None:
        """Draw the caption (top) and the outcome (bottom) on every frame and encode them as H.264 mp4."""
        import imageio.v2 as imageio
        from PIL import Image, ImageDraw, ImageFont

        font = ImageFont.load_default(size=max(10, self.size // 24))
        tmp = path.with_name(f".{path.name}.tmp.mp4")
        writer = imageio.get_writer(
            tmp, fps=FPS, codec="libx264", macro_block_size=1, ffmpeg_log_level="error", pixelformat="yuv420p"
        )
        try:
            for frame in self.frames:
                image = Image.fromarray(frame)
                draw = ImageDraw.Draw(image)
                for text, y in ((self.caption, 2), (outcome, self.size - font.size - 6)):
                    draw.text((4, y), text, font=font, fill=(255, 255, 255), stroke_width=2, stroke_fill=(0, 0, 0))
                writer.append_data(np.asarray(image))
        finally:
            writer.close()
        tmp.replace(path)


@dataclass
class EvalOutput:
    """What a rollout worker needs to know to record an evaluation's videos (pickled to spawned workers)."""

    video_dir: str | None  # None: no videos
    video_size: int
    env_name: str
    task_names: list[str] = field(default_factory=list)

    def task_label(self, task: int, init_state: int) -> str:
        if task == SINGLE_TASK:
            return f"{self.env_name}, seed {init_state}"
        return f"{self.task_names[task]}, init state {init_state}"

    def video_path(self, episode: EpisodeStats) -> Path:
        if math.isnan(episode.success):
            outcome = f"return{episode.episode_return:.1f}"
        else:
            outcome = "success" if episode.success else "failure"
        if episode.task == SINGLE_TASK:
            stem = f"{self.env_name}__seed{episode.init_state}__{outcome}"
        else:
            stem = f"{self.task_names[episode.task]}__init{episode.init_state:03d}__{outcome}"
        return Path(self.video_dir) / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', stem)}.mp4"

    def write_video(self, video: EpisodeVideo, episode: EpisodeStats) -> None:
        if math.isnan(episode.success):
            outcome = f"return {episode.episode_return:.1f} in {episode.length} steps"
        else:
            outcome = f"{'SUCCESS' if episode.success else 'FAILURE'} in {episode.length} steps"
        path = self.video_path(episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        video.write(path, outcome)
