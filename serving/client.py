"""Requests from the front end to the engine core, and their replies (``serving.protocol``)."""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from serving.api import SessionError
from serving.ipc import socket
from serving.protocol import CoreReply, CoreRequest, Refused, decode, encode

log = logging.getLogger("serving.client")


class CoreClient:
    """Requests to the engine core and their replies (a DEALER socket; each request numbered, its reply matched)."""

    def __init__(self, context: zmq.asyncio.Context, address: str) -> None:
        self._socket = socket(context, zmq.DEALER, address, bind=False)
        self._waiting: dict[int, asyncio.Future] = {}
        self._next = 0
        self._reader = asyncio.ensure_future(self._read())

    async def request(self, message: CoreRequest, timeout: float | None = 30.0) -> CoreReply:
        """Send ``message``, wait for its reply; SessionError when the core refused it. The message is encoded before
        its reply is waited for, so one that cannot be (a value msgpack cannot carry) leaves nothing in the table."""
        data = encode(message)
        self._next += 1
        rid = self._next
        future = self._waiting[rid] = asyncio.get_running_loop().create_future()
        await self._socket.send_multipart([rid.to_bytes(8, "big"), data])
        try:
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(rid, None)
        if isinstance(reply, Refused):
            raise SessionError(reply.error, reply.kind)
        return reply

    async def _read(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            try:
                rid, data = frames
                reply = decode(data)
            except ValueError as exc:  # a bad reply is dropped: its request times out, the others are answered
                log.warning("core client: dropped a malformed reply: %s", exc)
                continue
            future = self._waiting.get(int.from_bytes(rid, "big"))
            if future is not None and not future.done():
                future.set_result(reply)

    def fail_all(self, error: BaseException) -> None:
        """The core is gone: every waiting request gets ``error``."""
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        self._reader.cancel()
        self._socket.close()
