"""Play an audio file (WAV, FLAC, MP3, anything PyAV decodes) into a session in real time.

The file is pushed in 200 ms chunks at absolute deadlines (chunk k at anchor + k * 0.2 s), as
a live talker would arrive, so the session sees speech at the pace it plays it. At the end
the session is ended, or with ``loop`` the file starts over (the demo's endless speech).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from engine.audio.files import read_audio
from streaming.clock import Pacer
from streaming.frames import AudioSink

log = logging.getLogger(__name__)
CHUNK_SECONDS = 0.2


class FileSource:
    """Push ``samples`` (N,) or (N, C) at ``rate`` into ``session`` in real time, in a thread of its own."""

    def __init__(self, session: AudioSink, samples: np.ndarray, rate: int, loop: bool = False) -> None:
        if samples.size == 0:
            raise ValueError("the audio to play is empty")
        self.session, self.samples, self.rate, self.loop = session, samples, rate, loop
        self.chunks_pushed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="file-source", daemon=True)

    @classmethod
    def open(cls, session: AudioSink, path: str | Path, loop: bool = False) -> FileSource:
        """A source for an audio file (decoded whole, up front)."""
        samples, rate = read_audio(path)
        return cls(session, samples, rate, loop)

    def start(self) -> FileSource:
        """Start playing."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop pushing (the session is not ended) and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        step = max(1, round(self.rate * CHUNK_SECONDS))
        channels = self.samples.shape[1] if self.samples.ndim == 2 else None
        pacer = Pacer(delay=0.0)
        try:
            while not self._stop.is_set():
                for start in range(0, len(self.samples), step):
                    pacer.wait(self.chunks_pushed * CHUNK_SECONDS)
                    if self._stop.is_set():
                        return
                    self.session.push_audio(self.samples[start : start + step], self.rate, channels, block=True)
                    self.chunks_pushed += 1
                if not self.loop:
                    self.session.end()
                    return
        except Exception:
            log.exception("file source: pushing audio failed")
