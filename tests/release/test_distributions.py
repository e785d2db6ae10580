"""The sdist and the wheel hold everything of the design card's layout, and say what they are."""

from __future__ import annotations

import re
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from tests.helpers.release import LAYOUT, ROOT, Dist, relative_links, run, wheel_metadata


def source_packages() -> dict[str, str]:
    """Every folder with an ``__init__.py`` under the four roots: its dotted name, and its path
    inside the wheel."""
    found = {}
    for folder, target in LAYOUT.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).as_posix()
            path = target if rel == "." else f"{target}/{rel}"
            found[path.replace("/", ".")] = f"{path}/__init__.py"
    return found



def test_the_build_prints_no_warning(dist: Dist) -> None:
    warnings = [line for line in dist.build_output.splitlines() if re.search(r"warn", line, re.IGNORECASE)]
    assert not warnings, "\n".join(warnings)


def test_the_wheel_holds_every_package(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    missing = [package for package, init in source_packages().items() if init not in names]
    assert not missing, f"the wheel lacks these packages (an ImportError for users): {missing}"
    sources = {
        f"{LAYOUT[path.relative_to(ROOT).parts[0]]}/{Path(*path.relative_to(ROOT).parts[1:]).as_posix()}"
        for folder in LAYOUT for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts
    }
    assert not sources - names, f"the wheel lacks these modules: {sorted(sources - names)}"
    assert "pyharvest/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    # The Grafana dashboard and the alerting rules (reaper monitoring export), as in the checkout.
    with zipfile.ZipFile(dist.wheel) as whl:
        for name in ("pyharvest-alerts.yml", "pyharvest-dashboard.json"):
            shipped = whl.read(f"pyharvest/monitoring/{name}")
            assert shipped == (ROOT / "pyharvest" / "monitoring" / name).read_bytes(), name


def test_the_sdist_holds_the_sources_license_and_changelog(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for folder in LAYOUT:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert path.relative_to(ROOT).as_posix() in names, f"the sdist lacks {path.relative_to(ROOT)}"
    for document in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py", "pyharvest/py.typed"):
        assert document in names, f"the sdist lacks {document}"
    # The documentation the package index's description names, and the monitoring files.
    named = set(re.findall(r"`(docs/[\w-][^`\s]*|CHANGELOG\.md)`", wheel_metadata(dist).get_payload()))
    assert "docs/operations.md" in named
    for path in named:
        assert path.rstrip("/") in names, f"the description names {path}, which the sdist lacks"
    assert {"pyharvest/monitoring/pyharvest-alerts.yml", "pyharvest/monitoring/pyharvest-dashboard.json"} <= names


def test_twine_finds_the_distributions_fit_for_an_index(dist: Dist) -> None:
    done = run([sys.executable, "-m", "twine", "check", "--strict", dist.sdist, dist.wheel], cwd=dist.wheel.parent)
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_metadata_says_what_the_package_is(dist: Dist) -> None:
    meta = wheel_metadata(dist)
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "pyharvest" / "_version.py").read_text()).group(1)
    assert meta["Version"] == version
    assert dist.wheel.name == f"pyharvest-{version}-py3-none-any.whl"
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()
    assert meta.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(dist.wheel) as whl:
        assert f"pyharvest-{version}.dist-info/licenses/LICENSE" in whl.namelist()
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    oldest = int(requires.removeprefix(">=3."))
    listed = sorted(int(c.rsplit(".", 1)[1]) for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert listed and listed[0] == oldest, (requires, listed)
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# pyharvest")
    # README.md's relative docs/... links are dead on an index: the description has none.
    assert "docs/operations.md" in (ROOT / "README.md").read_text() and relative_links((ROOT / "README.md").read_text())
    assert not relative_links(meta.get_payload()), relative_links(meta.get_payload())
    # Only addresses that exist: the project has no public home page or tracker yet.
    assert meta.get_all("Project-URL") is None
    extras = set(meta.get_all("Provides-Extra"))
    assert {"postgresql", "mysql", "mssql", "oracle", "async", "spark", "django", "alembic", "metrics", "otel",
            "embedded"} <= extras


def test_the_changelog_describes_this_version(dist: Dist) -> None:
    version = wheel_metadata(dist)["Version"]
    assert re.search(rf"^## \[?{re.escape(version)}\]?", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)

