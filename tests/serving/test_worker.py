"""The output worker, in this process: what it tells the front end about a stream whose frame ring is gone."""

from __future__ import annotations

from pathlib import Path

import zmq

from serving.ipc import socket
from serving.protocol import (
    OutputFailed,
    OutputsClosed,
    RemoveStream,
    SessionOutputs,
    StreamRing,
    WorkerConfig,
    decode,
)
from serving.worker import Worker


def test_a_stream_whose_ring_was_freed_before_the_worker_attached_is_reported_closed(tmp_path: Path) -> None:
    """A session deleted before its worker caught up: the core freed its ring; the front end must still hear "closed"
    (its DELETE waits for it), not only the failure."""
    context = zmq.Context()
    events = socket(context, zmq.PULL, f"ipc://{tmp_path}/events", bind=True)
    worker = Worker(WorkerConfig(0, address=f"ipc://{tmp_path}/inbox", events=f"ipc://{tmp_path}/events"))
    try:
        worker.handle(SessionOutputs("s1", rtmp=(), mp4=None, preview=False))
        worker.handle(StreamRing("s1", ring="ditto-ring-that-is-gone", width=64, height=64, slots=8))
        received = []
        while events.poll(2000) and len(received) < 2:
            received.append(decode(events.recv()))
        assert [type(m) for m in received] == [OutputFailed, OutputsClosed]
        assert "frame ring" in received[0].message and received[1].id == "s1"
        assert "s1" not in worker.streams
    finally:
        worker.inbox.close()
        worker._events.close()
        events.close()
        context.term()


def test_a_stream_removed_before_its_ring_came_is_reported_closed_and_its_late_ring_dropped(tmp_path: Path) -> None:
    """A render job (or session) cancelled while it opens: the front end's cancel waits for "closed", and the ring the
    core announces afterwards must not start a stream nobody will end."""
    context = zmq.Context()
    events = socket(context, zmq.PULL, f"ipc://{tmp_path}/events", bind=True)
    worker = Worker(WorkerConfig(0, address=f"ipc://{tmp_path}/inbox", events=f"ipc://{tmp_path}/events"))
    try:
        worker.handle(SessionOutputs("s1", rtmp=(), mp4=None, preview=False))
        worker.handle(RemoveStream("s1"))
        assert events.poll(2000), "closed at once"
        closed = decode(events.recv())
        assert isinstance(closed, OutputsClosed) and closed.id == "s1"
        worker.handle(StreamRing("s1", ring="ditto-ring-of-a-removed-stream", width=64, height=64, slots=8))
        assert "s1" not in worker.streams and not events.poll(200), "the late ring starts nothing"
    finally:
        worker.inbox.close()
        worker._events.close()
        events.close()
        context.term()
