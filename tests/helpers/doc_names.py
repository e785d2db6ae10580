"""What the documentation and the comments name, read from the files: the paths the map
(``docs/architecture.md``) names, and the dotted references to pyharvest's modules anywhere,
each checked against the tree."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.layering import ROOT, module_names

MAP = ROOT / "docs" / "architecture.md"

_TOKEN = re.compile(r"`([^`\s]+)`")


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """(heading, block) for each table row and each paragraph (a list is one paragraph)."""
    heading, paragraph = "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            heading = line
        elif line.startswith("|") or not line.strip():
            if paragraph:
                yield heading, " ".join(paragraph)
                paragraph = []
            if line.startswith("|"):
                yield heading, line
        else:
            paragraph.append(line)


def _resolve(token: str, contexts: list[Path]) -> list[Path]:
    found = []
    for context in contexts:
        for base in (context, *context.parents):
            if not base.is_relative_to(ROOT):
                break
            if (base / token).exists():
                found.append(base / token)
    return found


def map_paths(text: str) -> tuple[set[Path], list[str]]:
    """The files and folders the map names, and the paths it names that are not there.

    The map writes a path whole (``core/telemetry/spans.py``) or from a folder named before it
    in the same table row or paragraph, or in the section's heading (``telemetry/`` ...
    ``events.py``), and a folder from the root or from such a folder; a path names each folder
    it runs through (``management/commands/reaper.py`` names ``management/``)."""
    named: set[Path] = set()
    missing: list[str] = []
    for heading, block in _blocks(text):
        contexts = [ROOT]
        for token in _TOKEN.findall(heading) + _TOKEN.findall(block):
            if not token.endswith((".py", "/")) or "<" in token or "*" in token:
                continue
            hits = _resolve(token.rstrip("/"), contexts)
            if not hits:
                missing.append(f"{token} (in: {block[:70]}...)")
            for hit in hits:
                folders = hit.parents[: token.rstrip("/").count("/")]
                named.update([hit, *folders])
                context = hit if hit.is_dir() else hit.parent
                if context not in contexts:
                    contexts.append(context)
    return named, missing


def unmapped_modules(exempt: tuple[str, ...] = ()) -> list[str]:
    """The modules of the four folders the map does not name (a package by its folder), but
    for those under the ``exempt`` folders."""
    named, _ = map_paths(MAP.read_text())
    return [
        str(path.relative_to(ROOT))
        for path in sorted(module_names().values())
        if not str(path.relative_to(ROOT)).startswith(exempt)
        and (path.parent if path.name == "__init__.py" else path) not in named
    ]


# A dotted reference to a module of the three installed folders, or to something in one.
_REFERENCE = re.compile(r"(?<![\w./-])pyharvest\.(?:core|bindings|plugins)(?:\.[A-Za-z_]\w*)+")
# A Sphinx role relative to the module it is written in (:mod:`.headers`).
_RELATIVE = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj):`~?(\.[\w.]+)`")


def _defined(path: Path) -> tuple[set[str], dict[str, set[str]]]:
    """The names a module defines or imports at any depth, and each class's own names."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, ast.ClassDef) and not node.bases:
            own = classes.setdefault(node.name, set())
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and inner is not node:
                    own.add(inner.name)
                elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    own.add(inner.id)
                elif isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                    own.add(inner.attr)
    return names, classes


def broken_reference(reference: str, modules: dict[str, Path]) -> str | None:
    """Why ``reference`` (``pyharvest.core.<package>.<module>.Name.attr``) names nothing, or None: its longest
    module prefix must define (or import) the next name, and a class of its own without
    bases, the name after that."""
    parts = reference.split(".")
    for end in range(len(parts), 1, -1):
        module = ".".join(parts[:end])
        if module not in modules:
            continue
        rest = parts[end:]
        if not rest or rest[0].startswith("__"):
            return None
        names, classes = _defined(modules[module])
        if rest[0] not in names:
            return f"{module} has no {rest[0]}"
        if len(rest) > 1 and rest[0] in classes and rest[1] not in classes[rest[0]]:
            return f"{module}.{rest[0]} has no {rest[1]}"
        return None
    return "no such module"


def broken_references(folders: tuple[str, ...], exempt: tuple[str, ...] = ()) -> list[str]:
    """Each reference in the sources and docs of ``folders`` (but the ``exempt`` ones) that
    names no module or no name in one, as ``file:line: reference: why``."""
    modules = module_names()
    by_path = {path: name for name, path in modules.items()}
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            relative = str(path.relative_to(ROOT))
            if path.suffix not in (".py", ".md") or "__pycache__" in path.parts or relative.startswith(exempt):
                continue
            name = by_path.get(path)
            package = None
            if name is not None:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for n, line in enumerate(path.read_text().splitlines(), 1):
                references = _REFERENCE.findall(line)
                if package is not None:
                    for relative_name in _RELATIVE.findall(line):
                        dots = len(relative_name) - len(relative_name.lstrip("."))
                        base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
                        references.append(f"{base}.{relative_name.lstrip('.')}")
                for reference in references:
                    why = broken_reference(reference.rstrip("."), modules)
                    if why:
                        found.append(f"{relative}:{n}: {reference}: {why}")
    return found
