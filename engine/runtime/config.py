"""The runtime's settings, with defaults for live serving on one GPU."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.buckets import RENDER_BUCKETS, WINDOW_BUCKETS, sized
from engine.timebase import HOP_FRAMES


@dataclass(frozen=True)
class RuntimeConfig:
    """Bucket sizes, bounds and pacing; ``None`` fields take a device-dependent default at start."""

    sessions: int | None = None
    """Sessions the runtime is sized for: its buckets stop at the first that holds a window of each (LMDM) and a
    hop of frames of each (render), larger ones are neither loaded nor captured, and it admits no more live
    sessions. None: every bucket, as many sessions as the GPU serves."""
    window_buckets: tuple[int, ...] = WINDOW_BUCKETS
    render_buckets: tuple[int, ...] = RENDER_BUCKETS
    batch_sessions: bool | None = None
    """Run several sessions' HuBERT chunks, windows and frames in one call (CUDA default); on the CPU each
    session's work runs in calls of its own, so its results are bit-identical whoever shares the runtime."""
    max_lead_seconds: float = 5.0
    """Audio a session may hold ahead of the frames taken from it; more is refused (or waited for)."""
    max_queued_frames: int = 25
    """Frames rendered but not yet taken, per session; a live session drops its oldest beyond this."""
    min_lead_frames: float = 0.5
    """Margin (frames) by which a live session's frames are final before its clock shows them, on top of the GPU
    time of a hop at the current load (measured at warm-up): the slack for jitter in pushes and ticks. It adds to
    the latency of every utterance; see ``engine.runtime.pacing``."""
    hubert_chunks_per_tick: int = 16
    """HuBERT chunks (200 ms each) encoded per session per tick, so one long push cannot stall the others."""
    render_frames_per_tick: int | None = None
    """Frames rendered per tick across all sessions, earliest deadline first. None: 80 where sessions are batched (CUDA)
    and share it; a hop each on the CPU, where a frame takes seconds and the loop answers its callers (session opens,
    closes) only between ticks."""
    slack_reserve_ms: float = 10.0
    """While live sessions are open, the GPU time kept free before the earliest one's next window falls due: render
    jobs take the rest of the time until then, by the costs measured at warm-up, this much less for their error
    (``engine.runtime.slack``). It comes out of the lead's margin (``min_lead_frames``) if a job's calls overrun."""
    slack_chunks_per_tick: int = 2
    """While live sessions are open, HuBERT chunks a session not live encodes per tick, if they fit its slack (its
    windows run only in ticks without a live one, one at a time)."""
    audio_rate: int = 48_000
    """Rate of the audio each frame carries, resampled from the pushed PCM (sinks want 48 kHz)."""
    admission: bool | None = None
    """Refuse live sessions beyond the measured capacity (CUDA default; the CPU cannot serve in real time)."""
    utilization: float = 0.8
    """Share of each 200 ms hop that admission lets live sessions fill."""
    progress: bool = True
    """Show a progress bar while warming up."""
    live: bool = True
    """Serve live sessions: warm-up then times every bucket, for admission and the live sessions' lead. A runtime
    that only renders files (``False``) skips that timing (half a second of a file render's start) and refuses
    live sessions."""

    def sized(self) -> RuntimeConfig:
        """This config with its buckets cut to what ``sessions`` can fill (unchanged without ``sessions``)."""
        if self.sessions is None:
            return self
        if self.sessions < 1:
            raise ValueError(f"a runtime serves at least one session, got sessions={self.sessions}")
        return replace(
            self,
            window_buckets=sized(self.window_buckets, self.sessions),
            render_buckets=sized(self.render_buckets, self.sessions * HOP_FRAMES),
        )
