"""One server process of the service: start it, serve its HTTP side, open the sessions asked for at start, and stop.

``serve`` runs the service (``serving.service``: the engine core and the output workers) behind the session API
until Ctrl-C, its duration, the end of every session opened at start, or the core's failure. It takes
``ServerOptions``, which the server app (``python -m apps.serve``) builds from its command line; a cluster deploys
the service its own way (``cluster/``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import WSCloseCode, web

from serving.access import resolve_token
from serving.api import SessionError
from serving.http import app_runner, close_websockets, create_service_app
from serving.processes import ServiceOptions
from serving.service import Service
from serving.sessions import SessionSpec, recording_path
from streaming.targets import TargetError, masked_rtmp_url

TOKEN_SHOWN = "TOKEN"
"""What the printed URLs carry in place of the token: a log is no place for it (a generated one is printed once)."""
STOPPING = "the service is stopping"
"""What the push connections are told as they close at the stop."""
AVATAR_AT_START = "anchor"
"""The name the avatar given at start (``--avatar`` or ``--demo``) is served under."""


def numbered(text: str, index: int, count: int) -> str:
    """Session ``index``'s variant of an RTMP URL or file name when several sessions share one."""
    if count == 1 or index == 0:
        return text
    path = Path(text)
    return str(path.with_name(f"{path.stem}-{index}{path.suffix}")) if path.suffix else f"{text}-{index}"


@dataclass(frozen=True)
class SessionsAtStart:
    """The sessions a server opens at start: ``count`` of them like ``first`` (of the avatar given at start,
    ``AVATAR_AT_START``; session i's RTMP URL and MP4 name end -i, ``numbered``, and its seed is first's + i), and what
    each speaks: the demo clip on loop, a file, a microphone, or audio pushed to it."""

    first: SessionSpec = SessionSpec(AVATAR_AT_START)
    count: int = 1
    push: bool = False
    audio: str | None = None
    mic: str | None = None
    """A microphone: its index or name ("" the default device)."""
    demo_audio: bool = False

    def spec(self, index: int, recordings: Path | None) -> SessionSpec:
        """Session ``index``'s spec, its MP4 name resolved inside ``recordings``."""
        first, count = self.first, self.count
        mp4 = numbered(first.mp4, index, count) if first.mp4 else None
        return replace(
            first,
            rtmp=tuple(numbered(url, index, count) for url in first.rtmp),
            mp4=mp4,
            seed=first.seed + index,
            recording=str(recording_path(mp4, recordings)) if mp4 else None,
        )


@dataclass(frozen=True)
class ServerOptions:
    """How to run one server: its service's processes, the address it serves, its token and its sessions at start."""

    service: ServiceOptions
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    """Required from every client; None: none on loopback, one generated (and printed) beyond it."""
    at_start: SessionsAtStart | None = None
    allow_origins: tuple[str, ...] = ()
    """Pages of other origins (``https://player.example``) that may use the API and WHEP from a browser."""
    duration: float | None = None
    """Stop this many seconds after the first frame is out; None: when every session opened at start has ended."""


