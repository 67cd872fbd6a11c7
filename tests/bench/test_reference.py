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
