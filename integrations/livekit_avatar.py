"""LiveKit Agents avatar: the agent's ``AvatarSession`` for the Ditto service, and an in-process mode.

Two ways, one protocol (``livekit.agents.voice.avatar``):

- **The service** (the way to serve many rooms from one GPU): ``DittoAvatarSession`` (agent side) mints the
  avatar's room token, asks the service (``python -m apps.serve``) for a session whose output is the agent's room
  (``POST /sessions {"avatar", "livekit": {"url", "token"}}``) and routes the agent's audio to the avatar. The
  service's output worker joins the room and speaks there (``serving.rooms``). ``python -m
  integrations.livekit_avatar``, the separate avatar worker with its own runtime, is gone (it says so).
- **In process** (a single agent on its own GPU: the agent's job owns the runtime): ``run_in_process`` runs
  ``DittoVideoGenerator``, a ``VideoGenerator`` over a live runtime session (TTS ``rtc.AudioFrame`` at any rate in,
  25 fps RGBA ``rtc.VideoFrame`` and each speech frame's 48 kHz audio out, one ``AudioSegmentEnd`` per segment after
  its last speech frame, by the service's playback rule (``streaming.playback`` over the frames shown here: the
  session numbers the segments, so a segment cleared by ``clear_buffer`` never ends the next one), under
  ``DittoAvatarRunner`` (LiveKit's ``AvatarRunner``, answering every clear).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
from livekit import api, rtc
from livekit.agents.voice.avatar import (
    AudioSegmentEnd,
    AvatarOptions,
    AvatarSession,
    DataStreamAudioReceiver,
    QueueAudioOutput,
    VideoGenerator,
)
from livekit.agents.voice.io import AudioOutput

from engine.audio.pcm import to_s16
from engine.runtime import SessionClosed
from engine.runtime.backpressure import push_when_room
from engine.timebase import FPS
from integrations.livekit_compat import DataStreamOutput, LiveSession
from integrations.slots import SlotPicker
from serving.rooms import RPC_PAUSE, RPC_RESUME
from streaming.playback import PlaybackEvents
from streaming.push_messages import PlaybackEvent, PlaybackFinished
from streaming.sinks.livekit_avatar_io import (
    ClearHookRunner,
    PlaybackRpcsOnItsRoom,
    allow_pause,
    keep_task,
    open_stream,
    output_room,
    pending_playback_count,
    runner_parts,
)
from streaming.sources.push import ProtocolError, PushFormat, decode_chunk

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.runtime.runtime import Runtime
    from engine.runtime.session import Session

log = logging.getLogger(__name__)
SLOT_S = 1 / FPS
START_TIMEOUT_S = 30.0
"""Seconds the service has to answer: it answers a LiveKit session once its avatar is in the room."""


def _rgba(image: np.ndarray) -> rtc.VideoFrame:
    height, width = image.shape[:2]
    rgba = np.empty((height, width, 4), np.uint8)
    rgba[..., :3] = image
    rgba[..., 3] = 255
    return rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, rgba.tobytes())


class DittoVideoGenerator(VideoGenerator):
    """The avatar's video and audio for ``AvatarRunner``, from a live runtime session (or anything with its
    contract)."""

    def __init__(self, session: Session, portrait: np.ndarray, *, max_held_frames: int = 25) -> None:
        """``session``: a live ``engine.runtime.session.Session``; ``portrait``: the avatar's (H, W, 3) uint8 frame,
        shown until the session's first frame."""
        self.session = session
        self.size = (portrait.shape[1], portrait.shape[0])
        self.audio_rate: int = session.audio_rate
        self._picker = SlotPicker(session, max_held_frames)
        self._picture = self._idle_picture = _rgba(portrait)
        self._finished: list[PlaybackFinished] = []
        self._playback = PlaybackEvents(self._take_event)
        """The service's playback events, from the frames shown here: a segment ends at the first frame above it."""
        self._speaking = False
        """Audio went into the session since its last segment was closed."""
        self._generation = 0
        self.clears = 0

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        """Queue a frame of TTS audio (waiting while the session holds its lead), or close the session's segment.

        An end with nothing pushed since the last close (its segment was cleared, or had no audio) closes nothing: the
        session numbers no segment for it, so it can never end the next one in the runner's eyes."""
        if isinstance(frame, AudioSegmentEnd):
            try:
                closed = self.session.end_segment()
            except SessionClosed:
                return
            self._speaking = False
            if closed is not None:
                self._playback.closed([(closed, False)])
            return
        try:
            pcm = decode_chunk(bytes(frame.data), PushFormat(frame.sample_rate, frame.num_channels, "s16le"))
        except ProtocolError as exc:
            log.warning("dropped a frame of the agent's audio: %s", exc)
            return
        generation = self._generation
        try:
            pushed = await push_when_room(
                lambda: self.session.push_audio(pcm, frame.sample_rate), lambda: generation == self._generation
            )
        except SessionClosed:
            return
        self._speaking |= pushed

    def clear_buffer(self) -> None:
        """Interrupt: drop the session's pending speech (closing its segment as interrupted) and every frame held
        here."""
        self._generation += 1
        self.clears += 1
        try:
            cut = self.session.interrupt()
        except SessionClosed:
            cut = None
        if cut is not None:
            self._playback.closed([(cut, True)])
        self._speaking = False
        self._picker.clear()
        self._picture = self._idle_picture

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        """One picture per slot (the last one again when no frame is due), speech audio, segment ends."""
        while True:
            try:
                frame = self._picker.next()
            except SessionClosed:
                self._playback.close()
                for _ in range(self._played_through() + self._speaking):
                    yield AudioSegmentEnd()
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
                yield rtc.AudioFrame(to_s16(frame.audio), self.audio_rate, 1, frame.audio.size)
            self._playback.shown(frame.speech, frame.segment)
            for _ in range(self._played_through()):
                yield AudioSegmentEnd()

    def _take_event(self, event: PlaybackEvent) -> bool:
        if isinstance(event, PlaybackFinished):
            self._finished.append(event)
        return True

    def _played_through(self) -> int:
        """How many segments finished since the last call, not cut: each is one ``AudioSegmentEnd`` (the runner
        answered a cut one at its clear)."""
        ended = sum(not event.interrupted for event in self._finished)
        self._finished.clear()
        return ended


