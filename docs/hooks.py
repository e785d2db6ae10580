"""MkDocs hooks (``hooks:`` in mkdocs.yml).

* ``on_config``: nav entries may be globs (``dialects/*.md``), expanded to the matching pages
  sorted by title, so pages added to a folder appear without editing mkdocs.yml;
* ``on_files``: checks that ``reference/configuration.md`` (stored, so that links to it work
  outside the site) is what ``docs/gen_config_reference.py`` generates from the config
  classes, so the reference cannot drift from the code;
* ``on_files`` and ``on_page_markdown``: the Grafana dashboard and the alerting rules live in
  the package (``pyharvest/monitoring/``, their one copy); the site publishes them as
  ``monitoring/<file>``, and a page's link to ``../pyharvest/monitoring/<file>`` (which works
  in the repository) is pointed there;
* the API reference (mkdocstrings) reads the sources through a temporary tree of symlinks
  laid out as the installed package: ``core/`` is ``pyharvest.core`` only through setuptools'
  package-dir mapping, which the static loader cannot follow.
"""

from __future__ import annotations

import atexit
import importlib.util
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# pyharvest.<sub> -> folder of the repository (pyproject.toml's package-dir)
PACKAGE_DIRS = {"core": "core", "bindings": "bindings", "plugins": "plugins"}
MONITORING = ROOT / "pyharvest" / "monitoring"
# A link that leaves docs/ for the package's monitoring files: one ../ more than the page's depth.
_MONITORING_LINK = re.compile(r"\]\(((?:\.\./)*)\.\./pyharvest/monitoring/")
_shadow: Path | None = None


def _source_tree() -> Path:
    """A folder holding ``pyharvest/`` as it is installed, made of symlinks to the sources."""
    global _shadow
    if _shadow is None:
        _shadow = Path(tempfile.mkdtemp(prefix="pyharvest-docs-"))
        atexit.register(shutil.rmtree, _shadow, True)
        package = _shadow / "pyharvest"
        package.mkdir()
        for entry in (ROOT / "pyharvest").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for sub, folder in PACKAGE_DIRS.items():
            (package / sub).symlink_to(ROOT / folder)
    return _shadow


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def _expand(items: list[Any], docs_dir: Path) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            out.append({k: _expand(v, docs_dir) if isinstance(v, list) else _glob_or(v, docs_dir)
                        for k, v in item.items()})
        elif isinstance(item, str) and "*" in item:
            pages = sorted(docs_dir.glob(item), key=lambda p: (p.stem == "writing-a-plugin", _title(p).lower()))
            out.extend({_title(p): p.relative_to(docs_dir).as_posix()} for p in pages)
        else:
            out.append(item)
    return out


def _glob_or(value: Any, docs_dir: Path) -> Any:
    if isinstance(value, str) and "*" in value:
        return _expand([value], docs_dir)
    return value


@event_priority(100)  # before mkdocstrings reads its handler options
def on_config(config: Any) -> Any:
    if config.get("nav"):
        config["nav"] = _expand(config["nav"], Path(config["docs_dir"]))
    mkdocstrings = config["plugins"].get("mkdocstrings")
    if mkdocstrings is not None:
        python = mkdocstrings.config["handlers"].setdefault("python", {})
        python["paths"] = [str(_source_tree())]
    return config


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    gen = _generator()
    problem = gen.stored_page_problem()
    if problem is not None:
        raise gen.DriftError(f"{problem}: run python docs/gen_config_reference.py --write")
    for name in ("pyharvest-alerts.yml", "pyharvest-dashboard.json"):
        files.append(File.generated(config, f"monitoring/{name}", abs_src_path=str(MONITORING / name)))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MONITORING_LINK.sub(lambda m: f"]({m.group(1)}monitoring/", markdown)
