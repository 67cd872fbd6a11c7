"""The old commands still run the apps (``python -m engine.render``, ``streaming.serve``, ``avatars``), no library
package imports the apps (the layer sits on top), and the media library never imports the service built on it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("engine", "compile", "streaming", "serving", "avatars", "integrations", "cluster")


@pytest.mark.parametrize(
    "old, app", [("engine.render", "apps.render"), ("streaming.serve", "apps.serve"), ("avatars", "apps.avatars")]
)
def test_an_old_command_hands_over_to_its_app(old: str, app: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    run = subprocess.run(
        [sys.executable, "-m", old, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: python -m {app} "), run.stdout[:200]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_library_imports_the_apps() -> None:
    upward = {
        str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path) if name.split(".")[0] == "apps")
        for package in LIBRARIES
        for path in (ROOT / package).rglob("*.py")
    }
    assert {path: names for path, names in upward.items() if names} == {}
    assert any(path.startswith("engine/") for path in upward), "the walk found the engine's modules"


def test_the_media_library_never_imports_the_service() -> None:
    upward = {
        str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path) if name.split(".")[0] == "serving")
        for path in (ROOT / "streaming").rglob("*.py")
    }
    assert {path: names for path, names in upward.items() if names} == {}
    assert "streaming/output.py" in upward, "the walk found the media library's modules"
