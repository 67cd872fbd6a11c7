"""Every text message of the push WebSocket (``/push?session=NAME``), both ways, and a session's playback events, as
typed values: the one definition the server (``streaming.sources.push``), its clients (``integrations.push_client``,
``serving.api``) and the playback events' makers (``streaming.playback``, the service) share.

A message travels as a JSON object whose ``type`` names it and whose other keys are its fields (``to_json``);
``client_message`` and ``server_message`` read one back. Only the standard library is imported here, so a client
needs neither numpy nor torch to speak the protocol. What each message means is ``streaming.sources.push``'s docstring.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar


class PushMessageError(ValueError):
    """A JSON object that is no message of the push protocol (an unknown ``type``, a missing or unknown field)."""


@dataclass(frozen=True, slots=True)
class PushMessage:
    """A message of the push protocol; ``TYPE`` is its ``type`` on the wire."""

    TYPE: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        """The message as the JSON object sent: ``type`` first, then its fields."""
        return {"type": self.TYPE, **asdict(self)}


# -- client -> server -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Format(PushMessage):
    """Declares what the binary messages that follow hold (checked by the server: ``streaming.sources.push``)."""

    TYPE: ClassVar[str] = "format"
    sample_rate: Any = None
    channels: Any = 1
    encoding: Any = "s16le"


@dataclass(frozen=True, slots=True)
class Controls(PushMessage):
    """Changes the named session controls (fields of ``engine.controls.Controls``, as JSON values)."""

    TYPE: ClassVar[str] = "controls"
    changes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **self.changes}


@dataclass(frozen=True, slots=True)
class EndOfSegment(PushMessage):
    """The speech segment pushed since the last one is complete."""

    TYPE: ClassVar[str] = "end_of_segment"


@dataclass(frozen=True, slots=True)
class Interrupt(PushMessage):
    """Drop the speech not yet spoken (barge-in)."""

    TYPE: ClassVar[str] = "interrupt"


@dataclass(frozen=True, slots=True)
class End(PushMessage):
    """End of input: the session speaks what it has, then ends."""

    TYPE: ClassVar[str] = "end"


# -- server -> client: answers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready(PushMessage):
    """The answer to ``format``: the format in force and the session's latency mode."""

    TYPE: ClassVar[str] = "ready"
    sample_rate: int
    channels: int
    encoding: str
    latency: str


@dataclass(frozen=True, slots=True)
class ControlsApplied(PushMessage):
    """The answer to ``controls``: every control's value now in force."""

    TYPE: ClassVar[str] = "controls"
    applied: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SegmentEnded(PushMessage):
    """The answer to ``end_of_segment``: the segment's number (None: nothing was pushed since the last one)."""

    TYPE: ClassVar[str] = "end_of_segment"
    segment: int | None


@dataclass(frozen=True, slots=True)
class Interrupted(PushMessage):
    """The answer to ``interrupt``: the segment it cut (None: none was open)."""

    TYPE: ClassVar[str] = "interrupted"
    segment: int | None


@dataclass(frozen=True, slots=True)
class Ended(PushMessage):
    """The answer to ``end``; the server closes the socket next."""

    TYPE: ClassVar[str] = "ended"


@dataclass(frozen=True, slots=True)
class Error(PushMessage):
    """A message the server could not take; the stream goes on."""

    TYPE: ClassVar[str] = "error"
    message: str


@dataclass(frozen=True, slots=True)
class AheadLimit(PushMessage):
    """The connection holds as much audio ahead of its session as it takes; the server reads no more for now."""

    TYPE: ClassVar[str] = "ahead_limit"
    queued_seconds: float
    limit_seconds: float


# -- server -> client: playback events --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlaybackStarted(PushMessage):
    """The first speech frame of ``segment`` is shown."""

    TYPE: ClassVar[str] = "playback_started"
    segment: int


@dataclass(frozen=True, slots=True)
class PlaybackFinished(PushMessage):
    """``segment`` has been shown to its end or was interrupted: ``position`` seconds of its speech were shown."""

    TYPE: ClassVar[str] = "playback_finished"
    segment: int
    position: float
    interrupted: bool