async def serve(options: ServerOptions) -> int:
    """Run the service until Ctrl-C, ``duration``, the end of every session opened at start, or the core's failure."""
    from engine.engine import RANDOM_WEIGHTS_NOTICE

    random_weights = options.service.checkpoints is None
    if random_weights:
        print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    if options.service.device == "cpu":
        print(
            "CPU: the networks render a frame every few seconds here, far from the 25 fps a live stream needs; "
            "the stream repeats its last picture meanwhile. Use a GPU for real-time output.",
            file=sys.stderr,
        )
    host, port = options.host, options.port
    token, generated = resolve_token(host, options.token)
    try:
        listening = listen(host, port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"error: cannot serve on {host}:{port}: {reason} (another server there? use --http)", file=sys.stderr)
        return 1
    service = Service(options.service)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = asyncio.ensure_future(service.start())
    await asyncio.wait([started, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        print("stopping during start-up: ending the engine core and the output workers...", file=sys.stderr)
        started.cancel()
        listening.close()
        await service.close()
        return 130
    if started.exception() is not None:
        print(f"the service could not start: {started.exception()}", file=sys.stderr)
        listening.close()
        await service.close()
        return 1
    app = create_service_app(
        service,
        token,
        RANDOM_WEIGHTS_NOTICE if random_weights else "",
        bound=(host, port),
        origins=options.allow_origins,
    )
    runner = app_runner(app)
    await runner.setup()
    await web.SockSite(runner, listening).start()
    try:
        sessions, sources = await _open_at_start(options.at_start, service)
    except (SessionError, TargetError) as exc:
        print(f"error: the sessions asked for at start cannot open: {exc}", file=sys.stderr)
        await runner.cleanup()
        await service.close()
        return 2
    _announce(options.at_start, host, port, token, generated, sessions, service)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(service.failed.wait())]
    if sessions:
        waits.append(asyncio.ensure_future(asyncio.gather(*(s.closed.wait() for s in sessions))))
    if options.duration is not None:
        waits.append(asyncio.ensure_future(_after_first_frame(service, options.duration)))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    print("stopping: ending the sessions, flushing their outputs...", file=sys.stderr)
    for source in sources:
        await asyncio.to_thread(source.stop)
    await service.end_sessions()
    await close_websockets(app, WSCloseCode.GOING_AWAY, STOPPING)
    await runner.cleanup()
    failure = service.failure
    await service.close()
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        return 3
    return 0


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the engine starts: a busy port fails at once, not after warm-up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


async def _open_at_start(at_start: SessionsAtStart | None, service: Service) -> tuple[list, list]:
    """The sessions to open at start, opened through the service, and their audio sources."""
    if at_start is None or at_start.count == 0:
        return [], []
    audio = None
    if at_start.demo_audio:
        from engine.assets import demo_audio

        audio = demo_audio()
    sessions, sources = [], []
    for i in range(at_start.count):
        spec = at_start.spec(i, service.recordings)
        session = await service.create(spec, session_id=str(i))
        session.push = at_start.push
        sessions.append(session)
        source = _audio_source(at_start, session.audio.blocking(), audio)
        if source is not None:
            sources.append(source.start())
    return sessions, sources


async def _after_first_frame(service: Service, seconds: float) -> None:
    """Wait until some session has released a frame, then ``seconds``."""
    while not any(s.output_stats.get("frames_released") for s in service.sessions.values()):
        await asyncio.sleep(0.2)
    await asyncio.sleep(seconds)


def _audio_source(at_start: SessionsAtStart, session, demo_audio):
    from streaming.sources.file import FileSource
    from streaming.sources.mic import MicrophoneSource

    if demo_audio is not None:
        samples, rate = demo_audio
        return FileSource(session, samples, rate, loop=True)
    if at_start.audio:
        return FileSource.open(session, at_start.audio)
    if at_start.mic is not None:
        device = int(at_start.mic) if at_start.mic.isdigit() else (at_start.mic or None)
        return MicrophoneSource(session, device)
    return None


def _announce(
    at_start: SessionsAtStart | None,
    host: str,
    port: int,
    token: str | None,
    generated: bool,
    sessions: list,
    service: Service,
) -> None:
    shown = f"[{host}]" if ":" in host else host
    suffix = f"?token={TOKEN_SHOWN}" if token else ""
    also = f"&token={TOKEN_SHOWN}" if token else ""
    capacity = service.budget.capacity()
    if generated:
        print(f"token (give it to viewers and pushers; {TOKEN_SHOWN} below): {token}", file=sys.stderr)
    print(
        f"service: {service.core_info.device}, admits {capacity['admitted']} live session(s) "
        f"({'CPU' if service.options.device == 'cpu' else 'GPU'} {capacity['runtime']}, "
        f"outputs {capacity['outputs']}); "
        f"sessions: http://{shown}:{port}/sessions{suffix}",
        file=sys.stderr,
    )
    for session in sessions:
        if session.preview is not None:
            print(f"preview: http://{shown}:{port}/?session={session.id}{also}", file=sys.stderr)
        if session.push:
            print(f"push:    ws://{shown}:{port}/push?session={session.id}{also}", file=sys.stderr)
    if at_start is not None and at_start.first.rtmp and sessions:
        others = f" (sessions 1 to {at_start.count - 1}: the same URL ending -1, -2, ...)" if at_start.count > 1 else ""
        print(f"rtmp:    {masked_rtmp_url(at_start.first.rtmp[0])}{others}", file=sys.stderr)
    print(f"metrics: http://{shown}:{port}/metrics{suffix}", file=sys.stderr)