class DittoAvatarRunner(ClearHookRunner):
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

    def answers_clear(self, audio_playing: bool) -> bool:
        segment = self._open_segment()
        if audio_playing or (segment is not None and segment != self._answered):
            self._answered = segment
            return True
        return False

    async def aclose(self) -> None:
        """Stop the runner, then close the generator's runtime session (its frames are no longer rendered)."""
        await super().aclose()
        generator = runner_parts(self)[1]
        if isinstance(generator, DittoVideoGenerator):
            generator.session.close()

    def _open_segment(self) -> object:
        """An identity of the segment the receiver holds unfinished, or None."""
        receiver = runner_parts(self)[0]
        if isinstance(receiver, QueueAudioOutput):
            return receiver.captured_playout_segments if pending_playback_count(receiver) > 0 else None
        if isinstance(receiver, DataStreamAudioReceiver):
            reader = open_stream(receiver)
            return None if reader is None else id(reader)
        return None


def avatar_options(generator: DittoVideoGenerator) -> AvatarOptions:
    """The runner's track settings for ``generator``'s frames: their size, 25 fps, the session's audio rate, mono."""
    width, height = generator.size
    return AvatarOptions(
        video_width=width, video_height=height, video_fps=FPS, audio_sample_rate=generator.audio_rate, audio_channels=1
    )


async def run_in_process(
    room: rtc.Room, runtime: Runtime, avatar: Avatar, **session_options: Any
) -> tuple[QueueAudioOutput, DittoAvatarRunner]:
    """In-process mode, inside the agent's job: returns the ``QueueAudioOutput`` to set as the agent session's audio
    output (``session.output.audio = audio``) and the started runner publishing the avatar into ``room``
    (``await runner.aclose()`` ends both it and the runtime session)."""
    session = await asyncio.to_thread(
        runtime.open_session, avatar, live=True, **session_options
    )  # it waits for the runtime's tick
    generator = DittoVideoGenerator(session, avatar.frames[0].cpu().numpy())
    audio = QueueAudioOutput()  # any rate: the session resamples, once
    runner = DittoAvatarRunner(room, audio_recv=audio, video_gen=generator, options=avatar_options(generator))
    await runner.start()
    return audio, runner


# -- the agent's side ---------------------------------------------------------------------------


class DittoAudioOutput(PlaybackRpcsOnItsRoom, DataStreamOutput):
    """LiveKit's ``DataStreamAudioOutput`` to the service's avatar, which can pause: the agent's false-interruption
    handling (``resume_false_interruption``) then holds the avatar's speech and resumes it where it stopped, where the
    stock output (no pause) restarts or loses the sentence. ``pause`` and ``resume`` are RPCs to the avatar.

    Its clears follow livekit-agents 1.8.9's rules in every release (``integrations.livekit_compat``), and the avatar's
    playback RPCs reach the output of their own room (``PlaybackRpcsOnItsRoom``): the stock output keeps their handlers
    in one table per process by the avatar's identity, so two rooms of one agent process with avatars of one name
    answered each other."""

    def __init__(self, room: rtc.Room, *, destination_identity: str, **options: Any) -> None:
        super().__init__(room, destination_identity=destination_identity, **options)
        allow_pause(self)

    def pause(self) -> None:
        AudioOutput.pause(self)  # the stock output's pause only warns that it cannot
        self._tell(RPC_PAUSE)

    def resume(self) -> None:
        AudioOutput.resume(self)
        self._tell(RPC_RESUME)

    def _tell(self, method: str) -> None:
        room, avatar = output_room(self)

        async def call() -> None:
            try:
                await room.local_participant.perform_rpc(destination_identity=avatar, method=method, payload="")
            except rtc.RpcError as exc:
                log.warning("the avatar did not take %s: %s", method, exc)

        keep_task(self, asyncio.ensure_future(call()))


