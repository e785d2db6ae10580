"""Package discovery for the design card's layout (the rest of the build is in pyproject.toml).

The sources live in four top-level folders that install as one package: ``pyharvest/`` as
``pyharvest``, and ``core/``, ``bindings/`` and ``plugins/`` as ``pyharvest.core``,
``pyharvest.bindings`` and ``pyharvest.plugins``. Setuptools maps folders to packages
(``package_dir``) but does not find the subpackages under a mapped folder, and a hand-kept list
drifts: the 0.1.0 wheel shipped without three of them. So every folder with an ``__init__.py``
under each root is found here, at build time, and ``tests/release`` checks the built wheel.
"""

from setuptools import find_packages, setup

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


setup(package_dir=ROOTS, packages=discovered_packages())
