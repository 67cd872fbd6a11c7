"""Serve avatars live: ``python -m streaming.serve --avatar NAME [--rtmp URL] [--webrtc HOST:PORT] [--audio FILE | --mic [DEVICE] | --listen]``.

One process, one runtime (the GPU), ``--sessions N`` live sessions. Each session's frames are
encoded once and fanned out to an RTMP server, the browser preview and/or an MP4 file; its
audio comes from a file played in real time, a microphone, or TTS engines pushing over a
WebSocket. The HTTP side (preview page, signalling, push, /metrics) binds 127.0.0.1 unless
told otherwise; any other address requires a token, given or generated and printed.
``--demo`` streams the bundled speech on loop with the demo portrait on random weights.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import secrets
import signal
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from engine.control_flags import add_control_arguments, control_changes, session_controls
from engine.engine import LIVE_OVERLAP
from streaming.app import Stream, create_app
from streaming.encoders.select import ENCODERS
from streaming.output import SessionOutput
from streaming.sinks.mp4 import Mp4Sink
from streaming.sinks.rtmp import RtmpSink
from streaming.sinks.webrtc import WebRtcPreview

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
    parser.add_argument("--avatar", help="a registered avatar's name or cache folder, or a portrait image to register now")
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
        help=f"HTTP address without a preview (default {DEFAULT_HTTP})",
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
    parser.add_argument("--sessions", type=int, default=1, help="live sessions served by the one runtime")
    parser.add_argument(
        "--no-admission",
        action="store_true",
        help="open every session even beyond the live capacity measured at warm-up (they may then miss deadlines)",
    )
    parser.add_argument(
        "--encoder", choices=ENCODERS, default="auto", help="H.264 encoder (auto: NVENC when this GPU has one, else x264)"
    )
    parser.add_argument("--token", help="required from viewers and pushers; generated when binding beyond loopback without one")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints folder (default: random stand-in weights)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--overlap", type=int, default=LIVE_OVERLAP, help="frames shared by consecutive 80-frame windows")
    parser.add_argument("--steps", type=int, default=25, help="DDIM steps per window")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: when every session has ended)")
    parser.add_argument("--seed", type=int, default=0, help="seed of session 0's diffusion noise (session i uses seed + i)")
    parser.add_argument("--demo", action="store_true", help="the demo portrait speaking the bundled clip on loop, random weights")
    add_control_arguments(parser)
    args = parser.parse_args(argv)
    args.control_changes = control_changes(args, parser)
    if args.sessions < 1:
        parser.error("--sessions must be at least 1")
    if not args.demo and not args.avatar:
        parser.error("--avatar is required (or use --demo)")
    if args.demo and (args.audio or args.mic is not None or args.listen):
        parser.error("--demo speaks the bundled clip; it takes no --audio, --mic or --listen")
    if args.demo and args.webrtc is None:
        args.webrtc = host_port(DEFAULT_HTTP)
    return args


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> tuple[str | None, bool]:
    """(token to require, whether it was generated): beyond loopback a token is mandatory."""
    if token or is_loopback(host):
        return token or None, False
    return secrets.token_urlsafe(16), True


def numbered(text: str, index: int, count: int) -> str:
    """Session ``index``'s variant of an RTMP URL or file name when several sessions share one."""
    if count == 1 or index == 0:
        return text
    path = Path(text)
    return str(path.with_name(f"{path.stem}-{index}{path.suffix}")) if path.suffix else f"{text}-{index}"


