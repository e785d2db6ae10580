"""Django and Alembic are optional: only pyharvest.django and pyharvest.alembic import them."""

from __future__ import annotations

import subprocess

from benchmarks.children import python_code
from tests.helpers.layering import ROOT, offending


def test_only_the_integrations_import_django_or_alembic() -> None:
    def bad(path, module: str) -> bool:
        if not module.startswith(("django", "alembic")):
            return False
        relative = path.relative_to(ROOT).as_posix()
        return not (relative.startswith("pyharvest/django/") or relative == "pyharvest/alembic.py")

    for folder in ("core", "bindings", "plugins", "pyharvest"):
        assert offending(folder, bad) == []


def test_importing_pyharvest_loads_neither() -> None:
    code = (
        "import sys, pyharvest, pyharvest.stasher, pyharvest._cli, pyharvest._harvest, pyharvest.bindings.sql; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'alembic')))"
    )
    out = subprocess.run(python_code(code), capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
