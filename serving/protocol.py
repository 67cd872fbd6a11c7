"""Every message between the service's processes, as a typed value, and the one encoding they travel in.

The front end asks the engine core by request and reply (each request gets exactly one reply); every other message
is one way, pushed to a socket the receiver binds. Messages are grouped below by direction; each is a frozen
dataclass, sent as msgpack ``[type name, fields]`` (plain data, never pickle) and dispatched by its receiver with
``match``. Only control travels here: frames stay in each session's shared-memory ring (``streaming.frame_ring``).
Each process is started with its configuration (``CoreConfig``, ``WorkerConfig``) as JSON on its command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgpack

Stats = dict[str, Any]
"""Counters by name, as a session, an output or the runtime reports them (``/metrics`` exports the numbers)."""


# -- front end -> each process, at its start: its command line, as JSON ------------------------------------------


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """How to start an engine core: its sockets, then the runtime to warm up (``serving.processes.ServiceOptions``)."""

    address: str
    """Where it answers the front end's requests (it binds a ROUTER)."""
    events: str
    """Where it pushes its events to the front end."""
    device: str = "cpu"
    checkpoints: str | None = None
    steps: int = 25
    plans: str | None = None
    admission: bool = True
    avatars: dict[str, str | None] = field(default_factory=dict)
    cache_dir: str | None = None
    runtime: str | None = None
    """``module:function`` building the runtime and avatars in place of the engine's (the tests' synthetic one)."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How to start output worker ``index``: its inbox (it binds a PULL) and where it pushes its events."""

    index: int
    address: str
    events: str
    core: str | None = None
    """Where the engine core answers requests: a session whose audio comes from a LiveKit room pushes it there."""


def to_argument(config: CoreConfig | WorkerConfig) -> str:
    """A process's configuration as its command-line argument."""
    return json.dumps(asdict(config))


def from_argument(kind: type[CoreConfig] | type[WorkerConfig], argument: str) -> CoreConfig | WorkerConfig:
    """The configuration ``to_argument`` wrote."""
    return kind(**json.loads(argument))


# -- front end -> engine core: requests -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Is the core ready? Answered once it has warmed up, with ``CoreReady``."""


@dataclass(frozen=True, slots=True)
class CoreStatsRequest:
    """The runtime's figures and every session's counters now; answered with ``CoreStats``."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop: the core after answering, a worker after its streams' outputs (also sent front end -> worker)."""


@dataclass(frozen=True, slots=True)
class DescribeAvatar:
    """The size of avatar ``avatar``'s frames (loaded from the cache on first use); answered with ``AvatarInfo``."""

    avatar: str


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Open session ``id`` on the runtime; its frames go to the worker at ``worker``, scaled to ``width`` x ``height``
    (0: the avatar's own size). Answered with ``Opened``."""

    id: str
    avatar: str
    overlap: int | None
    latency: str
    seed: int
    controls: dict[str, Any] | None
    worker: str
    width: int = 0
    height: int = 0


@dataclass(frozen=True, slots=True)
class OpenRender:
    """Open render job ``id``: a session that is not live, speaking the whole clip ``pcm`` (mono float32 bytes at
    ``rate`` Hz) as fast as the GPU's slack allows, its frames to the worker at ``worker`` through a ring it releases
    frame by frame. Answered with ``Opened``."""

    id: str
    avatar: str
    pcm: bytes
    rate: int
    overlap: int | None
    seed: int
    controls: dict[str, Any] | None
    worker: str


@dataclass(frozen=True, slots=True)
class PushAudio:
    """Mono float32 PCM (``pcm``: its bytes) at ``rate`` Hz for session ``id``; refused as backpressure when full."""

    id: str
    pcm: bytes
    rate: int


@dataclass(frozen=True, slots=True)
class UpdateControls:
    """Change some of session ``id``'s controls; answered with ``ControlsApplied``."""

    id: str
    changes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Drop session ``id``'s speech not yet spoken; answered with ``SegmentNumber`` (the segment interrupted)."""

    id: str


@dataclass(frozen=True, slots=True)
class EndSegment:
    """Close the speech segment pushed to session ``id`` since the last close; answered with ``SegmentNumber``."""

    id: str


@dataclass(frozen=True, slots=True)
class EndSession:
    """Session ``id`` ends once the audio pushed so far has been spoken."""

    id: str


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Session ``id`` ends now."""

    id: str


# -- engine core -> front end: replies and events ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoreReady:
    """The core has warmed up: its device, the sessions it serves in real time, its measured costs, its avatars and
    the wall-clock time of each step of its start (``serving.timeline``)."""

    device: str
    capacity: int | None
    warmup_seconds: float
    window_ms: dict[str, float]
    render_ms: dict[str, float]
    avatars: tuple[str, ...]
    marks: dict[str, float]


@dataclass(frozen=True, slots=True)
class CoreStats:
    """The runtime's figures (and the core's memory) and each session's counters, by session id."""

    runtime: Stats
    sessions: dict[str, Stats]


