"""The session controls as command-line flags, shared by ``python -m apps.render`` and ``python -m apps.serve``.

Flags name single controls; ``--controls FILE.json`` takes any of them as a JSON object of fields (the format of
the WebSocket ``controls`` message, tables included), and single flags override it. The changes are checked at
parse time and applied over the engine's defaults once it is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.controls import FADE_TARGETS, ControlError, Controls

NO_BLINK_TABLE = (
    "--blink: no blink table, so the eyes follow the motion model. The reference blinks with the table in its official "
    'cfg (ditto_cfg/*.pkl beside the checkpoints, read automatically); give one as "blink_table" in --controls '
    "FILE.json."
)
FLAGS = {
    "pitch": "degrees added to the head's pitch",
    "yaw": "degrees added to the head's yaw",
    "roll": "degrees added to the head's roll",
    "pitch_scale": "multiplies the pitch angle after the offset (0 holds the head level)",
    "yaw_scale": "multiplies the yaw angle after the offset",
    "roll_scale": "multiplies the roll angle after the offset",
    "vad_alpha": "mouth damping: 1 as driven, 0 the portrait's own expression",
}


def add_control_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the control flags (all default to 'not given': the engine's defaults stay)."""
    group = parser.add_argument_group(
        "controls", "per-session controls with the reference's defaults (see engine/controls.py)"
    )
    group.add_argument(
        "--controls",
        type=Path,
        metavar="FILE.json",
        help="controls as a JSON object of fields (flags below override it)",
    )
    for name, help_text in FLAGS.items():
        group.add_argument(f"--{name.replace('_', '-')}", type=float, metavar="X", help=help_text)
    group.add_argument(
        "--emotion",
        metavar="NAME[,NAME]",
        help="angry, disgust, fear, happy, neutral, sad, surprise, contempt; several mix",
    )
    group.add_argument(
        "--blink", action=argparse.BooleanOptionalAction, help="blink with the blink table (the official cfg's)"
    )
    group.add_argument(
        "--blink-gaps", metavar="N[,N]", help="open frames between blinks: 0 random 60-100, N fixed, a list cycled"
    )
    group.add_argument(
        "--fade-in", type=int, metavar="FRAMES", help="fade the expression in from --fade-target over the first frames"
    )
    group.add_argument(
        "--fade-out", type=int, metavar="FRAMES", help="fade it out to --fade-target over the last frames"
    )
    group.add_argument(
        "--fade-target", choices=FADE_TARGETS, help="what fades blend with: the avatar (source) or the first frame"
    )
    group.add_argument(
        "--fix-kp-cond",
        type=int,
        metavar="N",
        help="every N-th LMDM window restarts from the avatar's motion (0: never)",
    )
    group.add_argument(
        "--fix-kp-cond-dims", metavar="START:STOP", help="motion dims such a restart keeps from the last frame"
    )


def control_changes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The controls the flags (and --controls file) set, validated; exits through ``parser.error`` when one is bad."""
    try:
        changes = _read_file(args.controls) if args.controls else {}
        for name in FLAGS:
            if getattr(args, name) is not None:
                changes[name] = getattr(args, name)
        for name in ("blink", "fade_in", "fade_out", "fade_target", "fix_kp_cond"):
            if getattr(args, name) is not None:
                changes[name] = getattr(args, name)
        if args.emotion is not None:
            names = [n.strip() for n in args.emotion.split(",")]
            changes["emotion"] = names[0] if len(names) == 1 else tuple(names)
        if args.blink_gaps is not None:
            gaps = [_integer("--blink-gaps", n) for n in args.blink_gaps.split(",")]
            changes["blink_gaps"] = gaps[0] if len(gaps) == 1 else tuple(gaps)
        if args.fix_kp_cond_dims is not None:
            start, sep, stop = args.fix_kp_cond_dims.partition(":")
            if not sep:
                raise ControlError(f"--fix-kp-cond-dims takes START:STOP, got {args.fix_kp_cond_dims!r}")
            changes["fix_kp_cond_dims"] = (_integer("--fix-kp-cond-dims", start), _integer("--fix-kp-cond-dims", stop))
        Controls().replace(**changes)
    except ControlError as exc:
        parser.error(str(exc))
    return changes


def session_controls(defaults: Controls, changes: dict[str, Any]) -> Controls:
    """The engine's defaults with the command line's changes; says so when blinks are asked for but no table exists."""
    controls = defaults.replace(**changes)
    if changes.get("blink") and controls.blink_table is None:
        print(NO_BLINK_TABLE, file=sys.stderr)
    return controls


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ControlError(f"--controls {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ControlError(f"--controls {path} must hold a JSON object of control fields")
    return data


def _integer(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise ControlError(f"{flag} takes whole numbers, got {text!r}") from exc
