"""The service for an hour: N sessions pushed speech with interruptions, session churn, every stream read back; drift,
repeats, playback events, memory of every process and failed requests, over time.

``python -m bench.soak --sessions 8 --minutes 60 [--synthetic | --avatar DIR --plans DIR] --out FILE.json``

Starts nginx-rtmp and ``python -m apps.serve --avatar ... --sessions 0 --no-admission`` (with ``--synthetic``, the same
command line through ``harness.synthetic_serve``: the test suite's synthetic runtime in the engine core, so a CPU runs
it in real time), then through the session API only:

- ``--sessions`` steady sessions, each streaming to RTMP and read back (demuxed) for the whole run, each pushed the
  bundled speech in real time as utterances (``end_of_segment``, then 1-3 s of silence), every ``--interrupt-every``-th
  one cut halfway (``interrupt``);
- one more session created every ``--churn-every`` seconds: spoken to, then deleted while a segment is open;
- every ``--window`` seconds: /metrics (each session's repeated and released slots, deadline misses), the resident
  memory of every process of the server and the GPU memory of each (``nvidia-smi``, where there is one).

It reports, per steady stream and window, the drift of its pictures' arrival against its own timeline and of its
audio against its video (each from the stream's first window), timestamp gaps and repeated slots; the playback events
of every segment of every session (each segment closed or started must be finished exactly once); each process's
memory growth from ``--warm-minutes`` to the end; every request that failed (a status not asked for, or no answer)
and every error a push client was told. The targets (docs/benchmarks.md) are checked at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import av
import numpy as np

from bench.common.live import CPU_NOTICE, PUSH_RATE, START, device_of
from bench.common.memory import used_by_process
from bench.common.streams import CHUNK_SECONDS, SETTLE
from bench.common.targets import SOAK_DRIFT_MS, SOAK_MEMORY_GROWTH
from engine.timebase import DEFAULT_STEPS, FPS
from harness.live_server import LiveServer, metric, parse_metrics, run_keeping_server_log
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.push import Pusher
from harness.rtmp_read import OPEN_OPTIONS
from streaming.encoders.audio import AAC_BLOCK
from streaming.frames import AUDIO_RATE
from streaming.push_messages import EndOfSegment, Interrupt

READ_TIMEOUT = 15.0
"""Seconds a reader waits for the next packet: a stream that stalls this long has stopped (an error, before the end)."""
EVENTS_GRACE = 15.0
"""Seconds the pushers wait at the end for the playback events of the segments they closed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    runtime = parser.add_mutually_exclusive_group()
    runtime.add_argument(
        "--synthetic",
        action="store_true",
        help="the synthetic runtime in the engine core (harness.synthetic_serve): the service alone, on a CPU",
    )
    runtime.add_argument("--avatar", help="cached avatar folder or portrait image (default: the demo portrait)")
    parser.add_argument("--sessions", type=int, default=8, help="steady sessions, live for the whole run")
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the steady sessions are measured")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per row of the timeline")
    parser.add_argument("--warm-minutes", type=float, default=5.0, help="memory growth is counted from here")
    parser.add_argument("--churn-every", type=float, default=30.0, help="seconds between two churned sessions")
    parser.add_argument("--interrupt-every", type=int, default=4, help="every Nth utterance is cut halfway")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available; cpu with --synthetic)")
    parser.add_argument("--plans", type=Path, help="the torch backend's compiled packages, passed to apps.serve")
    parser.add_argument("--output-workers", type=int, help="output worker processes (default: apps.serve's)")
    parser.add_argument("--seed", type=int, default=0, help="the pauses between utterances")
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON (after every window)")
    args = parser.parse_args(argv)
    if args.synthetic and args.device is None:
        args.device = "cpu"
    return args


@dataclass
class Window:
    """What one stream's reader saw in one window of arrival time."""

    frames: int = 0
    gaps: int = 0
    lags: list[float] = field(default_factory=list)
    offsets: list[float] = field(default_factory=list)

    def row(self) -> dict:
        """The window's figures: frames, timestamp gaps, median lag and A/V offset (ms)."""
        return {
            "frames": self.frames,
            "gaps": self.gaps,
            "lag_ms": round(float(np.median(self.lags)) * 1000, 1) if self.lags else None,
            "av_offset_ms": round(float(np.median(self.offsets)) * 1000, 1) if self.offsets else None,
        }


