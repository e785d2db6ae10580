"""External tools some tests drive for real (Prometheus' promtool and server, Chromium and its
WebDriver): ``make test`` installs them from Debian's packages (``.ci/tools``).

Outside CI a missing tool skips its tests with the command that installs it; under ``CI=true``
it fails them, so that a run that should have exercised the tool cannot pass without it.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

__all__ = ["free_port", "require_module", "require_tool"]


def _missing(what: str, install: str) -> None:
    message = f"{what} is not installed: {install} (make test does it through .ci/tools)"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def require_tool(command: str, package: str) -> str:
    """The path of ``command``, from Debian's ``package``; skips (fails in CI) without it."""
    path = shutil.which(command)
    if path is None:
        _missing(f"{command!r}", f"apt-get install {package}")
    assert path is not None
    return path


def require_module(module: str, pip_name: str) -> None:
    """Import ``module`` or skip (fail in CI): it comes with the ``test`` extra."""
    try:
        __import__(module)
    except ImportError:
        _missing(f"the Python module {module!r}", f"pip install {pip_name}")


def free_port() -> int:
    """A TCP port free on the loopback interface now, for a tool that cannot be told to pick
    one itself and report it (Prometheus' --web.listen-address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
