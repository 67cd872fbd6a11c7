"""Render jobs on the live service: clips rendered to MP4 in the GPU loop's slack, beside the live sessions.

A job is a session that is not live: the engine core renders it in the same loop as the live sessions, after them
(``engine.runtime.scheduler``: it takes the padding of their batches and a few milliseconds a tick, and the whole GPU
when none is live), and an output worker writes its frames into one MP4 as they come (``serving.render_file``), its
ring the backpressure. Jobs run one at a time, in the order they came, from a bounded queue; each file is named by
the service inside the operator's renders folder and removed when its job is deleted. This module owns the jobs'
records, the queue, their progress and events; ``serving.service`` hands it the events of its jobs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.timebase import FPS, SAMPLE_RATE
from serving.api import ErrorKind, RenderState, SessionError
from serving.protocol import (
    CloseSession,
    Event,
    OpenRender,
    OutputFailed,
    OutputsClosed,
    RemoveStream,
    RenderProgress,
    SessionEnded,
    SessionOutputs,
)

log = logging.getLogger("serving.renders")
EVENTS_KEPT = 50
"""Events a job keeps (its progress events are folded into the last one)."""
DONE_KEPT = 100
"""Finished jobs kept (their files until the job is deleted); beyond, the oldest goes with its file."""


@dataclass(frozen=True)
class RenderLimits:
    """What the operator lets a render job take (``apps.serve``'s render options)."""

    folder: Path
    """Where the finished MP4s are written, each named by the service."""
    audio_folder: Path | None = None
    """Where ``audio_file`` names are looked up (None: uploads only)."""
    queue: int = 4
    """Jobs waiting beside the one running; one more is refused."""
    max_seconds: float = 600.0
    max_mb: float = 64.0


@dataclass(frozen=True)
class RenderSpec:
    """What a job renders: an avatar, the clip (16 kHz mono), and the motion options a session takes."""

    avatar: str
    pcm: np.ndarray
    overlap: int | None = None
    seed: int = 0
    controls: dict[str, Any] | None = None

    @property
    def seconds(self) -> float:
        return self.pcm.size / SAMPLE_RATE

    @property
    def frames(self) -> int:
        """Frames of the finished file: the clip's length at 25 fps, the last frame started."""
        return math.ceil(self.pcm.size / SAMPLE_RATE * FPS)


@dataclass
class RenderJob:
    """One job's record, as ``GET /renders/{id}`` shows it."""

    id: str
    spec: RenderSpec
    path: Path
    state: RenderState = RenderState.QUEUED
    frames_done: int = 0
    error: str | None = None
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    ended: float | None = None
    worker: int | None = None
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    opening: asyncio.Future | None = None
    """The start on the core and a worker while it is under way (a cancel waits for it, then closes what it opened)."""
    core_ended: bool = False
    file_closed: bool = False

    def event(self, kind: str, **fields: Any) -> None:
        """Record an event (``type`` and seconds since it was submitted ``at``); progress replaces progress."""
        entry = {"type": kind, "at": round(time.monotonic() - self.submitted, 2), **fields}
        if kind == "progress" and self.events and self.events[-1]["type"] == "progress":
            self.events[-1] = entry
        else:
            self.events.append(entry)

    @property
    def fps(self) -> float | None:
        """Frames written per second since it started."""
        if self.started is None or self.frames_done == 0:
            return None
        return self.frames_done / max((self.ended or time.monotonic()) - self.started, 1e-6)

    def describe(self) -> dict[str, Any]:
        fps = self.fps
        left = self.spec.frames - self.frames_done
        return {
            "id": self.id,
            "state": self.state,
            "avatar": self.spec.avatar,
            "frames_done": self.frames_done,
            "frames_total": self.spec.frames,
            "audio_seconds": round(self.spec.seconds, 3),
            "audio_seconds_rendered": round(self.frames_done / FPS, 2),
            "frames_per_second": None if fps is None else round(fps, 1),
            "eta_seconds": round(left / fps, 1) if fps and self.state == RenderState.RUNNING else None,
            "seconds": round((self.ended or time.monotonic()) - (self.started or self.submitted), 2)
            if self.started
            else None,
            "error": self.error,
            "events": list(self.events),
        }


class Renders:
    """The render jobs of one service: ``submit``, ``get``, ``cancel``; ``event`` takes what the processes say of a
    job. ``open_job(job)`` starts a job on the core and a worker (the service's), ``send_core`` and ``to_worker``
    reach them."""

    def __init__(
        self,
        limits: RenderLimits,
        open_job: Callable[[RenderJob], Any],
        send_core: Callable[[Any], Any],
        to_worker: Callable[[RenderJob, Any], None],
    ) -> None:
        self.limits = limits
        limits.folder.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, RenderJob] = {}
        self._queue: deque[RenderJob] = deque()
        self._running: RenderJob | None = None
        self._open_job, self._send_core, self._to_worker = open_job, send_core, to_worker
        self.counters = {"done": 0, "failed": 0, "cancelled": 0, "frames": 0}

    # -- the API ------------------------------------------------------------------------------

    def submit(self, spec: RenderSpec) -> RenderJob:
        """Queue a job (SessionError(admission) when the queue is full); it starts as soon as none runs."""
        if self._running is not None and len(self._queue) >= self.limits.queue:
            raise SessionError(
                f"the render queue is full ({self.limits.queue} job(s) waiting beside the one running); retry once "
                "one has finished, or delete one",
                ErrorKind.ADMISSION,
            )
        job_id = secrets.token_hex(6)
        job = RenderJob(job_id, spec, self.limits.folder / f"render-{job_id}.mp4")
        job.event("queued", position=len(self._queue) + (self._running is not None))
        self.jobs[job_id] = job
        self._queue.append(job)
        self._prune()
        self._next()
        return job

    def get(self, job_id: str) -> RenderJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise SessionError(f"no render job {job_id!r}; jobs: {', '.join(self.jobs) or 'none'}", ErrorKind.NOT_FOUND)
        return job

    async def cancel(self, job_id: str, timeout: float = 10.0) -> RenderJob:
        """Cancel a queued or running job, or forget a finished one; its file is removed either way."""
        job = self.get(job_id)
        if job.state == RenderState.QUEUED:
            self._queue.remove(job)
            self._end(job, RenderState.CANCELLED)
        elif job.state == RenderState.RUNNING:
            job.state = RenderState.CANCELLING
            if job.opening is not None:
                await asyncio.gather(job.opening, return_exceptions=True)  # the session closed below is then open
            self._to_worker(job, RemoveStream(job.id))
            try:
                await self._send_core(CloseSession(job.id))
            except SessionError:
                pass
            try:
                await asyncio.wait_for(job.finished.wait(), timeout)
            except TimeoutError:
                self._end(job, RenderState.CANCELLED)
        job.path.unlink(missing_ok=True)
        self.jobs.pop(job_id, None)
        return job

    def counts(self) -> dict[str, int]:
        """Jobs by state now, and the totals since the start (``/metrics``)."""
        states = [j.state for j in self.jobs.values()]
        return {
            "queued": states.count(RenderState.QUEUED),
            "running": int(self._running is not None),
            **self.counters,
        }

    def offline_fps(self) -> float:
        """Frames per second the running job writes (0 with none)."""
        return (self._running.fps or 0.0) if self._running is not None else 0.0

    # -- the processes' events -------------------------------------------------------------------

    def event(self, message: Event) -> None:
        """What the core or a worker said of a job."""
        job = self.jobs.get(message.id)
        if job is None or job.state not in (RenderState.RUNNING, RenderState.CANCELLING):
            return
        match message:
            case RenderProgress(frames=frames):
                job.frames_done = frames
                job.event("progress", frames_done=frames, frames_total=job.spec.frames)
            case OutputFailed(message=text):
                job.error = f"the MP4 could not be written: {text}"
                asyncio.ensure_future(self._close_on_core(job))
            case SessionEnded(error=error):
                job.core_ended = True
                if error is not None and job.state == RenderState.RUNNING and job.error is None:
                    job.error = f"the engine core ended the job: {error}"
                    self._to_worker(job, RemoveStream(job.id))
            case OutputsClosed(stats=stats):
                job.file_closed = True
                job.frames_done = int(stats.get("frames_written", job.frames_done))
                if job.state == RenderState.CANCELLING:
                    self._end(job, RenderState.CANCELLED)
                elif job.error is None and job.frames_done == job.spec.frames:
                    self._end(job, RenderState.DONE)
                else:
                    job.error = job.error or (
                        f"the file holds {job.frames_done} of the clip's {job.spec.frames} frames"
                    )
                    self._end(job, RenderState.FAILED)

    def failed(self, reason: str, worker: int | None = None) -> None:
        """A process died: the running job fails (every job, ``worker`` None: the core; else only that worker's)."""
        job = self._running
        if job is not None and (worker is None or job.worker == worker):
            job.error = reason
            if worker is not None:
                asyncio.ensure_future(self._close_on_core(job))
            self._end(job, RenderState.FAILED)

    # -- running ---------------------------------------------------------------------------------

    def _next(self) -> None:
        if self._running is not None or not self._queue:
            return
        job = self._running = self._queue.popleft()
        job.state, job.started = RenderState.RUNNING, time.monotonic()
        job.event("started", frames_total=job.spec.frames)
        job.opening = asyncio.ensure_future(self._start(job))

    async def _start(self, job: RenderJob) -> None:
        try:
            await self._open_job(job)
        except SessionError as exc:
            job.error = str(exc)
            self._end(job, RenderState.FAILED)
        finally:
            job.opening = None

    async def _close_on_core(self, job: RenderJob) -> None:
        try:
            await self._send_core(CloseSession(job.id))
        except SessionError:
            pass

    def _end(self, job: RenderJob, state: RenderState) -> None:
        if job.state.ended:
            return
        job.state, job.ended = state, time.monotonic()
        self.counters[state] += 1
        if state == RenderState.DONE:
            self.counters["frames"] += job.frames_done
            job.event("done", frames=job.frames_done, seconds=round(job.ended - (job.started or job.submitted), 2))
        elif state == RenderState.FAILED:
            job.event("failed", error=job.error)
            log.error("render %s failed: %s", job.id, job.error)
            job.path.unlink(missing_ok=True)
        else:
            job.event("cancelled")
        job.finished.set()
        if self._running is job:
            self._running = None
        self._next()

    def _prune(self) -> None:
        ended = [j for j in self.jobs.values() if j.state.ended]
        for job in ended[: max(0, len(ended) - DONE_KEPT)]:
            job.path.unlink(missing_ok=True)
            del self.jobs[job.id]


def render_outputs(job: RenderJob) -> SessionOutputs:
    """What the worker is told of a job: its file, written frame by frame."""
    return SessionOutputs(job.id, (), str(job.path), False, {}, None, render=True)


def open_request(job: RenderJob, worker_address: str) -> OpenRender:
    """What the core is asked to open for a job."""
    spec = job.spec
    return OpenRender(
        job.id,
        spec.avatar,
        spec.pcm.astype(np.float32).tobytes(),
        SAMPLE_RATE,
        spec.overlap,
        spec.seed,
        spec.controls,
        worker_address,
    )
