"""Waiting out backpressure: a push a full session refuses goes in once there is room, or is given up once unwanted."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from engine.runtime.backpressure import RETRY_S, push_when_room
from engine.runtime.config import RuntimeConfig
from engine.runtime.session import Session

RATE = 16_000


def full_session() -> Session:
    """A live session already holding its whole lead (1 s) of audio: the next push is refused."""
    session = Session(0, "synthetic", True, 75, 0, RuntimeConfig(progress=False, max_lead_seconds=1.0), lambda: None)
    session.push_audio(np.zeros(RATE, np.float32), RATE)
    return session


def test_a_refused_push_goes_in_once_the_session_has_room_and_not_before() -> None:
    async def scenario() -> tuple[bool, float]:
        session = full_session()
        started = time.monotonic()
        asyncio.get_running_loop().call_later(0.2, session.interrupt)  # the pending audio is dropped: room
        pushed = await push_when_room(lambda: session.push_audio(np.zeros(RATE // 2, np.float32), RATE))
        assert session.stats()["lead_seconds"] == 0.5, "the push that waited is the one the session holds"
        return pushed, time.monotonic() - started

    pushed, waited = asyncio.run(scenario())
    assert pushed and 0.2 <= waited < 0.2 + RETRY_S + 0.2


def test_a_push_no_longer_wanted_is_given_up_while_it_waits() -> None:
    async def scenario() -> tuple[bool, int]:
        session, tries = full_session(), []

        def push() -> None:
            tries.append(time.monotonic())
            session.push_audio(np.zeros(RATE // 2, np.float32), RATE)

        wanted = asyncio.Event()
        wanted.set()
        asyncio.get_running_loop().call_later(0.2, wanted.clear)  # an interruption: the audio is stale
        return await push_when_room(push, wanted.is_set), len(tries)

    pushed, tries = asyncio.run(scenario())
    assert not pushed and 2 <= tries <= 0.2 / RETRY_S + 2, "tried again every RETRY_S until it was not wanted"
