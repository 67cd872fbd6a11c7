"""LiveKit Agents avatar: a ``VideoGenerator`` over a runtime session, its worker, and the agent's ``AvatarSession``.

Three pieces, one protocol (``livekit.agents.voice.avatar``):

- ``DittoVideoGenerator``: TTS audio in (``rtc.AudioFrame`` at any rate, ``AudioSegmentEnd`` closing a
  segment), the avatar's frames out at 25 fps (``rtc.VideoFrame`` RGBA, and for speech frames the exact 48 kHz
  audio they speak as ``rtc.AudioFrame``, at the session's audio rate), one ``AudioSegmentEnd`` per segment once its last speech frame has
  been handed out. ``clear_buffer`` interrupts the session and forgets every open segment, so no stale segment
  end can ever close the next one. ``AvatarRunner`` turns those into ``lk.playback_started`` and
  ``lk.playback_finished`` (``interrupted`` after a clear).
- ``AvatarWorker`` (``python -m integrations.livekit_avatar``): a process beside ``apps.serve`` with its
  own runtime and the same session API shape: ``POST /sessions {"avatar", "livekit_url", "livekit_token"}``
  joins that room, runs ``AvatarRunner`` with ``DataStreamAudioReceiver`` over a new live session, and answers
  201 with the session's id and room identity; ``GET /sessions``, ``DELETE /sessions/{id}``.
- ``DittoAvatarSession`` (agent side): mints the avatar's token, asks the worker for a session for the room and
  routes the agent's audio to it (``DataStreamAudioOutput``). In-process instead: ``run_in_process``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
from aiohttp import web
from livekit import api, rtc
from livekit.agents.voice.avatar import (
    AudioSegmentEnd,
    AvatarOptions,
    AvatarRunner,
    AvatarSession,
    DataStreamAudioOutput,
    DataStreamAudioReceiver,
    QueueAudioOutput,
    VideoGenerator,
)

from engine.runtime import AdmissionError, Backpressure, SessionClosed
from engine.timebase import FPS
from integrations.pcm import float_to_s16, s16_to_float
from integrations.slots import SlotPicker

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.runtime.runtime import Runtime
    from engine.runtime.session import Session
    from livekit.agents import AgentSession

log = logging.getLogger(__name__)
SLOT_S = 1 / FPS
BACKPRESSURE_RETRY_S = 0.02


@dataclass
class _Segment:
    """One speech segment: seconds of audio pushed, seconds of it shown, whether its end was received."""

    pushed: float = 0.0
    shown: float = 0.0
    ended: bool = False


def _rgba(image: np.ndarray) -> rtc.VideoFrame:
    height, width = image.shape[:2]
    rgba = np.empty((height, width, 4), np.uint8)
    rgba[..., :3] = image
    rgba[..., 3] = 255
    return rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, rgba.tobytes())


class DittoVideoGenerator(VideoGenerator):
    """The avatar's video and audio for ``AvatarRunner``, from a live runtime session (or anything with its contract)."""

    def __init__(self, session: Session, portrait: np.ndarray, *, max_held_frames: int = 25) -> None:
        """``session``: a live ``engine.runtime.session.Session``; ``portrait``: the avatar's (H, W, 3) uint8 frame, shown
        until the session's first frame."""
        self.session = session
        self.size = (portrait.shape[1], portrait.shape[0])
        self.audio_rate: int = session.audio_rate
        self._picker = SlotPicker(session, max_held_frames)
        self._picture = self._idle_picture = _rgba(portrait)
        self._segments: list[_Segment] = []
        self._open: _Segment | None = None
        self._generation = 0
        self.clears = 0

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        """Queue a frame of TTS audio (waiting while the session holds its lead), or close the open segment.

        An end with no open segment (its segment was cleared, or had no audio) is dropped: handed on, it would close
        the next segment in the runner's eyes before that one is shown."""
        if isinstance(frame, AudioSegmentEnd):
            if self._open is not None:
                self._open.ended = True
                self._open = None
            return
        if self._open is None:
            self._open = _Segment()
            self._segments.append(self._open)
        segment, generation = self._open, self._generation
        pcm = s16_to_float(bytes(frame.data))
        while generation == self._generation:
            try:
                self.session.push_audio(pcm, frame.sample_rate, channels=frame.num_channels)
                segment.pushed += frame.samples_per_channel / frame.sample_rate
                return
            except Backpressure:
                await asyncio.sleep(BACKPRESSURE_RETRY_S)
            except SessionClosed:
                return

    def clear_buffer(self) -> None:
        """Interrupt: drop the session's pending speech, every frame held here and every open segment."""
        self._generation += 1
        self.clears += 1
        try:
            self.session.interrupt()
        except SessionClosed:
            pass
        self._picker.clear()
        self._segments.clear()
        self._open = None
        self._picture = self._idle_picture

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        """One picture per slot (the last one again when no frame is due), speech audio, segment ends."""
        while True:
            try:
                frame = self._picker.next()
            except SessionClosed:
                for segment in self._segments:
                    if segment.pushed:
                        yield AudioSegmentEnd()
                self._segments.clear()
                return
            if frame is None:
                await asyncio.sleep(SLOT_S)
                yield self._picture
                continue
            await asyncio.sleep(0)
            self._picture = _rgba(frame.image.cpu().numpy())
            if not frame.speech:
                self._idle_picture = self._picture
            yield self._picture
            if frame.speech:
                yield rtc.AudioFrame(float_to_s16(frame.audio), self.audio_rate, 1, frame.audio.size)
            if self._segment_done(frame.speech):
                self._segments.pop(0)
                yield AudioSegmentEnd()

    def _segment_done(self, speech: bool) -> bool:
        """Whether the oldest segment has now been shown whole: its end received, its audio's length shown, and this
        frame idle (or the next segment already speaking)."""
        if not self._segments:
            return False
        head = self._segments[0]
        if speech:
            head.shown += SLOT_S
            return head.ended and len(self._segments) > 1 and head.shown >= head.pushed + SLOT_S
        return head.ended and head.shown > 0 and head.shown >= head.pushed - SLOT_S


