"""The engine core: the process that owns the GPU, runs the runtime loop and nothing else of the server.

``python -m serving.core CONFIG_JSON`` (started by ``serving.service``; its ``runtime`` entry,
``module:function``, builds another runtime in place of the engine's: the tests' synthetic one). Three threads:
the runtime's loop; this process's main thread, answering the front end's requests (open a
session, pushed audio, controls, interrupt, end of a speech segment, end, close, stats) on a
ROUTER socket; and the publisher, which takes every session's finished frames, scales them to the session's output
size and converts them to I420 on the GPU straight into the session's shared-memory ring (``streaming.frame_ring``), and
tells the session's output worker which frame is in which slot and which speech segments closed. No encoder, muxer,
socket to a viewer
or HTTP handler shares this interpreter, so the loop's Python work never waits behind theirs.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from engine.controls import ControlError, Controls, check_changes
from engine.runtime import AdmissionError, AudioError, Backpressure, SessionClosed
from engine.runtime.clip_feed import feed_clip
from engine.runtime.session import Session
from engine.timebase import OFFLINE_OVERLAP
from serving.api import ErrorKind
from serving.ipc import socket
from serving.protocol import (
    AvatarInfo,
    CloseSession,
    ControlsApplied,
    CoreConfig,
    CoreReady,
    CoreReply,
    CoreRequest,
    CoreStats,
    CoreStatsRequest,
    DescribeAvatar,
    Done,
    EndSegment,
    EndSession,
    Hello,
    Interrupt,
    Opened,
    OpenRender,
    OpenSession,
    PushAudio,
    Refused,
    SegmentNumber,
    Shutdown,
    UpdateControls,
    decode,
    encode,
    from_argument,
)
from serving.publisher import CoreSession, Publisher, free_ring, pin, release_ring
from serving.timeline import process_started
from streaming.encoders.colour import rgb_to_i420_batch
from streaming.encoders.scale import scale_frames
from streaming.frame_ring import STILL, FrameRing
from streaming.frames import AUDIO_SAMPLES_PER_FRAME

log = logging.getLogger("ditto.core")
RUNTIME_CLOSE_WAIT = 2.0
"""Seconds a stopping core waits for its runtime's loop to finish its tick."""


class Avatars:
    """The avatars this core serves, each loaded once (by name from the cache, or given at start) and shared."""

    def __init__(self, device: torch.device, checkpoints: Path, cache_dir: str | None) -> None:
        self.device, self.checkpoints, self.cache_dir = device, checkpoints, cache_dir
        self.loaded: dict[str, Any] = {}

    def add(self, name: str, spec: str | None, random_weights: bool) -> None:
        """Load (or register, for a portrait file) ``spec`` under ``name``; None: the demo portrait."""
        from avatars.load import demo_avatar, load_or_register

        if spec is None:
            self.loaded[name] = demo_avatar(self.checkpoints, self.device)
        else:
            self.loaded[name] = load_or_register(spec, self.checkpoints, self.device, random_weights)

    def get(self, name: str):
        """The avatar called ``name``, loaded from the cache on first use; LookupError naming the known ones."""
        from avatars.cache import CacheError, load_avatar

        if name not in self.loaded:
            try:
                self.loaded[name] = load_avatar(
                    name, self.device, checkpoints=self.checkpoints, cache_dir=self.cache_dir
                )
            except CacheError as exc:
                raise LookupError(f"{exc}; avatars available: {', '.join(self.names()) or 'none'}") from exc
        return self.loaded[name]

    def names(self) -> list[str]:
        """Avatars loaded, and those registered in the cache folder."""
        from avatars.cache import default_cache_dir

        root = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        cached = sorted(p.name for p in root.iterdir() if (p / "manifest.json").is_file()) if root.is_dir() else []
        return sorted(set(self.loaded) | set(cached))


