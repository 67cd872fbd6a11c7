"""Audible markers for end-to-end latency: loud tone bursts in quiet speech, made here and found again after the codecs.

A marker is a 1 kHz burst at 0.9 of full scale, starting at its peak (a cosine) so that its
first sample already crosses the threshold; the speech around it is scaled to peak at
``SPEECH_PEAK``, well below the detection threshold, so after AAC or Opus the only samples
above ``THRESHOLD`` are the bursts'. A burst starts a marker when at least ``QUIET`` seconds of
samples below the threshold come before it. Each marker's burst length encodes its number
modulo ``CODES`` (``BURST_BASE + code * BURST_STEP`` seconds), so a marker lost on the way
cannot shift the pairing of every marker after it. The length is read from how many samples
are loud (a sine spends ``LOUD_FRACTION`` of its time above the threshold), so a gap that the
server inserts inside a burst (a push that came late) does not change its code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

THRESHOLD = 0.5
QUIET = 0.25
BURST_LEVEL = 0.9
BURST_HZ = 1000.0
BURST_BASE = 0.04
BURST_STEP = 0.03
CODES = 4
SPEECH_PEAK = 0.25
LOUD_FRACTION = 1 - 2 / math.pi * math.asin(THRESHOLD / BURST_LEVEL)
AAC_PRIMING = 1024
"""Samples of encoder delay in front of FFmpeg's AAC (FLV carries no edit list, so a decoder outputs them)."""


def burst_seconds(number: int) -> float:
    """Length of marker ``number``'s burst."""
    return BURST_BASE + (number % CODES) * BURST_STEP


def burst(number: int, rate: int) -> np.ndarray:
    """Marker ``number``'s burst at ``rate`` Hz, float32."""
    t = np.arange(round(burst_seconds(number) * rate)) / rate
    return (BURST_LEVEL * np.cos(2 * np.pi * BURST_HZ * t)).astype(np.float32)


def code_of(seconds: float) -> int:
    """The marker code (number modulo CODES) a detected burst length stands for."""
    return min(max(round((seconds - BURST_BASE) / BURST_STEP), 0), CODES - 1)


@dataclass(frozen=True)
class Utterance:
    """One pushed utterance: its samples and where its markers start in them (sample offsets)."""

    samples: np.ndarray
    marker_offsets: tuple[int, ...]


def utterance(
    speech: np.ndarray, rate: int, first_number: int, seconds: float, chunk: int, shift: float = 0.0
) -> Utterance:
    """``seconds`` of quiet ``speech`` with a marker at its start and one ``shift`` s after its middle, on ``chunk``
    boundaries.

    The first marker is pushed into an idle session (nothing pushed before it), the second in
    continuous speech (``shift`` moves it within the model's 200 ms hop); markers start on chunk
    boundaries so that the chunk holding a marker's first sample is sent at a known time.
    """
    total = round(seconds * rate / chunk) * chunk
    middle = round((total / 2 + shift * rate) / chunk) * chunk
    room = (BURST_BASE + (CODES - 1) * BURST_STEP + QUIET) * rate
    if middle < room or total - middle < room:
        raise ValueError(
            f"{seconds} s is too short for markers at 0 and {middle / rate:.2f} s (each needs {room / rate:.2f} s)"
        )
    peak = float(np.max(np.abs(speech))) or 1.0
    quiet = np.resize(speech * (SPEECH_PEAK / peak), total).astype(np.float32)
    offsets = (0, middle)
    for k, offset in enumerate(offsets):
        tone = burst(first_number + k, rate)
        quiet[offset : offset + tone.size] = tone
    return Utterance(quiet, offsets)


@dataclass(frozen=True)
class Onset:
    """A detected marker: when its burst starts (seconds on the stream's timeline) and how long its tone sounds."""

    time: float
    seconds: float

    @property
    def code(self) -> int:
        return code_of(self.seconds)


class OnsetDetector:
    """Find marker bursts in audio that arrives in blocks; ``feed`` returns the bursts that have ended."""

    def __init__(self, rate: int, threshold: float = THRESHOLD, quiet: float = QUIET) -> None:
        self.rate, self.threshold, self.quiet = rate, threshold, quiet
        self._start: float | None = None
        self._last_loud = -math.inf
        self._loud = 0

    def feed(self, block: np.ndarray, start: float) -> list[Onset]:
        """Samples ``block`` (mono) whose first sample is at ``start`` seconds; the bursts completed by it."""
        found: list[Onset] = []
        loud = np.flatnonzero(np.abs(np.asarray(block, np.float32).reshape(-1)) > self.threshold)
        for t in start + loud / self.rate:
            if t - self._last_loud >= self.quiet:
                if self._start is not None:
                    found.append(self._burst())
                self._start, self._loud = float(t), 0
            self._last_loud = float(t)
            self._loud += 1
        end = start + np.asarray(block).size / self.rate
        if self._start is not None and end - self._last_loud >= self.quiet:
            found.append(self._burst())
            self._start = None
        return found

    def _burst(self) -> Onset:
        return Onset(self._start, self._loud / self.rate / LOUD_FRACTION)


def find_onsets(samples: np.ndarray, rate: int, start: float = 0.0) -> list[Onset]:
    """Every marker burst in one block of samples (a whole recording)."""
    detector = OnsetDetector(rate)
    return detector.feed(samples, start) + detector.feed(
        np.zeros(math.ceil(QUIET * rate) + 1, np.float32), start + samples.size / rate
    )


def pair(onsets: Iterable[Onset], pushed: Sequence[float], arrived: Sequence[float]) -> list[int | None]:
    """For each detected onset (in order, arriving at ``arrived[i]``), the number of the marker it is, or None.

    Markers are taken in order; an onset is marker n when n is the next unpaired marker whose
    code matches and which was pushed (``pushed[n]``) before the onset arrived.
    """
    result: list[int | None] = []
    next_marker = 0
    for onset, at in zip(onsets, arrived):
        match = None
        for n in range(next_marker, min(next_marker + CODES, len(pushed))):
            if n % CODES == onset.code and pushed[n] <= at:
                match = n
                break
        result.append(match)
        if match is not None:
            next_marker = match + 1
    return result
