"""What `pyharvest` and `pyharvest.core` export: an application needs no private module path."""

from __future__ import annotations

import pkgutil

import pytest

import pyharvest
import pyharvest.core
from pyharvest.core.telemetry import events


@pytest.mark.parametrize("package", [pyharvest, pyharvest.core], ids=lambda p: p.__name__)
def test_every_event_is_exported(package):
    # An event handler matches on these classes; each one a harvester emits must be importable.
    for name in events.__all__:
        assert name in package.__all__
        assert getattr(package, name) is getattr(events, name)


def test_every_public_name_has_a_real_docstring():
    """help() on what an application uses says what it is: no bare alias, no inherited text."""
    from pyharvest import stasher

    public = [getattr(pyharvest, name) for name in pyharvest.__all__ if name not in ("__version__", "Event")]
    public += [stasher.stash, stasher.astash, stasher.Stasher]
    for thing in public:
        doc = thing.__doc__ or ""
        assert len(doc.split()) >= 4, f"{thing!r} has no docstring worth reading: {doc!r}"
        assert doc != type(thing).__doc__ and doc != object.__doc__, thing
    assert "Event" in pyharvest.EventHandler.__doc__ and "LeaderRevoked" in pyharvest.EventHandler.__doc__
    assert "transaction" in stasher.stash.__doc__ and "InvalidRecordError" in stasher.stash.__doc__


def test_any_function_of_an_event_is_an_event_handler():
    from pyharvest import Config, Harvest

    seen: list[object] = []

    def on_event(event: pyharvest.Event) -> None:
        seen.append(event)

    handler: pyharvest.EventHandler = on_event  # a plain function fits the protocol (mypy checks it)
    Harvest(Config(data_source="sqlite://"), on_event=handler).set_event_handler(seen.append)


# What help(pyharvest) lists under PACKAGE CONTENTS, besides pyharvest.core, .bindings and
# .plugins (separate source folders, inside the package only once installed from a wheel).
PUBLIC_MODULES = {"alembic", "django", "envconfig", "inbox", "stasher", "testing", "tracing", "verify"}


def test_package_contents_are_the_public_modules_and_private_ones():
    names = {m.name for m in pkgutil.iter_modules(pyharvest.__path__)} - {"core", "bindings", "plugins"}
    assert {n for n in names if not n.startswith("_")} == PUBLIC_MODULES
    assert {"_cli", "_commands", "_demo", "_harvest", "__main__"} <= names
