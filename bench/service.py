"""The service under load, through its API only: first picture of a new session, create/delete cycles, N streams at
once.

``python -m bench.service [--avatar DIR | --anchor] [--output KEY=VALUE,... ...] --sessions 12 16 --minutes 10 3
--cycles 100 --out FILE.json``

Starts nginx-rtmp and one ``python -m apps.serve --avatar DIR --sessions 0 --no-admission``
(the service with the avatar served as ``anchor`` and no session), waits until it is warm, then:
1. **first picture**: ``--first`` times, a session is created with ``POST /sessions`` (RTMP out) and
   timed to the first video packet read back from nginx, then deleted;
2. **cycles**: ``--cycles`` sessions created, run until their first frame is released, deleted; the
   core's GPU memory and every process's resident memory before and after (from /metrics);
3. **streams**: for each ``--sessions`` count (with its ``--minutes``), that many sessions at once,
   the bundled speech pushed into each over the WebSocket in real time, every RTMP stream read back
   (rate, drift, gaps, A/V offset; see ``bench.rtmp_sessions``), with the repeated (shed) frames in the
   measured window, deadline misses, the core's loop CPU and GPU per tick, the cores each kind of process used
   (front end, engine core, output workers) and what admission would admit; then all deleted.

Every session is created with ``--output`` (its size, bitrate, preset, ...: ``docs/output.md``): one for all phases,
or one per ``--sessions`` count. ``--anchor`` streams the generated 1920x1080 studio anchor (``avatars.anchor``),
registered at the server's start, instead of ``--avatar``.

With ``--ray`` the same runs through the cluster: ``python -m apps.serve --ray`` (a local Ray cluster, one engine
replica per GPU) instead of the single server, ready once Serve's proxy answers ``GET /sessions`` with a replica;
sessions are created, read and deleted through the proxy, speech is pushed to each session's ``urls.push`` (on the
replica that holds it) and the counters are read from each replica's own /metrics (``replica.url`` of the answer).
``ready_s`` is launch to ready in both modes.

``--trace DIR`` traces the service (``engine.trace``): each phase then says where its ticks' time went on the host and
the GPU, and at which stage each repeated picture was late (``bench.common.trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

from bench.common.live import CPU_NOTICE, STALL, START, device_of
from bench.common.streams import SETTLE, feed, server_counters, stream_report
from bench.common.trace import summary as trace_summary
from bench.common.trace import traced
from engine.timebase import DEFAULT_STEPS
from harness.live_server import LiveServer, metric, parse_metrics, run_keeping_server_log
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.rtmp_read import RtmpPacketLog
from streaming.output_settings import OutputSettings

RUNTIME_KEYS = (
    "tick_wall_ms_p50",
    "tick_wall_ms_p99",
    "tick_cpu_ms_p50",
    "tick_cpu_ms_p99",
    "tick_gpu_ms_p50",
    "tick_gpu_ms_p99",
    "gpu_busy",
    "capacity",
    "cuda_allocated_mb",
    "cuda_reserved_mb",
    "core_rss_mb",
    "frontend_rss_mb",
    "workers_rss_mb",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.service", description=__doc__.splitlines()[0])
    avatar = parser.add_mutually_exclusive_group()
    avatar.add_argument(
        "--avatar", help="cached avatar folder or portrait image (default: the demo portrait, registered at start)"
    )
    avatar.add_argument(
        "--anchor",
        action="store_true",
        help="the generated 1920x1080 studio anchor (avatars.anchor), registered at the server's start (face extra)",
    )
    parser.add_argument(
        "--output",
        nargs="*",
        default=[],
        type=output_settings,
        metavar="KEY=VALUE,...",
        help="each session's output settings (size=1080p,preset=veryfast,...; docs/output.md): one for every phase, "
        "or one per --sessions count (default: the avatar's size at its defaults)",
    )
    parser.add_argument("--sessions", type=int, nargs="*", default=[12], help="stream counts, one phase each")
    parser.add_argument("--minutes", type=float, nargs="*", default=[10.0], help="measured minutes of each phase")
    parser.add_argument("--first", type=int, default=5, help="sessions timed from creation to their first RTMP picture")
    parser.add_argument("--cycles", type=int, default=100, help="create/delete cycles")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--plans", type=Path, help="the torch backend's compiled packages, passed to apps.serve")
    parser.add_argument(
        "--output-workers", type=int, help="output worker processes, passed to apps.serve (default: apps.serve's)"
    )
    parser.add_argument(
        "--ray", action="store_true", help="through the cluster: apps.serve --ray (Serve's proxy, a replica per GPU)"
    )
    parser.add_argument("--trace", type=Path, help="trace the service into this folder and analyse each phase")
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if len(args.minutes) != len(args.sessions):
        parser.error("give one --minutes per --sessions count")
    if len(args.output) not in (0, 1, len(args.sessions)):
        parser.error("give one --output for every phase, or one per --sessions count")
    return args


def output_settings(text: str) -> OutputSettings:
    """An ``--output`` value."""
    try:
        return OutputSettings.from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def phase_outputs(args: argparse.Namespace) -> list[OutputSettings]:
    """The output settings of each phase's sessions (the first also of the first pictures and the cycles)."""
    given = args.output or [OutputSettings()]
    return given * len(args.sessions) if len(given) == 1 else given


