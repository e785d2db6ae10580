"""The source tree's imports, read from the files (imports inside functions included): what
the layering tests check."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offending(folder: str, rule) -> list[str]:
    return [f"{p.relative_to(ROOT)}: {m}" for p in sources(folder) for m in sorted(imports(p)) if rule(p, m)]

