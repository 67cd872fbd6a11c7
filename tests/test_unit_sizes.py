"""The service's packages stay in small units: no function over MAX_FUNCTION lines, no class over MAX_CLASS."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("serving", "streaming", "cluster", "apps")
MAX_FUNCTION = 80
MAX_CLASS = 300


def oversized(folder: Path) -> list[str]:
    """Every function and class under ``folder`` past its limit, as "path:line name (N lines)"."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
                if lines > limit:
                    where = f"{path.relative_to(folder.parent)}:{node.lineno}"
                    found.append(f"{where} {node.name} ({lines} lines, limit {limit})")
    return found


def test_no_function_or_class_of_the_service_packages_is_past_its_limit() -> None:
    found = [unit for package in PACKAGES for unit in oversized(ROOT / package)]
    assert not found, "split these by job:\n" + "\n".join(found)


def test_the_check_finds_a_long_method_and_passes_one_at_the_limit(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION - 1))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text(f"class A:\n    def at_limit(self):\n{body}\n")
    assert oversized(tmp_path / "pkg") == []
    (tmp_path / "pkg" / "long.py").write_text(f"class B:\n    def past(self):\n{body}\n        y = 0\n")
    assert oversized(tmp_path / "pkg") == [f"pkg/long.py:2 past ({MAX_FUNCTION + 1} lines, limit {MAX_FUNCTION})"]
