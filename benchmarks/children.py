"""Commands that start this checkout's Python code in a child process, for the benchmarks and
the test suite.

The suite runs against the installed wheel, as a user's code would. A plain ``python -m`` or
``python -c`` child puts its working directory first on ``sys.path``; started from the
checkout, that directory's ``pyharvest/`` (the façade alone: ``core/``, ``bindings/`` and
``plugins/`` live beside it and only the build maps them in) would shadow the installed
package, and the child would fail to import ``pyharvest.core``. These commands start the child
with ``-P`` (nothing put in front) and a prelude that gives it the path ``python -m`` would,
with one difference: the checkout goes last, where ``tests.*`` and ``benchmarks.*`` are still
found but nothing installed is hidden. Under an editable install the same commands work
unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])

# argv: ['-c', ROOT, ...]: the prelude takes ROOT out, so the rest reads as a plain -c's argv.
_PRELUDE = (
    "import os, sys; _root = sys.argv.pop(1); "
    "sys.path[:] = [p for p in [os.getcwd(), *sys.path] if os.path.abspath(p or '.') != _root] + [_root]; "
)
_RUN_MODULE = "import runpy; sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module *args``, with the checkout last on the child's ``sys.path``."""
    return [sys.executable, "-P", "-c", _PRELUDE + _RUN_MODULE, ROOT, module, *args]


def python_code(code: str, *args: str) -> list[str]:
    """``python -c code *args``, with the checkout last on the child's ``sys.path``."""
    return [sys.executable, "-P", "-c", _PRELUDE + code, ROOT, *args]
