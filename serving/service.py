"""The service as the front end runs it: sessions opened on the engine core and an output worker, listed and ended.

One process per job (as vLLM splits its EngineCore from its API server): this one, the front end, holds the HTTP side
(``serving.http``) and the browsers' WebRTC connections and does no GPU work; the engine core (``serving.core``) owns
the GPU; a pool of output workers (``serving.worker``) encodes and sends. A session is created by telling a worker its
outputs, then asking the core to open it; its frames go core -> worker through shared memory, its pushed audio front
end -> core. The jobs around the sessions are modules of their own: the processes' supervision
(``serving.processes``: a dead worker fails only its own sessions and is replaced; a dead core fails every session and
is started again, or fails the service), admission against the output workers' budget (``serving.output_budget``),
each session's events (``serving.session_events``) and the render jobs (``serving.renders``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from serving import timeline
from serving.api import ErrorKind, SessionError, SessionState
from serving.client import CoreClient
from serving.core import resident_mb
from serving.output_budget import REFERENCE_STREAM, OutputBudget
from serving.processes import Processes, ServiceOptions, WorkerProcess
from serving.protocol import (
    CloseSession,
    CoreReady,
    CoreStatsRequest,
    CostMeasured,
    DescribeAvatar,
    Event,
    OpenSession,
    PreviewWatched,
    RemoveStream,
    RequestKeyframe,
    RoomJoined,
    SessionOutputs,
    ToWorker,
    WorkerStats,
)
from serving.render_placement import RenderPlacement
from serving.renders import Renders
from serving.session_events import SessionEvents
from serving.sessions import RemoteSession, ServedSession, SessionSpec
from streaming.encoders.room_cost import ROOM
from streaming.output_settings import OutputSettingsError
from streaming.protocols import srt_unavailable
from streaming.sinks.webrtc import WebRtcPreview

log = logging.getLogger("serving.service")
DELETE_TIMEOUT = 10.0
END_TIMEOUT = 5.0
"""Seconds each session has to end when the service stops (its outputs flush and close)."""
STATS_TIMEOUT = 5.0
"""Seconds the core has to answer a stats request by default (its request thread answers while the loop ticks)."""
KEPT_ENDED = 100
ROOM_JOIN_TIMEOUT = 20.0
"""Seconds ``POST /sessions`` waits for a LiveKit session's avatar to join its room (the worker gives up after 15)."""
END_ON_DISCONNECT_GRACE = 2.0
"""Seconds a session asked to end on disconnect waits for a push connection to come back before it ends."""