class EngineCore:
    """The runtime, the sessions opened through it and the requests that drive them."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.marks: dict[str, float] = {"started": process_started(), "imported": time.time()}
        """The start's steps (``serving.timeline``), reported to the front end in the hello."""
        factory = config.runtime
        if factory:
            module, _, name = factory.partition(":")
            self.runtime, self.avatars = getattr(importlib.import_module(module), name)(config)
        else:
            self.runtime, self.avatars = engine_runtime(config, self.marks)
        self.marks["ready"] = time.time()
        self.sessions: dict[str, CoreSession] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.context = zmq.Context()
        self.runtime_closed = False
        """Whether the runtime closed when the core stopped (False: its loop was still inside a tick)."""

    # -- requests (main thread) -------------------------------------------------------------

    def serve(self, address: str, events: str) -> None:
        """Answer requests on ``address`` until a shutdown request; frames and events go out from the publisher."""
        router = socket(self.context, zmq.ROUTER, address, bind=True)
        publish = Publisher(self.sessions, self._lock, self._stopping, self.context, self.device)
        publisher = threading.Thread(target=publish.run, args=(events,), name="ditto-publisher", daemon=True)
        publisher.start()
        parent = os.getppid()
        try:
            while not self._stopping.is_set() and os.getppid() == parent:
                if not router.poll(200):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3:  # [peer, number, message]: anything else has no one to answer
                    log.warning("core: dropped a malformed request of %d frame(s)", len(frames))
                    continue
                peer, number, data = frames
                try:
                    request = decode(data)
                except ValueError as exc:
                    log.warning("core: dropped an undecodable request: %s", exc)
                    router.send_multipart([peer, number, encode(Refused(str(exc), ErrorKind.INVALID))])
                    continue
                try:
                    reply = self.handle(request)
                except Exception as exc:
                    log.exception("core: request failed")
                    reply = Refused(f"{type(exc).__name__}: {exc}", ErrorKind.INTERNAL)
                router.send_multipart([peer, number, encode(reply)])
        finally:
            self._stopping.set()
            publisher.join(5)
            router.close()
            self.runtime_closed = self._close_runtime()
            for core_session in list(self.sessions.values()):
                release_ring(core_session)
            self.context.term()
            if os.getppid() != parent:  # orphaned (the front end was killed): nobody else removes the service's folder
                shutil.rmtree(Path(address.removeprefix("ipc://")).parent, ignore_errors=True)

    def _close_runtime(self) -> bool:
        """Close the runtime, waiting at most RUNTIME_CLOSE_WAIT: its loop may be inside a tick that takes a minute on
        a CPU, and nothing of it is worth waiting for when the process ends (the loop's thread is a daemon). Whether
        it closed in that time."""
        closing = threading.Thread(target=self.runtime.close, name="ditto-runtime-close", daemon=True)
        closing.start()
        closing.join(RUNTIME_CLOSE_WAIT)
        if closing.is_alive():
            log.info("core: the runtime is inside a long tick; stopping without waiting for it")
            return False
        return True

    def handle(self, request: CoreRequest) -> CoreReply:
        """One request -> its reply (``Refused`` with its kind: admission, not_found, invalid, closed, backpressure)."""
        match request:
            case Hello():
                return self._hello()
            case CoreStatsRequest():
                return CoreStats(
                    {**self.runtime.metrics(), **self._memory()},
                    {i: c.session.stats() for i, c in list(self.sessions.items())},
                )
            case Shutdown():
                self._stopping.set()
                return Done()
            case DescribeAvatar(avatar=name):
                try:
                    height, width = self.avatars.get(name).frames.shape[1:3]
                except LookupError as exc:
                    return Refused(str(exc.args[0]), ErrorKind.NOT_FOUND)
                return AvatarInfo(int(width), int(height))
            case OpenSession():
                return self._open(request)
            case OpenRender():
                return self._open_render(request)
        core_session = self.sessions.get(request.id)
        if core_session is None:
            return Refused(f"no session {request.id!r}", ErrorKind.NOT_FOUND)
        session = core_session.session
        try:
            match request:
                case PushAudio(pcm=pcm, rate=rate):
                    session.push_audio(np.frombuffer(pcm, np.float32), rate, None, block=False)
                    return Done()
                case UpdateControls(changes=changes):
                    changes = check_changes(changes)  # control names only: never a parameter of the call (``self``)
                    return ControlsApplied(_applied(session.update_controls(**changes), changes))
                case Interrupt():
                    return SegmentNumber(session.interrupt())
                case EndSegment():
                    return SegmentNumber(session.end_segment())
                case EndSession():
                    session.end()
                    return Done()
                case CloseSession():
                    core_session.closing = True
                    session.close()
                    return Done()
        except Backpressure as exc:
            return Refused(str(exc), ErrorKind.BACKPRESSURE)
        except SessionClosed:
            return Refused(
                f"session {core_session.id} has ended; create a new one with POST /sessions", ErrorKind.CLOSED
            )
        except (AudioError, ControlError, TypeError, ValueError) as exc:
            return Refused(str(exc), ErrorKind.INVALID)
        return Refused(f"unknown request {type(request).__name__}", ErrorKind.INVALID)

    def _memory(self) -> dict[str, float]:
        """This process's resident memory and, on CUDA, the GPU memory torch holds (MB): what must stay flat."""
        memory = {"core_rss_mb": round(resident_mb(os.getpid()), 1)}
        if self.device.type == "cuda":
            memory["cuda_allocated_mb"] = round(torch.cuda.memory_allocated(self.device) / 2**20, 1)
            memory["cuda_reserved_mb"] = round(torch.cuda.memory_reserved(self.device) / 2**20, 1)
        return memory

    def _hello(self) -> CoreReady:
        runtime = self.runtime
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return CoreReady(
            device=name,
            capacity=runtime.capacity(),
            warmup_seconds=round(runtime.warmup_seconds, 2),
            window_ms={str(k): v for k, v in runtime.window_ms.items()},
            render_ms={str(k): v for k, v in runtime.render_ms.items()},
            avatars=tuple(self.avatars.names()),
            marks=self.marks,
        )

    def _open(self, request: OpenSession) -> Opened | Refused:
        def live(avatar: Any, controls: Controls) -> Session:
            return self.runtime.open_session(
                avatar,
                live=True,
                overlap=request.overlap,
                seed=request.seed,
                controls=controls,
                latency=request.latency,
            )

        return self._open_with(request, live, (request.width, request.height), still=True)

    def _open_render(self, request: OpenRender) -> Opened | Refused:
        """A render job: a session that is not live (no admission, no clock) speaking the whole clip, pushed by a
        thread of its own as the session takes it (its lead bounds what it holds), then ended."""
        overlap = OFFLINE_OVERLAP if request.overlap is None else request.overlap

        def offline(avatar: Any, controls: Controls) -> Session:
            return self.runtime.open_session(avatar, live=False, overlap=overlap, seed=request.seed, controls=controls)

        opened = self._open_with(request, offline, (None, None), still=False)
        if isinstance(opened, Opened):
            pcm = np.frombuffer(request.pcm, np.float32)
            name = f"render-{request.id}"
            session = self.sessions[request.id].session
            threading.Thread(target=_feed_job, args=(session, pcm, request.rate), name=name, daemon=True).start()
        return opened

    def _open_with(
        self,
        request: OpenSession | OpenRender,
        open_session: Callable[[Any, Controls], Session],
        size: tuple[int | None, int | None],
        still: bool,
    ) -> Opened | Refused:
        """Open a session of ``request``'s avatar with its controls: its ring at ``size`` (None: the avatar's), with the
        portrait as its still picture if ``still``, page-locked before the session's clock starts (so its first
        frames' staging does not wait for it: 155 MB at 1080p); a refused session's ring is freed again."""
        try:
            avatar = self.avatars.get(request.avatar)
        except LookupError as exc:
            return Refused(str(exc.args[0]), ErrorKind.NOT_FOUND)
        height, width = (int(n) for n in avatar.frames.shape[1:3])
        width, height = size[0] or width, size[1] or height
        ring = FrameRing(None, width, height, create=True)
        if still:
            write_still(ring, avatar.frames[0])
        host, registered = pin(ring, self.device)
        try:
            controls = self.runtime.default_controls
            if request.controls:
                controls = controls.replace(**request.controls)
            session = open_session(avatar, controls)
        except (AdmissionError, ControlError, TypeError, ValueError) as exc:
            free_ring(ring, host if registered else None)
            return Refused(str(exc), ErrorKind.ADMISSION if isinstance(exc, AdmissionError) else ErrorKind.INVALID)
        render = isinstance(request, OpenRender)
        with self._lock:
            self.sessions[request.id] = CoreSession(
                request.id, session, ring, request.worker, host=host, registered=registered, render=render
            )
        return Opened(width, height, ring.name, ring.slots)


