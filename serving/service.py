"""The service's processes, supervised from the front end: it starts the engine core and the output workers, places
each session on a worker, and opens, lists and ends sessions.

One process per job (as vLLM splits its EngineCore from its API server): this one, the front end,
holds the HTTP side (``serving.http``) and the browsers' WebRTC connections and does no GPU
work; the engine core (``serving.core``) owns the GPU; a pool of output workers
(``serving.worker``) encodes and sends. A session is created by telling a worker its outputs,
then asking the core to open it; its frames go core -> worker through shared memory, its pushed
audio front end -> core. A dead worker fails only its own sessions (and is replaced for new
ones); a dead core fails every session, and the service then stops with an error (a supervisor
restarts it: warming up again takes as long as a fresh start).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from engine.timebase import FPS
from serving import timeline
from serving.api import ErrorKind, ServiceError, SessionError, SessionState
from serving.client import CoreClient
from serving.core import resident_mb
from serving.ipc import endpoint, send_nowait, socket
from serving.live_cost import LiveCost
from serving.protocol import (
    CloseSession,
    CoreConfig,
    CoreReady,
    CoreStatsRequest,
    CostMeasured,
    DescribeAvatar,
    Event,
    Hello,
    MeasureCost,
    OpenSession,
    OutputFailed,
    OutputsClosed,
    Playback,
    PreviewEnded,
    PreviewPacket,
    PreviewWatched,
    RemoveStream,
    RequestKeyframe,
    RoomJoined,
    SessionEnded,
    SessionOutputs,
    Shutdown,
    ToWorker,
    WorkerConfig,
    WorkerReady,
    WorkerStats,
    decode,
    to_argument,
)
from serving.renders import RenderJob, RenderLimits, Renders, open_request, render_outputs
from serving.sessions import RemoteSession, ServedSession, SessionSpec
from streaming import push_messages as push
from streaming.encoders.room_cost import ROOM
from streaming.output import SILENCE, EncodedFrame
from streaming.output_settings import OutputSettings, OutputSettingsError
from streaming.protocols import srt_unavailable
from streaming.push_messages import playback_event
from streaming.sinks.webrtc import WebRtcPreview

log = logging.getLogger("serving.service")
UTILIZATION = 0.8
"""Share of a core an output worker's encoders may fill (as the runtime admits against 0.8 of each hop)."""
FRAME_MS = 1000 / FPS
REFERENCE_STREAM = (1280, 720, OutputSettings().preset)
"""With no session live, the outputs' capacity is counted in streams of this size at the default preset (measured at
start)."""
COST_TIMEOUT = 60.0
"""Seconds a worker has to measure a stream's cost (about a second of one core at 1080p and the slowest preset)."""
DELETE_TIMEOUT = 10.0
END_TIMEOUT = 5.0
"""Seconds each session has to end when the service stops (its outputs flush and close)."""
STATS_TIMEOUT = 5.0
"""Seconds the core has to answer a stats request by default (its request thread answers while the loop ticks)."""
DEGRADED_SHARE = 0.1
BEHIND_SECONDS = 5.0
"""A session whose newest frame is further than this behind its live clock is logged once as behind real time."""
KEPT_ENDED = 100
ROOM_JOIN_TIMEOUT = 20.0
"""Seconds ``POST /sessions`` waits for a LiveKit session's avatar to join its room (the worker gives up after 15)."""
CORE_RESTARTS = 3
"""The engine core's deaths within CORE_RESTART_WINDOW after each of which it is started again (a fourth fails it)."""
CORE_RESTART_WINDOW = 600.0
"""Seconds over which the engine core's deaths are counted against ``ServiceOptions.core_restarts``."""
END_ON_DISCONNECT_GRACE = 2.0
"""Seconds a session asked to end on disconnect waits for a push connection to come back before it ends."""


