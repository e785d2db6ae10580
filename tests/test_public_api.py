"""What `pyharvest` and `pyharvest.core` export: an application needs no private module path."""

from __future__ import annotations

import pytest

import pyharvest
import pyharvest.core
from pyharvest.core import events


@pytest.mark.parametrize("package", [pyharvest, pyharvest.core], ids=lambda p: p.__name__)
def test_every_event_is_exported(package):
    # An event handler matches on these classes; each one a harvester emits must be importable.
    for name in events.__all__:
        assert name in package.__all__
        assert getattr(package, name) is getattr(events, name)