class StreamWatch:
    """One RTMP stream demuxed (not decoded) in a thread of its own, summed up per window of arrival time: its video
    frames, the lag of their arrival behind the stream's timeline (from its first frame after ``origin``), the offset of
    its audio timeline ahead of its video's, and timestamp gaps. Opened before its session exists (nginx holds a player
    until the publisher comes); frames before ``origin`` is set, and before it, are not counted."""

    def __init__(self, url: str, window: float) -> None:
        self.url, self.window = url, window
        self.origin: float | None = None
        """When window 0 starts (monotonic s), set once every stream of the run has its first frames."""
        self.rows: dict[int, dict] = {}
        self.first_at: float | None = None
        self.error: str | None = None
        self._current: tuple[int, Window] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"soak {url}", daemon=True)

    def start(self) -> StreamWatch:
        self._thread.start()
        return self

    def stop(self, timeout: float) -> None:
        """Stop at the next packet (or the read timeout) and close the last window."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        base = last_pts = audio_end = None
        try:
            with av.open(self.url, format="flv", timeout=(START, READ_TIMEOUT), options=OPEN_OPTIONS) as container:
                for packet in container.demux():
                    if self._stop.is_set():
                        break
                    if packet.pts is None or packet.size == 0:
                        continue
                    now, pts = time.monotonic(), float(packet.pts * packet.time_base)
                    if packet.stream.type != "video":
                        audio_end = pts + AAC_BLOCK / AUDIO_RATE
                        continue
                    self.first_at = self.first_at or now
                    if self.origin is None or now < self.origin:  # what queued while connecting arrives at once
                        last_pts = pts
                        continue
                    if base is None:
                        base = now - pts
                    window = self._window(now)
                    window.frames += 1
                    window.lags.append(now - pts - base)
                    if last_pts is not None and round((pts - last_pts) * FPS) != 1:
                        window.gaps += 1
                    if audio_end is not None:
                        window.offsets.append(audio_end - (pts + 1 / FPS))
                    last_pts = pts
        except av.error.FFmpegError as exc:  # also the read timeout once the session has ended
            if not self._stop.is_set():
                self.error = f"{type(exc).__name__}: {exc}"
        self._window(None)

    def _window(self, now: float | None) -> Window:
        """The window ``now`` falls in; the one before summed up into ``rows`` once a new one starts (None: the end)."""
        index = None if now is None else int((now - self.origin) // self.window)
        if self._current is not None and self._current[0] != index:
            self.rows[self._current[0]] = self._current[1].row()
            self._current = None
        if index is None:
            return Window()
        if self._current is None:
            self._current = (index, Window())
        return self._current[1]


class Api:
    """The session API with every request counted, and each that failed (a status not expected, or no answer) kept."""

    def __init__(self, http: aiohttp.ClientSession, base: str, origin: float) -> None:
        self.http, self.base, self.origin = http, base, origin
        self.requests: Counter[str] = Counter()
        self.failed: list[dict] = []

    async def call(self, method: str, path: str, expect: int = 200, **kwargs) -> dict | str | None:
        """The answer's JSON (or text), or None when it failed (recorded)."""
        self.requests[method] += 1
        try:
            async with self.http.request(method, f"{self.base}{path}", **kwargs) as response:
                body = await (response.json() if response.content_type == "application/json" else response.text())
                if response.status == expect:
                    return body
                failure = {"status": response.status, "body": str(body)[:300]}
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = {"error": repr(exc)}
        self.failed.append({"at_s": round(time.monotonic() - self.origin, 1), "request": f"{method} {path}", **failure})
        return None

    async def create(self, rtmp: str) -> dict | None:
        return await self.call("POST", "/sessions", 201, json={"avatar": "anchor", "rtmp": rtmp})

    async def delete(self, session_id: str) -> dict | None:
        return await self.call("DELETE", f"/sessions/{session_id}")


