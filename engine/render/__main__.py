"""Offline render: ``python -m engine.render --avatar NAME_OR_IMAGE --audio FILE --out FILE.mp4``.

Runs the same session the live stream uses, at the offline overlap, and writes H.264 + AAC
with PyAV. ``--demo`` speaks a bundled clip with scikit-image's astronaut on random weights.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine.audio.files import read_audio
from engine.audio.hubert import SAMPLE_RATE
from engine.engine import OFFLINE_OVERLAP, RANDOM_WEIGHTS_NOTICE, Engine, models_dir, random_checkpoints
from engine.session import FPS

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
    parser.add_argument("--emotion", default="neutral", help="angry, disgust, fear, happy, neutral, sad, surprise, contempt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the diffusion noise")
    parser.add_argument("--max-seconds", type=float, help="render only the first N seconds of the audio")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the networks (GPU): a minute more at start, faster frames for long renders"
    )
    parser.add_argument("--demo", action="store_true", help="bundled speech + astronaut portrait on random weights")
    args = parser.parse_args(argv)
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
    engine = Engine.from_checkpoints(
        None if random_weights else args.checkpoints, device=device, steps=args.steps, compile_networks=args.compile
    )
    avatar = load_or_register(avatar_source, checkpoints, device, random_weights)
    session = engine.session(avatar, overlap=args.overlap, emotion=args.emotion, seed=args.seed)
    total = math.ceil(len(audio) / rate * FPS)
    height, width = avatar.frames.shape[1:3]

    from streaming.mp4 import Mp4Writer

    args.out.parent.mkdir(parents=True, exist_ok=True)
    hop = rate // 5
    writer = Mp4Writer(args.out, width, height, fps=FPS, audio_rate=SAMPLE_RATE)
    with writer, tqdm(total=total, unit="frame", desc="rendering") as bar:
        def drain(frames) -> None:
            if frames:
                writer.write_frames(torch.stack([f.image for f in frames]))
                writer.write_audio(np.concatenate([f.audio for f in frames]))
                bar.update(len(frames))

        for lo in range(0, len(audio), hop):
            session.push_audio(audio[lo : lo + hop], rate, channels=audio.shape[1] if audio.ndim == 2 else None)
            drain(session.take_ready())
        session.end()
        drain(session.take_all())
    elapsed = time.perf_counter() - started
    print(f"wrote {args.out}: {total} frames ({total / FPS:.2f} s) at {width}x{height} in {elapsed:.1f} s on {device}", file=sys.stderr)
    if random_weights:
        print("(random weights: the picture is not a face)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
