"""Voice-agent bots on one service: N pipecat bots in processes of their own (beside M RTMP streams), each bot's 25 fps
clock, repeats, segments and marker latency.

``python -m bench.agents [--avatar DIR] [--plans DIR] --bots 12 6 --rtmp 0 6 --minutes 2 2 [--interrupt-every 0 6]
[--latency faithful low] [--bot-python PY] [--glass FILE.json ...] --out FILE.json``

Starts one ``python -m apps.serve --avatar DIR --sessions 0 --no-admission --token T`` (the avatar served as
``anchor``; ``--service URL --token T`` uses one already running instead), and nginx-rtmp when a phase has RTMP
streams. Each phase then runs, for ``--minutes``:

* ``--bots`` N processes of ``python -m harness.pipecat_bot`` (with ``--bot-python``: pipecat's environment), each a
  pipecat pipeline ``[DittoVideoService(url=...), sink]`` speaking the bundled speech as TTS frames in real time, with
  timing markers in it and, with ``--interrupt-every S``, random interruptions, its session in the phase's
  ``--latency`` mode. Each reports its own window: pictures emitted on its clock (fps), repeats, speech pictures,
  segments started and ``TTSStoppedFrame``s passed, marker latency (marker sent into the pipeline -> the bot emits the
  audio carrying it: the bot's glass-to-glass) with every marker not found counted with its reason, its CPU and
  memory, whether torch is in its ``sys.modules``;
* a witness: the service's own WebRTC viewer (``harness.viewers.AiortcViewer``) of bot 0's stream, which finds the
  same markers in the same stream without the bot's pipeline: per marker, what the bot path adds;
* ``--rtmp`` M sessions with an RTMP output, the speech pushed over the WebSocket and every stream read back from
  nginx, as ``bench.service`` does.

Beside them: the service's counters of every session over the window (repeated and released slots, deadline misses,
from /metrics), the GPU memory of every process (``nvidia-smi``; the bots' must be none), the cores of the service's
processes and its runtime figures. The targets: the bot adds at most 40 ms to the witness at p99, the bots land
within 40 ms of each other, every marker is accounted for, and in the low-latency mode a bot's p99 is at most 350 ms
with twelve bots on one H200. ``--glass`` takes ``bench.glass_to_glass`` JSONs (``paths.aiortc_audio``, one session's
own WebRTC latency) and sets each beside the phases of its latency mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

from bench.common.live import CPU_NOTICE, STALL, START, device_of
from bench.common.streams import SETTLE, feed, server_counters, stream_report
from bench.service import Api, process_cpu, runtime_figures
from engine.assets import demo_audio, write_demo_portrait
from engine.latency import FAITHFUL, MODES
from engine.timebase import DEFAULT_STEPS
from harness.live_server import LiveServer, metric, run_keeping_server_log
from harness.markers import pair
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.rtmp_read import RtmpPacketLog
from harness.viewers import AiortcViewer, ViewerLog

REPO = Path(__file__).resolve().parent.parent
ADDED_P99_TARGET_MS = 40.0
"""The most the remote path may add to the service's own WebRTC latency of the same markers, at p99."""
SPREAD_TARGET_MS = 40.0
"""The most the bots of one service may land apart."""
LOW_P99_TARGET_MS = 350.0
"""A bot's marker p99 in the low-latency mode, with twelve bots on one H200."""
BOT_STOP_S = 45.0
"""How long a bot may take to report and end after SIGTERM (its drain, then EndFrame's wait for the last speech)."""
GPU_SAMPLE_S = 20.0
"""nvidia-smi is read this often during a window."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--avatar", help="cached avatar folder or portrait image (default: the demo portrait, registered at start)"
    )
    parser.add_argument("--plans", type=Path, help="the torch backend's compiled packages, passed to apps.serve")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--service", help="a service already running (http://HOST:PORT, serving 'anchor') instead of starting one"
    )
    parser.add_argument("--token", help="the service's token (default: a new one for the service started here)")
    parser.add_argument("--bots", type=int, nargs="+", default=[12], help="bot processes, one count per phase")
    parser.add_argument("--rtmp", type=int, nargs="*", default=[], help="RTMP streams beside them, one per phase")
    parser.add_argument("--minutes", type=float, nargs="+", default=[2.0], help="measured minutes of each phase")
    parser.add_argument(
        "--interrupt-every",
        type=float,
        nargs="*",
        default=[],
        help="each bot's mean seconds between interruptions (0: none): one for every phase, or one per phase",
    )
    parser.add_argument(
        "--latency",
        nargs="*",
        default=[],
        choices=sorted(MODES),
        help="the bots' sessions' latency mode: one for every phase, or one per phase (default faithful)",
    )
    parser.add_argument(
        "--bot-python", default=sys.executable, help="the interpreter of the bots, with pipecat (default: this one)"
    )
    parser.add_argument(
        "--glass",
        type=Path,
        nargs="*",
        default=[],
        help="bench.glass_to_glass JSONs: the service's own WebRTC latency, compared with the phases of their mode",
    )
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    args = parser.parse_args(argv)
    phases = len(args.bots)
    if len(args.minutes) != phases:
        parser.error("give one --minutes per --bots count")
    if len(args.rtmp) not in (0, phases):
        parser.error("give one --rtmp count per --bots count (or none)")
    if len(args.interrupt_every) not in (0, 1, phases):
        parser.error("give one --interrupt-every for every phase, or one per --bots count")
    if len(args.latency) not in (0, 1, phases):
        parser.error("give one --latency for every phase, or one per --bots count")
    args.latency = (args.latency or [FAITHFUL.name]) * (phases if len(args.latency) < 2 else 1)
    args.rtmp = args.rtmp or [0] * phases
    args.interrupt_every = (args.interrupt_every or [0.0]) * (phases if len(args.interrupt_every) < 2 else 1)
    return args


def gpu_memory() -> dict[int, float] | None:
    """MiB of GPU memory each process holds (``nvidia-smi --query-compute-apps``); None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    used = {}
    for line in done.stdout.splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if pid.isdigit():
            used[int(pid)] = float(mib) if mib.replace(".", "", 1).isdigit() else 0.0  # "[N/A]" where it is hidden
    return used


