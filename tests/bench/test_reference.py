"""bench.reference measures nothing without a reference checkout, and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import reference


def test_without_a_checkout_it_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("DITTO_REFERENCE_DIR", raising=False)
    assert reference.main([]) == 0
    assert "skipped, nothing measured: DITTO_REFERENCE_DIR is not set" in capsys.readouterr().err


def test_a_folder_that_is_not_a_checkout_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("DITTO_REFERENCE_DIR", str(tmp_path))
    assert reference.main([]) == 2
    assert "has no core/models/modules" in capsys.readouterr().err


def test_a_folder_inside_another_checkout_records_no_commit(tmp_path: Path) -> None:
    """A copied reference inside this project's checkout must not record the project's commit as its own."""
    import subprocess

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "project"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "reference").mkdir()
    assert reference.reference_checkout_version(tmp_path / "reference") == "unknown (not a git checkout)"
    assert reference.reference_checkout_version(tmp_path) == commit
