"""Software H.264 with libx264 through PyAV: colour conversion on the frame's device, one pinned copy to the host.

The RGB -> I420 conversion runs in torch where the frame already is (the GPU in production), on
the encoder's own stream after the frame's event, so only 1.5 bytes per pixel cross the bus, in
one copy into a page-locked buffer that is reused for every frame. libx264 runs the session's preset
(ultrafast unless its output settings say otherwise) with zerolatency: no B-frames and no lookahead,
so each call returns the packet of the frame it was given: no encoder delay to hide.
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import torch
from av.video.frame import PictureType

from engine.timebase import FPS
from streaming.encoders.colour import rgb_to_i420
from streaming.encoders.h264 import EncodedVideo, H264Settings, KeyframeRequests, level_for
from streaming.encoders.ordering import order_after
from streaming.frames import check_size

# VUI colour description: ITU-R BT.709 primaries, transfer and matrix, limited range.
BT709, LIMITED_RANGE = 1, 1


def live_options(settings: H264Settings, width: int, height: int) -> dict[str, str]:
    """libx264 options of a live stream: zerolatency (with the psy tune), the level for the size, the VBV, and for
    CBR the HRD with filler; High always uses the 8x8 transform, so its streams say High at every preset."""
    bitrate, buffer = settings.bitrate_for(width, height) // 1000, settings.buffer_for(width, height) // 1000
    tune = "zerolatency" if settings.tune == "zerolatency" else f"{settings.tune},zerolatency"
    params = f"scenecut=0:open-gop=0:vbv-maxrate={bitrate}:vbv-bufsize={buffer}"
    if settings.cbr:
        params += ":nal-hrd=cbr:filler=1"
    if settings.profile == "high":
        params += ":8x8dct=1"
    return {"tune": tune, "level": str(level_for(width, height)), "x264-params": params}


class X264Encoder:
    """Encode (H, W, 3) uint8 RGB tensors to Annex-B H.264 access units, one per frame, in order."""

    name = "x264"

    def __init__(self, width: int, height: int, settings: H264Settings | None = None, live: bool = True) -> None:
        check_size(width, height)
        self.width, self.height = width, height
        self.settings = settings or H264Settings()
        self.keyframes = KeyframeRequests()
        self._context = self._open(live)
        self._host: torch.Tensor | None = None
        self._stream: torch.cuda.Stream | None = None

    def _open(self, live: bool) -> av.VideoCodecContext:
        settings = self.settings
        context = av.CodecContext.create("libx264", "w")
        context.width, context.height, context.pix_fmt = self.width, self.height, "yuv420p"
        context.time_base = Fraction(1, FPS)
        context.framerate = FPS
        context.gop_size = settings.gop
        context.max_b_frames = 0
        context.thread_count = settings.threads
        context.colorspace = context.color_primaries = context.color_trc = BT709
        context.color_range = LIMITED_RANGE
        options = {"preset": settings.preset, "forced-idr": "1", "x264-params": "scenecut=0:open-gop=0"}
        if live:
            options |= live_options(settings, self.width, self.height)
            context.bit_rate = settings.bitrate_for(self.width, self.height)
            context.profile = settings.profile.capitalize()
        if settings.crf is not None:
            options["crf"] = str(settings.crf)
        context.options = options
        context.open()
        return context

    def encode(self, image: torch.Tensor, index: int, ready: torch.cuda.Event | None = None) -> list[EncodedVideo]:
        """Encode frame ``index``; an IDR when one is due or was requested. ``ready``: the event after which a device
        image is complete (a runtime frame's); without it, all work queued on the current stream is waited for."""
        return self.encode_picture(self.prepare(image, ready), index)

    def prepare(self, image: torch.Tensor | np.ndarray, ready: torch.cuda.Event | None = None) -> np.ndarray:
        """The encoder's input for one frame, made once however often it is encoded: a host I420 array of its own
        (an (H * 3/2, W) uint8 array that already is one is taken as it is)."""
        if isinstance(image, np.ndarray):
            if image.shape != (self.height * 3 // 2, self.width) or image.dtype != np.uint8:
                raise ValueError(
                    f"this encoder takes {self.width}x{self.height} I420 pictures, got {image.shape} {image.dtype}"
                )
            return image
        if tuple(image.shape[:2]) != (self.height, self.width):
            raise ValueError(f"this encoder takes {self.width}x{self.height} frames, got {tuple(image.shape)}")
        return self._i420_on_host(image, ready).copy()

    def encode_picture(self, picture: np.ndarray, index: int) -> list[EncodedVideo]:
        """Encode a prepared picture as frame ``index`` (the same picture again repeats it: the shed frame's
        stand-in)."""
        frame = av.VideoFrame.from_numpy_buffer(picture, format="yuv420p")
        frame.pts = index
        frame.time_base = self._context.time_base
        if self.keyframes.take(index):
            frame.pict_type = PictureType.I
        return self._packets(self._context.encode(frame))

    def flush(self) -> list[EncodedVideo]:
        """Drain the encoder at the end of the stream."""
        return self._packets(self._context.encode(None))

    def _i420_on_host(self, image: torch.Tensor, ready: torch.cuda.Event | None) -> np.ndarray:
        """The I420 planes as a host array; a device image is converted on this encoder's stream and copied once
        into a reused pinned buffer."""
        if image.device.type == "cpu":
            return rgb_to_i420(image).numpy()
        if self._stream is None:
            self._stream = torch.cuda.Stream(image.device)
        order_after(self._stream, ready)
        with torch.cuda.stream(self._stream):
            i420 = rgb_to_i420(image)
            if self._host is None:
                self._host = torch.empty(i420.shape, dtype=torch.uint8, pin_memory=True)
            self._host.copy_(i420, non_blocking=True)
        self._stream.synchronize()
        return self._host.numpy()

    @staticmethod
    def _packets(packets: list[av.Packet]) -> list[EncodedVideo]:
        return [EncodedVideo(int(p.pts), bytes(p), bool(p.is_keyframe)) for p in packets]