class BotProcess:
    """One ``python -m harness.pipecat_bot`` process: started, opened, told to start and end its window, its report."""

    def __init__(self, python: str, base: str, token: str | None, report: Path, seed: int, options: list[str]) -> None:
        self.report_path, self.log_path = report, report.with_suffix(".log")
        self.command = [python, "-m", "harness.pipecat_bot", "--url", base, "--out", str(report), "--seed", str(seed)]
        self.command += (["--token", token] if token else []) + options
        self.process: asyncio.subprocess.Process | None = None
        self.opened: dict = {}

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=log
            )

    async def wait_open(self, timeout: float) -> dict:
        """The bot's first line: its session (``event`` open) or why it has none (``error``)."""
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
            self.opened = json.loads(line) if line else {"event": "error", "message": "the bot exited"}
        except (TimeoutError, ValueError) as exc:
            self.opened = {"event": "error", "message": f"no session within {timeout:.0f} s: {exc!r}"}
        return self.opened

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)

    async def finish(self) -> dict:
        """SIGTERM, the exit (killed after ``BOT_STOP_S``), the report (or what went wrong, with the log's end)."""
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), BOT_STOP_S)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self.report_path.exists():
            return {**json.loads(self.report_path.read_text()), "exit": self.process.returncode}
        tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        return {"session": self.opened.get("session"), "exit": self.process.returncode, "error": tail}


