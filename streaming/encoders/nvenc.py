"""Hardware H.264 with NVENC through PyNvVideoCodec (>= 2.2), straight from device memory.

RGB -> NV12 runs on the GPU (torch) and the NV12 tensor is handed to the encoder as it is
(``__cuda_array_interface__``, no host copy). The conversion runs on a CUDA stream of the
encoder's own, which is also the stream NVENC is given, so the encoder reads the NV12 planes
after the kernels that wrote them and no other work has to wait. Low-latency tuning, CBR, no B-frames, an IDR
every ``keyframe_seconds`` and on demand (FORCEIDR + OUTPUT_SPSPPS), SPS/PPS repeated.

Two ways this is unavailable, both reported as ``NvencUnavailable`` with what to do:
PyNvVideoCodec raises RuntimeError (not ImportError) at import when the NVIDIA encode library
(libnvidia-encode.so.1) is missing, and data-centre GPUs (A100, H100, H200) have no NVENC
engine at all, so opening an encode session fails there.
"""

from __future__ import annotations

from types import ModuleType

import torch

from engine.timebase import FPS
from streaming.encoders.colour import rgb_to_nv12
from streaming.encoders.h264 import EncodedVideo, H264Settings, KeyframeRequests, is_idr
from streaming.encoders.ordering import order_after
from streaming.frames import check_size

NO_NVENC_GPUS = "data-centre GPUs (A100, H100, H200, ...) have no NVENC"


class NvencUnavailable(RuntimeError):
    """NVENC cannot be used on this machine; the message says why and what to use instead."""


def load_pynvvideocodec() -> ModuleType:
    """Import PyNvVideoCodec, turning its import-time failures into one clear NvencUnavailable."""
    try:
        import PyNvVideoCodec
    except ImportError as exc:
        raise NvencUnavailable("PyNvVideoCodec is not installed (pip install 'ditto-live[nvenc]')") from exc
    except RuntimeError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NvencUnavailable(
            f"PyNvVideoCodec cannot load the NVIDIA encoder library: {first_line} (no NVIDIA driver with video "
            "capability here)"
        ) from exc
    return PyNvVideoCodec


class NvencEncoder:
    """Encode (H, W, 3) uint8 RGB CUDA tensors to Annex-B H.264 access units with NVENC."""

    name = "nvenc"

    def __init__(self, width: int, height: int, device: torch.device, settings: H264Settings | None = None) -> None:
        check_size(width, height)
        if device.type != "cuda" or not torch.cuda.is_available():
            raise NvencUnavailable(f"NVENC needs a CUDA device, the frames are on {device}")
        self.width, self.height = width, height
        self.settings = settings or H264Settings()
        self.keyframes = KeyframeRequests()
        self.device = device
        self._nvc = load_pynvvideocodec()
        self._stream = torch.cuda.Stream(device)
        bitrate = self.settings.bitrate_for(width, height)
        try:
            self._encoder = self._nvc.CreateEncoder(
                width,
                height,
                "NV12",
                False,
                codec="h264",
                preset="P1",
                tuning_info="ultra_low_latency",
                rc="cbr",
                fps=FPS,
                gop=self.settings.gop,
                idrperiod=self.settings.gop,
                bf=0,
                bitrate=bitrate,
                maxbitrate=bitrate,
                vbvbufsize=self.settings.buffer_for(width, height),
                repeatspspps=1,
                gpu_id=device.index or 0,
                cudastream=self._stream.cuda_stream,
            )
        except Exception as exc:
            name = torch.cuda.get_device_name(device)
            raise NvencUnavailable(
                f"NVENC could not open an encode session on {name}: {exc} ({NO_NVENC_GPUS})"
            ) from exc
        flags = self._nvc.NV_ENC_PIC_FLAGS
        self._force_idr = int(flags.FORCEIDR) | int(flags.OUTPUT_SPSPPS)

    def encode(self, image: torch.Tensor, index: int, ready: torch.cuda.Event | None = None) -> list[EncodedVideo]:
        """Encode frame ``index``; NVENC may hand back earlier frames' packets (its output delay). ``ready``: the
        event after which the image is complete (a runtime frame's); without it, the current stream's work is waited
        for."""
        if tuple(image.shape[:2]) != (self.height, self.width):
            raise ValueError(f"this encoder takes {self.width}x{self.height} frames, got {tuple(image.shape)}")
        image = image.to(self.device)
        order_after(self._stream, ready)
        image.record_stream(self._stream)
        with torch.cuda.stream(self._stream):
            nv12 = rgb_to_nv12(image)
            params = self._nvc.NV_ENC_PIC_PARAMS()
            params.inputTimeStamp = index
            params.encodePicFlags = self._force_idr if self.keyframes.take(index) else 0
            return self._packets(self._encoder.Encode(nv12, params))

    def prepare(
        self, image: torch.Tensor, ready: torch.cuda.Event | None = None
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The encoder's input for one frame: the device image and its event (converted when encoded)."""
        return image, ready

    def encode_picture(self, picture: tuple[torch.Tensor, torch.cuda.Event | None], index: int) -> list[EncodedVideo]:
        """Encode a prepared picture as frame ``index`` (again, to repeat it)."""
        return self.encode(picture[0], index, picture[1])

    def flush(self) -> list[EncodedVideo]:
        """Drain the frames NVENC still holds."""
        return self._packets(self._encoder.EndEncode())

    @staticmethod
    def _packets(packets: list[dict]) -> list[EncodedVideo]:
        out = []
        for packet in packets:
            data = bytes(packet["data"])
            out.append(EncodedVideo(int(packet["timestamp"]), data, is_idr(data)))
        return out
