"""Waiting out backpressure: the one rule every pusher of audio follows when a session holds its lead.

A live session refuses audio beyond its lead (``Backpressure``, raised by a runtime session and, over the engine core's
socket, by the service's ``serving.sessions.RemoteSession``). A pusher on an event loop does not block a thread for
room: it tries again every ``RETRY_S``, so a client pushing faster than real time is slowed, never dropped, until it
no longer wants the audio pushed (an interruption came meanwhile).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from engine.runtime.errors import Backpressure

RETRY_S = 0.05
"""Seconds between two tries of a refused push: a small share of a session's lead, few requests to the engine core."""


def _always() -> bool:
    return True


async def push_when_room(push: Callable[[], Awaitable[None] | None], wanted: Callable[[], bool] = _always) -> bool:
    """Call ``push`` (a plain or an async call) until no ``Backpressure`` refuses it, waiting ``RETRY_S`` between tries;
    True once pushed, False when ``wanted()`` turned false first. Any other error is the caller's."""
    while wanted():
        try:
            pushed = push()
            if inspect.isawaitable(pushed):
                await pushed
            return True
        except Backpressure:
            await asyncio.sleep(RETRY_S)
    return False