async def phase(
    api: Api, args: argparse.Namespace, work: Path, number: int, nginx: NginxRtmp | None, server: int | None
) -> dict:
    """One phase: its bots and RTMP streams for its minutes; everything each reported, and the summaries."""
    bots, rtmp, minutes = args.bots[number], args.rtmp[number], args.minutes[number]
    every = args.interrupt_every[number]
    options = ["--seconds", str(round(START + minutes * 60 + 60))]  # a bot left behind stops by itself
    options += ["--interrupt-every", str(every)] if every else []
    options += ["--latency", args.latency[number]]
    folder = work / f"phase{number}"
    folder.mkdir()
    processes = [
        BotProcess(args.bot_python, api.base, args.token, folder / f"bot{i}.json", i, options) for i in range(bots)
    ]
    streams: list[dict] = []
    readers: list[RtmpPacketLog] = []
    feeders: list[asyncio.Future] = []
    stop = asyncio.Event()
    speech, rate = demo_audio()
    result: dict = {
        "bots": bots,
        "rtmp": rtmp,
        "minutes": minutes,
        "interrupt_every_s": every or None,
        "latency": args.latency[number],
    }
    witness: AiortcViewer | None = None
    result["service_idle_s"] = await service_idle(api)
    try:
        await asyncio.gather(*(bot.start() for bot in processes))
        opened = await asyncio.gather(*(bot.wait_open(START) for bot in processes))
        refused = [line for line in opened if line.get("event") != "open"]
        if refused:
            result["refused"] = refused
        for i in range(rtmp):  # after the bots': a bot gives up on its session after 10 s, this only after 30 s
            streams.append(await api.create(rtmp=nginx.url(f"phase{number}-{i}")))
            readers.append(RtmpPacketLog(nginx.url(f"phase{number}-{i}"), open_timeout=STALL, read_timeout=STALL))
            readers[-1].start()
            feeders.append(
                asyncio.ensure_future(feed(0, streams[-1]["id"], speech, rate, stop, streams[-1]["urls"]["push"]))
            )
        sessions = [line["session"] for line in opened if line.get("event") == "open"] + [s["id"] for s in streams]
        if opened and opened[0].get("event") == "open":
            witness = await watch(api, args.token, opened[0]["session"])
        result["first_frames_s"] = await first_frames(api, sessions, readers)
        await asyncio.sleep(SETTLE)  # what queued while connecting arrives at once
        start = time.monotonic()
        for bot in processes:
            bot.signal(signal.SIGUSR1)
        before, cpu_before = await api.metrics(), process_cpu(server) if server else {}
        used: dict[int, float] = {}
        gpu_seen = True
        while time.monotonic() < start + minutes * 60:
            sample = await asyncio.to_thread(gpu_memory)
            gpu_seen = sample is not None
            for pid, mib in (sample or {}).items():
                used[pid] = max(used.get(pid, 0.0), mib)
            await asyncio.sleep(min(GPU_SAMPLE_S, max(0.0, start + minutes * 60 - time.monotonic())))
        end = time.monotonic()
        after, cpu_after = await api.metrics(), process_cpu(server) if server else {}
        listing = await (await api.http.get(f"{api.base}/sessions")).json()
    finally:
        reports = await asyncio.gather(*(bot.finish() for bot in processes))
        seen = await witness.stop() if witness is not None else None
        stop.set()
        done, blocked = await asyncio.wait(feeders, timeout=10) if feeders else ([], [])
        for feeder in blocked:
            feeder.cancel()
        result["push_errors"] = push_errors(done)
        await asyncio.gather(*(api.delete(s["id"]) for s in streams))
        logs = await asyncio.gather(*(asyncio.to_thread(r.join, 30) for r in readers))
    for report in reports:
        report["service"] = window_counters(before, after, report.get("session"))
    rows = []
    for i, (session, log) in enumerate(zip(streams, logs)):
        rows.append({"stream": i, **stream_report(log, start, end), **window_counters(before, after, session["id"])})
    bot_pids = {report.get("pid") for report in reports}
    result.update(
        window_s=round(end - start, 2),
        bots_summary=bots_summary(reports),
        witness=witnessed(seen, reports[0]) if seen is not None and "markers" in reports[0] else None,
        streams_summary=streams_summary(rows) if rows else None,
        gpu_memory_mib={
            "nvidia_smi": gpu_seen,
            "bots": {pid: mib for pid, mib in used.items() if pid in bot_pids},
            "every_process": used,
        },
        cores={kind: round((cpu_after[kind] - cpu_before.get(kind, 0.0)) / (end - start), 2) for kind in cpu_after},
        capacity=listing.get("capacity"),
        runtime=runtime_figures(after),
        pushers_blocked_at_end=len(blocked),
        bot_reports=reports,
        streams=rows,
    )
    return result


