"""The suite tests what users install: under tox, the built wheel in site-packages, never the
checkout's folders (whose ``pyharvest/`` holds the façade alone)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from benchmarks.children import python_code

installed = pytest.mark.skipif(
    os.environ.get("PYHARVEST_TEST_INSTALLED") != "wheel",
    reason="not a tox run on the built wheel (PYHARVEST_TEST_INSTALLED=wheel): an editable install imports the checkout",
)
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


@installed
def test_the_suite_imports_the_installed_wheel() -> None:
    for name in ("pyharvest", "pyharvest.core", "pyharvest.bindings", "pyharvest.plugins.api"):
        module = importlib.import_module(name)
        assert Path(module.__file__).is_relative_to(SITE_PACKAGES), (name, module.__file__)


@installed
def test_a_child_started_from_the_checkout_imports_the_installed_wheel() -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(python_code("import pyharvest.core; print(pyharvest.core.__file__)"),
                          cwd=root, capture_output=True, text=True, check=True)
    assert Path(done.stdout.strip()).is_relative_to(SITE_PACKAGES), done.stdout
