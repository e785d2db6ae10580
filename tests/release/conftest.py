"""What a user installs, built and installed as a user would: the sdist, the wheel built from
that sdist, and fresh virtual environments outside the checkout (`tox -e release`)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.release import ROOT, Dist, Venv, run

# What a build copies: never the checkout's venvs, caches, brokers or earlier builds.
_NOT_SOURCES = shutil.ignore_patterns(
    ".*", "__pycache__", "*.egg-info", "build", "dist", "site", "*.db", "spark-warehouse", "metastore_db"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.release)



@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`python -m build` on a copy of the checkout: the sdist, then the wheel built from it."""
    source = tmp_path_factory.mktemp("source") / "pyharvest"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    out = tmp_path_factory.mktemp("dist")
    # setuptools warns that byte-compiling is disabled when PYTHONDONTWRITEBYTECODE is set (as
    # on some CI machines); a user's build does not set it, and the build must print no warning.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = run([sys.executable, "-m", "build", "--outdir", out, source], cwd=source, env=env)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel, done.stdout + done.stderr)



@pytest.fixture(scope="session")
def user_venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """The README's install, `pip install 'pyharvest[embedded]'`, from the built wheel."""
    env = Venv(tmp_path_factory.mktemp("user") / "venv")
    env.pip_install(f"{dist.wheel}[embedded]")
    yield env
