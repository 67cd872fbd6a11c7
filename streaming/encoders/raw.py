"""No encoder: the output's pictures stay raw I420 on the host, for sinks that take pictures (a LiveKit room).

An output whose sinks all take raw pictures (LiveKit encodes them itself, per subscriber) needs no H.264: this stands in
for the encoder in ``streaming.output.SessionOutput``, so the output clock, repeats and playback events stay the same
and each released frame carries its picture (``EncodedFrame.picture``) with an empty access unit.
"""

from __future__ import annotations

import numpy as np
import torch

from streaming.encoders.colour import rgb_to_i420
from streaming.encoders.h264 import EncodedVideo, KeyframeRequests


class RawPictures:
    """The encoder's interface, not encoding: ``prepare`` gives host I420, ``encode_picture`` an empty unit."""

    name = "raw"

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.keyframes = KeyframeRequests()

    def prepare(self, image: torch.Tensor | np.ndarray, ready: torch.cuda.Event | None = None) -> np.ndarray:
        """A host I420 (H * 3/2, W) uint8 array of the frame (one that already is one is taken as it is)."""
        if isinstance(image, np.ndarray):
            if image.shape != (self.height * 3 // 2, self.width) or image.dtype != np.uint8:
                raise ValueError(f"expected {self.width}x{self.height} I420 pictures, got {image.shape} {image.dtype}")
            return image
        if ready is not None:
            torch.cuda.current_stream(image.device).wait_event(ready)
        return rgb_to_i420(image).cpu().numpy()

    def encode(self, image: torch.Tensor, index: int, ready: torch.cuda.Event | None = None) -> list[EncodedVideo]:
        return self.encode_picture(self.prepare(image, ready), index)

    def encode_picture(self, picture: np.ndarray, index: int) -> list[EncodedVideo]:
        """An empty access unit for slot ``index``: the picture travels beside it."""
        return [EncodedVideo(index, b"", False)]

    def flush(self) -> list[EncodedVideo]:
        return []
