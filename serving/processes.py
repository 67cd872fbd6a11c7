"""The service's processes, as the front end supervises them: the engine core and the output workers started, their
events read, a dead one noticed and started again, and all of them stopped.

It owns the private socket folder, the ZeroMQ context, the core's request client and every worker's inbox. What a
death means for the sessions is the service's (``serving.service``): it is told through ``on_core_lost`` and
``on_worker_lost``. A core that dies is started again up to ``ServiceOptions.core_restarts`` times within
CORE_RESTART_WINDOW; one that dies before it was ever ready, or once more, fails the service (``failure``, ``failed``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from serving.api import ErrorKind, ServiceError, SessionError
from serving.client import CoreClient
from serving.ipc import endpoint, send_nowait, socket
from serving.protocol import (
    CoreConfig,
    CoreReady,
    Event,
    Hello,
    Shutdown,
    ToWorker,
    WorkerConfig,
    WorkerReady,
    decode,
    to_argument,
)
from serving.renders import RenderLimits

log = logging.getLogger("serving.processes")
CORE_RESTARTS = 3
"""The engine core's deaths within CORE_RESTART_WINDOW after each of which it is started again (a fourth fails it)."""
CORE_RESTART_WINDOW = 600.0
"""Seconds over which the engine core's deaths are counted against ``ServiceOptions.core_restarts``."""
STOP_TIMEOUT = 10.0
"""Seconds each process has to exit once told to stop before it is killed."""


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


