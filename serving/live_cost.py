"""What the output workers' streams cost as they run, against what their calibration said: admission's correction.

A stream's cost is calibrated once per size and preset on a picture that moves everywhere
(``streaming.encoders.cost``), the dearest case; an anchor's still studio around a speaking face costs x264 a
fraction of that. Each worker reports the CPU its process used per frame slot (``WorkerStats.cpu_ms_per_slot``);
over the last WINDOW seconds, that CPU over the calibrated costs of the streams it held is the share admission
multiplies every calibrated cost by, never below FLOOR. Until MIN_SPAN seconds of live streams are measured, the
calibration stands.
"""

from __future__ import annotations

from collections import deque

WINDOW = 30.0
"""Seconds of workers' reports the share is taken over."""
MIN_SPAN = 5.0
"""Seconds the reports must span before the share replaces the calibration."""
FLOOR = 0.5
"""The least share admission takes: streams measured while their avatars stand still cost x264 less than once they
speak (a speaking 1080p anchor used about half its calibrated cost), and the window may have seen only the former."""


class LiveCost:
    """The measured share of the calibrated output cost, from the workers' reports with streams live."""

    def __init__(self) -> None:
        self._reports: deque[tuple[float, float, float]] = deque()
        """(when, measured core ms per slot, calibrated core ms per slot of the streams the worker held)."""

    def add(self, now: float, measured_ms: float, calibrated_ms: float) -> None:
        """One worker's report at ``now`` (monotonic seconds): what its process used per slot, and what the
        calibration puts its live streams at (a worker with no stream live is not counted)."""
        if calibrated_ms > 0:
            self._reports.append((now, measured_ms, calibrated_ms))
        while self._reports and self._reports[0][0] < now - WINDOW:
            self._reports.popleft()

    def share(self, now: float) -> float | None:
        """Measured over calibrated over the window ending ``now`` (at least FLOOR); None while the reports span under
        MIN_SPAN seconds."""
        reports = [r for r in self._reports if r[0] >= now - WINDOW]
        if not reports or reports[-1][0] - reports[0][0] < MIN_SPAN:
            return None
        return max(FLOOR, sum(r[1] for r in reports) / sum(r[2] for r in reports))
