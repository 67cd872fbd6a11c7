"""The engine core's publisher thread: every session's finished frames out of the runtime, scaled to the session's
output size and converted to I420 (on the GPU, on a stream of its own), copied into the session's shared-memory ring
(``streaming.frame_ring``), and announced to its output worker slot by slot, with the speech segments that closed; a
session that has ended is reported to the front end once its last frame went out.

A render job's session (not live) has its frames taken only as far as its worker has released ring slots, and ends
only once the worker released the last one, so the ring outlives the writing of its file.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch
import zmq

from engine.runtime import SessionClosed
from engine.runtime.session import Frame, Session
from engine.timebase import FPS
from engine.trace import trace
from serving.ipc import send_nowait, socket
from serving.protocol import FrameReady, SegmentsClosed, SessionEnded, StreamEnded, StreamRing
from streaming.encoders.colour import rgb_to_i420_batch
from streaming.encoders.scale import scale_frames
from streaming.frame_ring import HEADER_BYTES, FrameRing

log = logging.getLogger("ditto.core")
PUBLISH_POLL = 0.003
"""Seconds the publisher sleeps when no frame is ready (frames are ready a lead of 100+ ms before they are due)."""


@dataclass
class CoreSession:
    """One session as the core sees it: the runtime's handle, its ring, the worker that encodes it."""

    id: str
    session: Session
    ring: FrameRing
    worker: str
    announced: bool = False
    staged: list = field(default_factory=list)
    host: torch.Tensor | None = None
    registered: bool = False
    render: bool = False
    """A render job: not live; its frames enter the ring only where its worker released the slot, and it ends only
    once the worker has released the last one (or it was closed), so the ring outlives every frame's writing."""
    next_index: int = 0
    closing: bool = False


