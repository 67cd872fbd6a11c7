"""Hashing the checkpoint files a start checks (its compiled packages', its cached avatars'), in threads, while the
networks load.

Hashing the checkpoints the packages are compiled from is a measurable part of a start (the figure is in
bench/results/2026-12-02_h200_start_with_packages.json); file reads and sha256 release the GIL, so the hash overlaps
with building the networks instead of following it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from engine.plans.manifest import file_sha256

_ahead: dict[Path, tuple[tuple[int, int, int], Future[str]]] = {}
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def hash_ahead(paths: Iterable[str | Path]) -> None:
    """Start hashing ``paths`` in the background; a missing file is left for ``sha256_of`` to report."""
    global _pool
    for path in (Path(p).resolve() for p in paths):
        try:
            stamp = _stamp(path)
        except OSError:
            continue
        with _lock:
            if path not in _ahead:
                _pool = _pool or ThreadPoolExecutor(max_workers=2, thread_name_prefix="hash-ahead")
                _ahead[path] = (stamp, _pool.submit(file_sha256, path))


def sha256_of(path: str | Path) -> str:
    """``file_sha256(path)``: the hash ``hash_ahead`` started, when the file is unchanged since (size, mtime, inode)."""
    path = Path(path).resolve()
    with _lock:
        ahead = _ahead.pop(path, None)
    if ahead is not None and ahead[0] == _stamp(path):
        return ahead[1].result()
    return file_sha256(path)


def _stamp(path: Path) -> tuple[int, int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns, status.st_ino
