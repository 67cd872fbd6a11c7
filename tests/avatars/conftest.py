"""Media writers for the avatar tests (the astronaut portrait they register is a fixture of tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image


def write_image(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    """Save ``array`` with Pillow (the format follows the suffix)."""
    Image.fromarray(array, mode).save(path) if mode else Image.fromarray(array).save(path)
    return path


def write_video(path: Path, frames: list[np.ndarray], fps: int = 25) -> Path:
    """Encode RGB frames to an H.264 MP4 with PyAV."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "12", "preset": "ultrafast"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