class Publisher:
    """Frames out of the runtime into each session's ring, for the core's ``sessions`` (guarded by ``lock``), until
    ``stopping`` is set."""

    def __init__(
        self,
        sessions: dict[str, CoreSession],
        lock: threading.Lock,
        stopping: threading.Event,
        context: zmq.Context,
        device: torch.device,
    ) -> None:
        self.sessions, self._lock, self._stopping, self.context, self.device = sessions, lock, stopping, context, device
        self.trace = trace("publisher")

    def run(self, events_address: str) -> None:
        """Take finished frames from every session into its ring and tell its worker; report sessions that end."""
        workers: dict[str, zmq.Socket] = {}
        events = socket(self.context, zmq.PUSH, events_address, bind=False)
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    busy = False
                    for core_session in list(self.sessions.values()):
                        sock = workers.get(core_session.worker)
                        if sock is None:
                            sock = workers[core_session.worker] = socket(
                                self.context, zmq.PUSH, core_session.worker, bind=False
                            )
                        busy |= self._publish(core_session, sock, events, stream)
                    if not busy:
                        time.sleep(PUBLISH_POLL)
        except Exception:
            log.exception("core: the publisher stopped; sessions can no longer reach their outputs")
            self._stopping.set()
        finally:
            for sock in (*workers.values(), events):
                sock.close()

    def _publish(
        self, core: CoreSession, worker: zmq.Socket, events: zmq.Socket, stream: torch.cuda.Stream | None
    ) -> bool:
        """Stage this session's ready frames, send the staged ones whose copy is done; True if anything moved."""
        if not core.announced:
            core.announced = send_nowait(
                worker, StreamRing(core.id, core.ring.name, core.ring.width, core.ring.height, core.ring.slots)
            )
            if not core.announced:
                return False
        if not core.render and core.session.clock_anchor is None and not core.session.finished:
            return False  # its frames leave with the session's clock, once the runtime has started it (or it is closed)
        frames = core.session.take_ready(self._free_slots(core) if core.render else None)
        core.next_index += len(frames)
        if frames and self.trace.on:
            self.trace.record("take", s=core.id, i=frames[0].index, n=len(frames), live=not core.render)
        closed = core.session.closed_segments()  # after the take: closed before any frame numbered above them was made
        if closed:
            send_nowait(worker, SegmentsClosed(core.id, tuple(closed)))
        if frames:
            self._stage(core, frames, stream)
        sent = self._send_staged(core, worker)
        if not frames and not core.staged and core.session.finished:
            if core.render and not core.closing and core.next_index and not core.ring.released(core.next_index - 1):
                return False  # the worker is still writing the job's file (or has yet to attach its ring)
            self._finish(core, worker, events)
            return True
        return bool(frames) or sent

    @staticmethod
    def _free_slots(core: CoreSession) -> int:
        """How many of a render job's next frames its ring has room for (slots its worker has released)."""
        free = 0
        while free < core.ring.slots and core.ring.free(core.next_index + free):
            free += 1
        return free

    def _stage(self, core: CoreSession, frames: list[Frame], stream: torch.cuda.Stream | None) -> None:
        """Scale ``frames`` to the ring's size (the session's output size), convert them to I420 and copy each into its
        ring slot (on CUDA: on the publisher's stream, DMA into the ring, done when the recorded event is)."""
        ring = core.ring
        anchor = core.session.clock_anchor
        slots = [ring.begin(f.index) for f in frames]
        for frame, slot in zip(frames, slots):
            ring.audio(slot)[:] = frame.audio
        if stream is None:
            images = scale_frames(torch.stack([f.image for f in frames]), ring.width, ring.height)
            pictures = rgb_to_i420_batch(images).numpy()
            for slot, picture in zip(slots, pictures):
                ring.picture(slot)[:] = picture
            core.staged.append((None, frames, anchor))
            return
        host = core.host
        for event in {id(f.ready): f.ready for f in frames if f.ready is not None}.values():
            stream.wait_event(event)
        with torch.cuda.stream(stream):
            images = scale_frames(torch.stack([f.image for f in frames]), ring.width, ring.height)
            pictures = rgb_to_i420_batch(images)
            for slot, picture in zip(slots, pictures):
                host[slot, HEADER_BYTES : HEADER_BYTES + ring.picture_bytes].view(picture.shape).copy_(
                    picture, non_blocking=True
                )
            done = torch.cuda.Event()
            done.record(stream)
        core.staged.append((done, frames, anchor))

    def _send_staged(self, core: CoreSession, worker: zmq.Socket) -> bool:
        sent = False
        while core.staged and (core.staged[0][0] is None or core.staged[0][0].query()):
            _, frames, anchor = core.staged.pop(0)
            for frame in frames:
                core.ring.commit(frame.index)
                send_nowait(worker, FrameReady(core.id, frame.index, frame.speech, anchor, frame.segment))
            if self.trace.on:
                due = None if anchor is None or core.render else round(anchor + frames[0].index / FPS, 6)
                self.trace.record("commit", s=core.id, i=frames[0].index, n=len(frames), due=due)
            sent = True
        return sent

    def _finish(self, core: CoreSession, worker: zmq.Socket, events: zmq.Socket) -> None:
        """The session has ended (or failed, or was closed) and every frame went out: tell its worker and the front
        end."""
        error = None
        try:
            core.session.next_frame(timeout=0)
        except SessionClosed as exc:
            error = str(exc)
        except TimeoutError:
            pass
        send_nowait(worker, StreamEnded(core.id))
        send_nowait(events, SessionEnded(core.id, error or None, core.session.stats()))
        with self._lock:
            self.sessions.pop(core.id, None)
        release_ring(core)


def pin(ring: FrameRing, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """The ring as a host tensor registered with CUDA (page-locked), so the copies into it are DMA, asynchronous;
    (None, False) on a CPU core, (the tensor, False) where the registration failed (its copies are synchronous)."""
    if device.type != "cuda":
        return None, False
    host = torch.from_numpy(ring.buffer)
    result = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel(), 0)
    if int(result) != 0:
        log.warning(
            "core: could not page-lock a %dx%d ring (%s); its copies are synchronous",
            ring.width,
            ring.height,
            result,
        )
    return host, int(result) == 0


def free_ring(ring: FrameRing, registered: torch.Tensor | None) -> None:
    """Unregister the ring's page-locked host view (``registered``, if any) and close the ring."""
    if registered is not None:
        torch.cuda.cudart().cudaHostUnregister(registered.data_ptr())
    ring.close()


def release_ring(core: CoreSession) -> None:
    """Unregister and free the session's ring (its worker has its own mapping; the block goes once both let go)."""
    free_ring(core.ring, core.host if core.registered else None)
    core.host, core.registered = None, False
