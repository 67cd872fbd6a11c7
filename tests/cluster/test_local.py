"""A local Ray cluster's files: removed when the service stops, kept (and said where) after a failure."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from cluster.local import RayCluster  # noqa: E402
from cluster.ray_files import RayFiles  # noqa: E402


def test_a_local_clusters_files_are_removed_at_the_stop_and_kept_after_a_failure(
    capsys: pytest.CaptureFixture,
) -> None:
    removed, kept = RayFiles(), RayFiles()
    try:
        RayCluster("local", removed).shutdown()
        RayCluster("local", kept).shutdown(failed=True)
        assert not removed.path.exists() and kept.path.is_dir()
        assert f"kept in {kept.path} (its logs: {kept.path}/session_latest/logs)" in capsys.readouterr().err
    finally:
        kept.remove()