async def watch(api: Api, token: str | None, session: str) -> AiortcViewer:
    """The service's own WebRTC viewer (``harness.viewers.AiortcViewer``) of a bot's session: the same stream the bot
    receives, so the same markers, as a viewer without the bot's pipeline gets them."""
    found = await (await api.http.get(f"{api.base}/sessions/{session}")).json()
    viewer = AiortcViewer(api.base, found["urls"]["whep"], token)
    await viewer.start()
    return viewer


def witnessed(log: ViewerLog, bot: dict) -> dict:
    """The witness's latency of the bot's markers (sent -> decoded by the viewer), and per marker what the bot added:
    its own latency of the same marker less the witness's."""
    markers = bot["markers"]
    sent, (start, end) = markers["sent_at"], markers["window"]
    onsets, arrived = [onset for onset, _ in log.onsets], [at for _, at in log.onsets]
    latency = {n: (at - sent[n]) * 1000 for n, at in zip(pair(onsets, sent, arrived), arrived) if n is not None}
    in_window = [n for n, t in enumerate(sent) if start <= t <= end]
    values = [round(latency[n], 1) for n in in_window if n in latency]
    added = [ms - latency[int(n)] for n, ms in markers["by_marker"].items() if int(n) in latency]
    return {
        "session": bot.get("session"),
        "markers_sent": len(in_window),
        "found": len(values),
        "latency": percentiles(values),
        "added_by_the_bot": percentiles(added),
        "added_ms": [round(v, 1) for v in added],
    }


async def service_idle(api: Api) -> float:
    """Wait (at most ``START``) until the service has no session that is not over and its engine core answers, so that
    the phase's sessions open at once (a CPU's core answers only between ticks of minutes, and a session asked for
    meanwhile fails after the front end's 30 s); the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < START:
        listing = await (await api.http.get(f"{api.base}/sessions")).json()  # asks the core for its figures
        over = all(s["state"] in ("ended", "failed") for s in listing["sessions"])
        if over and metric(await api.metrics(), "ditto_runtime_frontend_rss_mb") is not None:  # the core answered
            break
        await asyncio.sleep(1.0)
    return round(time.monotonic() - started, 1)


async def first_frames(api: Api, sessions: list[str], readers: list[RtmpPacketLog]) -> float:
    """Wait (at most ``START``) until the service has released a frame of every session and every RTMP stream read
    back has a picture (a CPU's first window takes minutes); the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < START:
        metrics = await api.metrics()
        released = [metric(metrics, "ditto_frames_released_total", session=s) or 0 for s in sessions]
        if all(released) and all(r.log.video for r in readers):
            break
        await asyncio.sleep(0.5)
    return round(time.monotonic() - started, 1)


def push_errors(feeds: set[asyncio.Future]) -> list[str]:
    """What the finished feeds of the RTMP sessions say: the server's push errors, or how a feed failed."""
    said = [repr(f.exception()) if f.exception() else f.result() for f in feeds if not f.cancelled()]
    return [text for text in said if text]


def window_counters(before: dict, after: dict, session: str | None) -> dict:
    """A session's counters from /metrics at the window's end, and its repeated and released slots in the window."""
    if session is None:
        return {}
    row = server_counters(after, session)
    earlier = server_counters(before, session)
    for key in ("repeated", "released"):
        row[f"{key}_in_window"] = row[key] - earlier[key] if None not in (row[key], earlier[key]) else None
    return row


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), **{f"p{q}_ms": round(float(np.percentile(values, q)), 1) for q in (50, 95, 99)}}