@dataclass(frozen=True, slots=True)
class OutputFailed(PushMessage):
    """One of the session's outputs (``sink``) failed and was detached; the session goes on with the others."""

    TYPE: ClassVar[str] = "output_failed"
    sink: str
    message: str


@dataclass(frozen=True, slots=True)
class SessionFailed(PushMessage):
    """The session failed; the server closes the socket next (1011, the message)."""

    TYPE: ClassVar[str] = "session_failed"
    message: str


@dataclass(frozen=True, slots=True)
class BehindRealTime(PushMessage):
    """The session's newest frame is ``seconds`` behind its live clock: the device renders slower than real time."""

    TYPE: ClassVar[str] = "behind_real_time"
    seconds: float


@dataclass(frozen=True, slots=True)
class KeepsUp(PushMessage):
    """A session that was behind real time is back within the limit."""

    TYPE: ClassVar[str] = "keeps_up"
    seconds: float


ClientMessage = Format | Controls | EndOfSegment | Interrupt | End
PlaybackEvent = PlaybackStarted | PlaybackFinished | OutputFailed | SessionFailed | BehindRealTime | KeepsUp
ServerMessage = Ready | ControlsApplied | SegmentEnded | Interrupted | Ended | Error | AheadLimit | PlaybackEvent
CLIENT_MESSAGES: dict[str, type[ClientMessage]] = {k.TYPE: k for k in (Format, Controls, EndOfSegment, Interrupt, End)}
PLAYBACK_EVENTS: dict[str, type[PlaybackEvent]] = {
    k.TYPE: k for k in (PlaybackStarted, PlaybackFinished, OutputFailed, SessionFailed, BehindRealTime, KeepsUp)
}
SERVER_MESSAGES: dict[str, type[ServerMessage]] = {
    **{k.TYPE: k for k in (Ready, ControlsApplied, SegmentEnded, Interrupted, Ended, Error, AheadLimit)},
    **PLAYBACK_EVENTS,
}


def client_message(data: Any) -> ClientMessage:
    """A client's JSON object as its message (``controls``: every key but ``type`` is a change); PushMessageError for
    anything else. The values are the server's to check."""
    kind = _type_of(data)
    if kind not in CLIENT_MESSAGES:
        raise PushMessageError(
            f"unknown message type {kind!r}; expected format, controls, end_of_segment, interrupt or end"
        )
    rest = {k: v for k, v in data.items() if k != "type"}
    if kind == Controls.TYPE:
        return Controls(rest)
    return _build(CLIENT_MESSAGES[kind], rest)


def server_message(data: Any) -> ServerMessage:
    """A server's JSON object as its message (what a client reads); PushMessageError for an unknown type."""
    kind = _type_of(data)
    if kind not in SERVER_MESSAGES:
        raise PushMessageError(f"unknown server message type {kind!r}")
    known = SERVER_MESSAGES[kind]
    names = {f.name for f in fields(known)}  # a newer server's extra fields are left out, not refused
    return _build(known, {k: v for k, v in data.items() if k in names})


def playback_event(kind: str, values: dict[str, Any]) -> PlaybackEvent:
    """A playback event from its ``type`` and fields (as ``serving.protocol.Playback`` carries it between processes)."""
    if kind not in PLAYBACK_EVENTS:
        raise PushMessageError(f"unknown playback event {kind!r}")
    return _build(PLAYBACK_EVENTS[kind], values)


def _type_of(data: Any) -> Any:
    if not isinstance(data, dict):
        raise PushMessageError("a message is a JSON object with a 'type'")
    return data.get("type")


def _build(kind: type[PushMessage], values: dict[str, Any]) -> Any:
    names = {f.name for f in fields(kind)}
    unknown = set(values) - names
    if unknown:
        raise PushMessageError(f"{kind.TYPE}: unknown field(s) {sorted(unknown)}; known: {', '.join(sorted(names))}")
    try:
        return kind(**values)
    except TypeError as exc:
        raise PushMessageError(f"{kind.TYPE}: {exc}") from None
