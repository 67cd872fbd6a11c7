"""The suite's registry: every module of ``bench`` with a ``main`` is a benchmark, described by its docstring's first
line.

Read from the sources (no imports), so listing the suite needs none of the benchmarks' dependencies.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent.parent


class Benchmark(NamedTuple):
    name: str
    """The module's name: ``python -m bench NAME`` or ``python -m bench.NAME`` runs it."""
    summary: str
    """What it measures: the first line of its docstring."""


def benchmarks() -> list[Benchmark]:
    """Every benchmark of the suite, by name."""
    found = []
    for module in pkgutil.iter_modules([str(BENCH)]):
        if module.ispkg or module.name.startswith("_"):
            continue
        tree = ast.parse((BENCH / f"{module.name}.py").read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            doc = ast.get_docstring(tree) or ""
            found.append(Benchmark(module.name, doc.strip().splitlines()[0] if doc.strip() else ""))
    return sorted(found)
