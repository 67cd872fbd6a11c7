"""The runtime: one thread owns the GPU and serves every session, batching their work per tick.

Per tick the loop commits each session's queued audio (and idle silence for live sessions
running short), encodes every session's new HuBERT chunks in one batch, samples every due
LMDM window in bucket-sized batches, renders every due frame in bucket-sized warp+decode
calls (earliest deadline first), pastes each back into its avatar and hands the frames to
their sessions. A tick is one ``step``, shaped like an inference engine's: per stage, the
scheduler picks the due work across sessions, the executor runs it on the engine and the update
step hands the results back to the pipelines (``engine.runtime.scheduler``, ``.executor``,
``.update``). Every shape the GPU sees was compiled and captured during warm-up, so no
session's push, however odd its size, triggers a compile mid-stream. Sessions launch no GPU
work; their handles only queue audio and take frames.
"""

from __future__ import annotations

import gc
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from engine.audio.hubert import CHUNK_SAMPLES
from engine.avatar import Avatar
from engine.buckets import call_cost
from engine.controls import Controls
from engine.diffusion.graphed import BucketedSampler
from engine.engine import LIVE_OVERLAP, Engine
from engine.graph_pool import GraphPool
from engine.latency import LOW, LatencyMode, latency_mode
from engine.motion.conditions import ConditionBuilder
from engine.motion.stitching import stitch_posed
from engine.offline_motion import PrecomputedMotion, offline_motion, window_sampler
from engine.runtime import admission, memory, update
from engine.runtime.avatars import AvatarStore
from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import AdmissionError, SessionClosed
from engine.runtime.executor import Executor, PosedJob
from engine.runtime.metrics import TickTimes
from engine.runtime.pacing import Lead
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.scheduler import FrameJob, Scheduler
from engine.runtime.session import Session
from engine.runtime.slack import GpuQueue, Slack
from engine.timebase import DEFAULT_STEPS, FPS, HOP_FRAMES, OFFLINE_OVERLAP, SEQ_FRAMES
from engine.timing import gpu_time
from engine.trace import trace

log = logging.getLogger("ditto.runtime")
IDLE_WAIT = 0.004
TIMING_REPEATS = 3


