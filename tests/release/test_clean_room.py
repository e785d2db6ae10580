"""The README's `pip install 'pyharvest[embedded]'`, from the built wheel into a fresh venv
outside the checkout: it imports, loads every dialect, types a user's script, and runs the demo."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers.release import Dist, Venv

HERE = Path(__file__).parent


def test_the_installed_package_imports_from_the_venv(user_venv: Venv) -> None:
    done = user_venv.run(
        "python", "-c",
        "import pyharvest, pyharvest.stasher, pyharvest.inbox, pyharvest.verify, pyharvest.testing; "
        "print(pyharvest.__file__); print(pyharvest.__version__)",
    )
    location, version = done.stdout.split()
    assert Path(location).is_relative_to(user_venv.path), location
    assert version


def test_every_dialect_entry_point_loads(user_venv: Venv) -> None:
    done = user_venv.run(
        "python", "-c",
        "from importlib.metadata import entry_points\n"
        "for ep in sorted(entry_points(group='pyharvest.dialects'), key=lambda e: e.name):\n"
        "    ep.load(); print(ep.name)",
    )
    assert done.stdout.split() == ["mssql", "mysql", "oracle", "postgresql", "sqlite"]


def test_reaper_prints_the_packages_version(user_venv: Venv, dist: Dist) -> None:
    version = user_venv.run("python", "-c", "import pyharvest; print(pyharvest.__version__)").stdout.strip()
    assert user_venv.run("reaper", "--version").stdout.strip() == f"reaper (pyharvest) {version}"
    assert dist.wheel.name.startswith(f"pyharvest-{version}-")


def test_reaper_monitoring_export_writes_the_dashboard_and_the_rules(user_venv: Venv) -> None:
    done = user_venv.run("reaper", "monitoring", "export", "monitoring")
    written = [Path(p) for p in done.stdout.split()]
    assert [p.name for p in written] == ["pyharvest-alerts.yml", "pyharvest-dashboard.json"], done.stdout
    checkout = Path(__file__).resolve().parents[2] / "pyharvest" / "monitoring"
    for path in written:
        assert (user_venv.cwd / path).read_bytes() == (checkout / path.name).read_bytes()
    # Where the installed files are, for a user who would rather point at them.
    located = user_venv.run("python", "-c", "from pyharvest.monitoring import path; print(path('pyharvest-alerts.yml'))")
    assert Path(located.stdout.strip()).is_relative_to(user_venv.path)


def test_the_demo_runs_on_the_embedded_default(user_venv: Venv) -> None:
    out = user_venv.run("reaper", "demo", "--records", "3000", timeout=300).stdout
    for line in ("records received  3000", "lost              0", "order per key     held", "verdict           OK"):
        assert line in out, out


def test_a_users_script_type_checks_against_the_installed_wheel(user_venv: Venv) -> None:
    user_venv.pip_install("mypy")
    for script in ("user_script.py", "user_mistake.py"):
        shutil.copy(HERE / script, user_venv.cwd / script)
    user_venv.run("mypy", "--strict", "--no-incremental", "user_script.py")
    mistake = user_venv.run("mypy", "--strict", "--no-incremental", "user_mistake.py", check=False)
    assert mistake.returncode == 1, mistake.stdout + mistake.stderr
    assert 'incompatible type "str"' in mistake.stdout and "OutboxRecord" in mistake.stdout, mistake.stdout
