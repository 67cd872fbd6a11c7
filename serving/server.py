"""One server process of the service: start it, serve its HTTP side, open the sessions asked for at start, and stop.

``serve`` runs the service (``serving.service``: the engine core and the output workers) behind the session API
until Ctrl-C, ``--duration``, the end of every session opened at start, or the core's failure. It takes the
parsed command line of the server app (``python -m apps.serve``); a cluster deploys the service its own way (``cluster/``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web

from serving.access import is_loopback, resolve_token
from serving.app import app_runner
from serving.http import create_service_app
from serving.service import Service, ServiceOptions
from serving.sessions import SessionSpec
from serving.timeline import process_started

CPU_DEMO_SECONDS = 20.0
AVATAR_AT_START = "anchor"
"""The name the avatar given with --avatar or --demo is served under."""


def numbered(text: str, index: int, count: int) -> str:
    """Session ``index``'s variant of an RTMP URL or file name when several sessions share one."""
    if count == 1 or index == 0:
        return text
    path = Path(text)
    return str(path.with_name(f"{path.stem}-{index}{path.suffix}")) if path.suffix else f"{text}-{index}"


async def serve(args: argparse.Namespace) -> int:
    """Run the service until Ctrl-C, ``--duration``, the end of every session opened at start, or the core's failure."""
    import torch

    from engine.engine import RANDOM_WEIGHTS_NOTICE

    random_weights = args.checkpoints is None or args.demo
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if random_weights:
        print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    if device == "cpu":
        print(
            "CPU: the networks render a frame every few seconds here, far from the 25 fps a live stream needs; "
            "the stream repeats its last picture meanwhile. Use a GPU for real-time output.",
            file=sys.stderr,
        )
        if args.demo and args.duration is None:
            args.duration = CPU_DEMO_SECONDS
            print(f"CPU demo: a short run of {CPU_DEMO_SECONDS:.0f} s after the first frame", file=sys.stderr)
    host, port = args.webrtc or args.http
    token, generated = resolve_token(host, args.token)
    avatars = {}
    if args.demo or args.avatar:
        avatars[AVATAR_AT_START] = None if args.demo else args.avatar
    options = ServiceOptions(
        checkpoints=None if random_weights else str(args.checkpoints), device=device, steps=args.steps, plans=args.plans and str(args.plans),
        admission=not args.no_admission, workers=args.output_workers, avatars=avatars, loopback_only=is_loopback(host),
        launched=process_started(),
    )
    service = Service(options)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = asyncio.ensure_future(service.start())
    await asyncio.wait([started, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        print("stopping during start-up: ending the engine core and the output workers...", file=sys.stderr)
        started.cancel()
        await service.close()
        return 130
    if started.exception() is not None:
        print(f"the service could not start: {started.exception()}", file=sys.stderr)
        await service.close()
        return 1
    app = create_service_app(service, token, RANDOM_WEIGHTS_NOTICE if random_weights else "", bound=(host, port))
    runner = app_runner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    sessions, sources = await _open_at_start(args, service)
    _announce(args, host, port, token, generated, sessions, service)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(service.failed.wait())]
    if sessions:
        waits.append(asyncio.ensure_future(asyncio.gather(*(s.closed.wait() for s in sessions))))
    if args.duration is not None:
        waits.append(asyncio.ensure_future(_after_first_frame(service, args.duration)))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    print("stopping: ending the sessions, flushing their outputs...", file=sys.stderr)
    for source in sources:
        await asyncio.to_thread(source.stop)
    await runner.cleanup()
    failure = service.failure
    await service.close()
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        return 3
    return 0


async def _open_at_start(args: argparse.Namespace, service: Service) -> tuple[list, list]:
    """The ``--sessions`` sessions of ``--avatar``/``--demo``, opened through the service, and their audio sources."""
    if not (args.avatar or args.demo) or args.sessions == 0:
        return [], []
    audio = None
    if args.demo:
        from engine.assets import demo_audio

        audio = demo_audio()
    sessions, sources = [], []
    for i in range(args.sessions):
        spec = SessionSpec(
            AVATAR_AT_START,
            rtmp=(numbered(args.rtmp, i, args.sessions),) if args.rtmp else (),
            mp4=numbered(str(args.mp4), i, args.sessions) if args.mp4 else None,
            preview=args.webrtc is not None,
            overlap=args.overlap,
            seed=args.seed + i,
            controls=args.control_changes or None,
            latency=args.latency,
        )
        session = await service.create(spec, session_id=str(i))
        session.push = args.listen
        sessions.append(session)
        source = _audio_source(args, session.audio.blocking(), audio)
        if source is not None:
            sources.append(source.start())
    return sessions, sources


async def _after_first_frame(service: Service, seconds: float) -> None:
    """Wait until some session has released a frame, then ``seconds``."""
    while not any(s.output_stats.get("frames_released") for s in service.sessions.values()):
        await asyncio.sleep(0.2)
    await asyncio.sleep(seconds)


def _audio_source(args: argparse.Namespace, session, demo_audio):
    from streaming.sources.file import FileSource
    from streaming.sources.mic import MicrophoneSource

    if demo_audio is not None:
        samples, rate = demo_audio
        return FileSource(session, samples, rate, loop=True)
    if args.audio:
        return FileSource.open(session, args.audio)
    if args.mic is not None:
        device = int(args.mic) if args.mic.isdigit() else (args.mic or None)
        return MicrophoneSource(session, device)
    return None


def _announce(args: argparse.Namespace, host: str, port: int, token: str | None, generated: bool, sessions: list, service: Service) -> None:
    shown = f"[{host}]" if ":" in host else host
    suffix = f"?token={token}" if token else ""
    also = f"&token={token}" if token else ""
    capacity = service.capacity()
    if generated:
        print(f"token (give it to viewers and pushers): {token}", file=sys.stderr)
    print(
        f"service: {service.core_info.device}, admits {capacity['admitted']} live session(s) "
        f"(GPU {capacity['runtime']}, outputs {capacity['outputs']}); sessions: http://{shown}:{port}/sessions{suffix}",
        file=sys.stderr,
    )
    for session in sessions:
        if session.preview is not None:
            print(f"preview: http://{shown}:{port}/?session={session.id}{also}", file=sys.stderr)
        if session.push:
            print(f"push:    ws://{shown}:{port}/push?session={session.id}{also}", file=sys.stderr)
    if args.rtmp and sessions:
        others = f" (sessions 1 to {args.sessions - 1}: the same URL ending -1, -2, ...)" if args.sessions > 1 else ""
        print(f"rtmp:    {args.rtmp}{others}", file=sys.stderr)
    print(f"metrics: http://{shown}:{port}/metrics{suffix}", file=sys.stderr)
