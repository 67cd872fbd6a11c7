"""Reading back what the sinks produced (a live RTMP stream, a file) and checking A/V sync on the synthetic pattern."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import av
import numpy as np

from streaming.frames import AUDIO_RATE
from tests.streaming.synthetic import is_flash, read_index

ONE_FRAME = 0.04


@dataclass
class Decoded:
    """Decoded pictures (pts, index, flash) and the audio timeline of one stream."""

    video: list[tuple[float, int, bool]] = field(default_factory=list)
    size: tuple[int, int] | None = None
    video_profile: str | None = None
    audio_codec: str | None = None
    audio_rate: int | None = None
    audio_channels: int | None = None
    audio: list[tuple[float, np.ndarray]] = field(default_factory=list)
    error: str | None = None

    @property
    def indices(self) -> list[int]:
        return [index for _, index, _ in self.video]

    def audio_seconds(self) -> float:
        return sum(block.size for _, block in self.audio) / AUDIO_RATE

    def burst_onsets(self) -> list[float]:
        """Times where the loud 1 kHz burst starts in the audio."""
        onsets, quiet_until = [], -1.0
        for start, block in self.audio:
            loud = np.flatnonzero(np.abs(block) > 0.5)
            for k in loud:
                t = start + k / AUDIO_RATE
                if t > quiet_until:
                    onsets.append(t)
                quiet_until = t + 0.1
        return onsets

    def sync_errors(self) -> list[float]:
        """For each flash picture, its distance to the nearest audio burst (seconds)."""
        onsets = np.array(self.burst_onsets())
        flashes = [pts for pts, _, flash in self.video if flash]
        return (
            [float(np.min(np.abs(onsets - pts))) for pts in flashes] if onsets.size else [float("inf")] * len(flashes)
        )


def decode(container: av.container.InputContainer, result: Decoded, last_index: int | None = None) -> None:
    """Demux and decode until ``last_index`` is seen, the stream ends, or the read times out."""
    video = container.streams.video[0]
    result.audio_codec = container.streams.audio[0].codec_context.name if container.streams.audio else None
    try:
        for packet in container.demux():
            for frame in packet.decode():
                if packet.stream is video:
                    rgb = frame.to_ndarray(format="rgb24")
                    result.size = (frame.width, frame.height)
                    result.video_profile = video.codec_context.profile
                    index = read_index(rgb)
                    result.video.append((float(frame.pts * frame.time_base), index, is_flash(rgb)))
                    if index == last_index:
                        return
                else:
                    result.audio_rate, result.audio_channels = frame.sample_rate, len(frame.layout.channels)
                    result.audio.append((float(frame.pts * frame.time_base), frame.to_ndarray()[0]))
    except av.error.FFmpegError as exc:  # nginx sends no EOF: a live read ends on its timeout
        result.error = f"{type(exc).__name__}: {exc}"


def read_file(path: str) -> Decoded:
    result = Decoded()
    with av.open(path) as container:
        decode(container, result)
    return result


class LiveReader:
    """Play an RTMP stream in a thread (opened before the publisher arrives: nginx holds the player)."""

    def __init__(self, url: str, last_index: int | None = None, read_timeout: float = 3.0) -> None:
        self.url, self.last_index, self.read_timeout = url, last_index, read_timeout
        self.result = Decoded()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with av.open(
                self.url, format="flv", timeout=(20, self.read_timeout), options={"rtmp_live": "live"}
            ) as container:
                decode(container, self.result, self.last_index)
        except av.error.FFmpegError as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"

    def join(self, timeout: float = 30.0) -> Decoded:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the RTMP reader did not finish"
        return self.result
