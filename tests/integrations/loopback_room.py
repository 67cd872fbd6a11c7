"""Two participants of one LiveKit room with no server between them: what LiveKit's avatar protocol uses of a room
(RPCs, byte streams, track publications, participants), delivered in order on this event loop.

No LiveKit server installs here, so the agent's real ``DataStreamAudioOutput`` (and ``DittoAudioOutput``) and the
avatar's real ``DataStreamAudioReceiver`` run over this instead. Delivery follows ``rtc.Room``'s: each thing sent is
one event on the receiving side, in the order sent; a byte stream's header calls the topic's handler at once (as
``Room._handle_byte_stream_opened`` does) and an RPC request runs its handler in a task of its own (as
``Room._on_rpc_method_invocation`` does). ``lose_trailers`` drops the next streams' ends, as a lossy link may.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from livekit import rtc

_ids = itertools.count()


class LoopbackReader:
    """An incoming byte stream (``rtc.ByteStreamReader``'s surface); ``closed`` says whether its reader let it go."""

    def __init__(self, info: rtc.ByteStreamInfo) -> None:
        self.info = info
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.get()
        if chunk is None:
            self.closed = True
            raise StopAsyncIteration
        return chunk

    def close(self) -> None:
        self.closed = True


class LoopbackWriter:
    """An outgoing byte stream (``rtc.ByteStreamWriter``'s surface)."""

    def __init__(self, participant: LoopbackParticipant, reader: LoopbackReader | None) -> None:
        self._participant, self._reader = participant, reader

    async def write(self, data: bytes) -> None:
        if self._reader is not None:
            self._participant.room.deliver(self._reader._chunks.put_nowait, bytes(data))

    async def aclose(self) -> None:
        room = self._participant.room
        if self._reader is None:
            return
        if room.lose_trailers > 0:
            room.lose_trailers -= 1
        else:
            room.deliver(self._reader._chunks.put_nowait, None)
        self._reader = None


@dataclass
class Publication:
    """A published track as the other side sees it."""

    kind: int
    name: str
    sid: str = field(default_factory=lambda: f"TR_{next(_ids)}")
    subscribed: bool = True
    track: Any = None


class LoopbackParticipant:
    """A room's local participant (and, seen from the other room, its remote one)."""

    def __init__(self, room: LoopbackRoom, identity: str, kind: int) -> None:
        self.room, self.identity, self.kind = room, identity, kind
        self.sid = f"PA_{next(_ids)}"
        self.name, self.attributes, self.metadata = identity, {}, ""
        self.state = rtc.ParticipantState.PARTICIPANT_STATE_ACTIVE
        self._rpc_handlers: dict[str, Callable] = {}
        self.track_publications: dict[str, Publication] = {}

    def register_rpc_method(self, method: str, handler: Callable) -> Callable:
        self._rpc_handlers[method] = handler
        return handler

    def unregister_rpc_method(self, method: str) -> None:
        self._rpc_handlers.pop(method, None)

    async def perform_rpc(
        self, *, destination_identity: str, method: str, payload: str, response_timeout: float | None = None
    ) -> str:
        self.room.sent.append((self.identity, method))
        peer = self.room.peer
        if peer is None or peer.local_participant.identity != destination_identity:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.RECIPIENT_NOT_FOUND, "Recipient not found")
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        data = rtc.RpcInvocationData(f"RQ_{next(_ids)}", self.identity, payload, response_timeout or 10.0)

        async def invoke() -> None:
            handler = peer.local_participant._rpc_handlers.get(method)
            try:
                if handler is None:
                    raise rtc.RpcError(rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD, "Method not supported")
                result = handler(data)
                if asyncio.iscoroutine(result):
                    result = await result
                self.room.deliver(lambda: answer.done() or answer.set_result(result or ""))
            except rtc.RpcError as exc:
                self.room.deliver(lambda error=exc: answer.done() or answer.set_exception(error))

        self.room.deliver(lambda: peer.spawn(invoke()))
        return await answer

    async def stream_bytes(
        self,
        name: str,
        *,
        topic: str = "",
        attributes: dict[str, str] | None = None,
        destination_identities: list[str] | None = None,
        **_: Any,
    ) -> LoopbackWriter:
        self.room.sent.append((self.identity, f"stream {topic}"))
        peer = self.room.peer
        handler = peer._byte_stream_handlers.get(topic) if peer is not None else None
        if handler is None:
            return LoopbackWriter(self, None)
        info = rtc.ByteStreamInfo(
            f"ST_{next(_ids)}",
            "application/octet-stream",
            topic,
            int(time.time() * 1000),
            0,
            dict(attributes or {}),
            name,
        )
        reader = LoopbackReader(info)
        peer.readers.append(reader)
        self.room.deliver(handler, reader, self.identity)
        return LoopbackWriter(self, reader)

    async def publish_track(self, track: rtc.Track, options: rtc.TrackPublishOptions | None = None) -> Publication:
        publication = Publication(track.kind, track.name, track=track)
        self.track_publications[publication.sid] = publication
        if self.room.peer is not None:
            self.room.deliver(self.room.peer.emit, "track_published", publication, self)
        return publication


class LoopbackRoom(rtc.EventEmitter):
    """One participant's view of the room (``rtc.Room``'s surface that the avatar protocol uses)."""

    def __init__(self, name: str, identity: str, kind: int) -> None:
        super().__init__()
        self.name = name
        self.local_participant = LoopbackParticipant(self, identity, kind)
        self.peer: LoopbackRoom | None = None
        self.remote_participants: dict[str, LoopbackParticipant] = {}
        self._byte_stream_handlers: dict[str, Callable] = {}
        self.readers: list[LoopbackReader] = []
        """Every byte stream received."""
        self.sent: list[tuple[str, str]] = []
        """(sender, what) of every RPC and byte stream either side sent, in order (one list for both sides)."""
        self.lose_trailers = 0
        """The next this many streams' ends sent from here never arrive."""
        self._tasks: set[asyncio.Task] = set()
        self._connected = True

    def isconnected(self) -> bool:
        return self._connected

    def register_byte_stream_handler(self, topic: str, handler: Callable) -> None:
        if topic in self._byte_stream_handlers:
            raise ValueError(f"byte stream handler for topic {topic!r} already set")
        self._byte_stream_handlers[topic] = handler

    def unregister_byte_stream_handler(self, topic: str) -> None:
        self._byte_stream_handlers.pop(topic, None)

    def deliver(self, action: Callable, *args: Any) -> None:
        """``action(*args)`` on the other side: one event, after those sent before it."""
        asyncio.get_running_loop().call_soon(action, *args)

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def disconnect(self) -> None:
        self._connected = False


def room_pair(
    name: str = "loopback", agent: str = "agent", avatar: str = "ditto-avatar"
) -> tuple[LoopbackRoom, LoopbackRoom]:
    """The agent's and the avatar's sides of one room (both agents, as LiveKit's avatar tokens make them)."""
    kind = rtc.ParticipantKind.PARTICIPANT_KIND_AGENT
    agent_room, avatar_room = LoopbackRoom(name, agent, kind), LoopbackRoom(name, avatar, kind)
    agent_room.peer, avatar_room.peer = avatar_room, agent_room
    avatar_room.sent = agent_room.sent
    agent_room.remote_participants[avatar] = avatar_room.local_participant
    avatar_room.remote_participants[agent] = agent_room.local_participant
    return agent_room, avatar_room
