"""Stasher specifics beyond the conformance suite: batching, caching, argument checks."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from pyharvest import stasher as stasher_module
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.errors import ConfigError
from pyharvest.core.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher import Stasher, stash


@pytest.fixture
def outbox(database_url: str, table_name: str):  # type: ignore[no-untyped-def]
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(binding.engine.url)
    yield binding, engine, table_name
    binding.dispose()
    engine.dispose()


def test_batch_flushes_every_n_and_at_the_end(outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    with engine.begin() as tx, Stasher(table).batch(tx, flush_every=3) as out:
        for i in range(7):
            out.stash(OutboxRecord("b", f"k{i}", str(i)))
    assert [r.value for r in binding.mark(str(uuid.uuid4()), 10)] == [str(i).encode() for i in range(7)]


def test_batch_discards_on_error_and_validates_early(outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    with pytest.raises(RuntimeError):
        with engine.begin() as tx, Stasher(table).batch(tx) as out:
            out.stash(OutboxRecord("b", "k", b"1"))
            raise RuntimeError("caller fails")
    with engine.begin() as tx, Stasher(table).batch(tx) as out:
        with pytest.raises(InvalidRecordError):
            out.stash(OutboxRecord("b", "", b"1"))
    assert binding.mark(str(uuid.uuid4()), 10) == []


def test_statements_are_cached_per_dialect_and_table(outbox) -> None:  # type: ignore[no-untyped-def]
    _, engine, table = outbox
    with engine.begin() as tx:
        a = Stasher(table).prepare(tx)
        b = Stasher(table).prepare(tx)
        stash(tx, OutboxRecord("c", "k", b"1"), table=table)
    assert a._insert is b._insert


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="outboxTable"):
        Stasher("x; DROP TABLE y")
    with pytest.raises(ValueError, match="layout"):
        Stasher("outbox", layout="other")
    with pytest.raises(TypeError, match="Connection or Session"):
        Stasher("outbox").prepare(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError):
        stash(object(), "not a record")  # type: ignore[arg-type]
    assert stasher_module.__all__