class DittoAvatarRunner(AvatarRunner):
    """``AvatarRunner`` that answers every clear of a segment the agent is waiting on, also one it never read.

    The base runner sends ``playback_finished(interrupted=True)`` on a clear only once it has read a frame of the
    segment from its receiver. A clear that comes while the segment's frames still wait in the receiver's queue
    (the receiver drops them) got no answer, and the agent waited for ever (in-process) or for its 2 s timeout.
    Here the receiver's own state says whether a segment is open: the agent output's pending count
    (``QueueAudioOutput``), or a byte stream open or waiting (``DataStreamAudioReceiver``); each such segment is
    answered once, however many clears follow.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answered: object = None

    def _on_clear_buffer(self) -> None:
        segment = self._open_segment()
        if self._audio_playing or (segment is not None and segment != self._answered):
            self._audio_playing = True
            self._answered = segment
        super()._on_clear_buffer()

    async def aclose(self) -> None:
        """Stop the runner, then close the generator's runtime session (its frames are no longer rendered)."""
        await super().aclose()
        if isinstance(self._video_gen, DittoVideoGenerator):
            self._video_gen.session.close()

    def _open_segment(self) -> object:
        """An identity of the segment the receiver holds unfinished, or None."""
        receiver = self._audio_recv
        if isinstance(receiver, QueueAudioOutput):
            return receiver.captured_playout_segments if receiver._pending_playback_count > 0 else None
        if isinstance(receiver, DataStreamAudioReceiver):
            reader = receiver._current_reader or (receiver._stream_readers[0] if receiver._stream_readers else None)
            return None if reader is None else id(reader)
        return None


def avatar_options(generator: DittoVideoGenerator) -> AvatarOptions:
    """The runner's track settings for ``generator``'s frames: their size, 25 fps, the session's audio rate, mono."""
    width, height = generator.size
    return AvatarOptions(video_width=width, video_height=height, video_fps=FPS, audio_sample_rate=generator.audio_rate, audio_channels=1)


async def run_in_process(room: rtc.Room, runtime: Runtime, avatar: Avatar, **session_options: Any) -> tuple[QueueAudioOutput, DittoAvatarRunner]:
    """In-process mode, inside the agent's job: returns the ``QueueAudioOutput`` to set as the agent session's audio
    output (``session.output.audio = audio``) and the started runner publishing the avatar into ``room``
    (``await runner.aclose()`` ends both it and the runtime session)."""
    session = await asyncio.to_thread(runtime.open_session, avatar, live=True, **session_options)  # it waits for the runtime's tick
    generator = DittoVideoGenerator(session, avatar.frames[0].cpu().numpy())
    audio = QueueAudioOutput()  # any rate: the session resamples, once
    runner = DittoAvatarRunner(room, audio_recv=audio, video_gen=generator, options=avatar_options(generator))
    await runner.start()
    return audio, runner


