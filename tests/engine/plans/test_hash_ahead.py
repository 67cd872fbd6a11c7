"""Checkpoint hashes started ahead, while the networks load, give what hashing them then would: a file changed in
between is hashed again, a missing one is reported when its hash is asked for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.plans.hash_ahead import hash_ahead, sha256_of
from engine.plans.manifest import file_sha256


def test_a_hash_started_ahead_is_the_files_sha256(tmp_path: Path) -> None:
    path = tmp_path / "lmdm.pth"
    path.write_bytes(os.urandom(3 << 20))
    hash_ahead([path])
    assert sha256_of(path) == file_sha256(path)
    assert sha256_of(path) == file_sha256(path), "asked again, it is hashed again"


def test_a_file_changed_after_its_hash_was_started_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "decoder.pth"
    path.write_bytes(b"the first weights")
    hash_ahead([path])
    path.write_bytes(b"other weights, longer")
    assert sha256_of(path) == file_sha256(path)


def test_a_missing_file_is_reported_when_its_hash_is_asked_for(tmp_path: Path) -> None:
    hash_ahead([tmp_path / "absent.pth"])
    with pytest.raises(FileNotFoundError):
        sha256_of(tmp_path / "absent.pth")
