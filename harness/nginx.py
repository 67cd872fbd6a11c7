"""nginx with the RTMP module on a free loopback port, from the system (Debian's packages) or from the carried bundle.

Used by the benchmarks (bench/) and by the streaming tests (tests/streaming/conftest.py).

``bench/glass_bundle.sh`` unpacks Debian's nginx, its RTMP module and the libraries nginx
links against into ``.carry/glass/root`` for machines where apt cannot run (the lent GPU);
:func:`find_nginx` prefers the system's and falls back to that bundle.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent.parent / ".carry" / "glass" / "root"
SYSTEM_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")
MODULE_IN_ROOT = Path("usr/lib/nginx/modules/ngx_rtmp_module.so")
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")


@dataclass(frozen=True)
class NginxInstall:
    """An nginx binary, its RTMP module and the environment it runs in."""

    binary: Path
    module: Path
    env: dict[str, str] = field(default_factory=dict)
    origin: str = "system"


def find_nginx(bundle: Path = BUNDLE) -> NginxInstall:
    """The system's nginx with libnginx-mod-rtmp, else the carried bundle; FileNotFoundError when neither is there."""
    binary = Path(shutil.which("nginx") or "/usr/sbin/nginx")
    if binary.exists() and SYSTEM_MODULE.exists():
        return NginxInstall(binary, SYSTEM_MODULE)
    if (bundle / "usr/sbin/nginx").exists() and (bundle / MODULE_IN_ROOT).exists():
        libraries = ":".join(str(bundle / d) for d in LIBRARY_DIRS)
        return NginxInstall(
            bundle / "usr/sbin/nginx", bundle / MODULE_IN_ROOT, {"LD_LIBRARY_PATH": libraries}, f"bundle {bundle}"
        )
    raise FileNotFoundError(
        "nginx with the RTMP module was not found: apt-get install nginx libnginx-mod-rtmp, "
        f"or run bench/glass_bundle.sh here and carry .carry/glass (looked in {bundle})"
    )


def free_port() -> int:
    """A TCP port nobody listens on right now (on 127.0.0.1)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, timeout: float = 10.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class NginxRtmp:
    """nginx-rtmp on 127.0.0.1 with a ``live`` application (publish and play from 127.0.0.1 only)."""

    def __init__(self, directory: Path, install: NginxInstall | None = None) -> None:
        self.directory = directory
        self.install = install or find_nginx()
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        (directory / "nginx.conf").write_text(
            f"""daemon off;
master_process on;
worker_processes 1;
error_log {directory}/logs/error.log info;
pid {directory}/nginx.pid;
load_module {self.install.module};
events {{ worker_connections 256; }}
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
        """The rtmp:// URL of stream ``name``."""
        return f"rtmp://127.0.0.1:{self.port}/live/{name}"

    def start(self) -> NginxRtmp:
        """Start the server and wait until it listens."""
        self.process = subprocess.Popen(
            [
                str(self.install.binary),
                "-p",
                str(self.directory),
                "-e",
                str(self.directory / "logs" / "error.log"),
                "-c",
                "nginx.conf",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **self.install.env},
        )
        try:
            wait_listening(self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"nginx did not start; see {self.directory / 'logs' / 'error.log'}") from None
        return self

    def stop(self) -> None:
        """Fast shutdown of the master (it takes its worker with it); its group is killed if it lingers."""
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

    def __enter__(self) -> NginxRtmp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