# -- the worker (beside the service) --------------------------------------------------------------


@dataclass
class _Room:
    id: str
    avatar: str
    identity: str
    room: rtc.Room
    session: Session
    runner: DittoAvatarRunner | None = None
    task: asyncio.Task | None = field(default=None, repr=False)
    started: bool = False


class AvatarWorker:
    """Avatar sessions in LiveKit rooms, one runtime session each, created and ended through a small HTTP API."""

    def __init__(self, runtime: Runtime, avatars: Any, *, latency: str = "faithful") -> None:
        """``avatars``: a registry with ``get(name)``; ``latency``: the sessions' mode (``engine.latency``)."""
        self.runtime = runtime
        self.avatars = avatars
        self.latency = latency
        self.rooms: dict[str, _Room] = {}

    def app(self) -> web.Application:
        """The HTTP API: POST/GET /sessions, DELETE /sessions/{id}."""
        app = web.Application()
        app.router.add_post("/sessions", self._create)
        app.router.add_get("/sessions", self._list)
        app.router.add_delete("/sessions/{id}", self._delete)
        app.on_cleanup.append(lambda _: self.aclose())
        return app

    async def join(self, avatar_name: str, url: str, token: str) -> _Room:
        """Join the room ``token`` grants, publish the avatar there, and run it until the room ends or ``leave``."""
        avatar = self.avatars.get(avatar_name)
        session = await asyncio.to_thread(self.runtime.open_session, avatar, live=True, latency=self.latency)  # off the event loop
        room = rtc.Room()
        try:
            await room.connect(url, token)
        except BaseException:
            session.close()
            raise
        entry = _Room(secrets.token_hex(4), avatar_name, room.local_participant.identity, room, session)
        generator = DittoVideoGenerator(session, avatar.frames[0].cpu().numpy())
        entry.runner = DittoAvatarRunner(
            room, audio_recv=DataStreamAudioReceiver(room), video_gen=generator, options=avatar_options(generator)
        )
        self.rooms[entry.id] = entry
        entry.task = asyncio.create_task(self._run(entry))
        room.on("disconnected", lambda *_: entry.id in self.rooms and asyncio.ensure_future(self.leave(entry.id)))
        return entry

    async def leave(self, session_id: str) -> None:
        """End one avatar session: stop its runner, close its runtime session, leave the room."""
        entry = self.rooms.pop(session_id, None)
        if entry is None:
            return
        if entry.task is not None:
            entry.task.cancel()
            await asyncio.gather(entry.task, return_exceptions=True)
        if entry.started:
            await entry.runner.aclose()
        else:  # still waiting for the agent to join: only the synchronizer's task runs
            await entry.runner.av_sync.aclose()
        entry.session.close()
        await entry.room.disconnect()

    async def aclose(self) -> None:
        """Leave every room."""
        for session_id in list(self.rooms):
            await self.leave(session_id)

    async def _run(self, entry: _Room) -> None:
        try:
            await entry.runner.start()
            entry.started = True
            await entry.runner.wait_for_complete()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("avatar session %s in room %s failed", entry.id, entry.room.name)

    async def _create(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            avatar, url, token = body.get("avatar", "anchor"), body["livekit_url"], body["livekit_token"]
        except (ValueError, KeyError, AttributeError) as exc:
            return web.json_response({"error": f"a JSON body with livekit_url and livekit_token is needed ({exc})"}, status=400)
        try:
            entry = await self.join(avatar, url, token)
        except LookupError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except AdmissionError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        except rtc.ConnectError as exc:
            return web.json_response({"error": f"could not join the room: {exc}"}, status=502)
        return web.json_response({"id": entry.id, "identity": entry.identity, "room": entry.room.name}, status=201)

    async def _list(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"sessions": [{"id": e.id, "avatar": e.avatar, "identity": e.identity, "room": e.room.name} for e in self.rooms.values()]}
        )

    async def _delete(self, request: web.Request) -> web.Response:
        session_id = request.match_info["id"]
        if session_id not in self.rooms:
            return web.json_response({"error": f"no session {session_id}"}, status=404)
        await self.leave(session_id)
        return web.json_response({"id": session_id, "state": "ended"})


# -- the agent's side ---------------------------------------------------------------------------


