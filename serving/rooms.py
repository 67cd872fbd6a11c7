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
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import zmq.asyncio
from livekit import rtc
from livekit.agents.voice.avatar import AudioReceiver, AudioSegmentEnd, QueueAudioOutput

from engine.timebase import FPS
from serving.client import CoreClient
from serving.sessions import SessionError
from streaming.output import EncodedFrame
from streaming.sinks.livekit_avatar_io import RoomAudioReceiver, pending_playback_count, remote_participant
from streaming.sinks.room_tracks import RoomTracks
from streaming.sources.push import ProtocolError, PushFormat, decode_chunk

log = logging.getLogger("serving.rooms")
JOIN_TIMEOUT = 15.0
"""Seconds the avatar has to connect to the room and publish its tracks."""
QUEUED_FRAMES = 5
"""Released frames waiting for the room's tracks at most; older ones are dropped (a room that stalls slows no one)."""
RECEIVE_FRAME_MS = 1000 // FPS
"""The agent's audio reaches the session in frames of one video frame's length (the receiver's stock 100 ms frames
would hold each segment's first 100 ms back from the session)."""
NEVER = 1 << 62
RPC_PAUSE = "ditto.pause"
RPC_RESUME = "ditto.resume"
"""The agent pauses and resumes its speech (LiveKit's false-interruption handling; ``DittoAudioOutput`` sends them)."""


class SessionAudio(Protocol):
    """A session's audio side, awaited (``serving.sessions.RemoteSession``)."""

    async def push_audio(self, pcm: Any, sample_rate: int) -> None: ...

    async def end_segment(self) -> int | None: ...

    async def interrupt(self) -> int | None: ...


@dataclass
class _Segment:
    """One agent speech segment (one byte stream): its audio, the session's number for it, what the agent was told.

    A pause cuts the session's speech; the resume pushes the segment's audio again from the position shown, as a new
    part (a new number on the session), so one agent segment may be spoken as several of the session's."""

    number: int | None = None
    """The session's number for its part now: set at the part's first push (the session's next number)."""
    audio: list[tuple[np.ndarray, int]] = field(default_factory=list)
    """Its audio as received (mono float32, rate): kept until it is answered, to resume from where a pause cut it."""
    shown_before: float = 0.0
    """Seconds of it shown in parts a pause cut."""
    ended: bool = False
    """Its stream has ended (its last part is closed, or will be at the resume)."""
    started: bool = False
    answered: bool = False

    def audio_from(self, seconds: float, start: int = 0) -> list[tuple[np.ndarray, int]]:
        """Its audio from ``seconds`` in, of the chunks from index ``start`` on (earlier ones counted, not returned)."""
        rest, elapsed = [], 0.0
        for index, (pcm, rate) in enumerate(self.audio):
            duration = pcm.size / rate
            if index >= start and elapsed + duration > seconds:
                rest.append((pcm[max(0, round((seconds - elapsed) * rate)) :], rate))
            elapsed += duration
        return rest


