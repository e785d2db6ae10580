"""What a user installs, built and installed as a user would: the sdist, the wheel built from
that sdist, and fresh virtual environments outside the checkout (`tox -e release`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The four top-level folders and where each lands in the installed package.
LAYOUT = {"pyharvest": "pyharvest", "core": "pyharvest/core", "bindings": "pyharvest/bindings", "plugins": "pyharvest/plugins"}
# What a build copies: never the checkout's venvs, caches, brokers or earlier builds.
_NOT_SOURCES = shutil.ignore_patterns(
    ".*", "__pycache__", "*.egg-info", "build", "dist", "site", "*.db", "spark-warehouse", "metastore_db"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.release)


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    build_output: str


def run(cmd: list[str | os.PathLike[str]], *, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; fail the test with its output when it fails (unless ``check`` is off)."""
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


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


class Venv:
    """A fresh virtual environment outside the checkout, filled by this interpreter's pip."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cwd = path.parent  # never the checkout: nothing of it may be importable
        venv.EnvBuilder(with_pip=False).create(path)
        self.python = path / "bin" / "python"

    def pip_install(self, *requirements: str) -> None:
        run([sys.executable, "-m", "pip", "--python", self.python, "install", "--quiet", *requirements], cwd=self.cwd)

    def run(self, *args: str | os.PathLike[str], timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command of the venv's (``python``, ``reaper``, ...), as its user would type it."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return run(list(args), cwd=self.cwd, env=env, timeout=timeout, check=check)


@pytest.fixture(scope="session")
def user_venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """The README's install, `pip install 'pyharvest[embedded]'`, from the built wheel."""
    env = Venv(tmp_path_factory.mktemp("user") / "venv")
    env.pip_install(f"{dist.wheel}[embedded]")
    yield env
