"""scripts/test.sh: its arguments reach both pytest runs intact, and the second run collects the integrations alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import pytest_ignore_collect

ROOT = Path(__file__).resolve().parents[2]
# A stand-in python3: records its arguments (and DITTO_TESTS), makes a venv's bin/python as a copy of itself, answers
# "a virtual environment is active" and "torch is installed", and exits with $PYTEST_EXIT for the integrations run
# and $RUFF_EXIT for ruff.
STANDIN = """#!/bin/sh
printf "DITTO_TESTS=%s" "${DITTO_TESTS:-}" >> CALLS; printf "|%s" "$@" >> CALLS; echo >> CALLS
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" "$3/site"; cp "$0" "$3/bin/python"; exit 0; fi
case "$*" in *sysconfig*) mkdir -p site; echo "$PWD/site"; exit 0;; esac
if [ "$1 $2" = "-m pytest" ] && [ -n "${DITTO_TESTS:-}" ]; then exit "${PYTEST_EXIT:-0}"; fi
if [ "$1 $2" = "-m ruff" ]; then exit "${RUFF_EXIT:-0}"; fi
exit 0
"""


def run_test_script(tmp_path: Path, *args: str, pytest_exit: int = 0, ruff_exit: int = 0) -> tuple[int, list[str]]:
    """test.sh in a copy of scripts/ whose system-package step does nothing; its exit status and python3's calls."""
    (tmp_path / "scripts").mkdir(parents=True)
    for name in ("test.sh", "python_env.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "scripts" / "install_system_deps.sh").write_text("exit 0\n")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STANDIN.replace("CALLS", str(calls)))
    (bin_dir / "python3").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTEST_EXIT": str(pytest_exit),
        "RUFF_EXIT": str(ruff_exit),
    }
    run = subprocess.run(
        [shutil.which("bash"), str(tmp_path / "scripts" / "test.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return run.returncode, calls.read_text().splitlines()


def test_every_argument_reaches_both_runs_as_given(tmp_path: Path) -> None:
    args = ("-q", "-p", "no:cacheprovider", "-k", "push and not slow", "--timeout", "300", "-x")
    status, calls = run_test_script(tmp_path, *args)
    runs = [c for c in calls if "|-m|pytest|" in c]
    assert status == 0
    assert runs == [
        "|".join(("DITTO_TESTS=", "-m", "pytest", *args)),
        "|".join(("DITTO_TESTS=integrations", "-m", "pytest", *args)),
    ]


def test_the_integrations_environment_sees_the_first_ones_packages_and_installs_no_torch(tmp_path: Path) -> None:
    _, calls = run_test_script(tmp_path, "-q")
    assert (tmp_path / "site" / "ditto-main-environment.pth").read_text().strip() == str(tmp_path / "site")
    assert not any("--system-site-packages" in c for c in calls)
    assert [c for c in calls if "torch==" in c] == []


def test_an_integrations_run_that_collects_nothing_is_not_a_failure_but_a_failing_one_is(tmp_path: Path) -> None:
    assert run_test_script(tmp_path / "a", "tests/engine", pytest_exit=5)[0] == 0
    assert run_test_script(tmp_path / "b", pytest_exit=1)[0] == 1


def test_the_tree_is_linted_and_format_checked_and_a_finding_fails_the_run_after_the_tests(tmp_path: Path) -> None:
    status, calls = run_test_script(tmp_path / "a", "-q")
    assert status == 0
    assert ["DITTO_TESTS=|-m|ruff|check|.", "DITTO_TESTS=|-m|ruff|format|--check|."] == [
        c for c in calls if "ruff" in c
    ]
    status, calls = run_test_script(tmp_path / "b", "-q", ruff_exit=1)
    assert status == 1
    assert len([c for c in calls if "|-m|pytest|" in c]) == 2, "both test runs go on after a lint finding"


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("tests", None),
        ("tests/integrations", None),
        ("tests/integrations/test_pipecat_video.py", None),
        ("tests/engine", True),
        ("tests/scripts/test_test_script.py", True),
    ],
)
def test_the_integrations_run_collects_tests_integrations_alone(
    monkeypatch: pytest.MonkeyPatch, path: str, ignored: bool | None
) -> None:
    monkeypatch.setenv("DITTO_TESTS", "integrations")
    assert pytest_ignore_collect(ROOT / path) is ignored


def test_the_first_run_collects_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DITTO_TESTS", raising=False)
    assert pytest_ignore_collect(ROOT / "tests" / "engine") is None