class Api:
    """The service's session API (with ``ray``: the cluster's proxy, and each replica's own /metrics)."""

    def __init__(self, http: aiohttp.ClientSession, base: str, ray: bool = False) -> None:
        self.http, self.base, self.ray = http, base, ray
        self.replicas: dict[str, str] = {}
        """Replica id -> its URL, from the proxy's answers to POST /sessions."""
        self.by_replica: dict[str, dict] = {}
        """Replica id -> its /metrics, as ``metrics`` last read them."""

    async def create(self, **body) -> dict:
        async with self.http.post(f"{self.base}/sessions", json={"avatar": "anchor", **body}) as response:
            if response.status != 201:
                raise RuntimeError(f"POST /sessions: {response.status} {await response.text()}")
            answer = await response.json()
        if self.ray:
            self.replicas[answer["replica"]["id"]] = answer["replica"]["url"]
        return answer

    async def get(self, session_id: str) -> dict:
        async with self.http.get(f"{self.base}/sessions/{session_id}") as response:
            return await response.json()

    async def delete(self, session_id: str) -> dict:
        async with self.http.delete(f"{self.base}/sessions/{session_id}") as response:
            return await response.json()

    async def metrics(self) -> dict:
        """/metrics of the server; with ``ray``, those of every replica that took a session, merged (each session's
        counters are on its replica alone; the runtime's figures are per replica in ``by_replica``)."""
        if not self.ray:
            async with self.http.get(f"{self.base}/metrics") as response:
                return parse_metrics(await response.text())
        merged: dict = {}
        for replica, url in self.replicas.items():
            async with self.http.get(f"{url}/metrics") as response:
                self.by_replica[replica] = parse_metrics(await response.text())
            for name, samples in self.by_replica[replica].items():
                merged.setdefault(name, {}).update(samples)
        return merged


async def first_pictures(api: Api, nginx: NginxRtmp, count: int, output: dict) -> list[float]:
    """Seconds from ``POST /sessions`` to the first video packet read back from RTMP, ``count`` times."""
    seconds = []
    for i in range(count):
        url = nginx.url(f"first-{i}")
        reader = RtmpPacketLog(url, open_timeout=STALL, read_timeout=2.0).start()
        await asyncio.sleep(0.5)  # the player is waiting on nginx before the session exists
        started = time.monotonic()
        session = await api.create(rtmp=url, output=output)
        while not reader.log.video and time.monotonic() - started < 30:
            await asyncio.sleep(0.005)
        seconds.append(round(reader.log.video[0][1] - started, 3) if reader.log.video else None)
        await api.delete(session["id"])
        reader.join(10)
    return seconds


async def cycles(api: Api, nginx: NginxRtmp, count: int, output: dict) -> dict:
    """``count`` sessions created, run to their first released frame, deleted; memory before and after."""
    before = runtime_figures(await api.metrics())
    started = time.monotonic()
    for i in range(count):
        session = await api.create(rtmp=nginx.url(f"cycle-{i % 4}"), output=output)
        while (await api.get(session["id"]))["counters"].get("frames_released", 0) < 1:
            await asyncio.sleep(0.02)
        await api.delete(session["id"])
    await asyncio.sleep(2.0)
    after = runtime_figures(await api.metrics())
    keys = ("cuda_allocated_mb", "cuda_reserved_mb", "core_rss_mb", "frontend_rss_mb", "workers_rss_mb")
    return {
        "cycles": count,
        "seconds": round(time.monotonic() - started, 1),
        "before": {k: before.get(k) for k in keys},
        "after": {k: after.get(k) for k in keys},
    }


