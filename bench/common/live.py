"""Settings the live-output benchmarks share: how they push speech, how long they wait for the server, what a CPU run
means."""

from __future__ import annotations

import argparse

from engine.timebase import SAMPLE_RATE

PUSH_RATE = SAMPLE_RATE
"""The rate the benchmarks push speech at, as a TTS engine would: the bundled clip's own (the model's)."""
START = 1200.0
"""Seconds the server may take to answer and to stream its first frames (a cold compile, or the CPU)."""
STALL = 1200.0
"""Seconds the RTMP readers wait for data (a CPU stream stalls for minutes between hops); stopping nginx ends them."""
CPU_NOTICE = (
    "CPU run: these numbers are NOT the target (the CPU renders far below 25 fps); "
    "the run only proves the script works."
)


def device_of(args: argparse.Namespace) -> str:
    """The device the server is told to use: --device, else cuda when this machine has one."""
    if args.device:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
