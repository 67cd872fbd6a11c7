"""The sockets between the service's processes: ZeroMQ, carrying the messages of ``serving.protocol``.

The front end talks to the engine core by request and reply (a DEALER against the core's ROUTER,
each request sent as [number, message] and answered with the same number), and every process pushes
one-way messages (frames, stream commands, events) to PULL sockets the receivers bind. Endpoints
are ``ipc://`` paths in one private folder per service, so nothing listens on the network.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq

from serving.protocol import Message, encode

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message any socket accepts (a pushed second of 192 kHz float audio is 0.77 MB)."""
SEND_HWM = 1000
"""Messages a PUSH socket queues for a slow receiver before sends would block (they are dropped instead)."""


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


def send_nowait(sock: zmq.Socket, message: Message) -> bool:
    """Send without blocking; False when the receiver's queue is full (the message is dropped). An asyncio socket
    reports that in the finished future it returns rather than by raising, so both kinds are looked at."""
    try:
        sent = sock.send(encode(message), zmq.NOBLOCK)
    except zmq.Again:
        return False
    if isinstance(sent, asyncio.Future):
        if isinstance(sent.exception(), zmq.Again):
            return False
        sent.result()
    return True
