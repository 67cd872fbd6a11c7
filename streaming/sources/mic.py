"""The microphone (any PortAudio input device, through sounddevice) as a session's live audio.

PortAudio calls back every 20 ms on its own thread; the callback only queues a copy of the
block (it must never block), and a pusher thread hands blocks to the session. Blocks that
cannot be queued because the session fell behind are dropped and counted.
"""

from __future__ import annotations

import logging
import queue
import threading

import numpy as np

from streaming.frames import AudioSink

log = logging.getLogger(__name__)
BLOCK_SECONDS = 0.02
QUEUE_BLOCKS = 50


class MicrophoneUnavailable(RuntimeError):
    """No usable input device (PortAudio missing, no device, or the device refused the format)."""


class MicrophoneSource:
    """Capture ``device`` (name or index; None: the default input) at ``rate`` and push it into ``session``."""

    def __init__(
        self, session: AudioSink, device: str | int | None = None, rate: int = 48_000, channels: int = 1
    ) -> None:
        self.session, self.device, self.rate, self.channels = session, device, rate, channels
        self.blocks_pushed = 0
        self.blocks_dropped = 0
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(QUEUE_BLOCKS)
        self._stream = None
        self._thread = threading.Thread(target=self._push_loop, name="mic-source", daemon=True)

    def start(self) -> MicrophoneSource:
        """Open the input device and start pushing."""
        try:
            import sounddevice
        except OSError as exc:
            raise MicrophoneUnavailable(
                f"PortAudio is not installed ({exc}); on Debian: apt-get install libportaudio2"
            ) from exc
        try:
            self._stream = sounddevice.InputStream(
                samplerate=self.rate,
                channels=self.channels,
                dtype="float32",
                blocksize=round(self.rate * BLOCK_SECONDS),
                device=self.device,
                callback=self._callback,
            )
            self._stream.start()
        except (sounddevice.PortAudioError, ValueError) as exc:
            raise MicrophoneUnavailable(f"cannot open input device {self.device!r}: {exc}") from exc
        log.info("microphone: %s at %d Hz", self._stream.device, self.rate)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the device and stop pushing."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _callback(self, indata: np.ndarray, frames: int, time, status) -> None:
        try:
            self._queue.put_nowait(indata.copy())
        except queue.Full:
            self.blocks_dropped += 1

    def _push_loop(self) -> None:
        while (block := self._queue.get()) is not None:
            try:
                self.session.push_audio(block, self.rate, self.channels, block=True)
                self.blocks_pushed += 1
            except Exception:
                log.exception("microphone: pushing audio failed")
                return
