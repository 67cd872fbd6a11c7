"""An output worker: the process that encodes some sessions' frames and sends them to their RTMP servers and files.

``python -m serving.worker CONFIG_JSON`` (started by ``serving.service``). It binds one PULL
socket: the engine core announces each session's frame ring there, then each frame's slot and the
speech segments it closed (for the playback events, ``streaming.playback``); the front end says
which outputs a session has (RTMP URLs, an MP4 path, the WebRTC preview) and how they are encoded
(``streaming.output_settings``), whether anyone watches the preview (its packets go to the front end
only then), asks for keyframes, and asks what a stream of a given size and preset (or a LiveKit room of a
given size) costs a core (measured on a thread of its own, for admission). Each session
runs a ``SessionOutput`` over its ring (its own output clock: repeats when the GPU is late, never
a late timeline). The preview's encoded packets and the playback events go to the front end,
which holds the browsers' peer connections and the push WebSockets. Until a session's first frame the preview
shows its avatar's portrait, which the core put in the ring. A session with a LiveKit room joins it from
here (``serving.rooms``, on an asyncio loop of its own thread): its pictures go to the room raw (no H.264 when it
has no other output) and the agent's audio comes from the room straight to the engine core. Once a second it reports
every stream's counters; when a stream has flushed and closed its outputs it says so.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from engine.timebase import FPS
from engine.trace import trace
from serving.ipc import send_nowait, socket
from serving.protocol import (
    CostMeasured,
    Event,
    FrameReady,
    MeasureCost,
    OutputFailed,
    OutputsClosed,
    Playback,
    PreviewEnded,
    PreviewPacket,
    PreviewWatched,
    RemoveStream,
    RenderProgress,
    RequestKeyframe,
    RoomJoined,
    SegmentsClosed,
    SessionOutputs,
    Shutdown,
    StreamEnded,
    StreamRing,
    ToWorker,
    WorkerConfig,
    WorkerReady,
    WorkerStats,
    decode,
    from_argument,
)
from serving.render_file import RenderFile
from serving.timeline import process_started
from streaming.encoders.cost import stream_cost_ms
from streaming.encoders.h264 import H264Settings
from streaming.encoders.room_cost import ROOM, room_cost_ms
from streaming.encoders.x264 import X264Encoder
from streaming.frame_ring import STILL, FrameRing
from streaming.output import EncodedFrame, SessionOutput
from streaming.output_settings import OutputSettings
from streaming.playback import PlaybackEvents
from streaming.push_messages import PlaybackEvent, PlaybackFinished, PlaybackStarted
from streaming.sinks.mp4 import Mp4Sink
from streaming.sinks.rtmp import RtmpSink

if TYPE_CHECKING:
    from serving.rooms import RoomOutput, RoomsLoop

log = logging.getLogger("ditto.worker")
STATS_EVERY = 1.0
COST_FRAMES = 15
"""Frames a cost is measured on: an IDR and the P-frames after it (their median is a P-frame's)."""
STILL_EVERY = 0.5
"""Seconds between the still pictures a preview shows before the session's first frame."""
REMOVED_KEPT = 1024
"""Ids of streams removed before they started that a worker remembers (their late halves are dropped)."""
SLOW_MESSAGE = 0.002
"""Seconds a message may take to handle before the trace (``engine.trace``) records it: the main thread passes every
stream's frames on, so a slow one delays them all."""


@dataclass
class RingFrame:
    """A frame copied out of the ring: its I420 picture on the host, its audio, its index."""

    index: int
    image: np.ndarray
    audio: np.ndarray
    speech: bool
    segment: int = 0
    ready: None = None

    @property
    def pts(self) -> Fraction:
        return Fraction(self.index, FPS)


class RingSource:
    """A session seen through its ring: the frames the core announced, in order, with the session's clock."""

    def __init__(self, ring: FrameRing) -> None:
        self.ring = ring
        self._frames: deque[RingFrame] = deque()
        self._changed = threading.Condition()
        self._anchor: float | None = None
        self._ended = False
        self.overwritten = 0
        self._newest: int | None = None

    @property
    def clock_anchor(self) -> float | None:
        """When the session's live clock shows frame 0 (the core's runtime sets it; monotonic time is system-wide)."""
        return self._anchor

    def put(self, index: int, speech: bool, anchor: float | None, segment: int) -> None:
        """Copy frame ``index`` out of its slot now (the core may reuse the slot a ring later)."""
        copied = self.ring.read(index)
        if copied is None:
            self.overwritten += 1
            return
        with self._changed:
            self._anchor = anchor
            self._newest = index
            self._frames.append(RingFrame(index, copied[0], copied[1], speech, segment))
            self._changed.notify_all()

    def end(self) -> None:
        """No frame follows the ones already put."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def next_frame(self, timeout: float | None = None) -> RingFrame | None:
        """The next frame; None once ended and drained; TimeoutError when none came within ``timeout``."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._frames or self._ended, timeout):
                raise TimeoutError
            return self._frames.popleft() if self._frames else None

    def behind_seconds(self) -> float | None:
        """How far the newest rendered frame is behind the session's live clock: a device slower than real time (a
        CPU) leaves it growing, and speech pushed now is shown that much later. None before the first frame: the clock
        starts with it, and a session that has rendered nothing is not yet measured (0 would say it keeps up)."""
        if self._anchor is None or self._newest is None:
            return None
        return round(max(0.0, time.monotonic() - self._anchor - self._newest / FPS), 2)

    def stats(self) -> dict[str, float | None]:
        return {"ring_overwritten": self.overwritten, "behind_seconds": self.behind_seconds()}


class PreviewRelay:
    """The sink that forwards a session's encoded packets to the front end, where the WebRTC viewers are, while
    the front end says someone watches (``watching``): no viewer, no packets crossing processes. Until the output
    releases its first frame it shows ``still`` (the avatar's portrait, I420) instead: a viewer of a session whose
    first frame takes minutes (a CPU) sees the avatar, not a black picture."""

    name = "webrtc"

    def __init__(
        self,
        session_id: str,
        send: Callable[[Event], bool],
        still: np.ndarray | None = None,
        settings: H264Settings | None = None,
    ) -> None:
        self.session_id, self._send = session_id, send
        self.watching = False
        self.frames_sent = 0
        self.frames_dropped = 0
        self.stills_sent = 0
        self._still, self._settings = still, settings
        self._still_packet: bytes | None = None
        self._released = False
        self._first_still: float | None = None
        self._next_still = 0.0
        self._lock = threading.Lock()

    def send(self, frame: EncodedFrame) -> None:
        with self._lock:
            self._released = True
            if not self.watching:
                return
            message = PreviewPacket(
                self.session_id,
                frame.index,
                frame.width,
                frame.height,
                frame.video,
                frame.keyframe,
                tuple(frame.opus),
                frame.speech,
                frame.repeat,
                frame.segment,
            )
            if self._send(message):
                self.frames_sent += 1
            else:
                self.frames_dropped += 1

    def still_now(self) -> None:
        """Show the still at the next ``show_still`` (a viewer joined and waits for a keyframe)."""
        self._next_still = 0.0

    def show_still(self, now: float) -> None:
        """Before the first frame, while someone watches, send the still every STILL_EVERY seconds (each one an IDR,
        so a viewer who joins gets it at once), numbered by the time since the first as frames are."""
        if self._still is None or self._released or not self.watching or now < self._next_still:
            return
        height, width = self._still.shape[0] * 2 // 3, self._still.shape[1]
        if self._still_packet is None:
            try:
                self._still_packet = X264Encoder(width, height, self._settings).encode_picture(self._still, 0)[0].data
            except Exception:
                log.exception("worker: session %s's still cannot be encoded; its preview waits", self.session_id)
                self._still = None
                return
        with self._lock:
            if self._released:
                return
            self._first_still = now if self._first_still is None else self._first_still
            index = round((now - self._first_still) * FPS)
            if self._send(
                PreviewPacket(self.session_id, index, width, height, self._still_packet, True, (), False, True, 0)
            ):
                self.stills_sent += 1
        self._next_still = now + STILL_EVERY

    def close(self) -> None:
        self._send(PreviewEnded(self.session_id))

    def stats(self) -> dict[str, int]:
        return {"frames_sent": self.frames_sent, "frames_dropped": self.frames_dropped, "stills_sent": self.stills_sent}


@dataclass
class WorkerStream:
    """One session this worker serves: what the front end asked for, and once the core announced it, its output."""

    id: str
    outputs: SessionOutputs | None = None
    ring: StreamRing | None = None
    source: RingSource | None = None
    output: SessionOutput | None = None
    relay: PreviewRelay | None = None
    playback: PlaybackEvents | None = None
    room: RoomOutput | None = None
    early: list[ToWorker] = field(default_factory=list)


Join = Callable[["RoomOutput", str, str, Callable[[str], None]], Coroutine[Any, Any, tuple[str, str]]]
"""How a stream's room output joins its room: (output, url, token, on_left) -> (room name, the avatar's identity)."""


async def join_livekit(room: RoomOutput, url: str, token: str, on_left: Callable[[str], None]) -> tuple[str, str]:
    """Join a LiveKit server's room (``RoomOutput.join``)."""
    return await room.join(url, token, on_left)


class Worker:
    """The worker's sockets and streams; ``run`` until told to stop."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.index = config.index
        self.trace = trace("worker")
        self.context = zmq.Context()
        self.inbox = socket(self.context, zmq.PULL, config.address, bind=True)
        self._events = socket(self.context, zmq.PUSH, config.events, bind=False)
        self._events_lock = threading.Lock()
        self.streams: dict[str, WorkerStream] = {}
        self._removed: deque[str] = deque(maxlen=REMOVED_KEPT)
        """Streams removed before both halves came: the other half, when it comes, is dropped."""
        self._stop = False
        self._parent = os.getppid()
        self.rooms: RoomsLoop | None = None
        """The loop the LiveKit rooms run on, started with the first one."""
        self.join: Join = join_livekit
        self._measurements: list[threading.Thread] = []
        """Cost measurements started (their CPU is not the streams')."""
        self._measured_until = 0.0
        """When the latest cost measurement ended (monotonic)."""

    def emit(self, message: Event) -> bool:
        """Send an event to the front end from any thread (False when its queue is full: dropped)."""
        with self._events_lock:
            return send_nowait(self._events, message)

    def run(self) -> None:
        marks = {"started": process_started(), "imported": time.time(), "ready": time.time()}
        self.emit(WorkerReady(self.index, marks))
        next_stats = time.monotonic() + STATS_EVERY
        window = (time.monotonic(), time.process_time())
        try:
            while not self._stop and os.getppid() == self._parent:
                if self.inbox.poll(50):
                    while True:
                        try:
                            message = decode(self.inbox.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                        except ValueError as exc:
                            log.warning("worker %d: dropped an undecodable message: %s", self.index, exc)
                            continue
                        if not isinstance(message, ToWorker):
                            kind = type(message).__name__
                            log.warning("worker %d: dropped a %s (not a worker's message)", self.index, kind)
                            continue
                        began = time.monotonic()
                        self.handle(message)
                        took = time.monotonic() - began
                        if self.trace.on and took > SLOW_MESSAGE:
                            self.trace.record(
                                "slow_message", began, message=type(message).__name__, ms=round(took * 1000, 2)
                            )
                self._reap()
                for stream in self.streams.values():
                    if stream.relay is not None:
                        stream.relay.show_still(time.monotonic())
                if time.monotonic() >= next_stats:
                    next_stats += STATS_EVERY
                    streams = {i: stream_stats(s) for i, s in self.streams.items() if s.output}
                    cpu_ms, window = self._cpu_ms_per_slot(window)
                    self.emit(WorkerStats(self.index, streams, cpu_ms))
        finally:
            for stream in self.streams.values():
                if stream.output is not None:
                    stream.output.stop()
            if self.rooms is not None:
                self.rooms.close([s.room.leaving for s in self.streams.values() if s.room and s.room.leaving])
            self.inbox.close()
            self._events.close()
            self.context.term()

    def _cpu_ms_per_slot(self, since: tuple[float, float]) -> tuple[float | None, tuple[float, float]]:
        """This process's CPU (every thread) in core milliseconds per frame slot since ``since`` (monotonic, CPU
        seconds), None where a cost measurement or a render job's file ran meanwhile (neither is a live stream's); and
        the start of the next window."""
        now = (time.monotonic(), time.process_time())
        self._measurements = [t for t in self._measurements if t.is_alive()]
        rendering = any(isinstance(s.output, RenderFile) for s in self.streams.values())
        if rendering:
            self._measured_until = now[0]
        if self._measurements or self._measured_until >= since[0] or now[0] <= since[0]:
            return None, now
        return (now[1] - since[1]) * 1000 / ((now[0] - since[0]) * FPS), now

    def handle(self, message: ToWorker) -> None:
        """One message from the core or the front end; a stream's messages that come before its output is built wait."""
        if isinstance(message, Shutdown):
            self._stop = True
            return
        if isinstance(message, MeasureCost):
            measurement = threading.Thread(target=self._measure, args=(message,), name="measure-cost", daemon=True)
            self._measurements.append(measurement)
            measurement.start()
            return
        if isinstance(message, (SessionOutputs, StreamRing)):
            if message.id in self._removed:
                return
            self.streams.setdefault(message.id, WorkerStream(message.id))
        stream = self.streams.get(message.id)
        if stream is None:
            return
        match message:
            case SessionOutputs():
                stream.outputs = message
            case StreamRing():
                stream.ring = message
            case FrameReady() | StreamEnded() if stream.source is None:
                stream.early.append(message)
            case FrameReady(index=index, speech=speech, anchor=anchor, segment=segment):
                stream.source.put(index, speech, anchor, segment)
            case StreamEnded():
                stream.source.end()
            case RequestKeyframe() if stream.output is not None:
                stream.output.request_keyframe()
                if stream.relay is not None:
                    stream.relay.still_now()
            case SegmentsClosed() if stream.playback is None:
                stream.early.append(message)
            case SegmentsClosed(closed=closed):
                stream.playback.closed(list(closed))
            case PreviewWatched() if stream.output is None:
                stream.early.append(message)
            case PreviewWatched(on=on) if stream.relay is not None:
                stream.relay.watching = on
            case RemoveStream():
                if stream.output is not None:
                    stream.output.stop()
                else:  # not started: nothing to flush, closed now (a cancel waits for that)
                    self.streams.pop(message.id, None)
                    self._removed.append(message.id)
                    self.emit(OutputsClosed(message.id, {}))
        if stream.output is None and stream.outputs is not None and stream.ring is not None:
            self._start(stream)

    def _start(self, stream: WorkerStream) -> None:
        """Both halves known: attach the ring, build the encoder's output and its sinks, replay what came early."""
        ring = stream.ring
        try:
            stream.source = RingSource(FrameRing(ring.ring, ring.width, ring.height, ring.slots))
        except (OSError, ValueError) as exc:
            # The core frees a ring when its session ends: one deleted before this worker caught up has none left.
            self.emit(OutputFailed(stream.id, "ring", f"cannot attach the frame ring: {exc}"))
            self.emit(OutputsClosed(stream.id, {}))
            self.streams.pop(stream.id, None)
            return
        spec = stream.outputs
        if spec.render:
            self._start_render(stream)
            return
        settings = OutputSettings.from_json(spec.output)
        channels = settings.audio_channels
        output = SessionOutput(
            stream.source,
            encoder="x264" if spec.encoded else "raw",
            settings=settings.video(ring.width, ring.height),
            name=stream.id,
            on_sink_failed=lambda sink, message: self.emit(OutputFailed(stream.id, sink, message)),
        )
        stream.playback = PlaybackEvents(lambda event: self._playback(stream, event))
        output.add_sink(stream.playback)
        if spec.livekit:
            self._join(stream, output, *spec.livekit)
        sinks = [
            ("rtmp", lambda url=url: RtmpSink(url, output.request_keyframe, audio_channels=channels))
            for url in spec.rtmp
        ]
        if spec.mp4:
            sinks.append(("mp4", lambda: Mp4Sink(spec.mp4, output.request_keyframe, audio_channels=channels)))
        for name, make in sinks:
            try:
                output.add_sink(make())
            except (OSError, ValueError) as exc:
                self.emit(OutputFailed(stream.id, name, str(exc)))
        if spec.preview:
            still = stream.source.ring.read(STILL)  # the avatar's portrait, put there before the ring was announced
            stream.relay = PreviewRelay(stream.id, self.emit, None if still is None else still[0], output.settings)
            output.add_sink(stream.relay)
        stream.output = output.start()
        for message in stream.early:
            self.handle(message)
        stream.early.clear()

    def _start_render(self, stream: WorkerStream) -> None:
        """A render job's stream: its file written from the ring, frame by frame (``serving.render_file``)."""
        ring = stream.source.ring
        render = RenderFile(
            stream.id,
            ring,
            stream.outputs.mp4,
            lambda frames: self.emit(RenderProgress(stream.id, frames)),
            lambda message: self.emit(OutputFailed(stream.id, "mp4", message)),
        )
        stream.source = stream.output = render.start()
        for message in stream.early:
            self.handle(message)
        stream.early.clear()

    def _measure(self, request: MeasureCost) -> None:
        """Measure a stream's cost per frame (``stream_cost_ms``, a room's ``room_cost_ms``) and tell the front end; its
        CPU clock is this thread's, so the streams this worker encodes meanwhile do not count in it (nor it in the
        worker's CPU per slot, ``_cpu_ms_per_slot``)."""
        try:
            self.emit(self._cost(request))
        finally:
            self._measured_until = time.monotonic()

    def _cost(self, request: MeasureCost) -> CostMeasured:
        width, height, preset = request.width, request.height, request.preset
        try:
            if preset == ROOM:
                ms = room_cost_ms(width, height, COST_FRAMES)
            else:
                ms = stream_cost_ms(width, height, preset, COST_FRAMES)
        except Exception as exc:  # reported, for the front end to refuse the session with it
            log.exception("worker %d: measuring a %dx%d %s stream failed", self.index, width, height, preset)
            return CostMeasured(self.index, width, height, preset, 0.0, f"{type(exc).__name__}: {exc}")
        log.info("worker %d: a %dx%d %s stream costs %.1f ms of a core a frame", self.index, width, height, preset, ms)
        return CostMeasured(self.index, width, height, preset, ms)

    def _join(self, stream: WorkerStream, output: SessionOutput, url: str, token: str) -> None:
        """Add the stream's room output and join its room on the rooms loop; the front end hears how it went."""
        from serving.rooms import (  # livekit is imported by the workers that serve a room only
            RoomOutput,
            RoomsLoop,
        )
        from serving.sessions import RemoteSession

        if self.rooms is None:
            self.rooms = RoomsLoop(self.config.core)
        audio = RemoteSession(self.rooms.core, stream.id, self.rooms.loop)
        stream.room = RoomOutput(audio, stream.ring.width, stream.ring.height, self.rooms.loop)
        output.add_sink(stream.room)

        def left(why: str) -> None:
            self.emit(OutputFailed(stream.id, "livekit", why))

        def joined(future: Future) -> None:
            error = future.exception()
            if error is not None:
                log.warning("session %s: %s", stream.id, error)
                self.emit(RoomJoined(stream.id, None, None, str(error)))
            else:
                self.emit(RoomJoined(stream.id, *future.result(), None))

        self.rooms.run(self.join(stream.room, url, token, left)).add_done_callback(joined)

    def _playback(self, stream: WorkerStream, event: PlaybackStarted | PlaybackFinished) -> bool:
        """A playback event to the front end (the push sockets), and to the stream's room (the agent)."""
        if stream.room is not None:
            self.rooms.call(stream.room.playback, event)
        return self.emit(playback(stream.id, event))

    def _reap(self) -> None:
        """Report and forget the streams whose output has flushed and closed."""
        for session_id, stream in list(self.streams.items()):
            if stream.output is not None and stream.output.finished.is_set():
                self.emit(OutputsClosed(session_id, stream_stats(stream)))
                stream.source.ring.close()
                del self.streams[session_id]
                gc.collect()


def playback(session_id: str, event: PlaybackEvent) -> Playback:
    """A playback event of ``streaming.playback`` as the message to the front end."""
    return Playback(session_id, event.TYPE, asdict(event))


def stream_stats(stream: WorkerStream) -> dict[str, Any]:
    """A stream's counters: its output's (see ``SessionOutput.snapshot``) and its ring's."""
    if isinstance(stream.output, RenderFile):
        return stream.output.stats()
    return {**stream.output.snapshot(), **stream.source.stats()}


def main(argv: list[str] | None = None) -> int:
    """Run a worker from its configuration (argv[0], ``WorkerConfig`` as JSON) until the front end shuts it down."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end stops its workers; Ctrl-C reaches it alone
    Worker(from_argument(WorkerConfig, (argv or sys.argv[1:])[0])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