def _feed_job(session: Session, pcm: np.ndarray, rate: int) -> None:
    """A render job's clip into its session (``engine.runtime.clip_feed``); a job cancelled meanwhile (its session
    closed) stops the feed."""
    try:
        feed_clip(session, pcm, rate)
    except SessionClosed:
        pass
    except (AudioError, ValueError) as exc:
        log.error("core: a render job's audio was refused: %s", exc)


def engine_runtime(config: CoreConfig, marks: dict[str, float] | None = None) -> tuple[Any, Avatars]:
    """The engine's runtime on the configured device (warmed up: minutes with an empty compile cache) and its avatars;
    ``marks`` gets the wall-clock time each step of that finished (``serving.timeline``)."""
    from avatars.cache import hash_checkpoints_ahead
    from engine.engine import models_dir, random_checkpoints
    from engine.runtime import Runtime, RuntimeConfig

    marks = {} if marks is None else marks
    random_weights = config.checkpoints is None
    device = torch.device(config.device)
    checkpoints = random_checkpoints() if random_weights else models_dir(Path(config.checkpoints))
    hash_checkpoints_ahead(
        checkpoints
    )  # every avatar's load checks them (at start or a session's open): hashed meanwhile
    runtime_config = RuntimeConfig(admission=None if config.admission else False)
    runtime = Runtime.from_checkpoints(
        config.checkpoints, device=device, steps=config.steps, config=runtime_config, plans=config.plans
    )
    warmed = time.time()
    marks["networks loaded"], marks["warmed up"] = warmed - runtime.warmup_seconds, warmed
    log.info("core: networks: %s", runtime.engine.backend.packages_status)
    avatars = Avatars(device, checkpoints, config.cache_dir)
    for name, spec in config.avatars.items():
        avatars.add(name, spec, random_weights)
    marks["avatars loaded"] = time.time()
    return runtime, avatars


