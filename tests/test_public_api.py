"""The public face: each public name has one public path, its ``__module__`` says which, and
``help(pyharvest)`` reads as a guide. An application needs no private module path."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import pydoc

import pytest

import pyharvest
import pyharvest.core
from pyharvest import Config, Delivery, GroupProtocol, PoisonPolicy
from pyharvest.core.telemetry import events as engine_events
from pyharvest.errors import ConfigError

# What help(pyharvest) lists under PACKAGE CONTENTS, besides pyharvest.core, .bindings and
# .plugins (separate source folders, inside the package only once installed from a wheel).
PUBLIC_MODULES = {"alembic", "django", "envconfig", "errors", "events", "inbox", "monitoring", "stasher", "testing",
                  "tracing", "verify"}
# The modules whose names an application imports (Django's needs Django configured).
FACADES = ["pyharvest", *(f"pyharvest.{m}" for m in sorted(PUBLIC_MODULES - {"django", "alembic", "testing"}))]


def exported(module_name: str) -> dict[str, object]:
    module = importlib.import_module(module_name)
    return {name: getattr(module, name) for name in module.__all__}


def test_every_event_a_harvester_emits_is_exported_by_pyharvest_events():
    # An event handler matches on these classes; each one a harvester emits must be importable.
    public = exported("pyharvest.events")
    for name in engine_events.__all__:
        assert public[name] is getattr(engine_events, name)


def test_each_public_name_has_one_public_path_and_says_so():
    homes: dict[int, str] = {}
    for module_name in FACADES:
        for name, value in exported(module_name).items():
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            assert value.__module__ == module_name, f"{module_name}.{name} says it lives in {value.__module__}"
            where = f"{module_name}.{name}"
            assert homes.setdefault(id(value), where) == where, f"{where} is also {homes[id(value)]}"
    assert not hasattr(pyharvest.core, "__all__"), "pyharvest.core is the engine, not a second public face"


def test_help_on_the_package_is_a_guide_not_the_module_tree():
    text = pydoc.render_doc(pyharvest, renderer=pydoc.plaintext)
    assert len(text.splitlines()) <= 600
    for module in ("pyharvest.stasher", "pyharvest.events", "pyharvest.errors", "pyharvest.inbox"):
        assert module in text
    assert "pyharvest.core." not in text.split("PACKAGE CONTENTS")[1]


def test_every_public_name_has_a_real_docstring():
    """help() on what an application uses says what it is: no bare alias, no inherited text."""
    from pyharvest import stasher

    public = [v for m in ("pyharvest", "pyharvest.events", "pyharvest.errors") for v in exported(m).values()]
    public = [v for v in public if inspect.isclass(v) or inspect.isfunction(v)]
    public += [stasher.stash, stasher.astash, stasher.Stasher]
    for thing in public:
        doc = thing.__doc__ or ""
        assert len(doc.split()) >= 4, f"{thing!r} has no docstring worth reading: {doc!r}"
        assert doc != type(thing).__doc__ and doc != object.__doc__, thing
    handler_doc = pyharvest.events.EventHandler.__doc__ or ""
    assert "Event" in handler_doc and "LeaderRevoked" in handler_doc
    assert "transaction" in (stasher.stash.__doc__ or "") and "InvalidRecordError" in (stasher.stash.__doc__ or "")


def test_the_choices_are_str_enums_that_take_the_yaml_strings():
    config = Config(delivery="exactly-once", poison_policy="quarantine", group_protocol="consumer").resolve()
    assert config.delivery is Delivery.EXACTLY_ONCE and config.delivery == "exactly-once"
    assert config.poison_policy is PoisonPolicy.QUARANTINE and config.group_protocol is GroupProtocol.CONSUMER
    assert Config(delivery=Delivery.EXACTLY_ONCE).resolve().to_mapping()["delivery"] == "exactly-once"
    assert f"{Delivery.AT_LEAST_ONCE}" == "at-least-once"
    with pytest.raises(ConfigError, match="delivery: expected one of at-least-once, exactly-once, got 'twice'"):
        Config(delivery="twice").resolve()


def test_any_function_of_an_event_is_an_event_handler():
    from pyharvest import Harvest
    from pyharvest.events import Event, EventHandler, LeaderAcquired, LeaderRevoked
    from tests.helpers.engine import make
    from tests.helpers.fakes import FakeBinding, FakeKafka
    from tests.helpers.waiting import wait_until

    by_function: list[object] = []
    seen: list[object] = []

    def on_event(event: Event) -> None:
        by_function.append(event)

    handler: EventHandler = on_event  # a plain function fits the protocol (mypy checks it)
    Harvest(Config(data_source="sqlite://"), on_event=handler).set_event_handler(seen.append)
    # Both kinds are called with the events: the function given at construction, then a bound
    # method set while running, in its place.
    db = FakeBinding()
    with Harvest(make(db, FakeKafka()).config, binding=db, kafka=FakeKafka(), on_event=handler) as h:
        wait_until(lambda: any(isinstance(e, LeaderAcquired) for e in by_function), what="the leader event")
        h.set_event_handler(seen.append)
    assert any(isinstance(e, LeaderRevoked) for e in seen)
    assert not any(isinstance(e, LeaderRevoked) for e in by_function)


def test_package_contents_are_the_public_modules_and_private_ones():
    names = {m.name for m in pkgutil.iter_modules(pyharvest.__path__)} - {"core", "bindings", "plugins"}
    assert {n for n in names if not n.startswith("_")} == PUBLIC_MODULES
    assert {"_cli", "_commands", "_demo", "_harvest", "__main__"} <= names