class DittoAvatarSession(AvatarSession):
    """Puts an avatar of the Ditto service (``python -m apps.serve``) into the agent's room:
    ``await DittoAvatarSession(...).start(session, room)``.

    ``start`` mints the avatar's room token (as LiveKit's avatar plugins do: kind agent, publishing on behalf of the
    agent), asks the service for a session whose output is the room (``POST /sessions`` with ``"livekit"``), and
    routes the agent's audio to the avatar (``DittoAudioOutput``: it waits for the avatar's first speech frame before
    the agent counts its speech as playing, and can pause). ``aclose`` ends the session (``DELETE``); a room that
    closes ends it too."""

    def __init__(
        self,
        url: str,
        *,
        avatar: str = "anchor",
        token: str | None = None,
        livekit_url: str,
        api_key: str,
        api_secret: str,
        identity: str = "ditto-avatar",
        latency: str = "faithful",
        options: dict[str, Any] | None = None,
    ) -> None:
        """``url``: the service's base URL and ``token`` its token (``apps.serve --token``); ``avatar`` a registered
        avatar's name; the LiveKit URL and key pair mint the avatar's room token; ``latency``: the session's mode,
        ``"faithful"`` or ``"low"`` (``engine.latency``: windows every 120 ms, frames released at once), as the pipecat
        service takes it; ``options``: more fields of the session (``overlap``, ``seed``, ``controls``, ``rtmp``,
        ``preview``: docs/service.md)."""
        super().__init__()
        self.url = url.rstrip("/")
        self.avatar = avatar
        self.latency = latency
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.livekit_url, self.api_key, self.api_secret = livekit_url, api_key, api_secret
        self._identity = identity
        self.options = dict(options or {})
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

    async def start(self, agent_session: LiveSession, room: rtc.Room) -> None:
        """Ask the service for an avatar session in ``room`` (it answers once the avatar is in), then send the agent's
        audio to it. RuntimeError with the service's status and reason when it refuses (503 full, 400 a bad field,
        404 an unknown avatar, 502 the avatar could not join)."""
        await super().start(agent_session, room)
        livekit = {"url": self.livekit_url, "token": self.token(room.name, room.local_participant.identity)}
        body = {**self.options, "avatar": self.avatar, "latency": self.latency, "livekit": livekit}
        timeout = aiohttp.ClientTimeout(total=START_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(headers=self._headers, timeout=timeout) as http,
            http.post(f"{self.url}/sessions", json=body) as answer,
        ):
            reply = await answer.json(content_type=None)
            if answer.status != 201:
                raise RuntimeError(f"the Ditto service refused the avatar ({answer.status}): {reply.get('error')}")
        self.session_id = reply["id"]
        agent_session.output.audio = DittoAudioOutput(
            room,
            destination_identity=self._identity,
            sample_rate=None,  # the TTS's own rate: the service resamples
            wait_remote_track=rtc.TrackKind.KIND_VIDEO,
            wait_playback_start=True,
        )

    async def aclose(self) -> None:
        """End the avatar's session on the service, then leave as the base class does."""
        if self.session_id is not None:
            timeout = aiohttp.ClientTimeout(total=START_TIMEOUT_S)
            async with aiohttp.ClientSession(headers=self._headers, timeout=timeout) as http:
                try:
                    async with http.delete(f"{self.url}/sessions/{self.session_id}"):
                        pass
                except (aiohttp.ClientError, TimeoutError) as exc:
                    log.warning("could not end the avatar's session %s: %r", self.session_id, exc)
            self.session_id = None
        await super().aclose()


def main(argv: list[str] | None = None) -> int:
    """The separate avatar worker is gone: LiveKit rooms are an output of the service; say how to use it."""
    print(
        "python -m integrations.livekit_avatar is gone: LiveKit rooms are an output of the service. Run\n"
        "    python -m apps.serve --avatar PORTRAIT_OR_NAME --http HOST:PORT --token TOKEN\n"
        'and in the agent: DittoAvatarSession("http://HOST:PORT", token=TOKEN, livekit_url=..., api_key=..., '
        "api_secret=...) (docs/voice-agents.md).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
