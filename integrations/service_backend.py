"""The remote backend of the pipecat video service: a session of the live service (``apps.serve``), driven over its
public API as any remote client does: ``POST /sessions`` (with a preview), the push WebSocket, WHEP, ``DELETE``.

What each picture shows comes with it (``streaming.picture_tags``, read by ``integrations.whep_receiver``): whether it
speaks, its segment, its audio. So a speech picture is emitted with exactly its own samples, a segment's end is known
when a picture of a later segment is shown (the service's own playback rule, ``streaming.playback``), and pictures go
out on the line of the stream's own clock (``integrations.playout``), to which the video service's slot deadlines are
locked (``phase``). A slot shows the picture due then; behind (a late picture was shown a slot late), an idle picture is
let go to catch up, speech only past ``MAX_BEHIND`` slots. After an interrupt the speech pictures of every segment it
cut show as the last idle picture, silent, until pictures of later speech come.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from integrations.avatar_backend import Refused, Shown
from integrations.push_client import PushClient
from integrations.whep_receiver import AUDIO_RATE, Received, WhepReceiver

MAX_BEHIND = 5
"""Slots a speech picture may be shown late before it is let go: a stalled bot catches up."""
AUDIO_LATE_SLOTS = 2
"""Slots a picture due without all its audio waits for it (then it goes with silence where the audio was lost)."""
ANSWER_WAIT_S = 2.0
"""Seconds speech pictures stay silent waiting for the service to answer an interrupt (it names what it cut)."""
HTTP_TIMEOUT_S = 10.0
GREY = 128


@dataclass
class BackendStats:
    """What the backend let go: pictures beyond ``max_held``, idle pictures to catch up, speech pictures past
    ``MAX_BEHIND``, and speech pictures an interrupt silenced."""

    dropped: int = 0
    skipped_idle: int = 0
    skipped_speech: int = 0
    silenced: int = 0


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
        self.stats = BackendStats()
        self._idle_rgb: bytes | None = None
        self._shown_through = -1
        """Every segment below the latest picture shown has ended in the pictures."""
        self._answer: tuple[int, float] | None = None
        """While an interrupt waits for its answer: (answers to wait for, when to stop waiting)."""
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

    async def push_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        await self.push.send_audio(pcm, sample_rate, channels, wanted)

    def interrupt(self) -> None:
        self._interrupts += 1
        self._answer = (self._interrupts, time.monotonic() + ANSWER_WAIT_S)
        asyncio.ensure_future(self.push.interrupt())

    async def end_segment(self) -> int | None:
        return await self.push.end_segment()

    def shown(self, segment: int) -> bool:
        return self._shown_through >= segment

    def phase(self) -> float | None:
        """When the stream's slot 0 is shown (``integrations.playout``): the slot deadlines' phase."""
        return None if self.receiver is None else self.receiver.playout.origin

    def next(self) -> Shown | None:
        receiver = self.receiver
        pictures = receiver.pictures
        while len(pictures) > self._max_held:
            self._let_go(pictures.popleft())
            self.stats.dropped += 1
        slot = receiver.playout.slot_at(time.monotonic())
        if slot is None or not pictures:
            return None
        while len(pictures) > 1 and pictures[0].slot < slot:
            speaks = self._speaks(pictures[0])
            if speaks and slot - pictures[0].slot <= MAX_BEHIND:
                break
            self._let_go(pictures.popleft())
            if speaks:
                self.stats.skipped_speech += 1
            else:
                self.stats.skipped_idle += 1
        head = pictures[0]
        if head.slot > slot or (not receiver.complete(head.slot) and slot - head.slot < AUDIO_LATE_SLOTS):
            return None
        pictures.popleft()
        audio = receiver.take_audio(head.slot)
        self._note(head)
        if self._speaks(head):
            return Shown(head.slot, head.rgb(), audio)
        if head.tag.speech:
            self.stats.silenced += 1
            return Shown(head.slot, self._idle_rgb or head.rgb(), None)
        self._idle_rgb = head.rgb()
        return Shown(head.slot, self._idle_rgb, None)

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
        self.receiver = self.push = None
        self.session_id = None

    def _let_go(self, picture: Received) -> None:
        self.receiver.take_audio(picture.slot)
        self._note(picture)

    def _note(self, picture: Received) -> None:
        """A picture was shown or let go: the segments below its own have ended in the pictures."""
        if not picture.tag.repeat:
            self._shown_through = max(self._shown_through, picture.tag.segment - 1)

    def _speaks(self, picture: Received) -> bool:
        """Whether a picture speaks: a speech picture of a segment no answered interrupt cut, and none unanswered."""
        if not picture.tag.speech:
            return False
        if self._answer is not None:
            wanted, give_up = self._answer
            if self.push.interrupts_answered < wanted and time.monotonic() < give_up:
                return False
            self._answer = None
        return picture.tag.segment > self.push.cut_through