class Runtime:
    """Owns the engine's GPU work; open sessions with ``open_session``; use as a context manager or call ``close``.

    ``start=False`` builds it without its loop thread: the caller runs each tick with ``step`` (and the
    calls that would wait for the loop run on the caller's thread). ``clock`` gives the time of each tick
    (monotonic seconds; a test's virtual clock), and the origin of the sessions' window grid.
    """

    def __init__(
        self,
        engine: Engine,
        config: RuntimeConfig | None = None,
        *,
        start: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.device = engine.device
        cuda = self.device.type == "cuda"
        self.config = self._sized(config or RuntimeConfig())
        self.batch_sessions = cuda if self.config.batch_sessions is None else self.config.batch_sessions
        if self.config.render_frames_per_tick is None:
            frames = 80 if cuda or self.batch_sessions else HOP_FRAMES
            self.config = replace(self.config, render_frames_per_tick=frames)
        self.enforce_admission = cuda if self.config.admission is None else self.config.admission
        self.clock = clock
        self.counters = {"ticks": 0, "oom_errors": 0, "loop_errors": 0, "captures_after_warmup": 0}
        self.scheduler = Scheduler(self.config, self.batch_sessions)
        self.executor = Executor(engine, engine.sampler(), self.config, self.counters)
        self.avatars = AvatarStore(self.device, engine.backend.dtype)
        self.window_ms: dict[int, float] = {}
        self.render_ms: dict[int, float] = {}
        self.hubert_ms: dict[int, float] = {}
        self._gpu = GpuQueue()
        self.warmup_seconds = 0.0
        self.warmup_memory: dict[str, memory.Reserve] = {}
        """The allocator's reserve after each warm-up step (a bucket captured and timed), and its peak so far (CUDA)."""
        self._pipelines: dict[int, SessionPipeline] = {}
        self._inbox: deque[tuple[Callable[[], Any], Future]] = deque()
        self._next_id = 0
        self._ids = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._trace = trace("core")
        self._times = TickTimes(cuda, self._trace)
        self._work: dict[str, list[int]] = {}
        """Rows of this tick's calls per stage, [live, jobs] (gathered only while tracing)."""
        self._captures = 0
        self._grid = clock() if self.batch_sessions else None
        self.warm_up()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="ditto-runtime", daemon=True)
            self._thread.start()

    def _sized(self, config: RuntimeConfig) -> RuntimeConfig:
        """``config`` with the buckets its sessions need, checked against the GPU memory free (before any is taken)."""
        free = memory.free_bytes(self.device)
        if free is None or self.engine.backend.name != "torch":
            return config.sized()
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else str(self.device)
        return memory.check(config, free, name, memory.expandable_segments())

    @classmethod
    def from_checkpoints(
        cls,
        checkpoints: str | Path | None = None,
        device: str | torch.device | None = None,
        backend: str = "torch",
        steps: int = DEFAULT_STEPS,
        plans: str | Path | None = None,
        config: RuntimeConfig | None = None,
        compile_networks: bool = True,
    ) -> Runtime:
        """Load the networks (official checkpoints, or random stand-ins when None), warm up, start the loop."""
        engine = Engine.from_checkpoints(
            checkpoints, device=device, backend=backend, steps=steps, plans=plans, compile_networks=compile_networks
        )
        return cls(engine, config)

    @property
    def sampler(self) -> BucketedSampler:
        """The batched LMDM sampler the executor runs (captured at warm-up)."""
        return self.executor.sampler

    @sampler.setter
    def sampler(self, sampler: BucketedSampler) -> None:
        self.executor.sampler = sampler

    # -- warm-up ----------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Compile and capture every bucket (CUDA), into one memory pool, largest first, and, for a runtime serving
        live sessions, time each: the live-session capacity and lead come from those times. The allocator's reserve
        left outside the pool is given back."""
        started = time.perf_counter()
        if self.device.type == "cuda":
            pool = GraphPool(self.device)
            steps = self.warmup_steps()
            with tqdm(
                steps, desc="warming up (compile + capture)", unit="bucket", disable=not self.config.progress
            ) as bar:
                for kind, bucket in bar:
                    bar.set_postfix_str(f"{kind} x{bucket}")
                    if kind == "LMDM windows":
                        self.sampler.capture((bucket,), pool)
                        if self.config.live:
                            self.window_ms[bucket] = self._time(lambda b=bucket: self._sample_dummy(b))
                    else:
                        if self.engine.backend.capabilities.render_graphs:
                            self.engine.backend.capture_render((bucket,), pool)
                        if self.config.live:
                            self.render_ms[bucket] = self._time(lambda b=bucket: self._render_dummy(b))
                    self.warmup_memory[f"{kind} x{bucket}"] = memory.reserve(self.device)
            if self.engine.hubert.graphs:
                self.engine.hubert.capture(pool=pool)
            self.engine.hubert.encode_batch(torch.zeros(1, CHUNK_SAMPLES))
            if self.config.live:
                for bucket in self.engine.hubert.buckets:
                    chunks = torch.zeros(bucket, CHUNK_SAMPLES)
                    self.hubert_ms[bucket] = self._time(lambda c=chunks: self.engine.hubert.encode_batch(c))
            self.warmup_memory["HuBERT chunks"] = memory.reserve(self.device)
            torch.cuda.empty_cache()
        self._captures = self._capture_count()
        self._times.anchor()
        self.warmup_seconds = time.perf_counter() - started
        gc.collect()
        gc.freeze()

    def warmup_steps(self) -> list[tuple[str, int]]:
        """The buckets warm-up captures and times on CUDA, in order: the render's largest first, then the LMDM's (the
        largest graph first takes the pool's memory, which every later one reuses)."""
        render = [("render frames", b) for b in sorted(self.config.render_buckets, reverse=True)]
        return render + [("LMDM windows", b) for b in sorted(self.config.window_buckets, reverse=True)]

    def capacity(self, overlap: int = LIVE_OVERLAP) -> int | None:
        """Live sessions this runtime can serve in real time at ``overlap`` (None where nothing was measured: the
        CPU)."""
        if not self.window_ms or not self.render_ms:
            return None
        compute = admission.capacity(overlap, self.window_ms, self.render_ms, self.config.utilization)
        return compute if self.config.sessions is None else min(compute, self.config.sessions)

    def lead(self, live_sessions: int) -> Lead:
        """How far ahead of their clocks live sessions keep their frames when ``live_sessions`` share this runtime:
        the GPU time of one hop of all of them (measured at warm-up; 0 on the CPU) plus ``min_lead_frames``."""
        compute = 0.0
        if self.window_ms and self.render_ms and live_sessions:
            compute = admission.hop_latency(live_sessions, self.window_ms, self.render_ms) / 1000 * FPS
        return Lead(compute, self.config.min_lead_frames)

    def _time(self, run: Callable[[], None]) -> float:
        """Median milliseconds of ``run`` on the GPU (its warm-up ran while capturing)."""
        return statistics.median(gpu_time(run, TIMING_REPEATS, warmup=0))

    def _sample_dummy(self, batch: int) -> None:
        frames, dim = self.sampler.shape
        dev = self.device
        self.sampler(
            torch.zeros(batch, frames, dim, device=dev),
            torch.zeros(batch, dim, device=dev),
            torch.zeros(batch, frames, self.engine.cond_width, device=dev),
            torch.zeros(self.engine.steps - 1, batch, frames, dim, device=dev),
        )

    def _render_dummy(self, batch: int) -> None:
        dt = self.engine.backend.dtype
        kp = torch.zeros(batch, 21, 3, device=self.device, dtype=dt)
        self.engine.backend.render(torch.zeros(batch, 32, 16, 64, 64, device=self.device, dtype=dt), kp, kp)

    def _capture_count(self) -> int:
        return len(self.sampler.buckets) + len(self.engine.hubert.buckets) + self.engine.backend.captures

    # -- sessions ---------------------------------------------------------------------------

    @property
    def default_controls(self) -> Controls:
        """The controls a session gets unless given others: the reference's defaults (see ``engine.controls``)."""
        return self.engine.default_controls

    def open_session(
        self,
        avatar: Avatar,
        live: bool = True,
        overlap: int | None = None,
        seed: int = 0,
        controls: Controls | None = None,
        motion: torch.Tensor | None = None,
        latency: str = "faithful",
    ) -> Session:
        """A new session speaking with ``avatar``: ``live`` paces it on a 25 fps clock and idles on silence;
        ``latency`` (``faithful`` or ``low``, see ``engine.latency``) sets its HuBERT hop, when its frames are released
        and its default ``overlap`` (75 faithful: a window per 200 ms hop; 77 low; 10 for offline renders);
        ``controls`` (default: the engine's, see ``engine.controls``) can be changed later through the session.

        ``motion`` (N,265), e.g. from ``offline_motion``: render these frames instead of sampling the
        pushed audio's (not live); push the same clip's audio, which the frames then carry. Its window
        controls (emotion, fix_kp_cond) are those it was computed with; the frame controls act as usual.
        """
        mode = latency_mode(latency)
        overlap = mode.overlap if overlap is None else overlap
        if not 0 <= overlap < SEQ_FRAMES:
            raise ValueError(f"overlap must be in [0, {SEQ_FRAMES}), got {overlap}")
        if motion is not None and live:
            raise ValueError(
                "a session fed precomputed motion renders a file, it cannot be live: open it with live=False"
            )
        if live and not self.config.live:
            raise ValueError(
                "this runtime renders files only (RuntimeConfig(live=False)): open the session with live=False"
            )
        controls = self.default_controls if controls is None else controls
        if not isinstance(controls, Controls):
            raise TypeError(f"controls must be an engine.controls.Controls, got {type(controls).__name__}")
        if self._stopping:
            raise SessionClosed("the runtime is closed")
        if live:
            self._admit(overlap, mode)
        with self._ids:
            session_id = self._next_id
            self._next_id += 1
        session = Session(session_id, avatar.name, live, overlap, seed, self.config, self._wake.set, controls, mode)

        def build() -> None:
            shared = self.avatars.acquire(avatar)
            try:
                pipeline = SessionPipeline(
                    session,
                    shared,
                    self.engine.backend.stitch,
                    self.engine.silence_feature,
                    self.engine.step_noise(seed),
                    self.engine.cond_width,
                    controls,
                    self.config,
                    None if motion is None else PrecomputedMotion(motion.to(shared.f_s.device, torch.float32)),
                )
            except BaseException:
                self.avatars.release(shared)
                raise
            pipeline.grid = self._grid
            self._pipelines[session_id] = pipeline

        self._call(build)
        return session

    def offline_motion(
        self,
        avatar: Avatar,
        samples: np.ndarray,
        overlap: int = OFFLINE_OVERLAP,
        seed: int = 0,
        controls: Controls | None = None,
    ) -> torch.Tensor:
        """The motion (N,265) of a whole 16 kHz mono clip as the reference's offline mode computes it, on the
        loop thread: HuBERT over the whole clip, then the windows one after another (each conditions the next),
        with the window controls (emotion, fix_kp_cond) of ``controls`` (default: the engine's).
        Render it with ``open_session(avatar, live=False, motion=...)``; other sessions wait meanwhile."""
        controls = self.default_controls if controls is None else controls

        def compute() -> torch.Tensor:
            shared = self.avatars.acquire(avatar)
            try:
                conditions = ConditionBuilder(
                    shared.canonical_kp,
                    shared.eye_open,
                    shared.eye_ball,
                    self.engine.cond_width,
                    controls.emotion_rows(self.device),
                )
                sample = window_sampler(self.sampler, self.engine.step_noise(seed), seed)
                return offline_motion(
                    self.engine.hubert,
                    conditions,
                    shared.source_motion,
                    samples,
                    overlap,
                    sample,
                    self.config.progress,
                    controls.fix_kp_cond,
                    controls.fix_kp_cond_dims,
                )
            finally:
                self.avatars.release(shared)

        return self._call(compute)

    def _admit(self, overlap: int, mode: LatencyMode) -> None:
        """Refuse a live session past those the runtime is sized for, or one the GPU cannot serve beside those open
        (their windows' rates as measured at warm-up)."""
        if not self.enforce_admission:
            return
        groups: dict[int, int] = {}
        for pipeline in self._pipelines.values():
            if pipeline.session.live:
                valid = SEQ_FRAMES - pipeline.session.overlap
                groups[valid] = groups.get(valid, 0) + 1
        live = sum(groups.values())
        if self.config.sessions is not None and live >= self.config.sessions:
            raise AdmissionError(
                f"this runtime is sized for {self.config.sessions} live session(s) (its buckets and GPU memory); "
                f"{live} are open: close one, or start the runtime for more sessions"
            )
        if not self.window_ms or not self.render_ms:
            return
        groups[SEQ_FRAMES - overlap] = groups.get(SEQ_FRAMES - overlap, 0) + 1
        if not admission.fits(groups, self.window_ms, self.render_ms, self.config.utilization):
            name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else str(self.device)
            raise AdmissionError(
                f"this runtime serves at most {self.capacity(overlap)} live session(s) in real time at overlap "
                f"{overlap} "
                f"({mode.name} latency) on {name} (measured at warm-up: {self.window_ms} ms per LMDM window batch, "
                f"{self.render_ms} ms per render batch); {live} are open: close one, use a longer hop (faithful "
                "latency, "
                f"a lower overlap), or serve it from another GPU's runtime"
            )

    def _call(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the loop thread (the only one that touches the GPU) and wait for its result;
        without a loop thread (``start=False``), on the caller's, which then drives the loop."""
        if self._thread is None:
            with torch.inference_mode():
                return work()
        if threading.current_thread() is self._thread:
            return work()
        if self._stopping:
            raise SessionClosed("the runtime is closed")
        future: Future = Future()
        self._inbox.append((work, future))
        self._wake.set()
        return future.result()

    def close(self) -> None:
        """Close every session, stop the loop; idempotent."""
        if self._stopping:
            return
        for pipeline in list(self._pipelines.values()):
            pipeline.session.close()
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        for pipeline in list(self._pipelines.values()):
            self._remove(pipeline)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Sessions, capacity, tick times (wall, the loop thread's CPU, GPU), GPU busy share, compiles after warm-up,
        errors,
        per-session totals. A tick whose wall time far exceeds its CPU time waited: for the GIL, or for the GPU."""
        pipelines = list(self._pipelines.values())
        totals: dict[str, float] = {}
        for pipeline in pipelines:
            for key, value in pipeline.session.counters.items():
                totals[key] = totals.get(key, 0) + value
        return {
            "sessions": len(pipelines),
            "live_sessions": sum(1 for p in pipelines if p.session.live),
            "capacity": self.capacity(),
            "capacity_low_latency": self.capacity(LOW.overlap),
            "avatars_loaded": len(self.avatars),
            "warmup_seconds": round(self.warmup_seconds, 2),
            **self._times.summary(),
            "gpu_busy": self._times.gpu_busy(),
            **self.counters,
            **totals,
        }

    # -- one tick ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one tick of work across all sessions on the caller's thread; True if anything was done.

        The loop thread calls this over and over; a runtime built with ``start=False`` has no loop thread,
        and its caller drives the ticks (tests, on their own ``clock``). A tick runs the calls waiting for
        the loop, takes each session's queued audio and commands, then plans, runs and hands back each
        stage in turn: HuBERT chunks, LMDM windows, frames (``Scheduler``, ``Executor``, ``update``).
        """
        with torch.inference_mode():
            worked = self._run_inbox()
            now = self.clock()
            started = self._times.begin()
            worked |= self._intake(now)
            pipelines = list(self._pipelines.values())
            start = self._gpu.start(now, self._times.gpu_idle())
            slack = self.scheduler.slack(pipelines, start, priced=bool(self.render_ms))
            work = self._tick_work(pipelines, now, start, slack)
            worked |= self._encode_features(pipelines, slack)
            worked |= self._sample_windows(pipelines, now, slack)
            for pipeline in pipelines:
                pipeline.finish_if_done()
            worked |= self._render(pipelines, slack)
            self._times.end(started, worked, work)
            for pipeline in update.settle(pipelines, self.clock()):
                self._remove(pipeline)
            if worked:
                self.counters["ticks"] += 1
            captures = self._capture_count() - self._captures
            if captures:
                self.counters["captures_after_warmup"] += captures
                self._captures += captures
            return worked

    def _tick_work(
        self, pipelines: list[SessionPipeline], now: float, start: float | None, slack: Slack
    ) -> dict[str, Any] | None:
        """What the trace records of this tick (None when off): sessions live and not, the slack and how far ahead
        the GPU's queue ran at its start; the stages' rows are added as their calls launch (``_note``)."""
        if not self._trace.on:
            return None
        self._work = {}
        live = sum(1 for p in pipelines if p.session.live)
        return {
            "live": live,
            "jobs": len(pipelines) - live,
            "slack": None if slack.whole else round(slack.ms, 2),
            "queued": None if start is None else round((start - now) * 1000, 2),
            "rows": self._work,
        }

    def _note(self, stage: str, batch: list, rows: Callable[[Any], int]) -> None:
        """Add a call's ``rows`` (per job of ``batch``) to this tick's trace record, as live or jobs'."""
        if self._trace.on:
            counts = self._work.setdefault(stage, [0, 0])
            for job in batch:
                counts[0 if job.pipeline.session.live else 1] += rows(job)

    def _run_inbox(self) -> bool:
        worked = False
        while self._inbox:
            work, future = self._inbox.popleft()
            worked = True
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)
        return worked

    def _intake(self, now: float) -> bool:
        """Every session's queued audio and commands, under the lead of the current load; closed sessions leave."""
        worked = False
        lead = self.lead(sum(1 for p in self._pipelines.values() if p.session.live))
        for pipeline in list(self._pipelines.values()):
            pipeline.lead = lead
            try:
                worked |= pipeline.intake(now)
            except Exception as exc:
                self._fail(pipeline, exc)
            if pipeline.closed:
                self._remove(pipeline)
        return worked

    def _encode_features(self, pipelines: list[SessionPipeline], slack: Slack) -> bool:
        """The HuBERT stage: every session's complete chunks encoded (a failed call fails its sessions)."""
        batches = self.scheduler.chunks(pipelines, slack, self.hubert_ms)
        for batch in batches:
            self._launched(sum(job.chunks.shape[0] for job in batch), self.hubert_ms)
            self._note("hubert", batch, lambda job: job.chunks.shape[0])
            try:
                features = self.executor.encode(batch)
            except Exception as exc:
                for job in batch:
                    self._fail(job.pipeline, exc)
                continue
            update.add_features(batch, features)
        return bool(batches)

    def _sample_windows(self, pipelines: list[SessionPipeline], now: float, slack: Slack) -> bool:
        """The LMDM stage: every due window sampled, in the scheduler's batches."""
        batches = self.scheduler.windows(pipelines, now, self.window_ms, slack)
        for batch in batches:
            self._launched(len(batch), self.window_ms)
            self._note("lmdm", batch, lambda job: 1)
            windows = self.executor.sample(batch)
            if windows is not None:
                update.complete_windows(batch, windows)
        return bool(batches)

    def _render(self, pipelines: list[SessionPipeline], slack: Slack) -> bool:
        """The render stage: the scheduler's frames posed per session (a failure fails only its session), stitched
        (one set of calls per batch), warped+decoded and pasted back, and delivered."""
        planned = self.scheduler.frames(pipelines, slack, self.render_ms)
        batches = [posed for batch in planned if (posed := self._pose(batch))]
        for batch in batches:
            self._launched(sum(job.rows.shape[0] for job in batch), self.render_ms)
            self._note("render", batch, lambda job: job.rows.shape[0])
            x_s, x_d = stitch_posed([job.posed for job in batch], self.engine.backend.stitch)
            rendered = self.executor.render(batch, x_s, x_d, self.render_ms)
            if rendered is not None:
                update.deliver_frames(batch, rendered)
        return bool(batches)

    def _launched(self, rows: int, costs: dict[int, float]) -> None:
        """A call of ``rows`` rows goes to the GPU: its measured cost joins the queue's (where it was measured)."""
        if costs and rows:
            self._gpu.launched(call_cost(rows, costs), self.clock())

    def _pose(self, batch: list[FrameJob]) -> list[PosedJob]:
        posed = []
        for job in batch:
            try:
                posed.append(PosedJob(job.pipeline, *job.pipeline.pose(job.count)))
            except Exception as exc:
                self._fail(job.pipeline, exc)
        return posed

    # -- the loop thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(
                    self.device.index if self.device.index is not None else torch.cuda.current_device()
                )
            while not self._stopping:
                if not self._tick():
                    self._wake.wait(IDLE_WAIT)
                    self._wake.clear()
        except BaseException as exc:
            log.exception("the runtime loop stopped")
            self._stopping = True
            for pipeline in list(self._pipelines.values()):
                self._fail(pipeline, exc)
            while self._inbox:
                self._inbox.popleft()[1].set_exception(SessionClosed(f"the runtime loop stopped: {exc}"))

    def _tick(self) -> bool:
        """The loop thread's tick: ``step``, a failure counted and logged so that the loop goes on."""
        try:
            return self.step()
        except Exception:
            self.counters["loop_errors"] += 1
            log.exception("runtime tick failed; the loop goes on")
            return False

    # -- bookkeeping ------------------------------------------------------------------------

    def _fail(self, pipeline: SessionPipeline, error: BaseException) -> None:
        log.error("session %d failed: %s", pipeline.session.id, error)
        pipeline.session.fail(error)
        self._remove(pipeline)

    def _remove(self, pipeline: SessionPipeline) -> None:
        if self._pipelines.pop(pipeline.session.id, None) is not None:
            self.avatars.release(pipeline.avatar)
