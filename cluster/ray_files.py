"""A local Ray cluster's files in a folder of the service's own, removed when the service stops.

Ray keeps a cluster's session (its logs, Unix sockets and spilled objects) under /tmp/ray and leaves it there at
shutdown, and the processes it starts make temporary folders of their own (the dashboard's forkserver, each
replica's service). A local cluster started by ``python -m apps.serve --ray`` keeps all of it in one short folder,
``ditto-ray-XXXXXXXX`` in the temp folder: Ray's temp dir and the TMPDIR of every process the cluster starts, so
removing it at the stop leaves nothing of the cluster behind, even of a replica killed outright. It stays short:
Ray puts its sockets two folders below it, and a Unix socket's path holds at most 107 bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PREFIX = "ditto-ray-"
"""The start of the folder's name (eight random characters follow): short, for Ray's socket paths."""


class RayFiles:
    """The folder of one local Ray cluster's files, made now."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX))

    @property
    def logs(self) -> Path:
        """Where Ray writes the logs of its latest session here (its processes', Serve's, every replica's)."""
        return self.path / "session_latest" / "logs"

    def init(self, **options: Any) -> Any:
        """``ray.init(**options)`` starting a local cluster whose processes keep their files here; its answer (the
        context: the node's addresses, the dashboard's URL)."""
        import ray

        previous = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(self.path)  # inherited by the processes ray.init starts, and by theirs
        try:
            return ray.init(_temp_dir=str(self.path), **options)
        finally:
            if previous is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = previous

    def remove(self) -> None:
        """Remove the folder and everything in it (once the cluster has shut down)."""
        shutil.rmtree(self.path, ignore_errors=True)