class Service:
    """The sessions over the engine core and the output workers; ``await start()``, then create and delete them."""

    def __init__(self, options: ServiceOptions) -> None:
        self.options = options
        self.sessions: dict[str, ServedSession] = {}
        self.processes = Processes(options, self._event, self._core_lost, self._worker_lost)
        self.budget = OutputBudget(self.processes, self._live, options.admission)
        self._events = SessionEvents(
            options.device,
            end=lambda session: asyncio.ensure_future(self._end_quietly(session)),
            close=lambda session_id: asyncio.ensure_future(self._close_quietly(session_id)),
            closed=self._outputs_closed,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.recordings = Path(options.recordings) if options.recordings else None
        if self.recordings is not None:
            self.recordings.mkdir(parents=True, exist_ok=True)
        self.refusing: str | None = None
        """Set to a reason to stop admitting new sessions and render jobs while the live ones go on (a cluster replica
        draining)."""
        placement = RenderPlacement(self.processes, self.budget)
        self.renders = (
            None
            if options.renders is None
            else Renders(options.renders, placement.open, placement.request, placement.to_worker)
        )
        """The render jobs (None when the service takes none)."""

    @property
    def core(self) -> CoreClient | None:
        """The engine core's request client (a new one each time the core is started again)."""
        return self.processes.core

    @property
    def core_info(self) -> CoreReady | None:
        """What the core said once it had warmed up (None until then)."""
        return self.processes.core_info

    @property
    def failure(self) -> str | None:
        """Why the service has failed (its core died for good), or None."""
        return self.processes.failure

    @property
    def failed(self) -> asyncio.Event:
        return self.processes.failed

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the core and the workers and measure the reference stream's cost; return once all are ready."""
        launched = self.options.launched or time.time()
        self._loop = asyncio.get_running_loop()
        spawned = await self.processes.start()
        await self.budget.cost_ms(*REFERENCE_STREAM)
        if (reason := srt_unavailable()) is not None:
            log.info("%s", reason)
        core_marks = {"spawned": spawned, **self.core_info.marks}
        workers = [w.marks for w in self.processes.workers]
        log.info("%s", timeline.describe(launched, time.time(), core_marks, workers))

    async def end_sessions(self) -> None:
        """End every live session at once, as DELETE does (its outputs flush and close), each within END_TIMEOUT."""
        if self.failure is not None:
            return
        live = [s.id for s in self._live()]
        ending = (asyncio.wait_for(self.delete(i), END_TIMEOUT) for i in live)  # the core may be inside a long tick
        results = await asyncio.gather(*ending, return_exceptions=True)
        for session_id, result in zip(live, results):
            if isinstance(result, BaseException):
                log.warning("session %s did not close in time: %s", session_id, result)

    async def close(self) -> None:
        """End every session, then stop the processes."""
        await self.end_sessions()
        await self.processes.stop()

    def abort(self, reason: str) -> None:
        """Fail every live session with ``reason`` and kill the core and the workers now, without asking them (they may
        be stuck): what a cluster replica does when its loop stopped ticking, before it is replaced."""
        for session in self._live():
            session.state, session.error = SessionState.FAILED, reason
            session.closed.set()
        self.processes.kill(reason)

    # -- sessions ---------------------------------------------------------------------------

    async def create(self, spec: SessionSpec, session_id: str | None = None) -> ServedSession:
        """Open a session: its avatar's size gives its stream's, whose measured cost (its H.264 stream's, its LiveKit
        room's, or both) must fit the outputs' budget; its outputs on the least loaded worker, then the session on the
        core."""
        if self.failure is not None or self.processes.restarting is not None:
            raise SessionError(self.processes.unavailable(), ErrorKind.UNAVAILABLE)
        if self.refusing is not None:
            raise SessionError(self.refusing, ErrorKind.ADMISSION)
        avatar = await self.core.request(DescribeAvatar(spec.avatar))
        try:
            output = spec.output.describe(avatar.width, avatar.height)
        except OutputSettingsError as exc:
            raise SessionError(str(exc), ErrorKind.INVALID) from None
        width, height, preset = output["width"], output["height"], spec.output.preset
        session_id = session_id or secrets.token_hex(4)
        outputs = SessionOutputs(
            session_id, spec.rtmp, spec.recording, spec.preview, spec.output.describe(), spec.livekit
        )
        kinds = [preset] if outputs.encoded else []
        kinds += [ROOM] if spec.livekit is not None else []
        cost = sum([await self.budget.cost_ms(width, height, kind) for kind in kinds])
        if session_id in self.sessions and self.sessions[session_id].live:
            raise SessionError(f"session {session_id!r} exists", ErrorKind.INVALID)
        worker = self.budget.pick_worker(f"{width}x{height} {' and '.join(map(_named, kinds))}", cost)
        session = ServedSession(session_id, spec, worker.index, cost_ms=cost, output={**output, "cost_ms": cost})
        if spec.preview:
            session.preview = WebRtcPreview(
                self._loop,
                lambda: self._to_worker(session, RequestKeyframe(session_id)),
                loopback_only=self.options.loopback_only,
                on_watching=lambda on: self._to_worker(session, PreviewWatched(session_id, on)),
            )
        session.audio = RemoteSession(self.core, session_id, self._loop, spec.latency)
        if spec.end_on_disconnect:
            session.on_abandoned = lambda: asyncio.ensure_future(self._end_abandoned(session))
        if spec.livekit is not None:
            session.push, session.joined = False, self._loop.create_future()  # its audio comes from the room
        self.sessions[session_id] = session
        worker.sessions.add(session_id)
        self._to_worker(session, outputs)
        try:
            opened = await self.core.request(
                OpenSession(
                    session_id,
                    spec.avatar,
                    spec.overlap,
                    spec.latency,
                    spec.seed,
                    spec.controls,
                    worker.address,
                    width,
                    height,
                )
            )
        except BaseException:
            self._to_worker(session, RemoveStream(session_id))
            worker.sessions.discard(session_id)
            del self.sessions[session_id]
            raise
        session.width, session.height, session.state = opened.width, opened.height, SessionState.LIVE
        if session.joined is not None:
            await self._in_room(session)
        return session

    def _to_worker(self, session: ServedSession, message: ToWorker) -> None:
        self.processes.send(session.worker, message, f"session {session.id}")

    async def _in_room(self, session: ServedSession) -> None:
        """Wait until the session's avatar is in its LiveKit room; one that cannot join is ended, never listed, and
        the client hears why (502)."""
        try:
            joined = await asyncio.wait_for(asyncio.shield(session.joined), ROOM_JOIN_TIMEOUT)
            error = joined.error
        except TimeoutError:
            error = f"the avatar did not join the LiveKit room within {ROOM_JOIN_TIMEOUT:g} s"
        except asyncio.CancelledError:  # the client left before the answer: nobody would ever delete the session
            asyncio.ensure_future(self._end_quietly(session))
            raise
        if error is None:
            session.room = {"room": joined.room, "identity": joined.identity}
            return
        try:
            await self.delete(session.id)
        except (TimeoutError, SessionError) as exc:
            log.warning("session %s did not end cleanly after its room failed: %s", session.id, exc)
        self.forget(session.id)
        raise SessionError(f"livekit: {error}", ErrorKind.BAD_GATEWAY)

    def _live(self) -> list[ServedSession]:
        return [s for s in self.sessions.values() if s.live]

    async def delete(self, session_id: str, timeout: float = DELETE_TIMEOUT) -> ServedSession:
        """End a session now: the core stops it, its worker flushes and closes its outputs; returns once closed."""
        session = self.get(session_id)
        if session.live:
            session.state = SessionState.ENDING
            try:
                await self.core.request(CloseSession(session_id))
            except SessionError as exc:
                if exc.kind != ErrorKind.NOT_FOUND:
                    raise
            await asyncio.wait_for(session.closed.wait(), timeout)
        return session

    async def _end_abandoned(self, session: ServedSession) -> None:
        """End a session whose push client left without ``end`` and did not come back within the grace."""
        await asyncio.sleep(END_ON_DISCONNECT_GRACE)
        if not session.live or session.pushers or session.audio.ending or session.state == SessionState.ENDING:
            return
        log.info('session %s: its push client disconnected without "end"; ending it', session.id)
        session.error = 'push: the client disconnected without "end" (end_on_disconnect)'
        await self._end_quietly(session)

    async def _end_quietly(self, session: ServedSession) -> None:
        """End a session that has nothing left to do (its client or its room is gone); its record stays, its
        ``error`` saying why, until deleted or pruned."""
        try:
            await self.delete(session.id)
        except (TimeoutError, SessionError) as exc:
            log.warning("session %s did not end cleanly: %s", session.id, exc)

    def get(self, session_id: str) -> ServedSession:
        """The session ``session_id``; SessionError(not_found) naming the ones there are."""
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(
                f"no session {session_id!r}; sessions: {', '.join(self.sessions) or 'none'}", ErrorKind.NOT_FOUND
            )
        return session

    def forget(self, session_id: str) -> None:
        """Drop an ended session's record."""
        session = self.sessions.get(session_id)
        if session is not None and not session.live:
            del self.sessions[session_id]

    async def refresh(self, timeout: float = STATS_TIMEOUT) -> dict[str, Any]:
        """The core's figures now (runtime metrics); every live session's counters updated from them. ``timeout``: how
        long the core may take to answer (a health check passes its own)."""
        if self.failure is not None or self.processes.restarting is not None:
            return {}
        stats = await self.core.request(CoreStatsRequest(), timeout=timeout)
        for session_id, values in stats.sessions.items():
            if session_id in self.sessions:
                self.sessions[session_id].core_stats = values
        memory = {"frontend_rss_mb": round(resident_mb(os.getpid()), 1)}
        memory["workers_rss_mb"] = round(sum(resident_mb(w.process.pid) for w in self.processes.workers), 1)
        return {**stats.runtime, **memory}

    # -- events from the core and the workers; their deaths ------------------------------------

    def _event(self, message: Event) -> None:
        match message:
            case CostMeasured():
                self.budget.measured(message)
            case WorkerStats(worker=index, streams=streams, cpu_ms_per_slot=cpu_ms):
                if cpu_ms is not None:
                    worker = self.processes.workers[index]
                    self.budget.live_cost.add(time.monotonic(), cpu_ms, self.budget.load_ms(worker))
                for session_id, values in streams.items():
                    if session_id in self.sessions:
                        self._events.counters(self.sessions[session_id], values)
            case _ if message.id in self.sessions:
                self._events.event(self.sessions[message.id], message)
            case _ if self.renders is not None and message.id in self.renders.jobs:
                self.renders.event(message)

    def _outputs_closed(self, session: ServedSession) -> None:
        self.processes.workers[session.worker].sessions.discard(session.id)
        self._prune()

    def _prune(self) -> None:
        """Keep the records of the last KEPT_ENDED sessions that ended (GET shows how they ended), not of every one."""
        ended = [i for i, s in self.sessions.items() if not s.live]
        for session_id in ended[: max(0, len(ended) - KEPT_ENDED)]:
            del self.sessions[session_id]

    def _core_lost(self, message: str) -> None:
        """The engine core died: every live session and render job fails, saying why."""
        for session in self._live():
            session.state, session.error = SessionState.FAILED, message
            session.audio.fail(message)
            self._to_worker(session, RemoveStream(session.id))
            session.closed.set()
        if self.renders is not None:
            self.renders.failed(message)

    def _worker_lost(self, worker: WorkerProcess, message: str) -> None:
        """An output worker died: its sessions, the costs it was measuring and its render job fail."""
        for session_id in list(worker.sessions):
            session = self.sessions.get(session_id)
            if session is not None and session.live:
                session.state, session.error = SessionState.FAILED, message
                session.audio.fail(message)
                session.closed.set()
                if session.joined is not None and not session.joined.done():
                    session.joined.set_result(RoomJoined(session_id, None, None, message))
                asyncio.ensure_future(self._close_quietly(session_id))
        self.budget.worker_lost(worker.index, message)
        if self.renders is not None:
            self.renders.failed(message, worker.index)

    async def _close_quietly(self, session_id: str) -> None:
        try:
            await self.core.request(CloseSession(session_id))
        except (TimeoutError, SessionError):
            pass


def _named(kind: str) -> str:
    """An output's cost as the refusal names it: "veryfast stream", "LiveKit room"."""
    return "LiveKit room" if kind == ROOM else f"{kind} stream"
