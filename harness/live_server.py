"""``python -m apps.serve`` as a child process, watched from outside: readiness and figures through /metrics only.

The benchmarks measure the server as users run it, so they start the real command line and
read nothing but what any client can: the RTMP stream, the WebRTC preview and /metrics.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Metrics = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse_metrics(text: str) -> Metrics:
    """Prometheus text -> {sample name: {sorted label pairs: value}}."""
    parsed: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = float(sample.value)
    return parsed


def metric(metrics: Metrics, name: str, **labels: str) -> float | None:
    """One sample's value (None when the server does not export it)."""
    return metrics.get(name, {}).get(tuple(sorted(labels.items())))


def run_keeping_server_log(measure, args, prefix: str) -> dict:
    """``asyncio.run(measure(args, folder))`` in a temporary folder; the server's log there is kept beside
    ``args.out``."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            return asyncio.run(measure(args, Path(tmp)))
        finally:
            log = Path(tmp) / "serve.log"
            if log.exists():
                (args.out.parent / f"{args.out.stem}.serve.log").write_text(log.read_text(errors="replace"))


class LiveServer:
    """``python -m apps.serve ARGS`` in its own process group, its output in ``log``; ``token``: the one ARGS give it
    (``--token``), sent with every request; ``module``: another module taking apps.serve's command line
    (``harness.synthetic_serve``)."""

    def __init__(
        self, args: list[str], http_port: int, log: Path, token: str | None = None, module: str = "apps.serve"
    ) -> None:
        self.args, self.http_port, self.log, self.module = args, http_port, log, module
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> LiveServer:
        """Start the command (returns at once)."""
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        return self

    def fetch_metrics(self) -> Metrics | None:
        """/metrics now, or None when the server does not answer."""
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/metrics", headers=self.headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                return parse_metrics(response.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout: float) -> Metrics:
        """Wait until /metrics answers (the runtime is warm and the sessions are open); RuntimeError if the process
        dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"apps.serve exited with {self.process.returncode}:\n{self.log_tail()}")
            if (metrics := self.fetch_metrics()) is not None:
                return metrics
            time.sleep(0.5)
        raise TimeoutError(f"apps.serve did not answer /metrics within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of the server's output (without the HTTP access log)."""
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join([line for line in text if "aiohttp.access" not in line][-lines:])

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the server closes its sessions and sinks), then kill the group if it lingers; the exit code."""
        if self.process is None:
            return None
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        return process.returncode