async def streams(
    api: Api, nginx: NginxRtmp, port: int, count: int, minutes: float, speech, rate: int, output: dict, server: int
) -> dict:
    """``count`` sessions at once for ``minutes``, each pushed the speech in real time and read back from RTMP; the
    cores each kind of the ``server`` process's processes used meanwhile."""
    sessions = [await api.create(rtmp=nginx.url(f"phase{count}-{i}"), output=output) for i in range(count)]
    ids = [s["id"] for s in sessions]
    readers = [
        RtmpPacketLog(nginx.url(f"phase{count}-{i}"), open_timeout=STALL, read_timeout=STALL).start()
        for i in range(count)
    ]
    stop = asyncio.Event()
    pushes = [s["urls"]["push"] if api.ray else None for s in sessions]
    feeders = [asyncio.ensure_future(feed(port, i, speech, rate, stop, url)) for i, url in zip(ids, pushes)]
    deadline = time.monotonic() + START
    while not all(r.log.video for r in readers) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    start = max((r.log.video[0][1] for r in readers if r.log.video), default=time.monotonic()) + SETTLE
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    before, cpu_before = await api.metrics(), process_cpu(server)
    while time.monotonic() < start + minutes * 60:
        await asyncio.sleep(1.0)
    end = time.monotonic()
    metrics, cpu_after = await api.metrics(), process_cpu(server)
    listing = await (await api.http.get(f"{api.base}/sessions")).json()
    stop.set()
    _, blocked = await asyncio.wait(feeders, timeout=10)
    for feeder in blocked:
        feeder.cancel()
    await asyncio.gather(*(api.delete(session_id) for session_id in ids))
    logs = await asyncio.gather(*(asyncio.to_thread(r.join, 30) for r in readers))
    rows = []
    for i, (session_id, log) in enumerate(zip(ids, logs)):
        row = {"session": i, **stream_report(log, start, end)}
        row.update(server_counters(metrics, session_id))
        earlier = server_counters(before, session_id)
        for key in ("repeated", "released"):
            row[f"{key}_in_window"] = row[key] - earlier[key] if None not in (row[key], earlier[key]) else None
        rows.append(row)
    repeated = sum(r["repeated_in_window"] or 0 for r in rows)
    released = sum(r["released_in_window"] or 0 for r in rows)
    phase = {
        "sessions": count,
        "minutes": minutes,
        "output": sessions[0]["output"],
        "size": sessions[0]["size"],
        "pushers_blocked_at_end": len(blocked),
        "repeated_share": round(repeated / released, 5) if released else None,
        "cores": {kind: round((cpu_after[kind] - cpu_before.get(kind, 0.0)) / (end - start), 2) for kind in cpu_after},
        "capacity": listing["capacity"],
        "encoding": listing.get("encoding"),
        "streams": rows,
        "runtime": runtime_figures(metrics),
        "window": [start, end],
    }
    if api.ray:
        phase["replicas"] = {
            replica: {"sessions": sum(s["replica"]["id"] == replica for s in sessions), **runtime_figures(figures)}
            for replica, figures in api.by_replica.items()
        }
    return phase


