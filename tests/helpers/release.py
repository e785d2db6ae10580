"""What the release tests build and install with: the distributions, fresh virtual
environments outside the checkout, and a command whose failure fails the test with its output."""

from __future__ import annotations

import email.message
import email.parser
import os
import re
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# The four top-level folders and where each lands in the installed package.
LAYOUT = {"pyharvest": "pyharvest", "core": "pyharvest/core", "bindings": "pyharvest/bindings", "plugins": "pyharvest/plugins"}


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



# A Markdown link or image, or an HTML href or src, to an address without a scheme (and not an
# anchor of the page): dead on a package index, where the page has no repository beside it.
_RELATIVE = re.compile(r"!?\[[^\]]*\]\((?![a-z][a-z0-9+.-]*:|#)[^)]*\)|(?:href|src)=[\"'](?![a-z][a-z0-9+.-]*:|#)[^\"']*")


def relative_links(markdown: str) -> list[str]:
    """The links of ``markdown`` that are relative to where it is served."""
    return _RELATIVE.findall(markdown)


def wheel_metadata(dist: Dist) -> email.message.Message:
    with zipfile.ZipFile(dist.wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(whl.read(name).decode())

