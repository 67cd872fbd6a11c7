"""A trace of the live path for profiling: timed records of each process's work, as JSON lines, only when asked.

With ``DITTO_TRACE_DIR`` set in the environment (the benchmarks set it; the service's processes inherit it), each
process that traces writes ``NAME-PID.jsonl`` there: one object a line, with ``k`` (what it records) and ``t`` (the
host's monotonic clock, which every process on the host shares, so the files line up). Unset, a trace is off and
costs one attribute test a record. ``bench.common.trace`` reads the files back: where each tick's time goes on the host
and the GPU, and where each repeated picture was late (the GPU, the core's publisher, the output worker).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

TRACE_DIR = "DITTO_TRACE_DIR"
"""The environment variable naming the folder the traces are written to."""
FLUSH_SECONDS = 1.0
"""A trace's buffered lines reach its file at least this often (a process killed loses at most this much)."""


class Trace:
    """One process's trace file (``path``), or none (off): ``record`` appends a line, safe from any thread."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._flushed = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1 << 16)
            atexit.register(self.close)

    @property
    def on(self) -> bool:
        """Whether records are written (test it before building an expensive record)."""
        return self._file is not None

    def record(self, kind: str, t: float | None = None, **fields: Any) -> None:
        """Append a ``kind`` record at ``t`` (default: now, monotonic seconds) with ``fields`` (JSON values)."""
        if self._file is None:
            return
        line = json.dumps({"k": kind, "t": round(time.monotonic() if t is None else t, 6), **fields})
        with self._lock:
            if self._file is None:
                return
            self._file.write(line + "\n")
            now = time.monotonic()
            if now - self._flushed >= FLUSH_SECONDS:
                self._file.flush()
                self._flushed = now

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_traces: dict[tuple[str, str | None, int], Trace] = {}


def trace(name: str) -> Trace:
    """This process's trace called ``name``: on when ``DITTO_TRACE_DIR`` is set (one per name, folder and process)."""
    folder = os.environ.get(TRACE_DIR) or None
    key = (name, folder, os.getpid())
    if key not in _traces:
        _traces[key] = Trace(Path(folder) / f"{name}-{os.getpid()}.jsonl" if folder else None)
    return _traces[key]