class Processes:
    """The engine core and the output workers; ``await start()``, then ``core`` takes requests and ``send`` reaches a
    worker. ``on_event`` gets every event of the core and the workers but a worker's ``WorkerReady``."""

    def __init__(
        self,
        options: ServiceOptions,
        on_event: Callable[[Event], None],
        on_core_lost: Callable[[str], None],
        on_worker_lost: Callable[[WorkerProcess, str], None],
    ) -> None:
        self.options = options
        self.folder = Path(tempfile.mkdtemp(prefix="ditto-svc-"))
        self.context = zmq.asyncio.Context()
        self.workers: list[WorkerProcess] = []
        self.core_process: subprocess.Popen | None = None
        self.core: CoreClient | None = None
        self.core_info: CoreReady | None = None
        """What the core said once it had warmed up (None until then)."""
        self.failure: str | None = None
        self.failed = asyncio.Event()
        self.restarting: str | None = None
        """Why the engine core is being started again (it died), while it warms up; None when it serves."""
        self._on_event, self._on_core_lost, self._on_worker_lost = on_event, on_core_lost, on_worker_lost
        self._core_deaths: list[float] = []
        self._tasks: list[asyncio.Task] = []
        self._closing = False

    async def start(self) -> float:
        """Start the core (it warms up: minutes with an empty compile cache) and the workers; return, once all are
        ready, when the core was spawned (wall clock). ServiceError when the core died before it was ready."""
        self._events = socket(self.context, zmq.PULL, endpoint(self.folder, "events"), bind=True)
        self._tasks.append(asyncio.ensure_future(self._read_events()))
        spawned = time.time()
        self._spawn_core()
        for index in range(self.options.workers):
            self.workers.append(self._spawn_worker(index))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        hello = asyncio.ensure_future(self.core.request(Hello(), timeout=None))
        await asyncio.wait([hello, asyncio.ensure_future(self.failed.wait())], return_when=asyncio.FIRST_COMPLETED)
        if self.failed.is_set():
            hello.cancel()
            raise ServiceError(self.failure)
        self.core_info = hello.result()
        await asyncio.gather(*(w.ready.wait() for w in self.workers))
        return spawned

    def alive(self) -> list[WorkerProcess]:
        """The workers started and not exited."""
        return [w for w in self.workers if w.alive]

    def send(self, index: int, message: ToWorker, whose: str) -> bool:
        """``message`` to worker ``index`` without waiting; False, and logged, when its inbox is full and the message
        was dropped (``whose``: what it is for, "session ID", "render ID")."""
        if send_nowait(self.workers[index].inbox, message):
            return True
        log.warning("worker %d is not taking messages; %s for %s dropped", index, type(message).__name__, whose)
        return False

    def unavailable(self) -> str:
        """Why no session can be served now: the service has failed, or its engine core is being started again."""
        if self.failure is not None:
            return f"the service has failed: {self.failure}"
        return f"{self.restarting}; it is being started again (warming up): retry"

    async def stop(self) -> None:
        """Stop the workers and the core (killed if they do not stop in time), remove the sockets and the folder."""
        self._closing = True
        for worker in self.workers:
            send_nowait(worker.inbox, Shutdown())
        if (self.core_info is None or self.restarting) and self.core_process is not None:
            self.core_process.terminate()  # still warming up: nothing of its state is worth waiting for
        elif self.core_process is not None and self.core_process.poll() is None:
            try:
                await self.core.request(Shutdown(), timeout=5.0)
            except (TimeoutError, SessionError):
                pass
        for process in [self.core_process, *(w.process for w in self.workers)]:
            if process is None:
                continue
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.warning("process %d did not stop; killing it", process.pid)
                process.kill()
        for task in self._tasks:
            task.cancel()
        if self.core is not None:
            self.core.close()
        for worker in self.workers:
            worker.inbox.close()
        self._events.close()
        self.context.term()
        shutil.rmtree(self.folder, ignore_errors=True)

    def kill(self, reason: str) -> None:
        """Fail with ``reason`` and kill every process now, without asking it (it may be stuck)."""
        self._closing = True
        self.failure = reason
        if self.core is not None:
            self.core.fail_all(SessionError(reason, ErrorKind.CLOSED))
        for process in [self.core_process, *(w.process for w in self.workers)]:
            if process is not None and process.poll() is None:
                process.kill()
        self.failed.set()

    def _spawn_core(self) -> None:
        """Start the engine core process and a client of its request socket."""
        options = self.options
        config = CoreConfig(
            endpoint(self.folder, "core"),
            endpoint(self.folder, "events"),
            options.device,
            options.checkpoints,
            options.steps,
            options.plans,
            options.admission,
            options.avatars,
            options.cache_dir,
            options.runtime,
        )
        self.core_process = subprocess.Popen([sys.executable, "-m", "serving.core", to_argument(config)])
        self.core = CoreClient(self.context, config.address)

    def _spawn_worker(self, index: int) -> WorkerProcess:
        address = endpoint(self.folder, f"worker-{index}-{secrets.token_hex(2)}")
        config = WorkerConfig(index, address, endpoint(self.folder, "events"), endpoint(self.folder, "core"))
        process = subprocess.Popen([sys.executable, "-m", "serving.worker", to_argument(config)])
        return WorkerProcess(index, address, process, socket(self.context, zmq.PUSH, address, bind=False))

    async def _read_events(self) -> None:
        while True:
            try:
                message = decode(await self._events.recv())
                if isinstance(message, WorkerReady):
                    worker = self.workers[message.worker]
                    worker.marks = message.marks
                    worker.ready.set()
                else:
                    self._on_event(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("service: a bad event")

    async def _watch(self) -> None:
        """Notice a dead core (every session fails; it is started again, or the service fails) or a dead worker (its
        sessions fail; it is replaced)."""
        while True:
            await asyncio.sleep(0.2)
            if self._closing:
                return
            code = self.core_process.poll()
            if code is not None:
                self._core_died(code)
                if self.failure is not None:
                    return
            for worker in list(self.workers):
                code = worker.process.poll()
                if code is not None:
                    self._worker_died(worker, code)

    def _core_died(self, code: int) -> None:
        """Fail what the core held, and start it again, unless it died before it was ever ready or more than
        ``core_restarts`` times in CORE_RESTART_WINDOW: then the service has failed (the server exits, code 3)."""
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
        self.core.fail_all(SessionError(self.unavailable(), ErrorKind.UNAVAILABLE))
        self._on_core_lost(message)
        if self.failure is not None:
            self.failed.set()
            return
        self.core.close()
        self._spawn_core()  # at once: ``_watch`` looks at the new process from its next round
        self._tasks.append(asyncio.ensure_future(self._warmed_up_again(now)))

    async def _warmed_up_again(self, started: float) -> None:
        """Serve again once the core started in place of a dead one has warmed up (a death during its warm-up is one
        more, which ``_watch`` sees)."""
        try:
            self.core_info = await self.core.request(Hello(), timeout=None)
        except SessionError:
            return
        self.restarting = None
        log.info("the engine core was started again: ready in %.1f s", time.monotonic() - started)

    def _worker_died(self, worker: WorkerProcess, code: int) -> None:
        message = f"output worker {worker.index} exited with code {code}; its sessions have failed"
        log.error("%s: %s", message, ", ".join(sorted(worker.sessions)) or "none")
        self._on_worker_lost(worker, message)
        worker.inbox.close()
        self.workers[worker.index] = self._spawn_worker(worker.index)
