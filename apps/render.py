"""Render a file: ``python -m apps.render --avatar NAME_OR_IMAGE --audio FILE --out FILE.mp4``.

``--mode offline`` (the default) computes the motion as the reference's offline mode does:
the whole clip's audio features and every window first (overlap 10 by default), then renders
it. ``--mode online`` previews what a live stream makes of the same audio (overlap 75 by
default, as ``serve``). Both render through the serving runtime, flat out (no pacing), and
write H.264 + AAC with PyAV. ``--demo`` speaks a bundled clip with scikit-image's astronaut on
random weights.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from apps.control_flags import add_control_arguments, control_changes, session_controls
from avatars.cache import hash_checkpoints_ahead
from avatars.load import demo_avatar, load_or_register
from engine.audio.files import read_audio
from engine.audio.pcm import to_mono_16k
from engine.buckets import RENDER_BUCKETS
from engine.engine import LIVE_OVERLAP, RANDOM_WEIGHTS_NOTICE, models_dir, random_checkpoints
from engine.runtime import OutOfMemoryAtStart, Runtime, RuntimeConfig
from engine.runtime.clip_feed import feed_clip
from engine.runtime.session import Frame, Session
from engine.timebase import DEFAULT_STEPS, FPS, OFFLINE_OVERLAP, SEQ_FRAMES
from serving.timeline import process_age
from streaming.mp4 import Mp4Writer

CPU_DEMO_SECONDS = 0.4
MODES = ("offline", "online")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m apps.render", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--avatar", help="a registered avatar's name or cache folder, or a portrait image to register now"
    )
    parser.add_argument("--audio", type=Path, help="speech to render (any format PyAV reads)")
    parser.add_argument("--out", type=Path, default=Path("ditto_render.mp4"), help="output MP4 (H.264 + AAC)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="DDIM steps per window (reference default 50)")
    parser.add_argument(
        "--plans",
        type=Path,
        help="the torch backend's compiled packages (python -m compile.build_plans): runtime speed without compiling",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="offline",
        help="offline: the reference's file algorithm (whole clip first); online: the live stream's, to preview it",
    )
    parser.add_argument(
        "--overlap",
        type=int,
        help=f"frames shared by consecutive 80-frame windows (default {OFFLINE_OVERLAP} offline, {LIVE_OVERLAP} "
        "online)",
    )
    parser.add_argument(
        "--checkpoints", type=Path, help="official checkpoints folder (default: random stand-in weights)"
    )
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the diffusion noise")
    parser.add_argument("--max-seconds", type=float, help="render only the first N seconds of the audio")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the networks (GPU): a minute more at start, faster frames for long renders",
    )
    parser.add_argument("--demo", action="store_true", help="bundled speech + astronaut portrait on random weights")
    parser.add_argument(
        "--service",
        metavar="URL",
        help="render on a running apps.serve (started with --renders DIR) instead of loading a runtime here: the "
        "avatar is one the service serves, the job runs in its GPU loop's slack beside its live sessions",
    )
    parser.add_argument("--token", help="the service's API token (--service on an address beyond loopback)")
    add_control_arguments(parser)
    args = parser.parse_args(argv)
    args.control_changes = control_changes(args, parser)
    if not args.demo and (args.avatar is None or args.audio is None):
        parser.error("--avatar and --audio are required (or use --demo)")
    if args.service and (args.demo or args.mode != "offline" or args.max_seconds is not None):
        parser.error(
            "--service renders --avatar and --audio as the service's jobs do (no --demo, --mode, --max-seconds)"
        )
    if args.overlap is None:
        args.overlap = OFFLINE_OVERLAP if args.mode == "offline" else LIVE_OVERLAP
    if not 0 <= args.overlap < SEQ_FRAMES:
        parser.error(f"--overlap must be in [0, {SEQ_FRAMES}), got {args.overlap}")
    return args


def feed(session: Session, audio: np.ndarray, rate: int, errors: list[BaseException]) -> None:
    """Push the clip as fast as the session's lead allows, then end it (``engine.runtime.clip_feed``); what went wrong
    goes to ``errors``."""
    try:
        feed_clip(session, audio, rate, audio.shape[1] if audio.ndim == 2 else None)
    except BaseException as exc:
        errors.append(exc)


def open_render(
    runtime: Runtime, avatar, audio: np.ndarray, rate: int, args: argparse.Namespace
) -> tuple[Session, int]:
    """The session that renders the clip in ``args.mode`` and the number of frames it will make.

    Offline, the motion of the whole clip is computed first and the session renders it;
    online, the session samples its windows from the audio as it arrives, as a live one does.
    """
    controls = session_controls(runtime.default_controls, args.control_changes)
    options = dict(live=False, overlap=args.overlap, seed=args.seed, controls=controls)
    if args.mode == "online":
        return runtime.open_session(avatar, **options), math.ceil(len(audio) / rate * FPS)
    samples = to_mono_16k(audio, rate, channels=audio.shape[1] if audio.ndim == 2 else None)
    motion = runtime.offline_motion(avatar, samples, args.overlap, args.seed, controls)
    return runtime.open_session(avatar, motion=motion, **options), motion.shape[0]


def write_mp4(
    session: Session, out: Path, width: int, height: int, total: int, device: torch.device
) -> tuple[float, float]:
    """Write the session's ``width`` x ``height`` frames and audio to ``out`` until it ends, every frame ready at once
    (one wait for the GPU per batch); returns the seconds spent waiting for frames and writing them.

    On a GPU the frames are stacked and converted on a stream of their own: they are complete when taken, and on the
    runtime's stream the copy would wait for the next batch's render, queued there meanwhile."""
    waiting = writing = 0.0
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    with (
        Mp4Writer(out, width, height, fps=FPS, audio_rate=session.audio_rate) as writer,
        tqdm(total=total, unit="frame", desc="rendering") as bar,
    ):
        mark = time.perf_counter()
        while (frame := next_frame_ticking(session, bar)) is not None:
            frames = [frame, *session.take_ready()]
            waiting, mark = waiting + time.perf_counter() - mark, time.perf_counter()
            with torch.cuda.stream(stream):
                writer.write_frames(torch.stack([f.image for f in frames]))
            writer.write_audio(np.concatenate([f.audio for f in frames]))
            bar.update(len(frames))
            writing, mark = writing + time.perf_counter() - mark, time.perf_counter()
    return waiting, writing


def next_frame_ticking(session: Session, bar: tqdm, tick: float = 1.0) -> Frame | None:
    """The session's next frame; meanwhile the bar's clock ticks every ``tick`` seconds: frames come in batches (a
    short clip's in one), which take minutes on a CPU, and a bar standing still at 0 looks hung."""
    while True:
        try:
            return session.next_frame(timeout=tick)
        except TimeoutError:
            bar.set_postfix_str("rendering a batch of frames", refresh=True)


def clip_audio(args: argparse.Namespace, device: torch.device) -> tuple[np.ndarray, int]:
    """The speech to render and its rate: ``--audio``'s, or with ``--demo`` the bundled clip (on a CPU only its first
    CPU_DEMO_SECONDS unless ``--max-seconds`` says), cut to ``--max-seconds``."""
    seconds = args.max_seconds
    if args.demo:
        from engine.assets import demo_audio

        audio, rate = demo_audio()
        if seconds is None and device.type == "cpu":
            seconds = CPU_DEMO_SECONDS
            print(
                f"CPU demo: rendering the first {CPU_DEMO_SECONDS} s only (the decoder takes seconds per frame on a "
                "CPU)",
                file=sys.stderr,
            )
    else:
        audio, rate = read_audio(args.audio)
    if seconds is not None:
        audio = audio[: int(seconds * rate)]
    return audio, rate


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.service:
        return on_service(args)
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random_weights = args.checkpoints is None or args.demo
    if random_weights:
        print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    checkpoints = random_checkpoints() if random_weights else models_dir(args.checkpoints)
    audio, rate = clip_audio(args, device)

    started = time.perf_counter()
    hash_checkpoints_ahead(checkpoints)  # the avatar's load checks them; hashed while the networks load
    # One bucket each: an offline render's windows run one after another and its frames in full batches of the largest
    # render bucket (only a short clip's last batch is padded), and every bucket warmed up costs its first call and
    # capture at start.
    config = RuntimeConfig(
        window_buckets=(1,), render_buckets=RENDER_BUCKETS[-1:], max_queued_frames=80, admission=False, live=False
    )
    try:
        runtime = Runtime.from_checkpoints(
            None if random_weights else args.checkpoints,
            device=device,
            steps=args.steps,
            config=config,
            compile_networks=args.compile,
            plans=args.plans,
        )
    except OutOfMemoryAtStart as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"networks: {runtime.engine.backend.packages_status}", file=sys.stderr)
    steps = {"runtime start": time.perf_counter() - started}
    with runtime:
        mark = time.perf_counter()
        avatar = (
            demo_avatar(checkpoints, device)
            if args.demo
            else load_or_register(args.avatar, checkpoints, device, random_weights)
        )
        steps["avatar"], mark = time.perf_counter() - mark, time.perf_counter()
        session, total = open_render(runtime, avatar, audio, rate, args)
        steps["session" if args.mode == "online" else "motion"], mark = time.perf_counter() - mark, time.perf_counter()
        height, width = (int(n) for n in avatar.frames.shape[1:3])
        errors: list[BaseException] = []
        feeder = threading.Thread(target=feed, args=(session, audio, rate, errors), daemon=True)
        feeder.start()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        waiting, writing = write_mp4(session, args.out, width, height, total, device)
        feeder.join()
    if errors:
        raise errors[0]
    steps["frames rendered and written"] = time.perf_counter() - mark
    steps["of which waiting for frames"], steps["writing them"] = waiting, writing
    elapsed = time.perf_counter() - started
    print(
        f"wrote {args.out}: {total} frames ({total / FPS:.2f} s) at {width}x{height} in {elapsed:.1f} s on {device} "
        f"({args.mode} mode, overlap {args.overlap}); {process_age():.1f} s since the process started",
        file=sys.stderr,
    )
    print(
        f"  {', '.join(f'{name} {seconds:.2f} s' for name, seconds in steps.items())} (warm-up "
        f"{runtime.warmup_seconds:.2f} s of the start)",
        file=sys.stderr,
    )
    if random_weights:
        print("(random weights: the picture is not a face)", file=sys.stderr)
    return 0


def on_service(args: argparse.Namespace) -> int:
    """Send the clip to a running service as a render job and write its MP4 where asked."""
    from apps.render_client import ServiceRefused, render_on_service

    started = time.perf_counter()
    try:
        job = render_on_service(
            args.service,
            args.avatar,
            args.audio,
            args.out,
            args.token,
            args.seed,
            args.overlap if args.overlap != OFFLINE_OVERLAP else None,
            args.control_changes or None,
        )
    except ServiceRefused as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:
        return 130
    elapsed = time.perf_counter() - started
    print(
        f"wrote {args.out}: {job['frames_done']} frames ({job['audio_seconds']:.2f} s of audio) in {elapsed:.1f} s, "
        f"{job['audio_seconds'] / elapsed:.1f}x real time (submit to download; rendering {job['seconds']:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
