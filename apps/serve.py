"""python -m apps.serve: serve talking-head avatars live, one service per GPU.

The service is an HTTP front end (the session API POST/GET/DELETE /sessions, the
browser preview, WHEP playback, the audio push WebSocket, /metrics), an engine core
process that owns the GPU, and output worker processes that encode and send
(serving.service, run by serving.server).

With no --avatar it starts with zero sessions and runs until stopped; clients open
sessions through the API. --avatar (or --demo) also opens --sessions N sessions at
start through the same API, each encoded once and fanned out to an RTMP server, the
browser preview and/or an MP4 file, its audio from a file played in real time, a
microphone, or a TTS engine pushing over the WebSocket; the server then ends when
they have. HTTP binds 127.0.0.1 unless told otherwise; any other address requires a
token, given or generated and printed. The manual: docs/service.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from apps.control_flags import add_control_arguments, control_changes
from engine.latency import FAITHFUL, MODES
from engine.timebase import DEFAULT_STEPS
from serving.access import is_loopback, origin_name
from serving.processes import ServiceOptions
from serving.renders import RenderLimits
from serving.server import AVATAR_AT_START, ServerOptions, SessionsAtStart, serve
from serving.sessions import SessionSpec
from serving.timeline import process_started
from streaming.output_settings import OutputSettings

if TYPE_CHECKING:
    from cluster.app import DeployOptions

DEFAULT_HTTP = "127.0.0.1:8080"
AT_START_FLAGS = {
    "--sessions": "sessions",
    "--latency": "latency",
    "--overlap": "overlap",
    "--seed": "seed",
    "--output": "output",
}
"""Flags of the sessions opened at start, refused with ``--ray`` (each POSTed session names its own): flag -> dest."""
CPU_DEMO_SECONDS = 20.0
EXAMPLES = """\
examples:
  python -m apps.serve
      the service on 127.0.0.1:8080 with no sessions yet: clients open them with
      POST /sessions (README.md)
  python -m apps.serve --demo
      the demo portrait speaking the bundled clip on loop (random weights), its
      preview at http://127.0.0.1:8080/?session=0
  python -m apps.serve --avatar anchor --listen --rtmp rtmp://host/live/KEY
      one session at start of the avatar "anchor" (python -m apps.avatars register),
      sent to the RTMP server, speaking what a TTS engine pushes to
      ws://127.0.0.1:8080/push?session=0
"""


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host.strip("[]"), int(port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: what applies together, and the preview ``--demo`` turns on."""
    parser = argparse.ArgumentParser(
        prog="python -m apps.serve",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sessions_at_start(parser)
    add_outputs(parser)
    add_http_and_access(parser)
    add_engine_and_device(parser)
    add_admission_and_capacity(parser)
    add_render_jobs(parser)
    add_cluster(parser)
    add_control_arguments(parser)
    args = parser.parse_args(argv)
    args.control_changes = control_changes(args, parser)
    if args.sessions < 0:
        parser.error("--sessions must be at least 0")
    if args.output_workers < 1:
        parser.error("--output-workers must be at least 1")
    check_sessions_at_start(parser, args)
    check_ray(parser, args)
    if args.demo and args.webrtc is None:
        args.webrtc = host_port(DEFAULT_HTTP)
    return args


def add_sessions_at_start(parser: argparse.ArgumentParser) -> None:
    """The sessions opened at start: their avatar, count, latency and audio, and how long the server runs."""
    group = parser.add_argument_group(
        "sessions at start", "opened by --avatar or --demo through the session API (ids 0, 1, ...)"
    )
    group.add_argument(
        "--avatar",
        help="open sessions at start with this avatar: a registered name or cache folder, or a portrait image",
    )
    group.add_argument(
        "--demo", action="store_true", help="the demo portrait speaking the bundled clip on loop, random weights"
    )
    group.add_argument(
        "--sessions",
        type=int,
        default=1,
        metavar="N",
        help="sessions opened at start with --avatar (0: none, the avatar is only served as 'anchor')",
    )
    group.add_argument(
        "--latency",
        choices=sorted(MODES),
        default=FAITHFUL.name,
        help="faithful: the reference's 200 ms hop (speech shown ~540 ms after it is pushed); low: a 120 ms hop, "
        "frames released before the next window's cross-fade (~280 ms), 5/3 the LMDM work per session (see README)",
    )
    group.add_argument(
        "--overlap",
        type=int,
        metavar="FRAMES",
        help="frames shared by consecutive 80-frame windows (default: 75 faithful, 77 low)",
    )
    group.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of session 0's diffusion noise (session i uses seed + i)"
    )
    group.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="stop this many seconds after the first frame is out (default: when every session has ended)",
    )
    audio = parser.add_argument_group("audio of the sessions at start (one of)").add_mutually_exclusive_group()
    audio.add_argument("--audio", metavar="FILE", type=Path, help="speak this file once, in real time, then end")
    audio.add_argument(
        "--mic",
        nargs="?",
        const="",
        metavar="DEVICE",
        help="speak what the microphone hears (default input, or a device name/index)",
    )
    audio.add_argument("--listen", action="store_true", help="take audio pushed over WebSocket at /push (TTS engines)")