class DittoAvatarSession(AvatarSession):
    """Puts a self-hosted Ditto avatar into the agent's room: ``await DittoAvatarSession(...).start(session, room)``."""

    def __init__(
        self,
        worker_url: str,
        *,
        avatar: str = "anchor",
        livekit_url: str,
        api_key: str,
        api_secret: str,
        identity: str = "ditto-avatar",
    ) -> None:
        """``worker_url``: the avatar worker's base URL; the LiveKit URL and key pair mint the avatar's room token."""
        super().__init__()
        self.worker_url = worker_url.rstrip("/")
        self.avatar = avatar
        self.livekit_url, self.api_key, self.api_secret = livekit_url, api_key, api_secret
        self._identity = identity
        self.session_id: str | None = None

    @property
    def avatar_identity(self) -> str:
        """The avatar's participant identity in the room."""
        return self._identity

    @property
    def provider(self) -> str:
        """Reported in the agent's avatar metrics."""
        return "ditto-live"

    def token(self, room: str, agent_identity: str) -> str:
        """A room token for the avatar, publishing on behalf of the agent (as LiveKit's avatar plugins do)."""
        return (
            api.AccessToken(self.api_key, self.api_secret)
            .with_identity(self._identity)
            .with_kind("agent")
            .with_grants(api.VideoGrants(room_join=True, room=room))
            .with_attributes({"lk.publish_on_behalf": agent_identity})
            .to_jwt()
        )

    async def start(self, agent_session: AgentSession, room: rtc.Room) -> None:
        """Ask the worker for an avatar session in ``room``, then send the agent's audio to it."""
        await super().start(agent_session, room)
        body = {
            "avatar": self.avatar,
            "livekit_url": self.livekit_url,
            "livekit_token": self.token(room.name, room.local_participant.identity),
        }
        async with aiohttp.ClientSession() as http, http.post(f"{self.worker_url}/sessions", json=body) as response:
            answer = await response.json()
            if response.status != 201:
                raise RuntimeError(f"the avatar worker answered {response.status}: {answer.get('error')}")
        self.session_id = answer["id"]
        agent_session.output.audio = DataStreamAudioOutput(
            room, destination_identity=self._identity, sample_rate=None,  # the TTS's own rate: the session resamples once
            wait_remote_track=rtc.TrackKind.KIND_VIDEO,
        )

    async def aclose(self) -> None:
        """End the avatar session on the worker, then leave as the base class does."""
        if self.session_id is not None:
            async with aiohttp.ClientSession() as http:
                async with http.delete(f"{self.worker_url}/sessions/{self.session_id}"):
                    pass
            self.session_id = None
        await super().aclose()


def main(argv: list[str] | None = None) -> int:
    """``python -m integrations.livekit_avatar --avatar anchor [--checkpoints DIR] [--http 127.0.0.1:8090]``."""
    parser = argparse.ArgumentParser(prog="python -m integrations.livekit_avatar", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", action="append", required=True, help="registered avatar name or cache dir (repeatable)")
    parser.add_argument("--checkpoints", default=None, help="official checkpoints (default: random weights, pictures are not faces)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--http", default="127.0.0.1:8090", help="host:port of the session API (binds 127.0.0.1 by default)")
    parser.add_argument("--latency", choices=("faithful", "low"), default="faithful", help="the sessions' latency mode")
    args = parser.parse_args(argv)
    host, port = args.http.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the worker's API has no token check: bind it to 127.0.0.1 and reach it from the agent's host")

    from avatars.cache import load_avatar
    from engine.runtime import Runtime

    runtime = Runtime.from_checkpoints(args.checkpoints, device=args.device)
    if args.checkpoints is None:
        print("RANDOM WEIGHTS: the avatar's pictures are not faces")
    avatars = _Avatars({name: load_avatar(name, runtime.device) for name in args.avatar})
    worker = AvatarWorker(runtime, avatars, latency=args.latency)
    try:
        web.run_app(worker.app(), host=host, port=int(port), access_log=None)
    finally:
        runtime.close()
    return 0


class _Avatars:
    """Avatars loaded at start, by the name they were given (the first also as ``anchor``)."""

    def __init__(self, loaded: dict[str, Any]) -> None:
        self.loaded = dict(loaded)
        self.loaded.setdefault("anchor", next(iter(loaded.values())))

    def get(self, name: str) -> Avatar:
        if name not in self.loaded:
            raise LookupError(f"no avatar {name!r}; avatars available: {', '.join(sorted(self.loaded))}")
        return self.loaded[name]


if __name__ == "__main__":
    raise SystemExit(main())
