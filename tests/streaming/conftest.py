"""Real servers for the streaming tests, started on 127.0.0.1 by the test and stopped by their own process ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.nginx import NginxRtmp, find_nginx, free_port

__all__ = ["INSTALL_HINT", "NginxRtmp", "free_port"]
INSTALL_HINT = "run scripts/install_system_deps.sh"


@pytest.fixture
def nginx_rtmp(tmp_path: Path) -> Iterator[NginxRtmp]:
    """A running nginx-rtmp (Debian's nginx with libnginx-mod-rtmp), stopped after the test (also when it fails)."""
    try:
        install = find_nginx()
    except FileNotFoundError:
        pytest.skip(f"nginx with libnginx-mod-rtmp is not installed ({INSTALL_HINT})")
    server = NginxRtmp(tmp_path / "nginx", install).start()
    try:
        yield server
    finally:
        server.stop()
