"""The server's start as a user sees it: `python -m apps.serve` launched -> /metrics answers -> its first RTMP picture.

``python -m bench.serve_start [--demo | --avatar DIR] [--plans DIR] [--starts 2] --out FILE.json`` launches the
real command line (``--demo`` by default: the demo portrait speaking the bundled clip; the first start registers the
portrait into the engine's cache, later ones load it) with its RTMP output to a loopback nginx-rtmp, times each start
from the launch to /metrics answering and to the first picture decoded from RTMP, then stops it (SIGTERM). Each
start's timeline as the server logs it ("service ready N s after launch: engine core ...") is kept beside its times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import time
from pathlib import Path

from bench.common.live import STALL, START, device_of
from engine.timebase import DEFAULT_STEPS
from harness.live_server import LiveServer
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.rtmp_read import RtmpPlayer

READY_LINE = re.compile(r"service ready .*")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_start", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--demo", action="store_true", help="serve --demo (the default)")
    source.add_argument("--avatar", help="serve --avatar DIR --audio (the bundled clip) instead of --demo")
    parser.add_argument("--plans", type=Path, help="the torch backend's compiled packages, passed to the server")
    parser.add_argument("--starts", type=int, default=2, help="starts, one after another (the first fills the caches)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--wait", type=float, help="seconds to wait for /metrics (default 120 on CUDA, 900 on the CPU)")
    parser.add_argument(
        "--out", type=Path, required=True, help="write the JSON result here; the servers' logs beside it"
    )
    args = parser.parse_args(argv)
    if args.starts < 1:
        parser.error("--starts must be at least 1")
    return args


async def one_start(args: argparse.Namespace, nginx: NginxRtmp, index: int, log: Path) -> dict:
    """Launch the server, time /metrics and the first RTMP picture, stop it."""
    http_port = free_port()
    stream = f"start{index}"
    if args.avatar:
        from importlib.resources import files

        from engine.assets import DEMO_SPEECH

        source = ["--avatar", args.avatar, "--audio", str(files("engine.assets") / DEMO_SPEECH)]
    else:
        source = ["--demo"]
    server = LiveServer(
        [
            *source,
            "--rtmp",
            nginx.url(stream),
            "--http",
            f"127.0.0.1:{http_port}",
            "--steps",
            str(args.steps),
            "--device",
            args.device,
        ]
        + (["--webrtc", f"127.0.0.1:{http_port}"] if not args.avatar else [])
        + (["--plans", str(args.plans)] if args.plans is not None else []),
        http_port,
        log,
    )
    player = RtmpPlayer(nginx.url(stream), open_timeout=STALL, read_timeout=STALL).start()
    server.start()
    try:
        await asyncio.to_thread(server.wait_ready, args.wait)
        metrics_s = time.monotonic() - server.started_at
        deadline = time.monotonic() + START
        while player.log.first_picture_at is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no RTMP picture within {START:.0f} s of /metrics:\n{server.log_tail()}")
            await asyncio.sleep(0.02)
        picture_s = player.log.first_picture_at - server.started_at
    finally:
        player.stop(timeout=1.0)  # nginx holds an idle player open: its thread ends when nginx stops
        server.stop()
    ready = READY_LINE.search(log.read_text(errors="replace"))
    return {
        "metrics_answer_s": round(metrics_s, 2),
        "first_rtmp_picture_s": round(picture_s, 2),
        "timeline": ready and ready.group(0),
    }


async def measure(args: argparse.Namespace, work: Path) -> dict:
    import torch

    args.device = device_of(args)
    nginx = NginxRtmp(work / "nginx", find_nginx())
    result: dict = {
        "what": "apps.serve launched -> /metrics answers -> first picture decoded from its RTMP stream (loopback "
        "nginx-rtmp)",
        "command": "apps.serve " + (f"--avatar {args.avatar} --audio demo_speech.wav" if args.avatar else "--demo"),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "plans": str(args.plans) if args.plans is not None else None,
        "steps": args.steps,
        "random_weights": True,
        "starts": [],
    }
    nginx.start()
    try:
        for index in range(args.starts):
            log = args.out.parent / f"{args.out.stem}.serve{index}.log"
            start = await one_start(args, nginx, index, log)
            result["starts"].append(start)
            print(
                f"start {index}: /metrics {start['metrics_answer_s']:.2f} s, first RTMP picture "
                f"{start['first_rtmp_picture_s']:.2f} s; {start['timeline']}",
                flush=True,
            )
    finally:
        nginx.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    if args.wait is None:
        args.wait = 120.0 if device_of(args) == "cuda" else 900.0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ditto-serve-start-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    args.out.write_text(json.dumps(result, indent=2))
    print("\n| start | /metrics answers | first RTMP picture |\n|---|---|---|")
    for index, start in enumerate(result["starts"]):
        print(f"| {index} | {start['metrics_answer_s']:.2f} s | {start['first_rtmp_picture_s']:.2f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
