"""The live clock: which frames are due, how far ahead of it a live session works, where new speech goes. Pure
functions.

A live session's timeline is continuous: frame i is shown at ``anchor + i/25``. Pushed speech
can only be appended to the audio already committed, and a frame is final only once the audio
``speech_depth`` frames after it has arrived (the rest of its 200 ms HuBERT hop, the next
window's cross-fade, the 80 ms look-ahead). So speech pushed at wall time t is shown no
earlier than ``t + depth + lead`` (the lead covers the GPU work and a margin), and no later
either: silence is committed just in time (only the samples that make the next frames final),
never ahead, and speech that would otherwise start earlier than it can be ready is placed
exactly that far ahead of the clock. Every utterance then has the same latency, whatever
the phase of the 200 ms hop grid when it arrives.

Sessions sharing a GPU keep in step: each clock starts on the runtime's window grid, and a live
session's window runs only once its first frame is within the lead of the clock. Every
session's window for a hop then runs in the same tick, as one batch, however out of phase
their clients connect and push.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.audio.hubert import CHUNK_SAMPLES, HOP_SAMPLES, LEAD_ZEROS
from engine.timebase import FPS, HOP_FRAMES, SAMPLES_PER_FRAME

LOOKAHEAD_FRAMES = (CHUNK_SAMPLES - LEAD_ZEROS - HOP_SAMPLES) / SAMPLES_PER_FRAME
"""2.125: the audio after a hop that its HuBERT chunk needs (2 frames and 80 samples)."""
RESYNC_FRAMES = 25
"""A live clock more than this many frames behind (an overloaded GPU, a CPU) restarts from the next frame instead of
bursting."""


def frames_due(now: float, anchor: float | None, fps: int = FPS) -> float:
    """Frames the session's clock has shown by ``now`` (0 before its first frame was ready)."""
    return 0.0 if anchor is None else max(now - anchor, 0.0) * fps


def frame_deadline(anchor: float, index: int, fps: int = FPS) -> float:
    """Wall time by which frame ``index`` must be ready: the clock shows it then."""
    return anchor + index / fps


def on_grid(t: float, origin: float, period: float) -> float:
    """The first instant at or after ``t`` on the grid ``origin + k * period``."""
    return origin + math.ceil((t - origin) / period - 1e-9) * period


@dataclass(frozen=True)
class Lead:
    """How far ahead of its clock (in frames) a live session keeps its final frames.

    ``compute``: the GPU time one hop takes at the current load (measured at warm-up; 0 where
    nothing was measured); ``margin``: slack on top of it for jitter in pushes and ticks.
    """

    compute: float
    margin: float

    @property
    def frames(self) -> float:
        """Idle silence keeps final frames at least this far ahead; new speech is placed this far beyond its depth."""
        return self.compute + self.margin

    @property
    def hold(self) -> float:
        """After speech, silence waits until the final frames are only this far ahead (half the margin left), so a
        push running late by up to half the margin is not padded mid-sentence, while frames made from silence
        committed at the end of an utterance are still ready before the clock shows them."""
        return self.compute + self.margin / 2


def speech_depth(valid: int, held: int, hop: int = HOP_FRAMES) -> float:
    """Frames of audio that must follow a frame before it is final, at worst (12.125 at overlap 75: 485 ms; 5.125 in the
    low-latency mode: 205 ms).

    A frame is emitted by the first window whose stop, less the frames it ``held`` for the next cross-fade, lies
    beyond it; that window needs features up to its stop, i.e. HuBERT hops (``hop`` frames each) up to there plus
    the look-ahead. The worst case is a frame at the start of a window's emitted range: ``valid + held`` frames,
    up to one hop less one frame of rounding when ``valid`` is not a whole number of hops, and the look-ahead.
    """
    rounding = 0 if valid % hop == 0 else hop - 1
    return valid + held + rounding + LOOKAHEAD_FRAMES


def needs_idle(produced: int, due: float, lead: Lead, speech_tail: bool) -> bool:
    """Whether a live session with no complete chunk waiting needs silence now (``produced``: frames final so far).

    Silence is committed just in time, never ahead: speech pushed while idling then starts as
    early as its frames can be ready, so idle time never delays speech and latency does not
    ratchet up. While the last committed audio is speech, silence waits for ``lead.hold``.
    """
    return produced < due + (lead.hold if speech_tail else lead.frames)


def window_due(produced: int, due: float, lead: Lead) -> bool:
    """Whether a live session's next window (its first frame: ``produced``) should run now: when idle silence would be
    committed (the clock within ``lead`` of it); earlier it would only wait in the queue, unbatched."""
    return needs_idle(produced, due, lead, speech_tail=False)


def window_due_at(anchor: float, produced: int, lead: Lead, fps: int = FPS) -> float:
    """Wall time at which a live session's next window (its first frame: ``produced``) falls due (``window_due``)."""
    return anchor + (produced - lead.frames) / fps


def speech_start(committed: int, due: float, lead: Lead, depth: float) -> int:
    """Sample (model rate, on the stream's own timeline) where speech arriving now begins.

    Right after the committed audio, unless that would show it before its frames can be final:
    then at ``due + depth + lead`` frames (the gap is filled with silence). ``due`` is on the same
    timeline as ``committed`` (stream frames).
    """
    return max(committed, math.ceil((due + depth + lead.frames) * SAMPLES_PER_FRAME))
