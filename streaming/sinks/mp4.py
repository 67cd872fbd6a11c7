"""MP4 file sink: records a live session's shared H.264 stream and its audio (AAC 48 kHz) to a file.

A file has no clock, so frames are written as they are released (already paced by the
output); the file's times come from frame indices, so it plays back at exactly 25 fps.
It starts on a keyframe (asking the encoder for one when it is attached mid-stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from streaming.output import EncodedFrame
from streaming.sinks.mux import Muxer

log = logging.getLogger(__name__)


class Mp4Sink:
    """Write the released frames to ``path`` until the output closes it."""

    name = "mp4"

    def __init__(self, path: str | Path, request_keyframe: Callable[[], None]) -> None:
        self.path = Path(path)
        self._request_keyframe = request_keyframe
        self._muxer: Muxer | None = None
        self._asked = False
        self.frames_sent = 0
        self.frames_dropped = 0

    def send(self, frame: EncodedFrame) -> None:
        """Write one frame (frames before the first keyframe are dropped)."""
        if self._muxer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._muxer = Muxer(str(self.path), "mp4", frame.width, frame.height)
        if self._muxer.write(frame):
            self.frames_sent += 1
            return
        self.frames_dropped += 1
        if not self._asked:
            self._request_keyframe()
            self._asked = True

    def close(self) -> None:
        """Finish the file (idempotent)."""
        if self._muxer is not None:
            self._muxer.close()
            self._muxer = None
            log.info("mp4: wrote %d frames to %s", self.frames_sent, self.path)

    def stats(self) -> dict[str, int | float]:
        """Frames written and dropped."""
        return {"frames_sent": self.frames_sent, "frames_dropped": self.frames_dropped}
