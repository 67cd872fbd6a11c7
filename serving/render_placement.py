"""Where a render job runs: its file on the least loaded output worker (a file is not live: no admission), its
session on the engine core; the calls ``serving.renders.Renders`` makes to start, ask and tell them."""

from __future__ import annotations

from typing import Any

from serving.api import ErrorKind, SessionError
from serving.output_budget import OutputBudget
from serving.processes import Processes
from serving.protocol import RemoveStream, ToWorker
from serving.renders import RenderJob, open_request, render_outputs


class RenderPlacement:
    """Starts render jobs on the service's processes and carries their requests and messages."""

    def __init__(self, processes: Processes, budget: OutputBudget) -> None:
        self._processes, self._budget = processes, budget

    async def open(self, job: RenderJob) -> None:
        """Start ``job``: its file on a worker, then its session on the core (the file is removed if that fails)."""
        if self._processes.failure is not None or self._processes.restarting is not None:
            raise SessionError(self._processes.unavailable(), ErrorKind.UNAVAILABLE)
        worker = self._budget.least_loaded(ErrorKind.UNAVAILABLE)
        job.worker = worker.index
        self.to_worker(job, render_outputs(job))
        try:
            await self._processes.core.request(open_request(job, worker.address))
        except BaseException:
            self.to_worker(job, RemoveStream(job.id))
            raise

    async def request(self, request: Any) -> Any:
        """A request to the engine core, answered (SessionError when refused)."""
        return await self._processes.core.request(request)

    def to_worker(self, job: RenderJob, message: ToWorker) -> None:
        """A message to the job's worker, once it has one."""
        if job.worker is not None:
            self._processes.send(job.worker, message, f"render {job.id}")