def bots_summary(reports: list[dict]) -> dict:
    """The bots of one phase together: their clocks, repeats (theirs and the service's), segments, markers, cost."""
    done = [r for r in reports if "fps" in r]
    slots = sum(r["slots"] for r in done)
    service = [r["service"] for r in done if r.get("service")]
    released = sum(s.get("released_in_window") or 0 for s in service)
    latencies = [v for r in done for v in r["markers"]["latency_ms"]]
    totals = {
        key: sum(r[key] for r in done)
        for key in (
            "segments_started",
            "segments_cut",
            "stops_sent",
            "stops_passed",
            "stops_missing",
            "stops_duplicated",
            "interrupts",
        )
    }
    return {
        "reported": len(done),
        "fps_min": min((r["fps"] for r in done), default=None),
        "fps_max": max((r["fps"] for r in done), default=None),
        "slots_skipped": sum(r["slots_skipped"] for r in done),
        "repeat_share": round(sum(r["repeats"] for r in done) / slots, 5) if slots else None,
        "service_repeat_share": round(sum(s.get("repeated_in_window") or 0 for s in service) / released, 5)
        if released
        else None,
        "service_deadline_misses": sum(s.get("deadline_misses") or 0 for s in service),
        **totals,
        "stops_mismatch": totals["stops_missing"] + totals["stops_duplicated"],
        "markers_sent": sum(r["markers"]["sent"] for r in done),
        "markers": percentiles(latencies),
        "markers_lost": {
            reason: sum(r["markers"].get("lost", {}).get(reason, 0) for r in done) for reason in ("cut", "not_found")
        },
        "per_bot": [
            {"session": r["session"], **{k: v for k, v in r["markers"].items() if k.startswith("p")}} for r in done
        ],
        "spread_ms": spread(done),
        "empty_audio_frames": sum(r.get("empty_audio_frames", 0) for r in done),
        "av_offset_ms_max": max((r.get("av_offset_ms_max", 0.0) for r in done), default=None),
        "service_speech_latency_ms": max(
            (s["speech_latency_ms"] for s in service if s.get("speech_latency_ms")), default=None
        ),
        "bot_cores_mean": round(float(np.mean([r["cores"] for r in done])), 4) if done else None,
        "bot_cores_max": max((r["cores"] for r in done), default=None),
        "bot_rss_mb_max": max((r["max_rss_mb"] for r in done), default=None),
        "bots_with_torch": sum(bool(r["torch"]) for r in done),
        "bots_with_errors": sum(bool(r.get("errors")) for r in done),
    }


def spread(reports: list[dict]) -> dict:
    """How far apart the bots land: the largest less the least of their marker p50s, and of their p99s."""
    return {
        q: round(max(values) - min(values), 1) if values else None
        for q in ("p50_ms", "p99_ms")
        for values in [[r["markers"][q] for r in reports if q in r["markers"]]]
    }


def streams_summary(rows: list[dict]) -> dict:
    """The RTMP streams of one phase together, as bench.service reports them."""
    fps = [r["fps"] for r in rows if r.get("fps") is not None]
    released = sum(r.get("released_in_window") or 0 for r in rows)
    return {
        "fps_min": min(fps, default=None),
        "fps_max": max(fps, default=None),
        "timestamp_gaps": sum(r.get("timestamp_gaps") or 0 for r in rows),
        "repeated_share": round(sum(r.get("repeated_in_window") or 0 for r in rows) / released, 5)
        if released
        else None,
        "deadline_misses": sum(r.get("deadline_misses") or 0 for r in rows),
    }


def glass_reference(path: Path) -> dict:
    """The service's own WebRTC latency from a bench.glass_to_glass JSON (the aiortc viewer's decoded burst), and the
    latency mode it was measured in."""
    result = json.loads(path.read_text())
    audio = result.get("paths", {}).get("aiortc_audio") or {}
    return {
        "file": str(path),
        "latency": result.get("latency", FAITHFUL.name),
        "path": "aiortc_audio",
        "p50_ms": audio.get("p50_ms"),
        "p99_ms": audio.get("p99_ms"),
    }


