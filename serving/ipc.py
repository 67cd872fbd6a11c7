"""Messages between the service's processes: ZeroMQ sockets carrying msgpack maps (plain data, never pickle).

The front end talks to the engine core by request and reply (a DEALER against the core's ROUTER,
each request numbered ``rid`` and answered with the same number), and every process pushes
one-way messages (frames, stream commands, events) to PULL sockets the receivers bind. Endpoints
are ``ipc://`` paths in one private folder per service, so nothing listens on the network.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import zmq

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message any socket accepts (a pushed second of 192 kHz float audio is 0.77 MB)."""
SEND_HWM = 1000
"""Messages a PUSH socket queues for a slow receiver before sends would block (they are dropped instead)."""


class ServiceError(RuntimeError):
    """A request the engine core refused or could not carry out; the message says why."""


def pack(message: dict[str, Any]) -> bytes:
    """A message as msgpack bytes (bytes values stay binary)."""
    return msgpack.packb(message, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    """msgpack bytes as a message map; ValueError for anything that is not a map."""
    message = msgpack.unpackb(data, raw=False)
    if not isinstance(message, dict):
        raise ValueError(f"a service message must be a map, got {type(message).__name__}")
    return message


def endpoint(folder: Path, name: str) -> str:
    """The ``ipc://`` address of socket ``name`` in the service's folder."""
    return f"ipc://{folder / name}"


def socket(context: zmq.Context, kind: int, address: str, bind: bool) -> zmq.Socket:
    """A socket of ``kind`` bound or connected to ``address``, bounded and closed without lingering."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.SNDHWM, SEND_HWM)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


def send_nowait(sock: zmq.Socket, message: dict[str, Any]) -> bool:
    """Send without blocking; False when the receiver's queue is full (the message is dropped). An asyncio socket
    reports that in the finished future it returns rather than by raising, so both kinds are looked at."""
    try:
        sent = sock.send(pack(message), zmq.NOBLOCK)
    except zmq.Again:
        return False
    if isinstance(sent, asyncio.Future):
        if isinstance(sent.exception(), zmq.Again):
            return False
        sent.result()
    return True