@dataclass
class WorkerProcess:
    """One output worker: its process, its inbox and the sessions it holds."""

    index: int
    address: str
    process: subprocess.Popen
    inbox: zmq.Socket
    marks: dict[str, float] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        """Started, and not exited."""
        return self.ready.is_set() and self.process.poll() is None


@dataclass(frozen=True)
class ServiceOptions:
    """How to start the service's processes."""

    checkpoints: str | None = None
    device: str = "cpu"
    steps: int = 25
    admission: bool = True
    workers: int = 1
    avatars: dict[str, str | None] = field(default_factory=dict)
    """Avatars to load at start, name -> a cached avatar's name or folder, a portrait image to register, or None: the
    demo portrait (registered once into the engine's cache, ``avatars.load.demo_avatar``)."""
    cache_dir: str | None = None
    loopback_only: bool = True
    runtime: str | None = None
    """``module:function`` building the core's runtime and avatars in place of the engine's (the tests' synthetic
    one)."""
    plans: str | None = None
    """Where the torch backend's compiled packages are (``docs/startup.md``): used when they match this GPU."""
    recordings: str | None = None
    """The folder sessions record their MP4 files into (created at start); None: this server records no files."""
    launched: float | None = None
    """When the server process was launched (wall clock), the origin of the start-up timeline; None: when ``start`` is
    called."""
    renders: RenderLimits | None = None
    """Where render jobs write their files and what they may take (``serving.renders``); None: no ``/renders``."""
    core_restarts: int = CORE_RESTARTS
    """Engine core deaths within CORE_RESTART_WINDOW after which the core is started again; one more and the service
    fails (0: at the first; a cluster replica, which Serve replaces)."""


