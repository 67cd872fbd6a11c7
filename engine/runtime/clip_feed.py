"""A clip pushed whole into a session that is not live: in pieces as fast as the session's lead takes them, then the
session is ended. What ``apps.render`` and the service's render jobs (``serving.core``) both do with their clip."""

from __future__ import annotations

import numpy as np

from engine.runtime.session import Session

PIECE_SECONDS = 0.2
"""Audio pushed per call: each call waits (``block``) until the session has room for it."""


def feed_clip(session: Session, pcm: np.ndarray, rate: int, channels: int | None = None) -> None:
    """Push ``pcm`` (samples at ``rate``, interleaved ``channels`` or mono) into ``session``, then end it. Whatever
    the session raises meanwhile (closed, refused audio) closes it and is raised."""
    hop = max(1, round(rate * PIECE_SECONDS))
    try:
        for lo in range(0, len(pcm), hop):
            session.push_audio(pcm[lo : lo + hop], rate, channels, block=True)
        session.end()
    except BaseException:
        session.close()
        raise
