"""How a public module claims what it exports (as httpx's ``__init__`` does): each class and
function it lists says, in ``__module__``, the one public path to import it from, so that
``help()``, ``repr()`` of a class and tracebacks read as the API, not the private module
tree it is written in."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping

__all__ = ["publish"]


def publish(module: str, namespace: Mapping[str, object], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` on the classes and functions among ``names``."""
    for name in names:
        value = namespace[name]
        if inspect.isclass(value) or inspect.isfunction(value):
            value.__module__ = module
