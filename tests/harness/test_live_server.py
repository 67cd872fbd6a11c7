"""A live benchmark keeps its server's log beside the results it was asked to write."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.live_server import run_keeping_server_log


def test_the_servers_log_is_kept_beside_the_results_file_even_when_the_measurement_fails(tmp_path: Path) -> None:
    async def measure(args: argparse.Namespace, folder: Path) -> dict:
        (folder / "serve.log").write_text("the engine core exited with code 1\n")
        raise RuntimeError("apps.serve exited with 1")

    args = argparse.Namespace(out=tmp_path / "glass_low.json")
    with pytest.raises(RuntimeError, match="exited with 1"):
        run_keeping_server_log(measure, args, "test-")
    assert (tmp_path / "glass_low.serve.log").read_text() == "the engine core exited with code 1\n"