async def measure(args: argparse.Namespace, work: Path) -> dict:
    result: dict = {
        "what": "pipecat bots as processes of their own against one apps.serve (DittoVideoService(url=...)), beside "
        "RTMP streams read back; each bot measures its own clock, repeats, segments and marker latency",
        "bot": "python -m harness.pipecat_bot: the bundled speech as TTS frames in real time (4 s utterances, 1 s "
        "gaps, 40 ms chunks), two markers an utterance",
        "encoder": "x264",
        "random_weights": True,
        "python": platform.python_version(),
        "bot_python": args.bot_python,
        "admission": "off (--no-admission); the capacity the service would admit is reported",
    }
    if args.glass:
        result["glass"] = [glass_reference(path) for path in args.glass]
    nginx = NginxRtmp(work / "nginx", find_nginx()) if any(args.rtmp) else None
    server = None
    if args.service:
        base = args.service.rstrip("/")
        result.update(service=base, device=None)
    else:
        device = device_of(args)
        args.token = args.token or secrets.token_urlsafe(16)
        avatar = args.avatar or str(write_demo_portrait(work))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        plans = ["--plans", str(args.plans.absolute())] if args.plans else []
        served = ["--avatar", avatar, "--sessions", "0", "--no-admission", "--token", args.token, *plans]
        served += ["--http", f"127.0.0.1:{port}", "--steps", str(args.steps), "--device", device]
        server = LiveServer(served, port, work / "serve.log", args.token)
        result.update(device=device, steps=args.steps, plans=args.plans and str(args.plans))
        if device == "cpu":
            result["notice"] = CPU_NOTICE
    try:
        if nginx is not None:
            nginx.start()
        if server is not None:
            server.start()
            await asyncio.to_thread(server.wait_ready, START)
            result["ready_s"] = round(time.monotonic() - server.started_at, 2)
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        async with aiohttp.ClientSession(headers=headers) as http:
            api = Api(http, base)
            result["capacity"] = (await (await http.get(f"{base}/sessions")).json())["capacity"]
            result["phases"] = []
            for number in range(len(args.bots)):
                pid = server.process.pid if server is not None else None
                try:
                    result["phases"].append(await phase(api, args, work, number, nginx, pid))
                except (RuntimeError, TimeoutError, aiohttp.ClientError) as exc:  # the next phase may still run
                    result["phases"].append({"bots": args.bots[number], "rtmp": args.rtmp[number], "error": repr(exc)})
                args.out.write_text(json.dumps(result, indent=2))
    finally:
        if server is not None:
            result["server_exit"] = await asyncio.to_thread(server.stop)
        if nginx is not None:
            nginx.stop()
    return result


