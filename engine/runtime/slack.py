"""The slack of a tick: the GPU time render jobs (sessions not live) may take without delaying a live session.

A live session needs the GPU again when its next window falls due (its clock within the lead of its first frame,
``engine.runtime.pacing``); the lead covers that hop's GPU work and a margin, assuming the GPU is free by then. So a
job may queue only as much work as ends, by the measured costs, ``reserve_ms`` before the earliest live session's next
window, counted from when the GPU finishes what is queued already (``GpuQueue``: the job's calls go right behind the
live sessions', without waiting for an idle GPU): nothing while a live session has frames or a window due, nothing
while a live clock is behind, and nothing while the GPU runs past what its queued calls should take. With no live
session open a job takes the whole loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from engine.buckets import call_cost


class LiveTimes(Protocol):
    """What the slack reads of a live session's pipeline."""

    def next_work_at(self) -> float:
        """When it next needs the GPU (``-inf``: it has work due now)."""
        ...


@dataclass
class Slack:
    """GPU milliseconds the sessions not live may still take in this tick (``math.inf``: no live session is open).

    ``priced``: the costs of the calls were measured (CUDA warm-up). Where nothing was (the CPU) the jobs beside live
    sessions get a least share instead: a window in a tick without a live one, a frame, a few chunks a tick.
    """

    ms: float
    priced: bool = True

    @property
    def whole(self) -> bool:
        """No live session is open: the jobs take the whole loop."""
        return math.isinf(self.ms)

    def take(self, cost: float) -> bool:
        """Spend ``cost`` ms if it fits in what is left; whether it did (always, unpriced)."""
        if not self.priced:
            return True
        if cost > self.ms:
            return False
        self.ms -= cost
        return True

    def frames(self, most: int, costs: dict[int, float]) -> int:
        """The most frames, up to ``most``, whose render call (``costs``: ms per bucket) fits, taking its cost; one
        unpriced."""
        if not self.priced:
            return min(most, 1)
        if self.ms <= 0:
            return 0
        for count in range(most, 0, -1):
            if self.take(call_cost(count, costs)):
                return count
        return 0


class GpuQueue:
    """When the GPU will have done the work queued so far, by the measured cost of each call launched."""

    def __init__(self) -> None:
        self.free_at = -math.inf

    def launched(self, ms: float, now: float) -> None:
        """A call of ``ms`` (measured) launched at ``now``: it runs after what is queued."""
        self.free_at = max(self.free_at, now) + ms / 1000

    def start(self, now: float, idle: bool) -> float | None:
        """When work launched ``now`` would start: now if the GPU is ``idle``; else when the queued calls end by their
        costs, if that is ahead; None where the GPU runs past that (the costs fell short: when it frees is unknown)."""
        if idle:
            self.free_at = now
            return now
        return self.free_at if self.free_at > now else None


def tick_slack(live: list[LiveTimes], start: float | None, reserve_ms: float, priced: bool) -> Slack:
    """The slack of a tick beside the ``live`` sessions whose work would start on the GPU at ``start``
    (``GpuQueue.start``; None: unknown, so no slack)."""
    if not live:
        return Slack(math.inf)
    if not priced:
        return Slack(0.0, priced=False)
    if start is None:
        return Slack(0.0)
    until = min(p.next_work_at() for p in live) - start
    return Slack(max(until * 1000 - reserve_ms, 0.0))