def add_outputs(parser: argparse.ArgumentParser) -> None:
    """Where the sessions at start are sent and how they are encoded; the folder clients' recordings go to."""
    group = parser.add_argument_group("outputs")
    group.add_argument(
        "--rtmp", metavar="URL", help="publish to this rtmp:// URL (sessions after the first get -1, -2, ... appended)"
    )
    group.add_argument(
        "--mp4",
        metavar="FILE",
        type=Path,
        help="also record each session at start to a new MP4 file (its folder is the recordings folder unless "
        "--recordings names one: then FILE is a name inside it)",
    )
    group.add_argument(
        "--output",
        metavar="KEY=VALUE,...",
        type=output_argument,
        help="how the sessions at start are encoded: size (avatar, 1080p, 720p, 540p), bitrate_kbps, buffer_kbits, "
        "rate_control, preset, tune, keyframe_seconds, profile, audio_channels, e.g. size=720p,preset=veryfast "
        "(or the JSON object; docs/output.md; default: the avatar's size, each size's defaults)",
    )
    group.add_argument(
        "--recordings",
        metavar="DIR",
        type=Path,
        help='the folder clients\' sessions record their "mp4" names into (created at start; default: no recordings)',
    )


def add_http_and_access(parser: argparse.ArgumentParser) -> None:
    """Where the HTTP side listens, and who may use it."""
    group = parser.add_argument_group("HTTP and access")
    group.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=host_port,
        default=host_port(DEFAULT_HTTP),
        help=f"HTTP address of the API, push and metrics without a preview (default {DEFAULT_HTTP})",
    )
    group.add_argument(
        "--webrtc", metavar="HOST:PORT", type=host_port, help="serve the browser preview (and everything HTTP) here"
    )
    group.add_argument(
        "--token", help="required from viewers and pushers; generated when binding beyond loopback without one"
    )
    group.add_argument(
        "--allow-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        type=origin_argument,
        help="a page of another origin (https://player.example) that may use the API and WHEP from a browser "
        "(CORS; repeatable; default: none)",
    )


def add_engine_and_device(parser: argparse.ArgumentParser) -> None:
    """The weights, the device and how the engine runs on it."""
    group = parser.add_argument_group("engine and device")
    group.add_argument(
        "--checkpoints", type=Path, metavar="DIR", help="official checkpoints folder (default: random stand-in weights)"
    )
    group.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    group.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, metavar="N", help=f"DDIM steps per window (default {DEFAULT_STEPS})"
    )
    group.add_argument(
        "--plans",
        type=Path,
        metavar="DIR",
        help="the torch backend's compiled packages (python -m compile.build_plans): a start in seconds where they fit",
    )


def add_admission_and_capacity(parser: argparse.ArgumentParser) -> None:
    """How many sessions the service takes, and the processes that encode them."""
    group = parser.add_argument_group("admission and capacity")
    group.add_argument(
        "--no-admission",
        action="store_true",
        help="open every session even beyond the live capacity measured at start (they may then shed frames)",
    )
    group.add_argument(
        "--output-workers",
        type=int,
        default=default_workers(),
        metavar="N",
        help="processes that encode and send the streams (default: half the cores, at most 8)",
    )


