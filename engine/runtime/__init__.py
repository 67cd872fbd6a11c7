"""The serving runtime: one loop owns the GPU and batches the work of every session.

from engine.runtime import Runtime
runtime = Runtime.from_checkpoints(None)          # random weights; warms up, starts the loop
session = runtime.open_session(avatar, live=True)
"""

from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import AdmissionError, AudioError, Backpressure, OutOfMemoryAtStart, SessionClosed

__all__ = [
    "AdmissionError",
    "AudioError",
    "Backpressure",
    "OutOfMemoryAtStart",
    "Runtime",
    "RuntimeConfig",
    "SessionClosed",
]


def __getattr__(name: str):
    """``Runtime`` is imported on first use: the session module imports this package's config and errors."""
    if name == "Runtime":
        from engine.runtime.runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'engine.runtime' has no attribute {name!r}")
