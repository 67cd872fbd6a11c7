"""The live service with the service tests' synthetic runtime in its engine core, as a process of its own.

``python -m tests.integrations.synthetic_service PORT TOKEN``: the real front end, engine core process, output worker,
push WebSocket and WHEP, with frames made in milliseconds (``tests.streaming.synthetic_runtime``) instead of by the
networks, which take seconds a frame on a CPU. ``apps.serve`` has no option to take another runtime, so the tests
start it here, as the service's own tests do in process. The avatar ``anchor`` gives 128x128 frames.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from serving.http import create_service_app
from serving.service import Service, ServiceOptions

RUNTIME = "tests.streaming.synthetic_runtime:build"


async def serve(port: int, token: str) -> None:
    """Serve on 127.0.0.1:``port`` until SIGTERM or SIGINT."""
    service = Service(ServiceOptions(workers=1, runtime=RUNTIME, avatars={"anchor": "anchor"}))
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


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))