@dataclass(frozen=True, slots=True)
class AvatarInfo:
    """An avatar's frame size: what a session's output size is derived from (``streaming.output_settings``)."""

    width: int
    height: int


@dataclass(frozen=True, slots=True)
class Opened:
    """The session is open: its picture size and the shared-memory ring its frames go through."""

    width: int
    height: int
    ring: str
    slots: int


@dataclass(frozen=True, slots=True)
class ControlsApplied:
    """The changed controls as now in force (JSON values)."""

    applied: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SegmentNumber:
    """The speech segment a request closed or interrupted (None: none was open)."""

    segment: int | None


@dataclass(frozen=True, slots=True)
class Done:
    """The request was carried out; nothing to tell."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The request was not carried out; ``kind``: admission, not_found, invalid, closed, backpressure or internal."""

    error: str
    kind: str


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """Session ``id`` has ended (``error``: why it failed, None when it ended as asked) and all its frames went out."""

    id: str
    error: str | None
    stats: Stats


# -- engine core -> output worker ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamRing:
    """Session ``id``'s frames come through the shared-memory ring ``ring`` (``slots`` pictures of width x height)."""

    id: str
    ring: str
    width: int
    height: int
    slots: int


@dataclass(frozen=True, slots=True)
class FrameReady:
    """Frame ``index`` of session ``id`` is in its ring slot; ``anchor``: when the session's clock shows frame 0."""

    id: str
    index: int
    speech: bool
    anchor: float | None
    segment: int


@dataclass(frozen=True, slots=True)
class SegmentsClosed:
    """Speech segments of session ``id`` closed, as (segment, interrupted), for its playback events."""

    id: str
    closed: tuple[tuple[int, bool], ...]


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """No frame of session ``id`` follows the ones announced: its outputs flush and close."""

    id: str


# -- front end -> output worker -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOutputs:
    """Where session ``id``'s stream goes: RTMP URLs, an MP4 path, the WebRTC preview (relayed to the front end), a
    LiveKit room; ``output``: how it is encoded, ``OutputSettings`` as its JSON fields (empty: the defaults), resolved
    at the ring's size (the stream's own: a named size resolves to itself)."""

    id: str
    rtmp: tuple[str, ...]
    mp4: str | None
    preview: bool
    output: dict[str, Any] = field(default_factory=dict)
    livekit: tuple[str, str] | None = None
    """(url, token) of the LiveKit room the avatar joins (``serving.rooms``); its audio then comes from the room."""
    render: bool = False
    """A render job: ``mp4`` is its file, every frame written as it comes (no output clock, no repeat), each slot of
    its ring released once written."""

    @property
    def encoded(self) -> bool:
        """Whether the frames are encoded as H.264: for any output but a LiveKit room, which takes raw pictures (and
        LiveKit encodes them); what admission counts and the worker builds."""
        return bool(self.rtmp or self.mp4 or self.preview) or self.livekit is None


@dataclass(frozen=True, slots=True)
class RequestKeyframe:
    """Make session ``id``'s next picture a keyframe (a viewer joined)."""

    id: str


@dataclass(frozen=True, slots=True)
class PreviewWatched:
    """Whether anyone watches session ``id``'s preview: its packets cross to the front end only then."""

    id: str
    on: bool


@dataclass(frozen=True, slots=True)
class RemoveStream:
    """Stop session ``id``'s outputs (the core has failed it or could not open it)."""

    id: str


@dataclass(frozen=True, slots=True)
class MeasureCost:
    """Measure what one output frame of ``width`` x ``height`` at x264 ``preset`` costs a core, or with ``preset``
    ``streaming.encoders.room_cost.ROOM``, one frame of a LiveKit room; answered with ``CostMeasured`` (the worker's
    streams go on meanwhile)."""

    width: int
    height: int
    preset: str