async def serve(args: argparse.Namespace) -> int:
    """Run until every session has ended, or Ctrl-C."""
    import torch

    from engine.engine import RANDOM_WEIGHTS_NOTICE
    from engine.runtime import Runtime, RuntimeConfig

    random_weights = args.checkpoints is None or args.demo
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if random_weights:
        print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    audio = None
    if args.demo:
        from engine.assets import demo_audio

        audio = demo_audio()
    if device.type == "cpu":
        print(
            "CPU: the networks render about one frame per second here, far from the 25 fps a live stream needs; "
            "the stream will stall and skip. Use a GPU for real-time output.",
            file=sys.stderr,
        )
        if args.demo and args.duration is None:
            args.duration = CPU_DEMO_SECONDS
            print(f"CPU demo: a short run of {CPU_DEMO_SECONDS:.0f} s", file=sys.stderr)
    config = RuntimeConfig(admission=False) if args.no_admission else None
    runtime = Runtime.from_checkpoints(None if random_weights else args.checkpoints, device=device, steps=args.steps, config=config)
    avatar = load_avatar(args, device, random_weights)

    host, port = args.webrtc or args.http
    token, generated = resolve_token(host, args.token)
    loop = asyncio.get_running_loop()
    streams, sources = [], []
    controls = session_controls(runtime.default_controls, args.control_changes)
    for i in range(args.sessions):
        session = runtime.open_session(avatar, live=True, overlap=args.overlap, seed=args.seed + i, controls=controls)
        output = SessionOutput(session, encoder=args.encoder, name=str(i))
        if args.rtmp:
            output.add_sink(RtmpSink(numbered(args.rtmp, i, args.sessions), output.request_keyframe))
        if args.mp4:
            output.add_sink(Mp4Sink(numbered(str(args.mp4), i, args.sessions), output.request_keyframe))
        preview = None
        if args.webrtc:
            preview = WebRtcPreview(loop, output.request_keyframe, loopback_only=is_loopback(host))
            output.add_sink(preview)
        streams.append(Stream(str(i), session, output, preview, push=args.listen))
        sources.append(_audio_source(args, session, audio))
        output.start()
    for source in sources:
        if source is not None:
            source.start()

    notice = RANDOM_WEIGHTS_NOTICE if random_weights else ""
    runner = web.AppRunner(create_app(streams, token, notice, runtime.metrics))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    _announce(args, host, port, token, generated, streams)

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ended = asyncio.gather(*(asyncio.to_thread(s.output.finished.wait) for s in streams))
    waits = [asyncio.ensure_future(stop.wait()), ended]
    if args.duration is not None:
        waits.append(asyncio.ensure_future(asyncio.sleep(args.duration)))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    print("stopping...", file=sys.stderr)
    for source in sources:
        if source is not None:
            source.stop()
    for stream in streams:
        stream.session.close()
        await asyncio.to_thread(stream.output.stop)
        if stream.preview is not None:
            await stream.preview.aclose()
    await runner.cleanup()
    runtime.close()
    return 0


def load_avatar(args: argparse.Namespace, device, random_weights: bool):
    """The avatar to serve: a cached one by name, an image registered now, or the demo portrait."""
    from engine.engine import models_dir, random_checkpoints
    from engine.render.__main__ import load_or_register

    source = args.avatar
    if args.demo:
        from engine.assets import write_demo_portrait

        source = str(write_demo_portrait(tempfile.mkdtemp(prefix="ditto-demo-")))
    checkpoints = random_checkpoints() if random_weights else models_dir(args.checkpoints)
    return load_or_register(source, checkpoints, device, random_weights)


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


def _announce(args: argparse.Namespace, host: str, port: int, token: str | None, generated: bool, streams: list[Stream]) -> None:
    shown = f"[{host}]" if ":" in host else host
    suffix = f"&token={token}" if token else ""
    if generated:
        print(f"token (give it to viewers and pushers): {token}", file=sys.stderr)
    for stream in streams:
        if stream.preview is not None:
            print(f"preview: http://{shown}:{port}/?session={stream.name}{suffix}", file=sys.stderr)
        if stream.push:
            print(f"push:    ws://{shown}:{port}/push?session={stream.name}{suffix}", file=sys.stderr)
    if args.rtmp:
        others = f" (sessions 1 to {args.sessions - 1}: the same URL ending -1, -2, ...)" if args.sessions > 1 else ""
        print(f"rtmp:    {args.rtmp}{others}", file=sys.stderr)
    print(f"metrics: http://{shown}:{port}/metrics", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
