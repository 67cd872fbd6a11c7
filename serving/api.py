"""What a client of the session API needs, importable without torch or numpy: session and render states, the kinds of
error and the one JSON shape every error has, and the limits a request body keeps.

The server's routes (``serving.http``, ``serving.render_routes``), the engine core's refusals, the Ray ingress
(``cluster.ingress``) and the integrations use these definitions; the push WebSocket's messages and the playback
events are ``streaming.push_messages`` (also torch-free). Plain strings compare equal to the enums' members, and JSON
carries them as their values.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

MAX_BODY_DEPTH = 8
"""How deep a request body's JSON may nest (a session's controls are three levels)."""
SESSION_FIELDS = (
    "avatar",
    "rtmp",
    "srt",
    "mp4",
    "preview",
    "livekit",
    "latency",
    "overlap",
    "seed",
    "controls",
    "output",
    "end_on_disconnect",
)
"""The fields of a ``POST /sessions`` body."""


class SessionState(StrEnum):
    """Where a session is in its life (``GET /sessions/{id}``'s ``state``)."""

    STARTING = "starting"
    LIVE = "live"
    ENDING = "ending"
    """Asked to end: its outputs flush and close."""
    ENDED = "ended"
    FAILED = "failed"
    """Its worker or the engine died, or its outputs could not start; ``error`` says why."""

    @property
    def live(self) -> bool:
        """Still holding the engine's and an output worker's resources."""
        return self in (SessionState.STARTING, SessionState.LIVE, SessionState.ENDING)


class RenderState(StrEnum):
    """Where a render job is (``GET /renders/{id}``'s ``state``)."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    """Cancelled while it ran: its session is being closed."""
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (RenderState.DONE, RenderState.FAILED, RenderState.CANCELLED)


class ErrorKind(StrEnum):
    """Why a request was refused; each kind has its HTTP status (``status``)."""

    INVALID = "invalid"
    """A bad request: a body, field or value the API does not take."""
    NOT_FOUND = "not_found"
    ADMISSION = "admission"
    """Beyond what the service serves in real time (or it is draining): retry later or elsewhere."""
    UNAVAILABLE = "unavailable"
    """The service cannot serve now (its engine is starting again, or it has failed)."""
    CLOSED = "closed"
    """The session has ended."""
    NOT_READY = "not_ready"
    """What was asked for is not there yet (a render job's video before the job is done)."""
    BACKPRESSURE = "backpressure"
    """The session holds as much audio as it takes; push again once it has spoken some."""
    BAD_GATEWAY = "bad_gateway"
    """A service the session depends on (a LiveKit server, a replica) failed."""
    TIMEOUT = "timeout"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    TOO_LARGE = "too_large"
    UNSUPPORTED = "unsupported"
    """A media type the route does not take."""
    INTERNAL = "internal"

    @property
    def status(self) -> int:
        """The HTTP status this kind is answered with."""
        return STATUS[self]

    @classmethod
    def of_status(cls, status: int) -> ErrorKind:
        """The kind of an error known only by its HTTP status (a route the server lacks, a refused token)."""
        return OF_STATUS.get(status, ErrorKind.INVALID if 400 <= status < 500 else ErrorKind.INTERNAL)


STATUS = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.ADMISSION: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.CLOSED: 409,
    ErrorKind.NOT_READY: 409,
    ErrorKind.BACKPRESSURE: 503,
    ErrorKind.BAD_GATEWAY: 502,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED: 415,
    ErrorKind.INTERNAL: 500,
}
OF_STATUS = {
    400: ErrorKind.INVALID,
    401: ErrorKind.UNAUTHORIZED,
    403: ErrorKind.FORBIDDEN,
    404: ErrorKind.NOT_FOUND,
    409: ErrorKind.CLOSED,
    413: ErrorKind.TOO_LARGE,
    415: ErrorKind.UNSUPPORTED,
    502: ErrorKind.BAD_GATEWAY,
    503: ErrorKind.UNAVAILABLE,
    504: ErrorKind.TIMEOUT,
}


class ServiceError(RuntimeError):
    """A request the service refused or could not carry out; the message says why."""


class SessionError(ServiceError):
    """A session or render request that cannot be served; ``kind`` is why (an ``ErrorKind``)."""

    def __init__(self, message: str, kind: ErrorKind | str) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)


def error_body(message: str, kind: ErrorKind | str) -> dict[str, Any]:
    """The JSON body of every error answer: ``{"error": message, "kind": kind}``."""
    return {"error": message, "kind": str(ErrorKind(kind))}