def add_render_jobs(parser: argparse.ArgumentParser) -> None:
    """Render jobs: clips to MP4 in the live loop's slack, and what a job may take."""
    group = parser.add_argument_group("render jobs (POST /renders: clips to MP4 in the live loop's slack)")
    group.add_argument(
        "--renders",
        metavar="DIR",
        type=Path,
        help="take render jobs, their MP4s written into DIR under names the service chooses (default: no jobs)",
    )
    group.add_argument(
        "--render-audio",
        metavar="DIR",
        type=Path,
        help='the folder a job\'s "audio_file" names a file of (default: jobs upload their audio)',
    )
    group.add_argument(
        "--render-queue", type=int, default=4, metavar="N", help="jobs waiting beside the one running (default 4)"
    )
    group.add_argument(
        "--render-max-seconds", type=float, default=600.0, metavar="S", help="longest clip taken (default 600 s)"
    )
    group.add_argument(
        "--render-max-mb", type=float, default=64.0, metavar="MB", help="largest audio upload taken (default 64 MB)"
    )


def add_cluster(parser: argparse.ArgumentParser) -> None:
    """Serving on a Ray cluster instead of one server."""
    group = parser.add_argument_group("cluster (--ray)")
    group.add_argument(
        "--ray",
        action="store_true",
        help="serve on a Ray cluster (RAY_ADDRESS, or a local one bound to loopback when --http is): one engine "
        "per GPU as Ray Serve replicas, sessions placed by capacity (cluster/, docs/cluster.md); the options of HTTP "
        "and access, engine and device, admission and capacity, render jobs and --recordings apply to each replica; "
        "the flags of sessions opened at start (--sessions, --latency, --overlap, --seed, the controls) are refused: "
        "a POSTed session names its own",
    )
    group.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="--ray: engine replicas (default: one per GPU of the cluster; 1 on the CPU)",
    )
    group.add_argument(
        "--gpus-per-replica", type=float, default=1.0, metavar="N", help="--ray: GPUs each replica takes (default 1)"
    )


def check_sessions_at_start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through ``parser.error`` when flags of sessions at start come without an avatar, or audio with --demo."""
    audio = args.audio or args.mic is not None or args.listen
    if not args.demo and not args.avatar and (audio or args.rtmp or args.mp4 or args.output):
        parser.error(
            "--avatar is required for sessions opened at start (or use --demo, or none: open them with POST /sessions)"
        )
    if args.demo and audio:
        parser.error("--demo speaks the bundled clip; it takes no --audio, --mic or --listen")


def check_ray(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through ``parser.error`` when ``--ray`` meets what only the single server does, or the replica flags
    come without it: a cluster serves only the sessions clients open, each naming its own settings."""
    if args.ray and (
        args.demo or args.audio or args.mic is not None or args.listen or args.rtmp or args.mp4 or args.duration
    ):
        parser.error(
            "--ray serves the sessions clients open with POST /sessions; sessions at start (--demo, --audio, --mic, "
            "--listen, --rtmp, --mp4, --duration) are the single server's"
        )
    if args.ray and args.allow_origin:
        parser.error("--allow-origin is the single server's: the --ray ingress sends no CORS headers to other pages")
    if args.ray:
        given = [flag for flag, dest in AT_START_FLAGS.items() if getattr(args, dest) != parser.get_default(dest)]
        given += ["the controls"] if args.control_changes else []
        if given:
            parser.error(
                "--ray serves the sessions clients open with POST /sessions, each naming its own settings: "
                f"{', '.join(given)} apply to sessions opened at start"
            )
    elif args.replicas is not None or args.gpus_per_replica != parser.get_default("gpus_per_replica"):
        parser.error("--replicas and --gpus-per-replica deploy on a Ray cluster: add --ray")
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be at least 1")


