"""Serve avatars live: ``python -m streaming.serve [--http HOST:PORT] [--avatar NAME [--rtmp URL] [--audio FILE | --mic | --listen]]``.

The service: an HTTP front end (the session API ``POST/GET/DELETE /sessions``, the preview page,
WHEP playback, the audio push WebSocket, /metrics), an engine core process that owns the GPU,
and output worker processes that encode and send (``streaming.service``). With no ``--avatar``
it starts with zero sessions and runs until stopped; sessions come and go through the API.
``--avatar`` (or ``--demo``) also opens ``--sessions N`` sessions at start through the same API,
each encoded once and fanned out to an RTMP server, the browser preview and/or an MP4 file,
its audio from a file played in real time, a microphone, or a TTS engine pushing over the
WebSocket; the server then ends when they have. The HTTP side binds 127.0.0.1 unless told
otherwise; any other address requires a token, given or generated and printed. ``--demo``
streams the bundled speech on loop with the demo portrait on random weights.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from engine.control_flags import add_control_arguments, control_changes
from engine.latency import FAITHFUL, MODES
from streaming.access import is_loopback, resolve_token
from streaming.api import create_service_app
from streaming.app import app_runner
from streaming.encoders.select import ENCODERS
from streaming.service import Service, ServiceOptions, SessionSpec

log = logging.getLogger("streaming.serve")
DEFAULT_HTTP = "127.0.0.1:8080"
CPU_DEMO_SECONDS = 20.0


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host.strip("[]"), int(port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m streaming.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", help="open sessions at start with this avatar: a registered name or cache folder, or a portrait image")
    parser.add_argument(
        "--rtmp", metavar="URL", help="publish to this rtmp:// URL (sessions after the first get -1, -2, ... appended)"
    )
    parser.add_argument(
        "--webrtc", metavar="HOST:PORT", type=host_port, help="serve the browser preview (and everything HTTP) here"
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=host_port,
        default=host_port(DEFAULT_HTTP),
        help=f"HTTP address of the API, push and metrics without a preview (default {DEFAULT_HTTP})",
    )
    parser.add_argument("--mp4", metavar="FILE", type=Path, help="also record each session to an MP4 file")
    audio = parser.add_mutually_exclusive_group()
    audio.add_argument("--audio", metavar="FILE", type=Path, help="speak this file once, in real time, then end")
    audio.add_argument(
        "--mic",
        nargs="?",
        const="",
        metavar="DEVICE",
        help="speak what the microphone hears (default input, or a device name/index)",
    )
    audio.add_argument("--listen", action="store_true", help="take audio pushed over WebSocket at /push (TTS engines)")
    parser.add_argument(
        "--sessions", type=int, default=1, help="sessions opened at start with --avatar (0: none, the avatar is only served as 'anchor')"
    )
    parser.add_argument(
        "--no-admission",
        action="store_true",
        help="open every session even beyond the live capacity measured at start (they may then shed frames)",
    )
    parser.add_argument(
        "--output-workers", type=int, default=default_workers(), help="processes that encode and send the streams (default: half the cores, at most 8)"
    )
    parser.add_argument(
        "--encoder", choices=ENCODERS, default="auto", help="H.264 encoder; the service's output workers encode with x264 (see README)"
    )
    parser.add_argument("--token", help="required from viewers and pushers; generated when binding beyond loopback without one")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints folder (default: random stand-in weights)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--latency", choices=sorted(MODES), default=FAITHFUL.name,
        help="faithful: the reference's 200 ms hop (speech shown ~540 ms after it is pushed); low: a 120 ms hop, frames "
        "released before the next window's cross-fade (~280 ms), 5/3 the LMDM work per session (see README)",
    )
    parser.add_argument("--overlap", type=int, help="frames shared by consecutive 80-frame windows (default: 75 faithful, 77 low)")
    parser.add_argument("--steps", type=int, default=25, help="DDIM steps per window")
    parser.add_argument("--duration", type=float, help="stop this many seconds after the first frame is out (default: when every session has ended)")
    parser.add_argument("--seed", type=int, default=0, help="seed of session 0's diffusion noise (session i uses seed + i)")
    parser.add_argument("--demo", action="store_true", help="the demo portrait speaking the bundled clip on loop, random weights")
    parser.add_argument(
        "--ray", action="store_true",
        help="serve on a Ray cluster (RAY_ADDRESS, or a local one): one engine per GPU as Ray Serve replicas, sessions placed by capacity (cluster/)",
    )
    add_control_arguments(parser)
    args = parser.parse_args(argv)
    args.control_changes = control_changes(args, parser)
    if args.sessions < 0:
        parser.error("--sessions must be at least 0")
    if args.output_workers < 1:
        parser.error("--output-workers must be at least 1")
    if not args.demo and not args.avatar and (args.audio or args.mic is not None or args.listen or args.rtmp or args.mp4):
        parser.error("--avatar is required for sessions opened at start (or use --demo, or none: open them with POST /sessions)")
    if args.demo and (args.audio or args.mic is not None or args.listen):
        parser.error("--demo speaks the bundled clip; it takes no --audio, --mic or --listen")
    if args.ray and (args.demo or args.audio or args.mic is not None or args.listen or args.rtmp or args.mp4 or args.duration):
        parser.error("--ray serves the sessions clients open with POST /sessions; sessions at start (--demo, --audio, --mic, --listen, --rtmp, --mp4, --duration) are the single server's")
    if args.encoder == "nvenc":
        parser.error("--encoder nvenc: the service's output workers take frames in host memory and encode with x264 (see README)")
    if args.demo and args.webrtc is None:
        args.webrtc = host_port(DEFAULT_HTTP)
    return args


def default_workers() -> int:
    """Half the cores, at least 1, at most 8: each worker is a process with its encoders' threads."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


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
        avatars[AVATAR_AT_START] = demo_portrait() if args.demo else args.avatar
    options = ServiceOptions(
        checkpoints=None if random_weights else str(args.checkpoints), device=device, steps=args.steps,
        admission=not args.no_admission, workers=args.output_workers, avatars=avatars, loopback_only=is_loopback(host),
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


AVATAR_AT_START = "anchor"
"""The name the avatar given with --avatar or --demo is served under."""


def demo_portrait() -> str:
    from engine.assets import write_demo_portrait

    return str(write_demo_portrait(tempfile.mkdtemp(prefix="ditto-demo-")))


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
        f"service: {service.core_info.get('device')}, admits {capacity['admitted']} live session(s) "
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.ray:
        from cluster.app import run

        return run(args)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
