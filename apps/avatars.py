"""Command line: ``python -m apps.avatars register PORTRAIT --name NAME``, ``list``, ``show NAME``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from avatars.cache import (
    REGISTRATION_NETWORKS,
    default_cache_dir,
    manifest_json,
    read_manifest,
    resolve,
)
from avatars.errors import AvatarError, CacheError
from engine.networks import OFFICIAL_FILENAMES, CheckpointError, write_random_checkpoints

RANDOM_CHECKPOINTS = ".random-checkpoints"
_RANDOM_BANNER = """\
************************************************************************
* No --checkpoints given: using RANDOM weights generated in            *
*   {dir}
* The avatar's features and every picture rendered from it are NOT    *
* faces. Pass --checkpoints DIR (the official ditto_pytorch/models     *
* folder) for a real avatar.                                          *
************************************************************************"""


def parse_box(text: str) -> tuple[float, float, float, float]:
    """'x,y,w,h' in pixels -> a 4-tuple."""
    parts = text.split(",")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"--face-box wants x,y,w,h in pixels (four numbers), got {text!r}")
    return values  # type: ignore[return-value]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m apps.avatars", description="Register and inspect cached avatars.")
    where = "avatar cache (default: $DITTO_AVATAR_DIR or ~/.cache/ditto-live/avatars)"
    parser.add_argument("--cache-dir", type=Path, default=None, help=where)
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("register", help="register a portrait image or short video")
    reg.add_argument("portrait", type=Path)
    reg.add_argument("--name", required=True)
    reg.add_argument("--checkpoints", type=Path, help="folder of the official .pth files (random weights if absent)")
    reg.add_argument("--face-box", type=parse_box, help="x,y,w,h of the face in pixels of the source (first frame)")
    reg.add_argument("--face-index", type=int, help="which face, counted from the left from 0 (default: the largest)")
    reg.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    listing = sub.add_parser("list", help="list the cached avatars")
    show = sub.add_parser("show", help="print an avatar's manifest")
    show.add_argument("name")
    for command in (reg, listing, show):
        command.add_argument("--cache-dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _register(args: argparse.Namespace, cache_dir: Path) -> None:
    from avatars.register import FaceChoice, register

    checkpoints, random_weights = args.checkpoints, args.checkpoints is None
    if random_weights:
        checkpoints = cache_dir / RANDOM_CHECKPOINTS
        missing = tuple(n for n in REGISTRATION_NETWORKS if not (checkpoints / OFFICIAL_FILENAMES[n]).is_file())
        if missing:
            write_random_checkpoints(checkpoints, seed=0, names=missing)
        print(_RANDOM_BANNER.format(dir=checkpoints), file=sys.stderr)
    path = register(
        args.portrait,
        args.name,
        checkpoints,
        choice=FaceChoice(args.face_box, args.face_index),
        device=args.device,
        cache_dir=cache_dir,
        random_weights=random_weights,
    )
    manifest = read_manifest(path)
    faces, source = manifest["faces"], manifest["source"]
    size = f"{source['width']}x{source['height']}"
    print(f"registered {args.name!r}: {source['kind']}, {source['frames']} frame(s), {size}")
    models = f"{faces['detector_used']}; landmarks {faces['landmarks']}; eyes {faces['eyes']}"
    print(f"  face path: {faces['kind']} ({models})")
    print(f"  face box: {faces['box']}")
    print(f"  cache: {path}  ({manifest['registration_seconds']} s)")
    if random_weights:
        print("  WARNING: random weights: this avatar renders no face", file=sys.stderr)


def _list(cache_dir: Path) -> None:
    entries = sorted(p for p in cache_dir.glob("*") if p.is_dir() and not p.name.startswith("."))
    if not entries:
        print(f"no avatars in {cache_dir}")
        return
    for entry in entries:
        try:
            m = manifest_json(entry)
            s = m["source"]
            weights = "random weights" if m["checkpoints"]["random_weights"] else "checkpoints"
            size = f"{s['frames']:4} frame(s) {s['width']}x{s['height']}"
            print(f"{entry.name:24} {s['kind']:5} {size}  format {m['format']}  {weights}  {m['created']}")
        except (CacheError, OSError, KeyError, TypeError):
            print(f"{entry.name:24} (unreadable manifest: register it again)")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 for a usage error, 1 for a failed command)."""
    args = _parser().parse_args(argv)
    cache_dir = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    try:
        if args.command == "register":
            _register(args, cache_dir)
        elif args.command == "list":
            _list(cache_dir)
        else:
            print(json.dumps(read_manifest(resolve(args.name, cache_dir)), indent=2))
    except (AvatarError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