class RoomOutput:
    """The avatar's side of one room: a sink of the session's output (``send``, release thread) and the agent's audio
    into the session (``attach``, then on the rooms loop)."""

    name = "livekit"

    def __init__(self, audio: SessionAudio, width: int, height: int, loop: asyncio.AbstractEventLoop) -> None:
        self.audio, self.width, self.height, self._loop = audio, width, height, loop
        self.receiver: AudioReceiver | None = None
        self.tracks: RoomTracks | None = None
        self._queued: deque[tuple[rtc.VideoFrame, np.ndarray]] = deque()
        self._queue_changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._room: rtc.Room | None = None
        self.leaving: Future | None = None
        """Once the output has ended: the leaving of the room, running on the rooms loop."""
        self._segments: list[_Segment] = []
        """Agent segments not answered yet, oldest first."""
        self._by_number: dict[int, _Segment] = {}
        self._open: _Segment | None = None
        self._opened = 0
        """Agent segments begun here (their first frame read), and those answered unread at a clear."""
        self._next_number = 0
        self._last_closed = -1
        self._paused = False
        """The agent paused its speech (a possible false interruption): audio is kept, none reaches the session."""
        self._holding = False
        """Paused, or pushing again what a pause cut: new audio waits in its segment."""
        self._held: asyncio.Task | None = None
        self._turn = 0
        """Counts clears: a resume's replay stops at the next one (what follows a clear is new speech)."""
        self._session_lock = asyncio.Lock()
        """Held around each request to the session, so an interrupt never overtakes the push or close before it."""
        self._pushing: asyncio.Task | None = None
        self._cut = -1
        """Speech frames of segments numbered up to this were cut by a clear: the room shows idle in their place."""
        self._spoken: dict[int, int] = {}
        """Speech frames released per segment (written on the release thread)."""
        self._idle: Any = None
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

    # -- the agent's side (rooms loop) ------------------------------------------------------------------------------

    async def attach(self, receiver: AudioReceiver, room: rtc.Room | None = None) -> None:
        """Start taking the agent's audio from ``receiver`` and publishing frames (tracks of ``room``, when given)."""
        tracks = self.tracks = RoomTracks.create(self.width, self.height)
        if room is not None:
            publish = room.local_participant.publish_track
            audio_track = rtc.LocalAudioTrack.create_audio_track("avatar_audio", tracks.audio)
            await publish(audio_track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
            video_track = rtc.LocalVideoTrack.create_video_track("avatar_video", tracks.video)
            await publish(video_track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_CAMERA))
        self.receiver = receiver
        receiver.on("clear_buffer", self._clear)
        self._spawn(self._publish())
        self._spawn(self._receive())

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

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _receive(self) -> None:
        """The agent's audio into the session, segment by segment (the receiver waits for the agent to join)."""
        receiver = self.receiver
        try:
            await receiver.start()
            async for item in receiver:
                if isinstance(item, AudioSegmentEnd):
                    await self._end_segment()
                else:
                    await self._push(item)
        except SessionError as exc:
            log.info("room output: the session no longer takes audio: %s", exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("room output: taking the agent's audio failed")

    async def _push(self, frame: rtc.AudioFrame) -> None:
        if self._open is None:
            self._open = _Segment()
            self._segments.append(self._open)
            self._opened += 1
            self.counters["segments"] += 1
        segment = self._open
        try:
            pcm = decode_chunk(bytes(frame.data), PushFormat(frame.sample_rate, frame.num_channels, "s16le"))
        except ProtocolError as exc:
            log.warning("room output: dropped a frame of the agent's audio: %s", exc)
            return
        segment.audio.append((pcm, frame.sample_rate))
        if not self._holding:
            await self._send_audio(segment, pcm, frame.sample_rate)

    async def _send_audio(self, segment: _Segment, pcm: np.ndarray, rate: int) -> None:
        """Push ``segment``'s audio into the session, in order with every other request (a clear or a pause that
        comes meanwhile cancels it)."""
        async with self._session_lock:
            if segment.answered or self._paused:  # cleared or paused while this waited
                return
            if segment.number is None:
                segment.number = self._next_number
                self._by_number[segment.number] = segment
            self._pushing = asyncio.ensure_future(self.audio.push_audio(pcm, rate))
            await asyncio.wait([self._pushing])
            pushing, self._pushing = self._pushing, None
            if pushing.cancelled():
                return
            try:
                pushing.result()
            except SessionError as exc:
                if exc.kind != "invalid":
                    raise
                log.warning("room output: the session refused a frame of the agent's audio: %s", exc)

    async def _end_segment(self) -> None:
        """The agent's stream ended: close the session's segment (a stream cleared or without audio has none open;
        while paused it is closed at the resume)."""
        segment, self._open = self._open, None
        if segment is None:
            return
        segment.ended = True
        if not self._holding:
            await self._close(segment)

    async def _close(self, segment: _Segment) -> None:
        async with self._session_lock:
            number = await self.audio.end_segment()
        self._confirm(segment, number)
        if number is None:
            self._answer(segment, segment.shown_before, interrupted=False)

    def _held_segments(self) -> int:
        """Segments the agent sent whose every frame the receiver held unread and dropped at this clear: the agent
        waits for their ``playback_finished`` too. Its audio output's own count tells when it is in this process
        (``QueueAudioOutput``); over a room, the byte streams the receiver took against the segments read here."""
        receiver = self.receiver
        if isinstance(receiver, QueueAudioOutput):
            return max(0, pending_playback_count(receiver) - len(self._segments))
        if isinstance(receiver, RoomAudioReceiver):
            return max(0, receiver.streams_taken() - self._opened)
        return 0

    def _confirm(self, segment: _Segment | None, number: int | None) -> None:
        """The session closed ``number`` (None: nothing was open) as ``segment``'s."""
        if number is None:
            if segment is not None and segment.number is not None:
                self._by_number.pop(segment.number, None)
                segment.number = None
            return
        if segment is not None and segment.number != number:
            log.warning("room output: the session numbered a segment %d, expected %s", number, segment.number)
            self._by_number.pop(segment.number, None)
            segment.number = number
            self._by_number[number] = segment
        self._next_number, self._last_closed = number + 1, number

    def _clear(self) -> None:
        """``lk.clear_buffer``: answer every unfinished segment now, then cut the session's speech."""
        self.counters["clears"] += 1
        self._cut = NEVER  # no speech frame reaches the room until the session has been interrupted
        self._paused = self._holding = False  # a clear ends a pause: what follows is new speech
        self._turn += 1
        held = self._held_segments()
        for segment in list(self._segments):
            self._answer(segment, self._shown(segment), interrupted=True)
        for _ in range(held):  # segments whose every frame the receiver dropped before this output read one
            self._segments.append(_Segment())
            self._answer(self._segments[-1], 0.0, interrupted=True)
        self._opened += held
        cleared, self._open = self._open, None
        if self._pushing is not None:
            self._pushing.cancel()
        self._spawn(self._interrupt(cleared))

    async def _interrupt(self, cleared: _Segment | None) -> None:
        async with self._session_lock:
            try:
                number = await self.audio.interrupt()
            except SessionError as exc:
                log.info("room output: could not interrupt the session: %s", exc)
                number = None
            self._confirm(cleared, number)
            self._cut = self._last_closed

    def _shown(self, segment: _Segment) -> float:
        """Seconds of ``segment`` shown so far."""
        now = self._spoken.get(segment.number, 0) / FPS if segment.number is not None else 0.0
        return segment.shown_before + now

    def pause(self) -> None:
        """The agent paused its speech: cut the session's speech now (the avatar idles), keep the audio to resume."""
        if self._paused:
            return
        self.counters["pauses"] += 1
        self._paused = self._holding = True
        self._cut = NEVER
        if self._pushing is not None:
            self._pushing.cancel()
        held = asyncio.ensure_future(self._hold())
        self._tasks.add(held)
        held.add_done_callback(self._tasks.discard)
        self._held = held

    async def _hold(self) -> None:
        """Interrupt the session; each unfinished segment keeps the seconds shown, its cut part forgotten."""
        async with self._session_lock:
            try:
                number = await self.audio.interrupt()
            except SessionError as exc:
                log.info("room output: could not pause the session: %s", exc)
                number = None
            if number is not None:
                self._next_number, self._last_closed = number + 1, number
            for segment in self._segments:
                segment.shown_before = self._shown(segment)
                if segment.number is not None:
                    self._by_number.pop(segment.number, None)
                    self._spoken.pop(segment.number, None)
                    segment.number = None
            self._cut = self._last_closed

    def resume(self) -> None:
        """The pause was a false alarm: speak each unfinished segment on from where it was cut."""
        if not self._paused:
            return
        self._paused = False
        self._spawn(self._replay(self._held, self._turn))

    async def _replay(self, held: asyncio.Task, turn: int) -> None:
        """Push each unfinished segment's audio again from the position shown (and what came meanwhile), closing
        those whose stream ended; then new audio flows again. A clear or another pause stops it."""
        await asyncio.wait([held])
        replayed: set[int] = set()
        while not self._paused and self._turn == turn:
            waiting = [segment for segment in self._segments if id(segment) not in replayed]
            if not waiting:
                self._holding = False  # no await since the last look: nothing can slip in between
                return
            segment = waiting[0]
            chunks, pushed = segment.audio_from(segment.shown_before), len(segment.audio)
            while chunks and not self._paused and self._turn == turn:
                for pcm, rate in chunks:
                    await self._send_audio(segment, pcm, rate)
                chunks, pushed = segment.audio[pushed:], len(segment.audio)
            if segment.ended and not segment.answered and not self._paused and self._turn == turn:
                await self._close(segment)
            replayed.add(id(segment))

    def playback(self, event: dict[str, Any]) -> None:
        """One of the session's playback events (``streaming.playback``), on the rooms loop."""
        number = event["segment"]
        if event["event"] == "playback_finished":
            segment = self._by_number.pop(number, None)
            self._spoken.pop(number, None)
            if segment is not None:
                self._answer(segment, segment.shown_before + event["position"], event["interrupted"])
            return
        segment = self._by_number.get(number)
        if event["event"] == "playback_started" and segment is not None and not segment.started:
            segment.started = True
            if not segment.answered:
                self._notify(self.receiver.notify_playback_started())

    def _answer(self, segment: _Segment, position: float, interrupted: bool) -> None:
        """Tell the agent ``segment`` is finished: once, whatever else happens to it."""
        if segment.answered:
            return
        segment.answered = True
        self._segments.remove(segment)
        self.counters["playback_finished"] += 1
        finished = self.receiver.notify_playback_finished(playback_position=round(position, 3), interrupted=interrupted)
        self._notify(finished)

    def _notify(self, result: Coroutine[Any, Any, None] | None) -> None:
        if asyncio.iscoroutine(result):
            self._spawn(result)

    # -- the session's frames (release thread in, rooms loop out) ---------------------------------------------------

    def send(self, frame: EncodedFrame) -> None:
        """One released frame, to the room (never blocks the output clock)."""
        if self._closed or self.tracks is None or frame.picture is None:  # not in a room (yet), or left
            return
        picture, audio = frame.picture, frame.audio
        if frame.speech and frame.segment <= self._cut:
            picture, audio = self._idle if self._idle is not None else picture, audio * 0
            self.counters["frames_cut"] += 1
        elif frame.speech:
            self._spoken[frame.segment] = self._spoken.get(frame.segment, 0) + 1
            self.counters["speech_frames_sent"] += 1
        elif not frame.repeat:
            self._idle = picture
        video = rtc.VideoFrame(self.width, self.height, rtc.VideoBufferType.I420, picture.tobytes())
        self._loop.call_soon_threadsafe(self._offer, video, audio)

    def _offer(self, video: rtc.VideoFrame, audio: np.ndarray) -> None:
        self._queued.append((video, audio))
        while len(self._queued) > QUEUED_FRAMES:
            self._queued.popleft()
            self.counters["frames_dropped"] += 1
        self._queue_changed.set()

    async def _publish(self) -> None:
        """Frames to the room's tracks, paced in real time by the audio source (``RoomTracks``)."""
        while True:
            await self._queue_changed.wait()
            self._queue_changed.clear()
            while self._queued:
                video, audio = self._queued.popleft()
                await self.tracks.push(video, audio)
                self.counters["frames_sent"] += 1

    def close(self) -> None:
        """The session's output has ended (release thread): leave the room (``leaving``)."""
        if self.leaving is None:
            self._closed = True
            self.leaving = asyncio.run_coroutine_threadsafe(self.aclose(), self._loop)

    async def aclose(self) -> None:
        """Answer what is left (interrupted), stop taking audio and publishing, leave the room."""
        self._closed = True
        for segment in list(self._segments):
            self._answer(segment, 0.0, interrupted=True)
        if self.receiver is not None:
            self.receiver.off("clear_buffer", self._clear)
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