def process_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the server process ``root`` and its children, by kind: the front end,
    the engine core, the output workers (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        stats[pid] = (command, (int(fields[11]) + int(fields[12])) / ticks)
    used: dict[str, float] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        if pid in stats:
            command, seconds = stats[pid]
            kind = "front_end"
            if "serving.core" in command or "serving.worker" in command:
                kind = "engine_core" if "serving.core" in command else "output_workers"
            used[kind] = used.get(kind, 0.0) + seconds
    return used


def wait_proxy(server: LiveServer, timeout: float) -> dict:
    """Wait until the cluster's proxy answers ``GET /sessions`` naming an engine replica (Serve runs a replica once its
    engine is warm); its answer. RuntimeError if the process dies, TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"apps.serve --ray exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/sessions", timeout=10) as response:
                answer = json.loads(response.read())
            if answer.get("replicas"):
                return answer
        except (urllib.error.URLError, OSError, ValueError):
            pass  # not listening yet, or 503 while the replicas warm up
        time.sleep(0.5)
    raise TimeoutError(f"the proxy named no engine replica within {timeout:.0f} s:\n{server.log_tail()}")


def runtime_figures(metrics: dict) -> dict:
    figures = {key: metric(metrics, f"ditto_runtime_{key}") for key in RUNTIME_KEYS}
    figures["capacity_admitted"] = metric(metrics, "ditto_capacity", kind="admitted")
    figures["capacity_outputs"] = metric(metrics, "ditto_capacity", kind="outputs")
    return figures


async def measure(args: argparse.Namespace, work: Path) -> dict:
    from engine.assets import demo_audio, write_demo_portrait

    device = device_of(args)
    avatar = args.avatar or str(anchor_portrait(work) if args.anchor else write_demo_portrait(work))
    outputs = [output.describe() for output in phase_outputs(args)]
    speech, rate = demo_audio()
    nginx = NginxRtmp(work / "nginx", find_nginx())
    port = free_port()
    passed = ["--plans", str(args.plans.absolute())] if args.plans else []
    if args.output_workers:
        passed += ["--output-workers", str(args.output_workers)]
    if args.ray:
        served = ["--ray", "--avatar", str(Path(avatar).absolute()), "--no-admission", *passed]
    else:
        served = ["--avatar", avatar, "--sessions", "0", "--no-admission", *passed]
    server = LiveServer(
        [*served, "--http", f"127.0.0.1:{port}", "--steps", str(args.steps), "--device", device],
        port,
        work / "serve.log",
    )
    result: dict = {
        "what": "one streaming.serve service driven through its session API; every RTMP stream read back with PyAV",
        "device": device,
        "steps": args.steps,
        "encoder": "x264",
        "random_weights": True,
        "python": platform.python_version(),
        "audio": "the bundled speech on loop, pushed over the WebSocket in real time (200 ms chunks)",
        "admission": "off (--no-admission); the capacity the service would admit is reported",
    }
    if device == "cpu":
        result["notice"] = CPU_NOTICE
    result.update(ray=args.ray, plans=args.plans and str(args.plans), output_workers=args.output_workers)
    if args.ray:
        result["what"] = (
            "apps.serve --ray (a local Ray cluster, Serve's proxy, an engine replica per GPU) driven through the "
            "proxy's session API; speech pushed to each replica, every RTMP stream read back with PyAV"
        )
    nginx.start()
    try:
        with traced(args.trace):
            server.start()
        if args.ray:
            await asyncio.to_thread(wait_proxy, server, START)
        else:
            await asyncio.to_thread(server.wait_ready, START)
        result["ready_s"] = round(time.monotonic() - server.started_at, 2)
        async with aiohttp.ClientSession() as http:
            api = Api(http, f"http://127.0.0.1:{port}", args.ray)
            sessions = await (await http.get(f"{api.base}/sessions")).json()
            result["capacity"] = sessions["capacity"]
            if args.ray:
                result["replicas_at_ready"] = sessions["replicas"]
            result["first_picture_s"] = await first_pictures(api, nginx, args.first, outputs[0])
            result["cycles"] = await cycles(api, nginx, args.cycles, outputs[0]) if args.cycles else None
            result["phases"] = []
            for count, minutes, output in zip(args.sessions, args.minutes, outputs):
                phase = await streams(api, nginx, port, count, minutes, speech, rate, output, server.process.pid)
                result["phases"].append(phase)
                args.out.write_text(json.dumps(result, indent=2))
    finally:
        result["server_exit"] = await asyncio.to_thread(server.stop)
        nginx.stop()
    if args.trace:
        for phase in result.get("phases", []):
            phase["trace"] = trace_summary(args.trace, *phase["window"])
    return result


def anchor_portrait(work: Path) -> Path:
    """The generated 1920x1080 studio anchor as a PNG in ``work`` (the server registers it at its start)."""
    from PIL import Image

    from avatars.anchor import anchor_frame

    path = work / "anchor1080.png"
    Image.fromarray(anchor_frame()).save(path)
    return path


def table(result: dict) -> str:
    lines = [
        f"service on {result['device']}: ready {result.get('ready_s')} s, capacity {result.get('capacity')}; random "
        "weights"
    ]
    if result.get("ray"):
        lines[0] = f"cluster (apps.serve --ray) {lines[0].removeprefix('service ')}"
    lines.append(f"first RTMP picture after POST /sessions: {result.get('first_picture_s')} s")
    if result.get("cycles"):
        c = result["cycles"]
        lines.append(
            f"{c['cycles']} create/delete cycles in {c['seconds']} s: before {c['before']}, after {c['after']}"
        )
    for phase in result.get("phases", []):
        rows = phase["streams"]
        fps = [r.get("fps") for r in rows]
        drift = [r.get("drift_ms") for r in rows]
        size, output = phase.get("size"), phase.get("output", {})
        share = (phase.get("encoding") or {}).get("measured_share")  # a cluster's proxy reports no encoding
        lines.append(
            f"{phase['sessions']} streams of {size[0]}x{size[1]} {output.get('preset')} {output.get('bitrate_kbps')} "
            f"kbit/s, {phase['minutes']} min: repeated {phase['repeated_share']} of the window's slots, "
            f"cores {phase['cores']}, admission would admit {phase['capacity']['admitted']} ({phase['capacity']}; "
            + (f"encode cost at {share} of its calibration)" if share is not None else "encode cost not reported)")
            if size
            else f"{phase['sessions']} streams"
        )
        lines.append(
            f"  fps {min(fps, default=None)}-{max(fps, default=None)}, "
            f"drift ms {min(drift, default=None)}..{max(drift, default=None)}, gaps "
            f"{sum(r.get('timestamp_gaps') or 0 for r in rows)}, "
            f"A/V ms {[r.get('av_offset_ms') for r in rows]}, repeated {[r['repeated'] for r in rows]}, "
            f"misses {[r['deadline_misses'] for r in rows]}, runtime {phase['runtime']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_keeping_server_log(measure, args, "service-")
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