def playback(events: list[dict]) -> dict:
    """Every segment a push client closed (``end_of_segment``, ``interrupt``) or was told started must be told finished
    exactly once: the segments, and those lost (never finished) or told twice."""
    closed = {
        e["segment"] for e in events if e["type"] in ("end_of_segment", "interrupted") and e["segment"] is not None
    }
    started = Counter(e["segment"] for e in events if e["type"] == "playback_started")
    finished = Counter(e["segment"] for e in events if e["type"] == "playback_finished")
    expected = closed | set(started)
    return {
        "segments": len(expected | set(finished)),
        "interrupted": sum(e["type"] == "playback_finished" and e["interrupted"] for e in events),
        "lost": sorted(s for s in expected if not finished[s]),
        "twice": sorted({s for s, n in (finished + started).items() if finished[s] > 1 or started[s] > 1}),
    }


def told_errors(events: list[dict]) -> list[dict]:
    """What a push client was told that is an error: a refused message, an output or the session failing."""
    return [e for e in events if e["type"] in ("error", "output_failed", "session_failed")]


async def speak(url: str, speech: np.ndarray, stop: asyncio.Event, rng: random.Random, every: int) -> list[dict]:
    """Push utterances of ``speech`` into one session in real time until ``stop``, every ``every``-th cut halfway, with
    1-3 s of silence between; then wait for the playback of what it closed. The events it was told."""
    async with Pusher(url, PUSH_RATE, round(CHUNK_SECONDS * PUSH_RATE)) as pusher:
        spoken = 0
        while not stop.is_set() and not pusher.closed:
            spoken += 1
            if spoken % every == 0:
                await pusher.play(speech[: speech.size // 2])
                await pusher.send(Interrupt())
            else:
                await pusher.play(speech)
                await pusher.send(EndOfSegment())
            await pusher.pause(rng.uniform(1.0, 3.0))
        deadline = time.monotonic() + EVENTS_GRACE
        while playback(pusher.events)["lost"] and time.monotonic() < deadline and not pusher.closed:
            await asyncio.sleep(0.2)
        return pusher.events


async def churn(api: Api, nginx: NginxRtmp, every: float, stop: asyncio.Event, speech: np.ndarray) -> list[dict]:
    """A session created every ``every`` s, spoken to (one segment closed, one left open), then deleted; each one's
    events, with its id and final state."""
    done: list[dict] = []
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            break
        except TimeoutError:
            pass
        session = await api.create(nginx.url(f"churn-{len(done) % 4}"))
        if session is None:
            continue
        async with Pusher(session["urls"]["push"], PUSH_RATE, round(CHUNK_SECONDS * PUSH_RATE)) as pusher:
            await pusher.play(speech[: 2 * PUSH_RATE])
            await pusher.send(EndOfSegment())
            await pusher.play(speech[2 * PUSH_RATE : 3 * PUSH_RATE])
            ended = await api.delete(session["id"])
            await asyncio.sleep(2.0)  # the open segment's end, told as the stream ends
        done.append({"id": session["id"], "state": ended and ended["state"], "events": pusher.events})
    return done


def processes(root: int) -> dict[int, str]:
    """The server process ``root`` and its children (Linux /proc), each named by its kind: front end, engine core,
    output worker, other (a helper of one of them)."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    kinds, pending = {}, [root]
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        command = commands.get(pid, "")
        kinds[pid] = (
            "front end"
            if pid == root
            else "engine core"
            if "serving.core" in command
            else "output worker"
            if "serving.worker" in command
            else "other"
        )
    return kinds


def resident_mb(pid: int) -> float | None:
    """A process's resident set size (MB), None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def memory_sample(root: int) -> dict:
    """Resident and GPU memory (MB) of every process of the server, keyed "kind pid"."""
    gpu = used_by_process()
    sample: dict = {"rss_mb": {}, "gpu_mb": {} if gpu is not None else None}
    for pid, kind in processes(root).items():
        rss = resident_mb(pid)
        if rss is not None:
            sample["rss_mb"][f"{kind} {pid}"] = rss
        if gpu and pid in gpu:
            sample["gpu_mb"][f"{kind} {pid}"] = round(gpu[pid] / 2**20, 1)
    return sample


def growth(samples: list[dict], key: str, warm_s: float) -> dict:
    """Each process's memory (``key``: rss_mb or gpu_mb) at the first sample from ``warm_s`` on and at the last, and
    its growth between them (a share), for the processes in both; and all of them summed."""
    later = [s for s in samples if s["t_s"] >= warm_s and s.get(key)]
    if len(later) < 2:
        return {}
    first, last = later[0][key], later[-1][key]
    rows = {name: {"warm": first[name], "end": last[name]} for name in first if name in last}
    rows["all processes"] = {"warm": sum(first.values()), "end": sum(last.values())}
    for row in rows.values():
        row["warm"], row["end"] = round(row["warm"], 1), round(row["end"], 1)
        row["growth"] = round((row["end"] - row["warm"]) / row["warm"], 4) if row["warm"] else None
    return rows


def stream_timeline(watch: StreamWatch, samples: list[dict], session_id: str) -> dict:
    """One steady stream: per window its frames, gaps, drift of its pictures against its timeline and of its audio
    against its video (ms, from its first window), and the slots repeated (the server's counter); at the end."""
    rows = [{"window": i, **watch.rows[i]} for i in sorted(watch.rows)]
    full = [r for r in rows if r["lag_ms"] is not None and r["av_offset_ms"] is not None]
    repeated = {s["window"]: s["repeated"].get(session_id) for s in samples}
    for row in rows:
        before, after = repeated.get(row["window"] - 1, 0), repeated.get(row["window"])
        row["repeated"] = after - (before or 0) if after is not None else None
        if full:
            row["drift_ms"] = round(row["lag_ms"] - full[0]["lag_ms"], 1) if row["lag_ms"] is not None else None
            row["av_drift_ms"] = (
                round(row["av_offset_ms"] - full[0]["av_offset_ms"], 1) if row["av_offset_ms"] is not None else None
            )
    end = full[-2] if len(full) > 2 else full[-1] if full else {}  # the last window is cut by the stop
    return {
        "session": session_id,
        "read_error": watch.error,
        "frames": sum(r["frames"] for r in rows),
        "gaps": sum(r["gaps"] for r in rows),
        "drift_ms_at_end": end.get("drift_ms"),
        "av_drift_ms_at_end": end.get("av_drift_ms"),
        "repeated": (samples[-1]["repeated"].get(session_id) if samples else None),
        "released": (samples[-1]["released"].get(session_id) if samples else None),
        "deadline_misses": (samples[-1]["misses"].get(session_id) if samples else None),
        "windows": rows,
    }


def counters(metrics: dict, ids: list[str]) -> dict:
    """Each session's repeated and released slots and deadline misses, from /metrics."""
    return {
        "repeated": {i: metric(metrics, "ditto_frames_repeated_total", session=i) for i in ids},
        "released": {i: metric(metrics, "ditto_frames_released_total", session=i) for i in ids},
        "misses": {i: metric(metrics, "ditto_session_deadline_misses", session=i) for i in ids},
    }


def machine() -> dict:
    """The hardware and software the run measured."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    found = {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(int(memory) / 2**20, 1)}
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        found["gpu"] = gpus or None
    except OSError:
        found["gpu"] = None
    import torch
    import zmq

    found["software"] = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "torch": torch.__version__,
        "av": av.__version__,
        "ffmpeg_libavcodec": av.library_versions.get("libavcodec"),
        "aiohttp": aiohttp.__version__,
        "pyzmq": zmq.__version__,
    }
    try:
        found["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        found["commit"] = None
    return found


def server_command(args: argparse.Namespace, work: Path, port: int) -> tuple[list[str], str]:
    """The server's command line, and the module that takes it."""
    from engine.assets import write_demo_portrait

    avatar = "synthetic" if args.synthetic else (args.avatar or str(write_demo_portrait(work)))
    command = ["--avatar", avatar, "--sessions", "0", "--no-admission", "--http", f"127.0.0.1:{port}"]
    command += ["--steps", str(args.steps), "--device", device_of(args)]
    if args.plans:
        command += ["--plans", str(args.plans.absolute())]
    if args.output_workers:
        command += ["--output-workers", str(args.output_workers)]
    return command, "harness.synthetic_serve" if args.synthetic else "apps.serve"


async def measure(args: argparse.Namespace, work: Path) -> dict:
    from engine.assets import demo_audio

    speech, rate = demo_audio()
    assert rate == PUSH_RATE, rate
    nginx = NginxRtmp(work / "nginx", find_nginx())
    port = free_port()
    command, module = server_command(args, work, port)
    server = LiveServer(command, port, work / "serve.log", module=module)
    result: dict = {
        "what": "bench.soak: steady sessions pushed speech with interruptions, session churn, every steady RTMP stream "
        "read back (demuxed) from nginx-rtmp on loopback",
        "runtime": "synthetic (tests/streaming/synthetic_runtime.py, harness.synthetic_serve)"
        if args.synthetic
        else "the engine (random weights unless the avatar's checkpoints are official)",
        "device": device_of(args),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine(),
        "targets": {"drift_ms": SOAK_DRIFT_MS, "memory_growth": SOAK_MEMORY_GROWTH, "lost_playback": 0, "failed": 0},
    }
    if device_of(args) == "cpu" and not args.synthetic:
        result["notice"] = CPU_NOTICE
    nginx.start()
    try:
        server.start()
        await asyncio.to_thread(server.wait_ready, START)
        result["ready_s"] = round(time.monotonic() - server.started_at, 2)
        async with aiohttp.ClientSession() as http:
            result.update(await run(args, http, f"http://127.0.0.1:{port}", nginx, server, speech, result))
    finally:
        result["server_exit"] = await asyncio.to_thread(server.stop)
        nginx.stop()
    return result


async def run(
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
    base: str,
    nginx: NginxRtmp,
    server: LiveServer,
    speech: np.ndarray,
    result: dict,
) -> dict:
    """The run itself, once the server answers: the steady sessions, the churn, the samples, the report."""
    origin = time.monotonic()
    api = Api(http, base, origin)
    watches = [StreamWatch(nginx.url(f"soak-{i}"), args.window).start() for i in range(args.sessions)]
    sessions = [await api.create(nginx.url(f"soak-{i}")) for i in range(args.sessions)]
    ids = [s["id"] for s in sessions if s is not None]
    stop = asyncio.Event()
    rng = random.Random(args.seed)
    speakers = [
        asyncio.ensure_future(speak(s["urls"]["push"], speech, stop, random.Random(rng.random()), args.interrupt_every))
        for s in sessions
        if s is not None
    ]
    deadline = time.monotonic() + START
    while not all(w.first_at for w in watches) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    origin = max((w.first_at for w in watches if w.first_at), default=time.monotonic()) + SETTLE
    for watch in watches:
        watch.origin = origin
    api.origin = origin
    churning = asyncio.ensure_future(churn(api, nginx, args.churn_every, stop, speech))
    samples: list[dict] = []
    window = -1  # a sample at the start: what each window's counters are counted from
    while window < 0 or time.monotonic() < origin + args.minutes * 60:
        await asyncio.sleep(max(0.0, origin + (window + 1) * args.window - time.monotonic()))
        text = await api.call("GET", "/metrics")
        sample = {"window": window, "t_s": round(time.monotonic() - origin, 1), "load_1m": os.getloadavg()[0]}
        sample.update(memory_sample(server.process.pid))  # the machine's load: what else competed for its cores
        sample.update(counters(parse_metrics(text) if text else {}, ids))
        samples.append(sample)
        window += 1
        result["samples"] = samples
        args.out.write_text(json.dumps(result, indent=2))
    stop.set()
    churned = await churning
    told = await asyncio.gather(*speakers, return_exceptions=True)
    await asyncio.gather(*(asyncio.to_thread(w.stop, READ_TIMEOUT + 5) for w in watches))  # at their next packet
    ended = [await api.delete(i) for i in ids]
    return report(args, api, ids, watches, samples, told, churned, ended)


def report(
    args: argparse.Namespace,
    api: Api,
    ids: list[str],
    watches: list[StreamWatch],
    samples: list[dict],
    told: list,
    churned: list[dict],
    ended: list,
) -> dict:
    """The report: per stream, playback, memory, errors, and the targets checked."""
    streams = [stream_timeline(w, samples, i) for w, i in zip(watches, ids)]
    pushers = [t if isinstance(t, list) else [{"type": "error", "message": repr(t)}] for t in told]
    accounts = [playback(events) for events in pushers] + [playback(c["events"]) for c in churned]
    lost = sum(len(a["lost"]) + len(a["twice"]) for a in accounts)
    errors = [e for events in pushers for e in told_errors(events)]
    errors += [{**e, "session": c["id"]} for c in churned for e in told_errors(c["events"])]
    warm_s = args.warm_minutes * 60
    memory = {"rss_mb": growth(samples, "rss_mb", warm_s), "gpu_mb": growth(samples, "gpu_mb", warm_s)}
    drifts = [abs(d) for s in streams for d in (s["drift_ms_at_end"], s["av_drift_ms_at_end"]) if d is not None]
    growths = [row["growth"] for kind in memory.values() for row in kind.values() if row.get("growth") is not None]
    summary = {
        "steady_sessions": len(ids),
        "churned_sessions": len(churned),
        "churned_states": dict(Counter(c["state"] for c in churned)),
        "ended_states": dict(Counter(e and e["state"] for e in ended)),
        "max_drift_ms_at_end": max(drifts, default=None),
        "max_memory_growth": max(growths, default=None),
        "segments": sum(a["segments"] for a in accounts),
        "segments_interrupted": sum(a["interrupted"] for a in accounts),
        "lost_playback_events": lost,
        "requests": dict(api.requests),
        "failed_requests": len(api.failed),
        "push_errors": len(errors),
        "read_errors": sum(s["read_error"] is not None for s in streams),
        "repeated": sum(s["repeated"] or 0 for s in streams),
        "released": sum(s["released"] or 0 for s in streams),
        "gaps": sum(s["gaps"] for s in streams),
    }
    summary["met"] = {
        "drift": bool(drifts) and len(drifts) == 2 * len(streams) and max(drifts) <= SOAK_DRIFT_MS,
        "memory": bool(growths) and max(growths) <= SOAK_MEMORY_GROWTH,
        "playback": lost == 0 and summary["segments"] > 0,
        "requests": not api.failed,
    }
    return {
        "summary": summary,
        "memory": memory,
        "failed_requests": api.failed,
        "push_errors": errors,
        "playback": accounts,
        "streams": streams,
    }


def table(result: dict) -> str:
    s = result.get("summary", {})
    lines = [
        f"soak on {result['device']} ({result['runtime'].split(' ')[0]} runtime): {s.get('steady_sessions')} steady "
        f"sessions, {s.get('churned_sessions')} churned, {result['settings']['minutes']} min; ready "
        f"{result.get('ready_s')} s"
    ]
    if s:
        lines += [
            f"drift at the end (pictures and A/V, worst stream): {s['max_drift_ms_at_end']} ms "
            f"(target <= {result['targets']['drift_ms']}): {'met' if s['met']['drift'] else 'NOT met'}",
            f"memory growth after warm-up (worst process): {s['max_memory_growth']} "
            f"(target <= {result['targets']['memory_growth']}): {'met' if s['met']['memory'] else 'NOT met'}",
            f"playback: {s['segments']} segments ({s['segments_interrupted']} interrupted), "
            f"{s['lost_playback_events']} lost or told twice: {'met' if s['met']['playback'] else 'NOT met'}",
            f"requests {s['requests']}, failed {s['failed_requests']}: {'met' if s['met']['requests'] else 'NOT met'}; "
            f"push errors {s['push_errors']}, read errors {s['read_errors']}",
            f"slots repeated {s['repeated']} of {s['released']}, timestamp gaps {s['gaps']}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_keeping_server_log(measure, args, "soak-")
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