class Service:
    """The engine core, the output workers and the sessions; ``await start()``, then create and delete sessions."""

    def __init__(self, options: ServiceOptions) -> None:
        self.options = options
        self.sessions: dict[str, ServedSession] = {}
        self.core_info: CoreReady | None = None
        """What the core said once it had warmed up (None until then)."""
        self.failure: str | None = None
        self.failed = asyncio.Event()
        self.restarting: str | None = None
        """Why the engine core is being started again (it died), while it warms up; None when it serves."""
        self._core_deaths: list[float] = []
        self._folder = Path(tempfile.mkdtemp(prefix="ditto-svc-"))
        self._context = zmq.asyncio.Context()
        self._workers: list[WorkerProcess] = []
        self._core: subprocess.Popen | None = None
        self.core: CoreClient | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.recordings = Path(options.recordings) if options.recordings else None
        if self.recordings is not None:
            self.recordings.mkdir(parents=True, exist_ok=True)
        self.refusing: str | None = None
        """Set to a reason to stop admitting new sessions while the live ones go on (a cluster replica draining)."""
        self.costs: dict[tuple[int, int, str], float] = {}
        """Core milliseconds per output frame by (width, height, x264 preset or ROOM), each measured once by a
        worker."""
        self._measuring: dict[tuple[int, int, str], tuple[int, asyncio.Future]] = {}
        """Costs being measured: (the measuring worker, the future of its answer)."""
        self.live_cost = LiveCost()
        """What the workers' streams use of their calibrated costs, as they run."""
        self.renders = (
            None
            if options.renders is None
            else Renders(options.renders, self._open_render, self.core_request, self._job_to_worker)
        )
        """The render jobs (None when the service takes none)."""

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the core (it warms up: minutes with an empty compile cache) and the workers; return once all are
        ready."""
        launched = self.options.launched or time.time()
        self._loop = asyncio.get_running_loop()
        self._events = socket(self._context, zmq.PULL, endpoint(self._folder, "events"), bind=True)
        self._tasks.append(asyncio.ensure_future(self._read_events()))
        spawned = time.time()
        self._spawn_core()
        for index in range(self.options.workers):
            self._workers.append(self._spawn_worker(index))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        hello = asyncio.ensure_future(self.core.request(Hello(), timeout=None))
        await asyncio.wait([hello, asyncio.ensure_future(self.failed.wait())], return_when=asyncio.FIRST_COMPLETED)
        if self.failed.is_set():
            hello.cancel()
            raise ServiceError(self.failure)
        self.core_info = hello.result()
        await asyncio.gather(*(w.ready.wait() for w in self._workers))
        await self.cost_ms(*REFERENCE_STREAM)
        if (reason := srt_unavailable()) is not None:
            log.info("%s", reason)
        core_marks = {"spawned": spawned, **self.core_info.marks}
        log.info("%s", timeline.describe(launched, time.time(), core_marks, [w.marks for w in self._workers]))

    def _spawn_core(self) -> None:
        """Start the engine core process and a client of its request socket."""
        options = self.options
        config = CoreConfig(
            endpoint(self._folder, "core"),
            endpoint(self._folder, "events"),
            options.device,
            options.checkpoints,
            options.steps,
            options.plans,
            options.admission,
            options.avatars,
            options.cache_dir,
            options.runtime,
        )
        self._core = subprocess.Popen([sys.executable, "-m", "serving.core", to_argument(config)])
        self.core = CoreClient(self._context, config.address)

    def _spawn_worker(self, index: int) -> WorkerProcess:
        address = endpoint(self._folder, f"worker-{index}-{secrets.token_hex(2)}")
        config = WorkerConfig(index, address, endpoint(self._folder, "events"), endpoint(self._folder, "core"))
        process = subprocess.Popen([sys.executable, "-m", "serving.worker", to_argument(config)])
        return WorkerProcess(index, address, process, socket(self._context, zmq.PUSH, address, bind=False))

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
        """End every session, stop the workers and the core (killed if they do not stop in time), remove the sockets."""
        self._closing = True
        await self.end_sessions()
        for worker in self._workers:
            send_nowait(worker.inbox, Shutdown())
        if (self.core_info is None or self.restarting) and self._core is not None:
            self._core.terminate()  # still warming up: nothing of its state is worth waiting for
        elif self._core is not None and self._core.poll() is None:
            try:
                await self.core.request(Shutdown(), timeout=5.0)
            except (TimeoutError, SessionError):
                pass
        for process in [self._core, *(w.process for w in self._workers)]:
            if process is None:
                continue
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                log.warning("process %d did not stop; killing it", process.pid)
                process.kill()
        for task in self._tasks:
            task.cancel()
        if self.core is not None:
            self.core.close()
        for worker in self._workers:
            worker.inbox.close()
        self._events.close()
        self._context.term()
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- sessions ---------------------------------------------------------------------------

    def capacity(self) -> dict[str, int | None]:
        """Live sessions the service serves in real time: the device's (measured at the core's warm-up), the outputs'
        (as many streams as the workers' budget holds at the live ones' mean cost, or with none live, of
        REFERENCE_STREAM, each as the live streams measure it (``share``): fewer than are live when sessions opened
        without admission overload them), and the smaller, which is what it admits."""
        runtime = self.core_info.capacity if self.core_info is not None else None
        if self.restarting is not None:
            runtime = 0
        live = self._live()
        costs = [s.cost_ms for s in live if s.cost_ms]
        reference = sum(costs) / len(costs) if costs else self.costs.get(REFERENCE_STREAM)
        outputs = math.floor(self.budget_ms() / (reference * self.share()) + 1e-9) if reference else 0
        admitted = outputs if runtime is None else min(runtime, outputs)
        return {"runtime": runtime, "outputs": outputs, "admitted": admitted}

    def budget_ms(self) -> float:
        """Core milliseconds per frame the output workers encode in real time: UTILIZATION of a core each."""
        return UTILIZATION * FRAME_MS * sum(w.alive for w in self._workers)

    def load_ms(self, worker: WorkerProcess | None = None) -> float:
        """What the live sessions' streams (of ``worker``, or all) cost a core per frame, as calibrated."""
        return sum(s.cost_ms for s in self._live() if worker is None or s.worker == worker.index)

    def share(self) -> float:
        """What the live streams use of their calibrated cost (``serving.live_cost``); 1 until it is measured."""
        share = self.live_cost.share(time.monotonic())
        return 1.0 if share is None else share

    def encoding(self) -> dict[str, Any]:
        """The outputs' budget and load (core milliseconds per frame), the measured share of the calibrated costs
        (None until measured) and every cost measured, as ``GET /sessions`` shows them."""
        share = self.live_cost.share(time.monotonic())
        return {
            "budget_ms": round(self.budget_ms(), 1),
            "live_ms": round(self.load_ms() * self.share(), 1),
            "measured_share": None if share is None else round(share, 3),
            "costs": {f"{w}x{h} {preset}": ms for (w, h, preset), ms in sorted(self.costs.items())},
        }

    async def cost_ms(self, width: int, height: int, preset: str) -> float:
        """What a ``width`` x ``height`` stream at x264 ``preset`` (``preset`` ROOM: a LiveKit room of that size) costs
        a core per frame: measured by a worker the first time it is asked for (about a second), then known."""
        key = (width, height, preset)
        if key in self.costs:
            return self.costs[key]
        if key not in self._measuring:
            alive = [w for w in self._workers if w.alive]
            if not alive:
                raise SessionError(
                    "no output worker is running (starting or being replaced); retry", ErrorKind.ADMISSION
                )
            worker = min(alive, key=self.load_ms)
            if not send_nowait(worker.inbox, MeasureCost(width, height, preset)):
                raise SessionError(f"output worker {worker.index} is not taking messages; retry", ErrorKind.INTERNAL)
            self._measuring[key] = (worker.index, self._loop.create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(self._measuring[key][1]), COST_TIMEOUT)
        except TimeoutError:
            self._measuring.pop(key, None)
            raise SessionError(
                f"measuring what a {width}x{height} {preset} stream costs took over {COST_TIMEOUT:.0f} s",
                ErrorKind.INTERNAL,
            ) from None

    async def create(self, spec: SessionSpec, session_id: str | None = None) -> ServedSession:
        """Open a session: its avatar's size gives its stream's, whose measured cost (its H.264 stream's, its LiveKit
        room's, or both) must fit the outputs' budget; its outputs on the least loaded worker, then the session on the
        core."""
        if self.failure is not None or self.restarting is not None:
            raise SessionError(self._unavailable(), ErrorKind.UNAVAILABLE)
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
        cost = sum([await self.cost_ms(width, height, kind) for kind in kinds])
        if session_id in self.sessions and self.sessions[session_id].live:
            raise SessionError(f"session {session_id!r} exists", ErrorKind.INVALID)
        worker = self._pick_worker(f"{width}x{height} {' and '.join(map(_named, kinds))}", cost)
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

    async def _open_render(self, job: RenderJob) -> None:
        """Start a render job: its file on the least loaded worker (a file is not live: no admission), then its
        session on the core."""
        if self.failure is not None or self.restarting is not None:
            raise SessionError(self._unavailable(), ErrorKind.UNAVAILABLE)
        alive = [w for w in self._workers if w.alive]
        if not alive:
            raise SessionError("no output worker is running (starting or being replaced)", ErrorKind.UNAVAILABLE)
        worker = min(alive, key=self.load_ms)
        job.worker = worker.index
        self._job_to_worker(job, render_outputs(job))
        try:
            await self.core.request(open_request(job, worker.address))
        except BaseException:
            self._job_to_worker(job, RemoveStream(job.id))
            raise

    async def core_request(self, request: Any) -> Any:
        """A request to the engine core, answered (SessionError when refused)."""
        return await self.core.request(request)

    def _job_to_worker(self, job: RenderJob, message: ToWorker) -> None:
        if job.worker is not None and not send_nowait(self._workers[job.worker].inbox, message):
            log.warning(
                "worker %d is not taking messages; %s for render %s dropped", job.worker, type(message).__name__, job.id
            )

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

    def _pick_worker(self, what: str, cost: float) -> WorkerProcess:
        """The least loaded worker, when the outputs' budget holds one more session's outputs (``what``, e.g. "1280x720
        veryfast stream") of ``cost`` (or admission is off)."""
        alive = [w for w in self._workers if w.alive]
        if not alive:
            raise SessionError("no output worker is running (starting or being replaced); retry", ErrorKind.ADMISSION)
        share = self.share()
        load, budget = self.load_ms() * share, self.budget_ms()
        if self.options.admission and load + cost * share > budget:
            measured = "" if share == 1.0 else f" ({cost * share:.1f} as the live streams measure it)"
            raise SessionError(
                f"the outputs are full: a {what} costs {cost:.1f} ms of a core per frame{measured}, "
                f"and {len(self._live())} live session(s) take {load:.1f} of the {budget:.1f} ms that {len(alive)} "
                "output worker(s) encode in real time; end a session, choose a smaller output size or a faster "
                "preset, or start the service with more --output-workers (a core each)",
                ErrorKind.ADMISSION,
            )
        return min(alive, key=self.load_ms)

    def _to_worker(self, session: ServedSession, message: ToWorker) -> None:
        worker = self._workers[session.worker]
        if not send_nowait(worker.inbox, message):
            log.warning(
                "worker %d is not taking messages; %s for session %s dropped",
                worker.index,
                type(message).__name__,
                session.id,
            )

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
        if self.failure is not None or self.restarting is not None:
            return {}
        stats = await self.core.request(CoreStatsRequest(), timeout=timeout)
        for session_id, values in stats.sessions.items():
            if session_id in self.sessions:
                self.sessions[session_id].core_stats = values
        memory = {"frontend_rss_mb": round(resident_mb(os.getpid()), 1)}
        memory["workers_rss_mb"] = round(sum(resident_mb(w.process.pid) for w in self._workers), 1)
        return {**stats.runtime, **memory}

    # -- events from the core and the workers ------------------------------------------------

    async def _read_events(self) -> None:
        while True:
            try:
                message = decode(await self._events.recv())
                self._event(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("service: a bad event")

    def _event(self, message: Event) -> None:
        match message:
            case WorkerReady(worker=index, marks=marks):
                worker = self._workers[index]
                worker.marks = marks
                worker.ready.set()
            case CostMeasured(width=width, height=height, preset=preset, ms=ms, error=error):
                key = (width, height, preset)
                if error is None:
                    self.costs[key] = ms
                _, future = self._measuring.pop(key, (None, None))
                if future is not None and not future.done():
                    if error is None:
                        future.set_result(ms)
                    else:
                        text = f"the output worker could not encode a {width}x{height} {preset} stream: {error}"
                        future.set_exception(SessionError(text, ErrorKind.INTERNAL))
            case WorkerStats(worker=index, streams=streams, cpu_ms_per_slot=cpu_ms):
                if cpu_ms is not None:
                    self.live_cost.add(time.monotonic(), cpu_ms, self.load_ms(self._workers[index]))
                for session_id, values in streams.items():
                    if session_id in self.sessions:
                        self._degrade(self.sessions[session_id], values)
            case _ if message.id in self.sessions:
                self._session_event(self.sessions[message.id], message)
            case _ if self.renders is not None and message.id in self.renders.jobs:
                self.renders.event(message)

    def _session_event(self, session: ServedSession, message: Event) -> None:
        match message:
            case PreviewPacket() if session.preview is not None:
                session.preview.send(
                    EncodedFrame(
                        message.index,
                        message.width,
                        message.height,
                        message.video,
                        message.keyframe,
                        SILENCE,
                        message.opus,
                        message.speech,
                        message.repeat,
                        message.segment,
                    )
                )
            case Playback(event=event, fields=fields):
                session.audio.playback(playback_event(event, fields))
            case PreviewEnded() if session.preview is not None:
                asyncio.ensure_future(session.preview.aclose())
            case SessionEnded(error=error, stats=stats):
                session.core_stats = stats or session.core_stats
                if error is not None and session.state != SessionState.ENDING:
                    session.state, session.error = SessionState.FAILED, error
            case RoomJoined() if session.joined is not None and not session.joined.done():
                session.joined.set_result(message)
            case OutputFailed(sink="livekit", message=text) if session.live:
                log.info("session %s: %s; ending it", session.id, text)  # the room was its audio: nothing left to do
                session.error = f"livekit: {text}"
                asyncio.ensure_future(self._end_quietly(session))
            case OutputFailed(sink=sink, message=text):
                log.error("session %s: its %s output failed: %s", session.id, sink, text)
                session.error = f"{sink}: {text}"
                session.audio.playback(push.OutputFailed(sink, text))
            case OutputsClosed(stats=stats):
                session.output_stats = stats or session.output_stats
                if (
                    session.state == SessionState.LIVE
                ):  # its outputs closed on their own (a ring it could not attach): end it
                    asyncio.ensure_future(self._close_quietly(session.id))
                if session.state != SessionState.FAILED:
                    session.state = SessionState.ENDED
                self._workers[session.worker].sessions.discard(session.id)
                session.closed.set()
                self._prune()

    def _degrade(self, session: ServedSession, stats: dict[str, Any]) -> None:
        """Take a worker's counters; mark (and log, once) a session whose output has shed more than DEGRADED_SHARE of
        its slots since the last report. The policy is to degrade, not to end it: the client decides."""
        before = session.output_stats
        slots = stats.get("frames_released", 0) - before.get("frames_released", 0)
        repeats = stats.get("repeated", 0) - before.get("repeated", 0)
        session.output_stats = stats
        seconds = stats.get("behind_seconds")
        behind = seconds is not None and seconds > BEHIND_SECONDS
        if behind and not session.behind:
            log.warning(
                "session %s is %.0f s behind real time: %s renders slower than real time, so what is pushed now is "
                "shown that much later",
                session.id,
                seconds,
                self._device(),
            )
            session.audio.playback(push.BehindRealTime(seconds))
        elif session.behind and not behind and seconds is not None:
            log.info("session %s is back within %.0f s of real time", session.id, BEHIND_SECONDS)
            session.audio.playback(push.KeepsUp(seconds))
        session.behind = behind
        degraded = slots > 0 and repeats > DEGRADED_SHARE * slots
        if degraded != session.degraded:
            session.degraded = degraded
            if degraded:
                log.warning(
                    "session %s is shedding: %d of its last %d frames were repeats (its frames are not ready in time: "
                    "more sessions than %s serves)",
                    session.id,
                    repeats,
                    slots,
                    self._device(),
                )
            else:
                log.info("session %s keeps up again", session.id)

    def _device(self) -> str:
        """The device the core runs on, as the log names it: "the CPU" or "the GPU"."""
        return "the CPU" if self.options.device == "cpu" else "the GPU"

    def _prune(self) -> None:
        """Keep the records of the last KEPT_ENDED sessions that ended (GET shows how they ended), not of every one."""
        ended = [i for i, s in self.sessions.items() if not s.live]
        for session_id in ended[: max(0, len(ended) - KEPT_ENDED)]:
            del self.sessions[session_id]

    async def _watch(self) -> None:
        """Notice a dead core (every session fails, the service stops) or a dead worker (its sessions fail;
        replaced)."""
        while True:
            await asyncio.sleep(0.2)
            if self._closing:
                return
            code = self._core.poll()
            if code is not None:
                self._core_died(code)
                if self.failure is not None:
                    return
            for worker in list(self._workers):
                code = worker.process.poll()
                if code is not None:
                    self._worker_died(worker, code)

    def _core_died(self, code: int) -> None:
        """Every session fails, saying why; the core is started again, unless it died before it was ever ready or more
        than ``core_restarts`` times in CORE_RESTART_WINDOW: then the service has failed (the server exits, code 3)."""
        died = f"the engine core exited with code {code}"
        message = f"{died}; every session has failed (see its log above)"
        now = time.monotonic()
        self._core_deaths = [t for t in self._core_deaths if now - t < CORE_RESTART_WINDOW] + [now]
        times = len(self._core_deaths)
        if self.core_info is None or times > self.options.core_restarts:
            self.failure = message if times == 1 else f"{message}; it died {times} times in {CORE_RESTART_WINDOW:g} s"
            log.error("%s", self.failure)
        else:
            self.restarting = died
            log.error("%s; starting it again", message)
        self.core.fail_all(SessionError(self._unavailable(), ErrorKind.UNAVAILABLE))
        for session in self._live():
            session.state, session.error = SessionState.FAILED, message
            session.audio.fail(message)
            self._to_worker(session, RemoveStream(session.id))
            session.closed.set()
        if self.renders is not None:
            self.renders.failed(message)
        if self.failure is not None:
            self.failed.set()
            return
        self.core.close()
        self._spawn_core()  # at once: ``_watch`` looks at the new process from its next round
        self._tasks.append(asyncio.ensure_future(self._warmed_up_again(now)))

    def _unavailable(self) -> str:
        """Why no session can be served now: the service has failed, or its engine core is being started again."""
        if self.failure is not None:
            return f"the service has failed: {self.failure}"
        return f"{self.restarting}; it is being started again (warming up): retry"

    async def _warmed_up_again(self, started: float) -> None:
        """Admit again once the core started in place of a dead one has warmed up (a death during its warm-up is one
        more, which ``_watch`` sees)."""
        try:
            self.core_info = await self.core.request(Hello(), timeout=None)
        except SessionError:
            return
        self.restarting = None
        log.info("the engine core was started again: ready in %.1f s", time.monotonic() - started)

    def abort(self, reason: str) -> None:
        """Fail every live session with ``reason`` and kill the core and the workers now, without asking them (they may
        be stuck): what a cluster replica does when its loop stopped ticking, before it is replaced."""
        self._closing = True
        self.failure = reason
        if self.core is not None:
            self.core.fail_all(SessionError(reason, ErrorKind.CLOSED))
        for session in self._live():
            session.state, session.error = SessionState.FAILED, reason
            session.closed.set()
        for process in [self._core, *(w.process for w in self._workers)]:
            if process is not None and process.poll() is None:
                process.kill()
        self.failed.set()

    def _worker_died(self, worker: WorkerProcess, code: int) -> None:
        message = f"output worker {worker.index} exited with code {code}; its sessions have failed"
        log.error("%s: %s", message, ", ".join(sorted(worker.sessions)) or "none")
        for session_id in list(worker.sessions):
            session = self.sessions.get(session_id)
            if session is not None and session.live:
                session.state, session.error = SessionState.FAILED, message
                session.audio.fail(message)
                session.closed.set()
                if session.joined is not None and not session.joined.done():
                    session.joined.set_result(RoomJoined(session_id, None, None, message))
                asyncio.ensure_future(self._close_quietly(session_id))
        for key, (index, future) in list(self._measuring.items()):
            if index == worker.index:
                del self._measuring[key]
                if not future.done():
                    future.set_exception(
                        SessionError(f"{message} while measuring a stream's cost; retry", ErrorKind.INTERNAL)
                    )
        if self.renders is not None:
            self.renders.failed(message, worker.index)
        worker.inbox.close()
        self._workers[worker.index] = self._spawn_worker(worker.index)

    async def _close_quietly(self, session_id: str) -> None:
        try:
            await self.core.request(CloseSession(session_id))
        except (TimeoutError, SessionError):
            pass


def _named(kind: str) -> str:
    """An output's cost as the refusal names it: "veryfast stream", "LiveKit room"."""
    return "LiveKit room" if kind == ROOM else f"{kind} stream"
