"""The errors a session or the runtime raises to its callers, each saying what to do instead."""

from __future__ import annotations

from engine.audio.pcm import PcmError


class AudioError(PcmError):
    """Pushed audio that cannot be used (NaN/inf, absurd rate, wrong dtype or shape); the session goes on."""


class Backpressure(RuntimeError):
    """More audio than the session's lead allows is waiting; push later, or push with ``block=True``."""


class AdmissionError(RuntimeError):
    """The runtime cannot serve another live session in real time."""


class OutOfMemoryAtStart(RuntimeError):
    """The GPU lacks the memory a runtime needs for the sessions asked; raised before warm-up, in one line."""


class SessionClosed(RuntimeError):
    """The session was closed (or failed); open a new one."""
