"""LiveKit rooms as an output of a session: the avatar joins the agent's room, publishes the session's pictures and the
speech they speak, takes the agent's TTS audio into the session and tells the agent what was played.

Runs in the session's output worker (``serving.worker``), on an asyncio loop of its own thread (``RoomsLoop``). The
protocol is LiveKit Agents' avatar protocol (``livekit.agents.voice.avatar``), its avatar side:

- **Out.** ``RoomOutput`` is a sink of the session's output (``streaming.output.SessionOutput``, the output clock
  that releases one frame per 1/25 s slot): each released frame's I420 picture (LiveKit's native buffer: no RGB round
  trip) and its 48 kHz audio go to the room's video and audio tracks in step (``streaming.sinks.room_tracks``: the
  picture leaves when its sound starts to).
- **In.** The agent's TTS audio arrives as ``lk.audio_stream`` byte streams (``DataStreamAudioReceiver``), one per
  speech segment; it is decoded as the push WebSocket decodes PCM and pushed into the session the same way
  (``serving.sessions.RemoteSession``: the engine core's backpressure slows the receiver, never drops audio). A
  stream's end closes the session's segment (``end_segment``).
- **Playback.** ``lk.playback_started`` and ``lk.playback_finished`` come from the session's own playback events
  (``streaming.playback``, what the push WebSocket reports), mapped to the agent's segments: exactly once per segment.
- **Interrupt.** ``lk.clear_buffer`` is answered at once (the agent gives up after 2 s): every segment not yet
  finished gets ``playback_finished`` (interrupted, with the seconds of it shown), the session drops its pending
  speech (``interrupt``), and speech frames of the cut segments already on their way to the room are replaced by the
  last idle picture and silence, so the avatar stops speaking at the clear.
- **Pause.** ``ditto.pause`` (a possible false interruption: the agent holds its speech) cuts the session's speech as a
  clear does but answers nothing and keeps each unfinished segment's audio from the position shown; ``ditto.resume``
  pushes it again from there, and the segment's ``playback_finished`` adds up what was shown before and after.
  LiveKit's own data-stream output cannot pause; ``integrations.livekit_avatar.DittoAudioOutput`` can.

Numbering: the session numbers segments 0, 1, 2, ... as audio is pushed and closed (``engine.runtime.session``); its
audio comes from the room alone (a LiveKit session takes no pushed audio), so each agent segment's number is known
when its first audio is pushed, before the session confirms it at the close.

One module a job: ``RoomOutput`` here joins the room, tells the agent what was played and ends; the speech in is
``serving.room_speech`` (push, clear, pause, resume), the frames out ``serving.room_frames``, the segments they share
``serving.room_segments``; what livekit-agents keeps private is reached through ``streaming.sinks.livekit_avatar_io``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent import futures
from concurrent.futures import Future
from typing import Any

import zmq.asyncio
from livekit import rtc
from livekit.agents.voice.avatar import AudioReceiver

from engine.timebase import FPS
from serving.client import CoreClient
from serving.room_frames import RoomFrames
from serving.room_segments import Segment, SegmentBook
from serving.room_speech import AgentSpeech, SessionAudio
from streaming.output import EncodedFrame
from streaming.push_messages import PlaybackFinished, PlaybackStarted
from streaming.sinks.livekit_avatar_io import RoomAudioReceiver, remote_participant
from streaming.sinks.room_tracks import RoomTracks

log = logging.getLogger("serving.rooms")
JOIN_TIMEOUT = 15.0
"""Seconds the avatar has to connect to the room and publish its tracks."""
RECEIVE_FRAME_MS = 1000 // FPS
"""The agent's audio reaches the session in frames of one video frame's length (the receiver's stock 100 ms frames
would hold each segment's first 100 ms back from the session)."""
RPC_PAUSE = "ditto.pause"
RPC_RESUME = "ditto.resume"
"""The agent pauses and resumes its speech (LiveKit's false-interruption handling; ``DittoAudioOutput`` sends them)."""


class RoomOutput:
    """The avatar's side of one room: a sink of the session's output (``send``, release thread) and the agent's audio
    into the session (``attach``, then on the rooms loop)."""

    name = "livekit"

    def __init__(self, audio: SessionAudio, width: int, height: int, loop: asyncio.AbstractEventLoop) -> None:
        self.audio, self.width, self.height, self._loop = audio, width, height, loop
        self.receiver: AudioReceiver | None = None
        self._tasks: set[asyncio.Task] = set()
        self._room: rtc.Room | None = None
        self.leaving: Future | None = None
        """Once the output has ended: the leaving of the room, running on the rooms loop."""
        self._closed = False
        self.counters = {
            "frames_sent": 0,
            "speech_frames_sent": 0,
            "frames_dropped": 0,
            "frames_cut": 0,
            "clears": 0,
            "pauses": 0,
            "segments": 0,
            "playback_finished": 0,
        }
        self.book = SegmentBook()
        """The agent's segments not answered yet, their numbers on the session, the frames shown of each, the cut."""
        self.speech = AgentSpeech(audio, self.book, self._answer, self._spawn, self.counters)
        self.frames = RoomFrames(width, height, loop, self.book, self.counters)

    @property
    def tracks(self) -> RoomTracks | None:
        """The room's video and audio sources, once attached."""
        return self.frames.tracks

    @property
    def _by_number(self) -> dict[int, Segment]:
        return self.book.by_number

    @property
    def _spoken(self) -> dict[int, int]:
        return self.book.spoken

    # -- the agent's side (rooms loop) ------------------------------------------------------------------------------

    async def attach(self, receiver: AudioReceiver, room: rtc.Room | None = None) -> None:
        """Start taking the agent's audio from ``receiver`` and publishing frames (tracks of ``room``, when given)."""
        tracks = self.frames.open_tracks()
        if room is not None:
            publish = room.local_participant.publish_track
            audio_track = rtc.LocalAudioTrack.create_audio_track("avatar_audio", tracks.audio)
            await publish(audio_track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
            video_track = rtc.LocalVideoTrack.create_video_track("avatar_video", tracks.video)
            await publish(video_track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_CAMERA))
        self.receiver = self.speech.receiver = receiver
        receiver.on("clear_buffer", self.speech.clear)
        self._spawn(self.frames.publish())
        self._spawn(self.speech.receive())

    async def join(self, url: str, token: str, on_left: Callable[[str], None]) -> tuple[str, str]:
        """Connect to the room ``token`` grants, publish there and take the agent's audio: (room name, the avatar's
        identity). ``on_left(why)`` is called if the room drops the avatar before the output ends (the room was closed,
        the avatar removed, reconnecting failed). Raises ``ConnectionError`` saying why it could not join."""
        room = self._room = rtc.Room(loop=asyncio.get_running_loop())

        async def connect() -> None:
            await room.connect(url, token, rtc.RoomOptions(auto_subscribe=False))
            await self.enter(room)

        try:
            await asyncio.wait_for(connect(), JOIN_TIMEOUT)
        except (rtc.ConnectError, TimeoutError, OSError, RuntimeError) as exc:
            await room.disconnect()
            why = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise ConnectionError(f"could not join the LiveKit room at {url}: {why}") from exc

        def disconnected(reason: int) -> None:
            if not self._closed:
                on_left(f"the avatar left the room {room.name!r} ({rtc.DisconnectReason.Name(reason)})")

        room.on("disconnected", disconnected)
        return room.name, room.local_participant.identity

    async def enter(self, room: rtc.Room) -> None:
        """In a connected ``room``: publish there, take the agent's audio from its byte streams, answer its RPCs."""
        await self.attach(RoomAudioReceiver(room, frame_size_ms=RECEIVE_FRAME_MS), room)
        for method, action in ((RPC_PAUSE, self.pause), (RPC_RESUME, self.resume)):
            room.local_participant.register_rpc_method(method, self._from_agent(action))

    def _from_agent(self, action: Callable[[], None]) -> Callable[[rtc.RpcInvocationData], str]:
        """An RPC handler doing ``action`` when the agent whose audio this takes calls it."""

        def handler(data: rtc.RpcInvocationData) -> str:
            sender = remote_participant(self.receiver)
            if sender is None or data.caller_identity != sender.identity:
                return "reject"
            action()
            return "ok"

        return handler

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def pause(self) -> None:
        """The agent paused its speech: cut the session's speech now (the avatar idles), keep the audio to resume."""
        self.speech.pause()

    def resume(self) -> None:
        """The pause was a false alarm: speak each unfinished segment on from where it was cut."""
        self.speech.resume()

    # -- what the agent is told (rooms loop) ------------------------------------------------------------------------

    def playback(self, event: PlaybackStarted | PlaybackFinished) -> None:
        """One of the session's playback events (``streaming.playback``), on the rooms loop."""
        number = event.segment
        if isinstance(event, PlaybackFinished):
            segment = self._by_number.pop(number, None)
            self._spoken.pop(number, None)
            if segment is not None:
                self._answer(segment, segment.shown_before + event.position, event.interrupted)
            return
        segment = self._by_number.get(number)
        if segment is not None and not segment.started:
            segment.started = True
            if not segment.answered:
                self._notify(self.receiver.notify_playback_started())

    def _answer(self, segment: Segment, position: float, interrupted: bool) -> None:
        """Tell the agent ``segment`` is finished: once, whatever else happens to it."""
        if segment.answered:
            return
        segment.answered = True
        self.book.unanswered.remove(segment)
        self.counters["playback_finished"] += 1
        finished = self.receiver.notify_playback_finished(playback_position=round(position, 3), interrupted=interrupted)
        self._notify(finished)

    def _notify(self, result: Coroutine[Any, Any, None] | None) -> None:
        if asyncio.iscoroutine(result):
            self._spawn(result)

    # -- the session's frames (release thread in, rooms loop out) ---------------------------------------------------

    def send(self, frame: EncodedFrame) -> None:
        """One released frame, to the room (never blocks the output clock)."""
        if not self._closed:  # not left
            self.frames.send(frame)

    def close(self) -> None:
        """The session's output has ended (release thread): leave the room (``leaving``)."""
        if self.leaving is None:
            self._closed = True
            self.leaving = asyncio.run_coroutine_threadsafe(self.aclose(), self._loop)

    async def aclose(self) -> None:
        """Answer what is left (interrupted), stop taking audio and publishing, leave the room."""
        self._closed = True
        for segment in list(self.book.unanswered):
            self._answer(segment, 0.0, interrupted=True)
        if self.receiver is not None:
            self.receiver.off("clear_buffer", self.speech.clear)
        await asyncio.sleep(0.05)  # the last notifications go out
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.receiver is not None:
            await self.receiver.aclose()
        if self.tracks is not None:
            await self.tracks.aclose()
        if self._room is not None:
            await self._room.disconnect()

    def stats(self) -> dict[str, float]:
        """The counters, and the tracks' (``RoomTracks.stats``: the sound queued, the worst picture-to-sound offset)."""
        return {**self.counters, **(self.tracks.stats() if self.tracks is not None else {})}


class RoomsLoop:
    """The worker's asyncio loop for its rooms, on a thread of its own, with a client of the engine core."""

    def __init__(self, core_address: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rooms", daemon=True)
        self._thread.start()
        self.core = self.run(self._client(core_address)).result()

    async def _client(self, address: str) -> CoreClient:
        """A client of the engine core made on the loop (its reader task runs there)."""
        self._context = zmq.asyncio.Context()
        return CoreClient(self._context, address)

    def run(self, coroutine: Awaitable[Any]) -> Future:
        """Run ``coroutine`` on the loop; its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, function: Callable[..., Any], *args: Any) -> None:
        """Call ``function(*args)`` on the loop, soon."""
        self.loop.call_soon_threadsafe(function, *args)

    def close(self, leaving: list[Future], timeout: float = 5.0) -> None:
        """Wait for the rooms being left (``RoomOutput.leaving``, at most ``timeout``), then stop the loop."""
        futures.wait(leaving, timeout)

        async def stop() -> None:
            self.core.close()
            self._context.term()

        try:
            self.run(stop()).result(1.0)
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("rooms: did not close cleanly: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
