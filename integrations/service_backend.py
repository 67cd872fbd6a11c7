"""The remote backend of the pipecat video service: a session of the live service (``apps.serve``), driven over its
public API as any remote client does: ``POST /sessions`` (with a preview), the push WebSocket, WHEP, ``DELETE``.

Which frames speak comes from the push socket's playback events, each applied at the picture the service showed
when it sent it: a frame's release time on the bot's clock is the stream's origin plus its index, and an event
arrives ``EVENT_LEAD_FRAMES`` before the pictures of its time do at best (the encoder, jitter buffer and decoder that
the least-delayed frame still went through). Audio is emitted while a segment plays. After an interrupt the pictures in
flight belong to the cut
speech, so the slots show the last idle picture until the service has answered the interrupt and no segment it cut
still plays in the pictures (at most ``RESUME_TIMEOUT_S``), then take the stream again from what arrives next.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from engine.timebase import FPS
from integrations.avatar_backend import Refused, Shown
from integrations.push_client import PushClient
from integrations.slots import SlotPicker
from integrations.whep_receiver import AUDIO_RATE, WhepReceiver

SAMPLES_PER_SLOT = AUDIO_RATE // FPS
EVENT_LEAD_FRAMES = 3
RESUME_TIMEOUT_S = 2.0
HTTP_TIMEOUT_S = 10.0
GREY = 128


class ServiceBackend:
    """One session of the service at ``url``, its push connection and its WHEP viewer."""

    def __init__(self, url: str, avatar: str, token: str | None, options: dict[str, Any], max_held: int) -> None:
        self.url = url.rstrip("/")
        self.spec = {
            "avatar": avatar,
            "preview": True,
            "end_on_disconnect": True,  # a bot that dies frees its session
            **{k: v for k, v in options.items() if v is not None},
        }
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._max_held = max_held
        self.size: tuple[int, int] | None = None
        self.audio_rate = AUDIO_RATE
        self.session_id: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self.push: PushClient | None = None
        self.receiver: WhepReceiver | None = None
        self._picker: SlotPicker | None = None
        self._resume_after: tuple[int, int, float] | None = None
        """While resuming from an interrupt: (interrupts answered to wait for, highest segment named before it,
        give-up time)."""
        self._interrupts = 0

    def first_picture(self) -> bytes | None:
        """Mid grey at the session's size, once it is known."""
        return None if self.size is None else bytes([GREY]) * (self.size[0] * self.size[1] * 3)

    async def open(self) -> None:
        self._http = aiohttp.ClientSession(headers=self._headers, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        try:
            async with self._http.post(f"{self.url}/sessions", json=self.spec) as answer:
                if answer.status != 201:
                    raise Refused(f"the service refused the session ({answer.status}): {(await answer.text()).strip()}")
                session = await answer.json()
        except (TimeoutError, aiohttp.ClientError) as exc:
            await self._http.close()
            raise Refused(f"the service at {self.url} could not be reached: {exc!r}") from exc
        except Refused:
            await self._http.close()
            raise
        self.session_id, self.size = session["id"], tuple(session["size"])
        try:
            self.push = await PushClient.connect(self._http, session["urls"]["push"])
            self.receiver = await WhepReceiver.connect(self._http, session["urls"]["whep"])
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            await self.close()
            raise Refused(f"the service's session {session['id']} could not be joined: {exc!r}") from exc
        self._picker = SlotPicker(self.receiver, self._max_held)

    async def push_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        await self.push.send_audio(pcm, sample_rate, channels, wanted)

    def interrupt(self) -> None:
        self._interrupts += 1
        self._resume_after = (self._interrupts, self.push.highest_segment, time.monotonic() + RESUME_TIMEOUT_S)
        asyncio.ensure_future(self.push.interrupt())
        self._picker.clear()
        self.receiver.drop()

    async def end_segment(self) -> int | None:
        return await self.push.end_segment()

    def shown(self, segment: int) -> bool:
        return self.push.finished_through >= segment

    def next(self) -> Shown | None:
        if self._resuming():
            dropped = self.receiver.take_ready()
            if dropped:
                self._settle(dropped[-1].index)
            self._picker.clear()
            self.receiver.drop()
            return None
        frame = self._picker.next()
        if frame is None:
            return None
        self._settle(frame.index)
        audio = self.receiver.take_audio(SAMPLES_PER_SLOT)
        return Shown(frame.index, frame.rgb(), audio if self.push.playing else None)

    async def close(self) -> None:
        """Leave the stream and delete the session on the service."""
        if self.receiver is not None:
            await self.receiver.close()
        if self.push is not None:
            await self.push.close()
        if self._http is not None:
            if self.session_id is not None:
                try:
                    async with self._http.delete(f"{self.url}/sessions/{self.session_id}"):
                        pass
                except (TimeoutError, aiohttp.ClientError):
                    pass  # the service is gone or busy: nothing more a client can do
            await self._http.close()
        self.receiver = self.push = self._picker = None
        self.session_id = None

    def _settle(self, index: int) -> None:
        """Apply the playback events sent by the time the service showed frame ``index``."""
        self.push.settle(self.receiver.origin + (index - EVENT_LEAD_FRAMES) / FPS)

    def _resuming(self) -> bool:
        """Whether the slots still wait for the service to have cut the interrupted speech."""
        if self._resume_after is None:
            return False
        answered, named, give_up = self._resume_after
        cut = max(named, -1 if self.push.interrupted_segment is None else self.push.interrupted_segment)
        still_playing = any(segment <= cut for segment in self.push.playing)
        if (self.push.interrupts_answered >= answered and not still_playing) or time.monotonic() > give_up:
            self._resume_after = None
        return self._resume_after is not None
