"""Package discovery for the design card's layout (the rest of the build is in pyproject.toml).

The sources live in four top-level folders that install as one package: ``pyharvest/`` as
``pyharvest``, and ``core/``, ``bindings/`` and ``plugins/`` as ``pyharvest.core``,
``pyharvest.bindings`` and ``pyharvest.plugins``. Setuptools maps folders to packages
(``package_dir``) but does not find the subpackages under a mapped folder, and a hand-kept list
drifts: the 0.1.0 wheel shipped without three of them. So every folder with an ``__init__.py``
under each root is found here, at build time, and ``tests/release`` checks the built wheel.

The package index's description is README.md with its relative links (``docs/...``, dead on
an index) made absolute or plain: :func:`index_description`.
"""

import re
import tomllib
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent

ROOTS = {
    "pyharvest": "pyharvest",
    "pyharvest.core": "core",
    "pyharvest.bindings": "bindings",
    "pyharvest.plugins": "plugins",
}


def discovered_packages() -> list[str]:
    found = []
    for package, folder in ROOTS.items():
        found.append(package)
        found.extend(f"{package}.{sub}" for sub in find_packages(folder))
    return sorted(found)


# A Markdown link or image whose target has no scheme: a file of the repository, relative to it.
_RELATIVE_LINK = re.compile(r"(!?)\[([^\]]+)\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")

SOURCE_NOTE = (
    "> The `docs/...` and other paths named below are files of pyharvest's source distribution, which "
    "holds the documentation (`pip download --no-deps --no-binary pyharvest pyharvest`); "
    "`reaper --help` lists the commands, and `reaper monitoring export DIR` writes out the Grafana "
    "dashboard and the alerting rules."
)


def index_description(readme: str, repository: str | None) -> str:
    """README.md as the package index shows it, with no relative link (dead there).

    With a ``Repository`` address in ``[project.urls]``, each link points at the file on it
    (``<address>/blob/HEAD/<path>``, as GitHub, GitLab and Gitea serve a file); without one (as
    now: the project has no public address yet), a link becomes its text and the path of the
    file in the source distribution, and a note after the title says where those files are."""

    def absolute(match: re.Match[str]) -> str:
        image, text, target = match.groups()
        return f"{image}[{text}]({repository.rstrip('/')}/blob/HEAD/{target})"  # type: ignore[union-attr]

    def plain(match: re.Match[str]) -> str:
        _image, text, target = match.groups()
        path = target.split("#", 1)[0]
        if text.strip("`") in (path, path.rsplit("/", 1)[-1]):
            return f"`{path}`"
        # Inside parentheses already ("... shards ([operations](docs/operations.md))"): no second pair.
        before, after = match.string[: match.start()].rstrip()[-1:], match.string[match.end():].lstrip()[:1]
        inside = before in ("(", ",") and after in (")", ",")
        return f"{text}: `{path}`" if inside else f"{text} (`{path}`)"

    if repository:
        return _RELATIVE_LINK.sub(absolute, readme)
    title, _, rest = readme.partition("\n\n")
    return f"{title}\n\n{SOURCE_NOTE}\n\n{_RELATIVE_LINK.sub(plain, rest)}"


def long_description() -> str:
    urls = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["project"].get("urls", {})
    return index_description((HERE / "README.md").read_text(encoding="utf-8"), urls.get("Repository"))


# Run by the build backend (and `python setup.py`) as __main__; imported, it only defines.
if __name__ == "__main__":
    setup(
        package_dir=ROOTS,
        packages=discovered_packages(),
        long_description=long_description(),
        long_description_content_type="text/markdown",
    )
