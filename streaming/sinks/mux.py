"""One FLV or MP4 output through PyAV: the shared H.264 access units plus AAC encoded here from the frames' audio.

A muxer starts on a keyframe (frames before it are refused) and its timeline starts there:
the first frame it writes is pts 0 for video, and the same frame's first audio sample is
pts 0 for audio. Video times are frame counts (1/25 s), audio times sample counts, so the two
can never drift apart. Frames lost upstream leave a gap in both timelines, and writing
resumes at the next keyframe. The H.264 stream is added without an encoder (the packets come from
the shared one); PyAV takes the stream's SPS/PPS from the first keyframe.
"""

from __future__ import annotations

from fractions import Fraction
from typing import BinaryIO

import av

from engine.timebase import FPS
from streaming.encoders.audio import AAC_BITRATE, AAC_BLOCK, LAYOUTS, AudioBlocks
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output import EncodedFrame

VIDEO_TIME_BASE = Fraction(1, FPS)


class Muxer:
    """Write encoded frames to ``target`` (a path, or a file object such as an ``RtmpConnection``) in ``format``
    ("flv" or "mp4") with AAC of ``audio_channels`` channels; a file object stays open after ``close`` (its owner
    closes it)."""

    def __init__(self, target: str | BinaryIO, format: str, width: int, height: int, audio_channels: int = 1) -> None:
        self.container = av.open(target, mode="w", format=format)
        self._video = self.container.add_mux_stream("h264", rate=FPS, width=width, height=height)
        self._video.time_base = VIDEO_TIME_BASE
        self._audio = self.container.add_stream("aac", rate=AUDIO_RATE, layout=LAYOUTS[audio_channels])
        self._audio.bit_rate = AAC_BITRATE
        self._blocks = AudioBlocks(AAC_BLOCK, channels=audio_channels)
        self.first_index: int | None = None
        self._next_index: int | None = None
        self.frames = 0

    def write(self, frame: EncodedFrame) -> bool:
        """Mux one frame; False (nothing written) while waiting for a keyframe, at the start or after a gap."""
        if self.first_index is None:
            if not frame.keyframe:
                return False
            self.first_index = self._next_index = frame.index
        if frame.index != self._next_index:
            if not frame.keyframe:
                return False
            self._mux_audio(self._blocks.skip_to((frame.index - self.first_index) * AUDIO_SAMPLES_PER_FRAME))
        self._next_index = frame.index + 1
        packet = av.Packet(frame.video)
        packet.pts = packet.dts = frame.index - self.first_index
        packet.duration = 1  # one frame, explicit: the track's length must not rest on the muxer's guess
        packet.time_base = VIDEO_TIME_BASE
        packet.is_keyframe = frame.keyframe
        packet.stream = self._video
        self.container.mux(packet)
        self._mux_audio(self._blocks.push(frame.audio))
        self.frames += 1
        return True

    def _mux_audio(self, blocks: list[av.AudioFrame]) -> None:
        for block in blocks:
            self.container.mux(self._audio.encode(block))

    def close(self) -> None:
        """Flush the audio, write the trailer and close the file or connection."""
        try:
            if self.first_index is not None:
                self._mux_audio(self._blocks.flush(pad=False))
                self.container.mux(self._audio.encode(None))
        finally:
            self.container.close()
