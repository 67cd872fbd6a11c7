"""What the output workers encode in real time, and admission against it.

Each kind of stream (its size and x264 preset, or a LiveKit room of that size) is measured once by a worker: core
milliseconds per output frame. The budget is UTILIZATION of a core per live worker; the live streams' load is their
calibrated costs times the share of them they are measured to use (``serving.live_cost``). A session is admitted onto
the least loaded worker when its cost fits what is left (or admission is off).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from engine.timebase import FPS
from serving.api import ErrorKind, SessionError
from serving.live_cost import LiveCost
from serving.processes import Processes, WorkerProcess
from serving.protocol import CostMeasured, MeasureCost
from serving.sessions import ServedSession
from streaming.output_settings import OutputSettings

UTILIZATION = 0.8
"""Share of a core an output worker's encoders may fill (as the runtime admits against 0.8 of each hop)."""
FRAME_MS = 1000 / FPS
REFERENCE_STREAM = (1280, 720, OutputSettings().preset)
"""With no session live, the outputs' capacity is counted in streams of this size at the default preset (measured at
start)."""
COST_TIMEOUT = 60.0
"""Seconds a worker has to measure a stream's cost (about a second of one core at 1080p and the slowest preset)."""


class OutputBudget:
    """The costs measured, the live load against the workers' budget, and the worker a new session goes to."""

    def __init__(self, processes: Processes, live: Callable[[], list[ServedSession]], admission: bool) -> None:
        self._processes, self._live, self._admission = processes, live, admission
        self.costs: dict[tuple[int, int, str], float] = {}
        """Core milliseconds per output frame by (width, height, x264 preset or ROOM), each measured once by a
        worker."""
        self._measuring: dict[tuple[int, int, str], tuple[int, asyncio.Future]] = {}
        """Costs being measured: (the measuring worker, the future of its answer)."""
        self.live_cost = LiveCost()
        """What the workers' streams use of their calibrated costs, as they run."""

    def capacity(self) -> dict[str, int | None]:
        """Live sessions the service serves in real time: the device's (measured at the core's warm-up), the outputs'
        (as many streams as the workers' budget holds at the live ones' mean cost, or with none live, of
        REFERENCE_STREAM, each as the live streams measure it (``share``): fewer than are live when sessions opened
        without admission overload them), and the smaller, which is what it admits."""
        info = self._processes.core_info
        runtime = info.capacity if info is not None else None
        if self._processes.restarting is not None:
            runtime = 0
        costs = [s.cost_ms for s in self._live() if s.cost_ms]
        reference = sum(costs) / len(costs) if costs else self.costs.get(REFERENCE_STREAM)
        outputs = math.floor(self.budget_ms() / (reference * self.share()) + 1e-9) if reference else 0
        admitted = outputs if runtime is None else min(runtime, outputs)
        return {"runtime": runtime, "outputs": outputs, "admitted": admitted}

    def budget_ms(self) -> float:
        """Core milliseconds per frame the output workers encode in real time: UTILIZATION of a core each."""
        return UTILIZATION * FRAME_MS * len(self._processes.alive())

    def load_ms(self, worker: WorkerProcess | None = None) -> float:
        """What the live sessions' streams (of ``worker``, or all) cost a core per frame, as calibrated."""
        return sum(s.cost_ms for s in self._live() if worker is None or s.worker == worker.index)

    def share(self) -> float:
        """What the live streams use of their calibrated cost (``serving.live_cost``); 1 until it is measured."""
        share = self.live_cost.share(time.monotonic())
        return 1.0 if share is None else share

    def encoding(self) -> dict[str, Any]:
        """The outputs' budget and load (core milliseconds per frame), the measured share of the calibrated costs
        (None until measured) and every cost measured, as ``GET /sessions`` shows them."""
        share = self.live_cost.share(time.monotonic())
        return {
            "budget_ms": round(self.budget_ms(), 1),
            "live_ms": round(self.load_ms() * self.share(), 1),
            "measured_share": None if share is None else round(share, 3),
            "costs": {f"{w}x{h} {preset}": ms for (w, h, preset), ms in sorted(self.costs.items())},
        }

    async def cost_ms(self, width: int, height: int, preset: str) -> float:
        """What a ``width`` x ``height`` stream at x264 ``preset`` (``preset`` ROOM: a LiveKit room of that size) costs
        a core per frame: measured by a worker the first time it is asked for (about a second), then known."""
        key = (width, height, preset)
        if key in self.costs:
            return self.costs[key]
        if key not in self._measuring:
            worker = self.least_loaded(ErrorKind.ADMISSION)
            if not self._processes.send(worker.index, MeasureCost(width, height, preset), f"a {width}x{height} cost"):
                raise SessionError(f"output worker {worker.index} is not taking messages; retry", ErrorKind.INTERNAL)
            self._measuring[key] = (worker.index, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(self._measuring[key][1]), COST_TIMEOUT)
        except TimeoutError:
            self._measuring.pop(key, None)
            raise SessionError(
                f"measuring what a {width}x{height} {preset} stream costs took over {COST_TIMEOUT:.0f} s",
                ErrorKind.INTERNAL,
            ) from None

    def least_loaded(self, kind: ErrorKind) -> WorkerProcess:
        """The live worker with the least load; SessionError(``kind``) when none is running."""
        alive = self._processes.alive()
        if not alive:
            raise SessionError("no output worker is running (starting or being replaced); retry", kind)
        return min(alive, key=self.load_ms)

    def pick_worker(self, what: str, cost: float) -> WorkerProcess:
        """The least loaded worker, when the outputs' budget holds one more session's outputs (``what``, e.g. "1280x720
        veryfast stream") of ``cost`` (or admission is off)."""
        worker = self.least_loaded(ErrorKind.ADMISSION)
        share = self.share()
        load, budget = self.load_ms() * share, self.budget_ms()
        if self._admission and load + cost * share > budget:
            measured = "" if share == 1.0 else f" ({cost * share:.1f} as the live streams measure it)"
            raise SessionError(
                f"the outputs are full: a {what} costs {cost:.1f} ms of a core per frame{measured}, "
                f"and {len(self._live())} live session(s) take {load:.1f} of the {budget:.1f} ms that "
                f"{len(self._processes.alive())} output worker(s) encode in real time; end a session, choose a smaller "
                "output size or a faster preset, or start the service with more --output-workers (a core each)",
                ErrorKind.ADMISSION,
            )
        return worker

    def measured(self, message: CostMeasured) -> None:
        """A worker's answer to ``MeasureCost``: kept, and given to whoever waits for it."""
        key = (message.width, message.height, message.preset)
        if message.error is None:
            self.costs[key] = message.ms
        _, future = self._measuring.pop(key, (None, None))
        if future is None or future.done():
            return
        if message.error is None:
            future.set_result(message.ms)
        else:
            text = f"the output worker could not encode a {key[0]}x{key[1]} {key[2]} stream: {message.error}"
            future.set_exception(SessionError(text, ErrorKind.INTERNAL))

    def worker_lost(self, index: int, message: str) -> None:
        """Worker ``index`` died (``message`` says how): the costs it was measuring fail."""
        for key, (measuring, future) in list(self._measuring.items()):
            if measuring == index:
                del self._measuring[key]
                if not future.done():
                    future.set_exception(
                        SessionError(f"{message} while measuring a stream's cost; retry", ErrorKind.INTERNAL)
                    )