def resident_mb(pid: int) -> float:
    """A process's resident set size in MB (Linux /proc; 0 where it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def write_still(ring: FrameRing, portrait: torch.Tensor) -> None:
    """Put the avatar's portrait (its first source frame, (H, W, 3) uint8 RGB) into the ring as its still picture: what
    the preview shows until the first frame is rendered, which on a CPU takes minutes."""
    picture = rgb_to_i420_batch(scale_frames(portrait[None], ring.width, ring.height)).cpu().numpy()[0]
    ring.write(STILL, picture, np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32))


def _applied(controls: Controls, changes: dict[str, Any]) -> dict[str, Any]:
    """The changed fields as now in force (JSON values)."""
    return {k: v for k, v in controls.to_dict().items() if k in changes}


def main(argv: list[str] | None = None) -> int:
    """Run a core from its configuration (argv[0], ``CoreConfig`` as JSON): warm up, then serve until shut down."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end shuts the core down; Ctrl-C reaches it alone
    config = from_argument(CoreConfig, (argv or sys.argv[1:])[0])
    core = EngineCore(config)
    core.serve(config.address, config.events)
    if not core.runtime_closed:
        exit_mid_tick()
    return 0


def exit_mid_tick() -> None:
    """End the process now, without finalizing the interpreter, once everything the core holds is released but the
    runtime's loop is still inside a tick: that daemon thread is in torch's C++ code with the GIL released, and
    CPython ends such a thread, when it next takes the GIL during finalization, by unwinding it through torch's frames,
    which may not be unwound; the process then aborts ("terminate called without an active exception", status 134)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
