"""Real servers for the streaming tests, started on 127.0.0.1 by the test and stopped by their own process ids."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")
INSTALL_HINT = "run scripts/install_system_deps.sh"


def free_port() -> int:
    """A TCP port nobody listens on right now (on 127.0.0.1)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class NginxRtmp:
    """Debian's nginx with the RTMP module, on a free loopback port; ``live`` application, publish and play from 127.0.0.1."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        (directory / "nginx.conf").write_text(
            f"""daemon off;
master_process on;
worker_processes 1;
error_log {directory}/logs/error.log info;
pid {directory}/nginx.pid;
load_module {RTMP_MODULE};
events {{ worker_connections 64; }}
rtmp {{
    server {{
        listen 127.0.0.1:{self.port};
        chunk_size 4096;
        application live {{
            live on;
            wait_key on;
            wait_video on;
            allow publish 127.0.0.1;
            deny publish all;
            allow play 127.0.0.1;
            deny play all;
        }}
    }}
}}
"""
        )

    def url(self, name: str = "test") -> str:
        return f"rtmp://127.0.0.1:{self.port}/live/{name}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [NGINX, "-p", str(self.directory), "-e", str(self.directory / "logs" / "error.log"), "-c", "nginx.conf"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_listening(self.port)

    def stop(self) -> None:
        """Fast shutdown of the master (it takes its worker with it); killed if it lingers."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


@pytest.fixture
def nginx_rtmp(tmp_path: Path) -> Iterator[NginxRtmp]:
    """A running nginx-rtmp, stopped after the test (also when it fails)."""
    if not Path(NGINX).exists() or not RTMP_MODULE.exists():
        pytest.skip(f"nginx with libnginx-mod-rtmp is not installed ({INSTALL_HINT})")
    server = NginxRtmp(tmp_path / "nginx")
    server.start()
    try:
        yield server
    finally:
        server.stop()
