"""The live clock: which frames are due, and when a live session needs idle silence. Pure functions."""

from __future__ import annotations

from engine.session import FPS


def frames_due(now: float, anchor: float | None, fps: int = FPS) -> float:
    """Frames the session's clock has shown by ``now`` (0 before its first frame was ready)."""
    return 0.0 if anchor is None else max(now - anchor, 0.0) * fps


def frame_deadline(anchor: float, index: int, fps: int = FPS) -> float:
    """Wall time by which frame ``index`` must be ready: the clock shows it then."""
    return anchor + index / fps


RESYNC_FRAMES = 25
"""A live clock more than this many frames behind (an overloaded GPU, a CPU) restarts from the next frame instead of bursting."""
SPEECH_HOLD_FRAMES = 2
"""After speech, silence waits until the frames are this close to their deadline: a late push is not cut off."""


def needs_idle(produced: int, due: float, min_lead: int, speech_tail: bool) -> bool:
    """Whether a live session with no complete chunk waiting needs one hop of silence now.

    Silence is committed just in time, never ahead: speech pushed while idling takes the place of
    silence not yet committed, so idle time never delays speech and latency does not ratchet up.
    While the last committed audio is speech, silence waits until the deadline is
    ``SPEECH_HOLD_FRAMES`` away, so a pusher running a little late is not padded mid-sentence.
    """
    return produced < due + (SPEECH_HOLD_FRAMES if speech_tail else min_lead)
