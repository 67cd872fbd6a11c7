"""``python -m apps.serve`` with the test suite's synthetic runtime in its engine core, for benchmarks of the service
itself on a CPU (``bench.soak``): ``python -m harness.synthetic_serve ARGS``, run from the repository's root.

The same command line and the same processes (front end, engine core, output workers), sockets and shared-memory rings;
only the frames are made in milliseconds by ``tests/streaming/synthetic_runtime.py`` (index bits, flashes, speech frames
per 40 ms pushed) instead of by the networks, which take seconds a frame on a CPU. ``apps.serve`` has no option for
another runtime; this module is how a benchmark gets one. The synthetic runtime admits 4 sessions: past that, start it
with ``--no-admission``. Every avatar name serves 128x128 frames.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys

from apps.serve import parse_args, server_options
from serving.server import serve

RUNTIME = "tests.streaming.synthetic_runtime:build"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.ray:
        print("error: harness.synthetic_serve runs the single server (apps.serve without --ray)", file=sys.stderr)
        return 2
    options = server_options(args)
    return asyncio.run(
        serve(dataclasses.replace(options, service=dataclasses.replace(options.service, runtime=RUNTIME)))
    )


if __name__ == "__main__":
    sys.exit(main())