def output_argument(text: str) -> OutputSettings:
    """An ``--output`` value: the settings of the sessions opened at start."""
    try:
        return OutputSettings.from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def origin_argument(text: str) -> str:
    """An ``--allow-origin`` value as browsers send it in ``Origin``."""
    try:
        return origin_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_workers() -> int:
    """Half the cores, at least 1, at most 8: each worker is a process with its encoders' threads."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The options of one server from its command line; on the CPU, ``--demo`` runs CPU_DEMO_SECONDS by default."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    host, port = args.webrtc or args.http
    duration = args.duration
    if device == "cpu" and args.demo and duration is None:
        duration = CPU_DEMO_SECONDS
        print(f"CPU demo: a short run of {CPU_DEMO_SECONDS:.0f} s after the first frame", file=sys.stderr)
    recordings, mp4 = recordings_and_name(args.recordings, args.mp4)
    at_start = None
    if args.demo or args.avatar:
        first = SessionSpec(
            AVATAR_AT_START,
            rtmp=(args.rtmp,) if args.rtmp else (),
            mp4=mp4,
            preview=args.webrtc is not None,
            overlap=args.overlap,
            seed=args.seed,
            controls=args.control_changes or None,
            latency=args.latency,
            output=args.output or OutputSettings(),
        )
        at_start = SessionsAtStart(
            first,
            count=args.sessions,
            push=args.listen,
            audio=args.audio and str(args.audio),
            mic=args.mic,
            demo_audio=args.demo,
        )
    avatars = {AVATAR_AT_START: None if args.demo else args.avatar} if at_start else {}
    service = service_options(args, device, host, avatars, recordings, launched=process_started())
    return ServerOptions(service, host, port, args.token, at_start, tuple(args.allow_origin), duration)


def recordings_and_name(recordings: Path | None, mp4: Path | None) -> tuple[Path | None, str | None]:
    """The recordings folder and the MP4 name of the sessions at start: ``--mp4 FILE`` alone records into FILE's
    folder under its name; with ``--recordings DIR``, FILE is a name inside DIR."""
    if mp4 is None or recordings is not None:
        return recordings, mp4 and str(mp4)
    return mp4.absolute().parent, mp4.name


def service_options(
    args: argparse.Namespace,
    device: str,
    host: str,
    avatars: dict[str, str | None],
    recordings: Path | None,
    launched: float | None = None,
) -> ServiceOptions:
    """The service's options from the command line: the single server's and every ``--ray`` replica's alike."""
    random_weights = args.checkpoints is None or args.demo
    return ServiceOptions(
        checkpoints=None if random_weights else str(args.checkpoints),
        device=device,
        steps=args.steps,
        plans=args.plans and str(args.plans),
        admission=not args.no_admission,
        workers=args.output_workers,
        avatars=avatars,
        loopback_only=is_loopback(host),
        recordings=recordings and str(recordings),
        launched=launched,
        renders=render_limits(args),
    )


def render_limits(args: argparse.Namespace) -> RenderLimits | None:
    """What render jobs may take, from the command line; None without ``--renders``."""
    if args.renders is None:
        if args.render_audio is not None:
            raise SystemExit("error: --render-audio needs --renders DIR (where the jobs' files go)")
        return None
    if args.render_queue < 0 or args.render_max_seconds <= 0 or args.render_max_mb <= 0:
        raise SystemExit("error: --render-queue is 0 or more, --render-max-seconds and --render-max-mb above 0")
    if args.render_audio is not None and not args.render_audio.is_dir():
        raise SystemExit(f"error: --render-audio {args.render_audio} is not a folder")
    return RenderLimits(
        args.renders.absolute(),
        args.render_audio and args.render_audio.absolute(),
        args.render_queue,
        args.render_max_seconds,
        args.render_max_mb,
    )


def deploy_options(args: argparse.Namespace) -> DeployOptions:
    """What ``--ray`` deploys, from the command line: each replica's service as the single server's (its device the
    one Ray offers unless ``--device`` says), the sessions those clients open, none at start."""
    from cluster.app import DeployOptions  # Ray is an extra: imported only when asked for

    host, port = args.webrtc or args.http
    avatars = {AVATAR_AT_START: args.avatar} if args.avatar else {}
    service = service_options(args, args.device or "cuda", host, avatars, args.recordings)
    return DeployOptions(service, args.device, (host, port), args.token, args.replicas, args.gpus_per_replica)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.ray:
        from cluster.app import run

        return run(deploy_options(args))
    return asyncio.run(serve(server_options(args)))


if __name__ == "__main__":
    sys.exit(main())