def table(result: dict) -> str:
    lines = [
        f"bots on {result.get('device') or result.get('service')}: service ready {result.get('ready_s')} s, "
        f"capacity {result.get('capacity')}; random weights"
    ]
    glass = {reference["latency"]: reference for reference in result.get("glass", [])}
    for p in result.get("phases", []):
        if "error" in p:
            lines.append(f"{p['bots']} bots + {p['rtmp']} RTMP: failed: {p['error']}")
            continue
        b, s = p["bots_summary"], p["streams_summary"]
        every = f"interruptions every ~{p['interrupt_every_s']} s" if p["interrupt_every_s"] else "no interruptions"
        refused = f", {len(p['refused'])} bots refused a session" if p.get("refused") else ""
        lines.append(f"{p['bots']} bots + {p['rtmp']} RTMP, {p['window_s']} s measured, {every}{refused}:")
        lines.append(
            f"  bots: {b['reported']} reported, fps {b['fps_min']}-{b['fps_max']} on their clocks, repeats "
            f"{b['repeat_share']} of slots (service {b['service_repeat_share']}, target <= 0.001; "
            f"{b['service_deadline_misses']} deadline misses), CPU {b['bot_cores_mean']} cores a bot (max "
            f"{b['bot_cores_max']}), RSS <= {b['bot_rss_mb_max']} MB, torch in {b['bots_with_torch']}, GPU memory "
            f"in bots: {p['gpu_memory_mib']['bots'] or 'none'}"
            + ("" if p["gpu_memory_mib"]["nvidia_smi"] else " (no nvidia-smi)")
        )
        lines.append(
            f"  segments (each bot's whole run): {b['segments_started']} started, {b['segments_cut']} cut by "
            f"{b['interrupts']} interruptions, {b['stops_sent']} TTSStoppedFrames sent, {b['stops_passed']} passed, "
            f"{b['stops_missing']} missing, {b['stops_duplicated']} twice (target: every one once)"
        )
        lines += marker_lines(b, p.get("witness"), glass.get(p.get("latency")), p.get("latency"))
        m = b["markers"]
        if b.get("service_speech_latency_ms") is not None and m.get("p50_ms") is not None:
            lines.append(
                f"  the sessions' speech latency by construction (push -> shown on their clock, at most) "
                f"{b['service_speech_latency_ms']} ms: transport, player and bot take "
                f"{round(m['p50_ms'] - b['service_speech_latency_ms'], 1)} ms at p50"
            )
        if s:
            lines.append(
                f"  RTMP: fps {s['fps_min']}-{s['fps_max']}, repeated {s['repeated_share']} of the window's slots, "
                f"gaps {s['timestamp_gaps']}, deadline misses {s['deadline_misses']}"
            )
        lines.append(f"  service cores {p['cores']}, runtime gpu_busy {p['runtime'].get('gpu_busy')}")
    return "\n".join(lines)


def marker_lines(b: dict, witness: dict | None, glass: dict | None, latency: str | None) -> list[str]:
    """The table's marker lines: every bot's latency, their spread, what went missing and why, and what the bot path
    adds to the service's own WebRTC viewer of the same stream (the witness) and to bench.glass_to_glass's."""
    m, lost = b["markers"], b.get("markers_lost", {})
    lines = [
        f"  markers ({latency}): {m['n']} of {b['markers_sent']} found ({lost.get('cut', 0)} cut by an interruption, "
        f"{lost.get('not_found', 0)} not found), p50 {m.get('p50_ms')} ms, p99 {m.get('p99_ms')} ms; bots apart by "
        f"{b['spread_ms']['p50_ms']} ms at p50, {b['spread_ms']['p99_ms']} at p99 (target <= {SPREAD_TARGET_MS:.0f})"
        + (f"; p99 target {LOW_P99_TARGET_MS:.0f}" if latency == "low" else ""),
        "    per bot p50/p99 ms: " + ", ".join(f"{r.get('p50_ms')}/{r.get('p99_ms')}" for r in b["per_bot"]),
        f"    audio: {b['empty_audio_frames']} empty frames, picture to its audio at most {b['av_offset_ms_max']} ms",
    ]
    if witness:
        w, added = witness["latency"], witness["added_by_the_bot"]
        lines.append(
            f"  the service's own WebRTC viewer of bot 0's stream: {w['n']} of {witness['markers_sent']} markers, p50 "
            f"{w.get('p50_ms')} ms, p99 {w.get('p99_ms')} ms; the bot adds p50 {added.get('p50_ms')} ms, p99 "
            f"{added.get('p99_ms')} ms to the same markers (target <= {ADDED_P99_TARGET_MS:.0f})"
        )
    if glass and glass.get("p99_ms") is not None and m.get("p99_ms") is not None:
        lines.append(
            f"  bench.glass_to_glass's WebRTC (aiortc) p99 {glass['p99_ms']} ms: the bots' p99 is "
            f"{round(m['p99_ms'] - glass['p99_ms'], 1)} ms above it"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_keeping_server_log(measure, args, "agents-")
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
