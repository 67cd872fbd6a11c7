"""What a service leaves behind, read from /proc: its private folder and the shared-memory rings its processes map."""

from __future__ import annotations

import re
from pathlib import Path

SERVICE_FOLDER = r"/tmp/(?:ditto-ray-\w+/)?ditto-svc-\w+"
"""A service's folder: in the temp folder, inside the local Ray cluster's own when the service runs in a replica."""


def service_files(pids: set[int]) -> set[str]:
    """The service folders named on the command lines of ``pids`` and the shared-memory rings they map."""
    found: set[str] = set()
    for pid in pids:
        try:
            found |= set(re.findall(SERVICE_FOLDER, Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")))
            found |= set(re.findall(r"/dev/shm/psm_\w+", Path(f"/proc/{pid}/maps").read_text()))
        except OSError:
            continue
    return found