# -- output worker -> front end -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """Worker ``worker`` is ready: the steps of its start."""

    worker: int
    marks: dict[str, float]


@dataclass(frozen=True, slots=True)
class CostMeasured:
    """What ``MeasureCost`` found: core milliseconds per output frame (``streaming.encoders.cost.stream_cost_ms``, or a
    room's ``streaming.encoders.room_cost.room_cost_ms``), or ``error``: why it could not measure."""

    worker: int
    width: int
    height: int
    preset: str
    ms: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Worker ``worker``'s counters of every stream it serves, by session id (sent once a second), and the CPU its
    process used since the last, in core milliseconds per frame slot (None while it measured a cost)."""

    worker: int
    streams: dict[str, Stats]
    cpu_ms_per_slot: float | None = None


@dataclass(frozen=True, slots=True)
class PreviewPacket:
    """One encoded frame of session ``id``'s preview: H.264 ``video`` and its Opus packets as (pts, data); what it
    shows (``streaming.output.EncodedFrame``'s speech, repeat and segment) goes to its viewers in the picture."""

    id: str
    index: int
    width: int
    height: int
    video: bytes
    keyframe: bool
    opus: tuple[tuple[int, bytes], ...]
    speech: bool
    repeat: bool
    segment: int


@dataclass(frozen=True, slots=True)
class PreviewEnded:
    """Session ``id``'s preview has sent its last packet."""

    id: str


@dataclass(frozen=True, slots=True)
class Playback:
    """A playback event of session ``id`` (``streaming.push_messages``): ``event`` is its type, ``fields`` the rest."""

    id: str
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutputFailed:
    """Output ``sink`` of session ``id`` (rtmp, mp4, webrtc, livekit, or ring: none at all) failed and was detached; the
    session goes on with the others (a session whose room is gone ends: the room was its audio too)."""

    id: str
    sink: str
    message: str


@dataclass(frozen=True, slots=True)
class RoomJoined:
    """Session ``id``'s avatar joined LiveKit room ``room`` as ``identity``, or (``error``) could not."""

    id: str
    room: str | None
    identity: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class RenderProgress:
    """Render job ``id`` has written ``frames`` frames to its file."""

    id: str
    frames: int


@dataclass(frozen=True, slots=True)
class OutputsClosed:
    """Session ``id``'s outputs have flushed and closed; its final counters."""

    id: str
    stats: Stats


CoreRequest = (  # what the core's ROUTER receives, each answered with one CoreReply
    Hello
    | CoreStatsRequest
    | Shutdown
    | DescribeAvatar
    | OpenSession
    | OpenRender
    | PushAudio
    | UpdateControls
    | Interrupt
    | EndSegment
    | EndSession
    | CloseSession
)
CoreReply = CoreReady | CoreStats | AvatarInfo | Opened | ControlsApplied | SegmentNumber | Done | Refused
ToWorker = (
    StreamRing
    | FrameReady
    | SegmentsClosed
    | StreamEnded
    | SessionOutputs
    | RequestKeyframe
    | PreviewWatched
    | RemoveStream
    | MeasureCost
    | Shutdown
)
"""What an output worker's inbox receives, from the core (a session's frames) and the front end (its outputs)."""
Event = (
    SessionEnded
    | WorkerReady
    | CostMeasured
    | WorkerStats
    | PreviewPacket
    | PreviewEnded
    | Playback
    | OutputFailed
    | OutputsClosed
    | RenderProgress
    | RoomJoined
)
"""What the front end's events socket receives, from the core and the workers."""
Message = CoreRequest | CoreReply | ToWorker | Event

_TYPES: dict[str, type] = {
    cls.__name__: cls for group in (CoreRequest, CoreReply, ToWorker, Event) for cls in group.__args__
}


def encode(message: Message) -> bytes:
    """``message`` as msgpack ``[type name, {field: value}]`` (bytes stay binary)."""
    values = {f.name: getattr(message, f.name) for f in fields(message)}
    return msgpack.packb([type(message).__name__, values], use_bin_type=True)


def decode(data: bytes) -> Message:
    """The message ``encode`` made of ``data`` (sequences come back as tuples); ValueError for anything else."""
    try:
        name, values = msgpack.unpackb(data, raw=False, use_list=False)
        return _TYPES[name](**values)
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a service message ({type(exc).__name__}: {exc})") from exc
