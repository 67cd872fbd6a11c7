"""The H.264 encoder by name, auto|nvenc|x264: the one asked for, or for auto the best one that works here."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from streaming.encoders.h264 import EncodedVideo, H264Settings, KeyframeRequests
from streaming.encoders.nvenc import NvencEncoder, NvencUnavailable
from streaming.encoders.x264 import X264Encoder

ENCODERS = ("auto", "nvenc", "x264")


class VideoEncoder(Protocol):
    """What the output pipeline needs from an H.264 encoder."""

    name: str
    width: int
    height: int
    keyframes: KeyframeRequests

    def encode(self, image: torch.Tensor, index: int, ready: torch.cuda.Event | None = None) -> list[EncodedVideo]: ...

    def prepare(self, image: torch.Tensor, ready: torch.cuda.Event | None = None) -> Any: ...

    def encode_picture(self, picture: Any, index: int) -> list[EncodedVideo]: ...

    def flush(self) -> list[EncodedVideo]: ...


def open_video_encoder(
    kind: str, width: int, height: int, device: torch.device, settings: H264Settings | None = None
) -> tuple[VideoEncoder, str]:
    """(encoder, one line saying which one was chosen and why)."""
    if kind not in ENCODERS:
        raise ValueError(f"unknown encoder {kind!r}; choose one of {', '.join(ENCODERS)}")
    if kind == "x264":
        return X264Encoder(width, height, settings), "encoder: x264 (libx264, requested)"
    try:
        encoder = NvencEncoder(width, height, device, settings)
        return encoder, "encoder: nvenc (PyNvVideoCodec, from device memory)"
    except NvencUnavailable as exc:
        if kind == "nvenc":
            raise
        return X264Encoder(width, height, settings), f"encoder: x264 (libx264); NVENC unavailable: {exc}"
