"""The live service with the service tests' synthetic runtime in its engine core, as a process of its own.

``python -m tests.integrations.synthetic_service PORT TOKEN [AVATAR]``: the real front end, engine core process, output
worker, push WebSocket and WHEP, with frames made in milliseconds (``tests.streaming.synthetic_runtime``) instead of by
the networks, which take seconds a frame on a CPU. ``apps.serve`` has no option to take another runtime, so the tests
start it here, as the service's own tests do in process. The avatar ``anchor`` gives 128x128 frames; with ``AVATAR``
(``echo``: speaks what is pushed, markers included) it is that synthetic avatar.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from aiohttp import web

from serving.http import create_service_app
from serving.processes import ServiceOptions
from serving.service import Service

RUNTIME = "tests.streaming.synthetic_runtime:build"
REPO = Path(__file__).resolve().parents[2]


async def serve(port: int, token: str, anchor: str = "anchor") -> None:
    """Serve on 127.0.0.1:``port`` until SIGTERM or SIGINT, ``anchor`` being the synthetic avatar of that name."""
    service = Service(ServiceOptions(workers=1, runtime=RUNTIME, avatars={"anchor": anchor}))
    await service.start()
    runner = web.AppRunner(create_service_app(service, token=token, bound=("127.0.0.1", port)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"serving http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await service.close()


def start(
    command: list[str], url: str, env: dict[str, str], ready_s: float, headers: dict[str, str]
) -> subprocess.Popen:
    """Start a service process (this module, or ``apps.serve``) and wait until its session API answers."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-3000:]
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/sessions", headers=headers), timeout=1):
                return process
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError(f"{command} did not answer within {ready_s} s")


def stop(process: subprocess.Popen) -> None:
    """Stop a service process as Ctrl-C does (killed if it takes more than 20 s)."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4]))
