"""Offline render: ``python -m engine.render --avatar NAME_OR_IMAGE --audio FILE --out FILE.mp4``.

Runs the same serving runtime the live stream uses, flat out (no pacing), at the offline
overlap, and writes H.264 + AAC with PyAV. ``--demo`` speaks a bundled clip with
scikit-image's astronaut on random weights.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine.audio.files import read_audio
from engine.control_flags import add_control_arguments, control_changes, session_controls
from engine.engine import OFFLINE_OVERLAP, RANDOM_WEIGHTS_NOTICE, models_dir, random_checkpoints
from engine.runtime import Runtime, RuntimeConfig
from engine.session import FPS, Session

CPU_DEMO_SECONDS = 0.4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.render", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", help="a registered avatar's name or cache folder, or a portrait image to register now")
    parser.add_argument("--audio", type=Path, help="speech to render (any format PyAV reads)")
    parser.add_argument("--out", type=Path, default=Path("ditto_render.mp4"), help="output MP4 (H.264 + AAC)")
    parser.add_argument("--steps", type=int, default=25, help="DDIM steps per window (reference default 50)")
    parser.add_argument("--overlap", type=int, default=OFFLINE_OVERLAP, help="frames shared by consecutive 80-frame windows")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints folder (default: random stand-in weights)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the diffusion noise")
    parser.add_argument("--max-seconds", type=float, help="render only the first N seconds of the audio")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the networks (GPU): a minute more at start, faster frames for long renders"
    )
    parser.add_argument("--demo", action="store_true", help="bundled speech + astronaut portrait on random weights")
    add_control_arguments(parser)
    args = parser.parse_args(argv)
    args.control_changes = control_changes(args, parser)
    if not args.demo and (args.avatar is None or args.audio is None):
        parser.error("--avatar and --audio are required (or use --demo)")
    return args


def load_or_register(avatar: str, checkpoints: Path, device: torch.device, random_weights: bool):
    """A cached avatar by name, or register an image/video path on the fly into a temporary cache."""
    from avatars.cache import load_avatar
    from avatars.register import register

    path = Path(avatar)
    if path.is_file():
        cache = Path(tempfile.mkdtemp(prefix="ditto-avatar-"))
        folder = register(path, "oneshot", checkpoints, device=device, cache_dir=cache, random_weights=random_weights)
        return load_avatar(folder, device)
    return load_avatar(avatar, device, checkpoints=checkpoints)


def feed(session: Session, audio: np.ndarray, rate: int, errors: list[BaseException]) -> None:
    """Push the clip in 200 ms pieces as fast as the session's lead allows, then end it (close it on an error)."""
    hop = rate // 5
    channels = audio.shape[1] if audio.ndim == 2 else None
    try:
        for lo in range(0, len(audio), hop):
            session.push_audio(audio[lo : lo + hop], rate, channels=channels, block=True)
        session.end()
    except BaseException as exc:
        errors.append(exc)
        session.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random_weights = args.checkpoints is None or args.demo
    if random_weights:
        print(RANDOM_WEIGHTS_NOTICE, file=sys.stderr)
    checkpoints = random_checkpoints() if random_weights else models_dir(args.checkpoints)

    if args.demo:
        from engine.assets import demo_audio, write_demo_portrait

        audio, rate = demo_audio()
        avatar_source = str(write_demo_portrait(tempfile.mkdtemp(prefix="ditto-demo-")))
        if args.max_seconds is None and device.type == "cpu":
            args.max_seconds = CPU_DEMO_SECONDS
            print(f"CPU demo: rendering the first {CPU_DEMO_SECONDS} s only (the decoder takes seconds per frame on a CPU)", file=sys.stderr)
    else:
        audio, rate = read_audio(args.audio)
        avatar_source = args.avatar
    if args.max_seconds is not None:
        audio = audio[: int(args.max_seconds * rate)]

    started = time.perf_counter()
    from streaming.mp4 import Mp4Writer

    config = RuntimeConfig(window_buckets=(1,), render_buckets=(10, 20, 40), max_queued_frames=80, admission=False)
    runtime = Runtime.from_checkpoints(
        None if random_weights else args.checkpoints, device=device, steps=args.steps, config=config, compile_networks=args.compile
    )
    avatar = load_or_register(avatar_source, checkpoints, device, random_weights)
    controls = session_controls(runtime.default_controls, args.control_changes)
    session = runtime.open_session(avatar, live=False, overlap=args.overlap, seed=args.seed, controls=controls)
    total = math.ceil(len(audio) / rate * FPS)
    height, width = avatar.frames.shape[1:3]
    errors: list[BaseException] = []
    feeder = threading.Thread(target=feed, args=(session, audio, rate, errors), daemon=True)
    feeder.start()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with runtime, Mp4Writer(args.out, width, height, fps=FPS, audio_rate=session.audio_rate) as writer, tqdm(total=total, unit="frame", desc="rendering") as bar:
        while (frame := session.next_frame()) is not None:
            writer.write_frames(frame.image[None])
            writer.write_audio(frame.audio)
            bar.update(1)
    feeder.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - started
    print(f"wrote {args.out}: {total} frames ({total / FPS:.2f} s) at {width}x{height} in {elapsed:.1f} s on {device}", file=sys.stderr)
    if random_weights:
        print("(random weights: the picture is not a face)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
