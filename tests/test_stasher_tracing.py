"""``propagate_trace``: the current OpenTelemetry trace reaches the outbox row as W3C headers."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pyharvest import stasher, tracing
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher import Stasher

MINE = "00-11111111111111111111111111111111-2222222222222222-01"


@pytest.fixture
def tracer():
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider

    # A provider of our own: the global one can be set only once per process.
    return TracerProvider().get_tracer("pyharvest-tests")


@pytest.fixture
def sqlite(tmp_path) -> Iterator[tuple[str, str, sa.Engine, object]]:
    """(URL, table, engine, binding) on a SQLite file: the propagation is dialect-independent."""
    url, table = f"sqlite:///{tmp_path / 'outbox.db'}", "outbox"
    create_outbox_table(url, table)
    binding = create_binding(url, table)
    engine = sa.create_engine(url)
    yield url, table, engine, binding
    engine.dispose()
    binding.dispose()


def rows(binding) -> list[dict[str, str | bytes]]:
    """Each row's headers, keyed by name."""
    return [dict(r.headers) for r in binding.mark(str(uuid.uuid4()), 100)]


def traceparent_of(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_every_sync_form_adds_the_current_span(sqlite, tracer) -> None:
    _, table, engine, binding = sqlite
    traced = Stasher(table, propagate_trace=True)
    with tracer.start_as_current_span("request") as span, engine.begin() as tx:
        stasher.stash(tx, OutboxRecord("t", "module", b"v", [("own", "kept")]), table=table, propagate_trace=True)
        traced.stash(tx, OutboxRecord("t", "stasher", b"v"))
        traced.prepare(tx).stash(OutboxRecord("t", "prepared", b"v"))
        traced.stash_many(tx, [OutboxRecord("t", "many", b"v")] * 2)
        with traced.batch(tx) as out:
            out.stash(OutboxRecord("t", "batch", b"v"))
    got = rows(binding)
    assert got[0] == {"own": "kept", "traceparent": traceparent_of(span)}
    assert [h["traceparent"] for h in got] == [traceparent_of(span)] * 6


def test_off_by_default_and_outside_a_span(sqlite, tracer) -> None:
    _, table, engine, binding = sqlite
    with engine.begin() as tx:
        with tracer.start_as_current_span("request"):
            stasher.stash(tx, OutboxRecord("t", "default", b"v"), table=table)
            Stasher(table).stash_many(tx, [OutboxRecord("t", "default", b"v")])
        Stasher(table, propagate_trace=True).stash(tx, OutboxRecord("t", "no span", b"v"))
    assert rows(binding) == [{}, {}, {}]


def test_an_explicit_traceparent_wins_and_tracestate_comes_along(sqlite) -> None:
    pytest.importorskip("opentelemetry")
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    _, table, engine, binding = sqlite
    remote = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "value")]),
    )
    explicit = OutboxRecord("t", "explicit", b"v", [("TraceParent", MINE)])
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        with engine.begin() as tx:
            Stasher(table, propagate_trace=True).stash_many(tx, [explicit, OutboxRecord("t", "added", b"v")])
    finally:
        context.detach(token)
    assert rows(binding) == [
        {"TraceParent": MINE},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=value"},
    ]
    assert explicit.headers == [("TraceParent", MINE)]


def test_computed_once_per_stash_many_after_validation_without_touching_records(sqlite, tracer, monkeypatch) -> None:
    _, table, engine, binding = sqlite
    calls = []
    real = tracing.trace_headers

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tracing, "trace_headers", counting)
    records = [OutboxRecord("t", f"k{i}", b"v", [("n", str(i))]) for i in range(5)]
    with tracer.start_as_current_span("request"), engine.begin() as tx:
        prepared = Stasher(table, propagate_trace=True).prepare(tx)
        with pytest.raises(InvalidRecordError):
            prepared.stash_many([*records, OutboxRecord("t", "", b"v")])
        assert calls == []  # refused before any trace work, and nothing written
        assert prepared.stash_many(records) == 5
        assert calls == [1]
        prepared.stash_many([OutboxRecord("t", "explicit", b"v", [("traceparent", MINE)])])
        assert calls == [1]  # nobody needed it
    assert all(r.headers == [("n", str(i))] for i, r in enumerate(records))  # the caller's records unchanged
    got = rows(binding)
    assert len(got) == 6 and len({h["traceparent"] for h in got[:5]}) == 1 and got[5]["traceparent"] == MINE


def test_a_batch_record_carries_the_span_of_its_own_stash(sqlite, tracer) -> None:
    _, table, engine, binding = sqlite
    spans = []
    with engine.begin() as tx, Stasher(table, propagate_trace=True).batch(tx, flush_every=10) as out:
        for i in range(2):
            with tracer.start_as_current_span(f"item {i}") as span:
                out.stash(OutboxRecord("t", f"k{i}", b"v"))
                spans.append(traceparent_of(span))
    assert [h["traceparent"] for h in rows(binding)] == spans and spans[0] != spans[1]


def test_async_forms(sqlite, tracer) -> None:
    pytest.importorskip("aiosqlite")
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import create_async_engine

    url, table, _, binding = sqlite

    async def main() -> str:
        engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://", 1))
        try:
            with tracer.start_as_current_span("async request") as span:
                async with engine.begin() as tx:
                    await stasher.astash(tx, OutboxRecord("t", "module", b"v"), table=table, propagate_trace=True)
                    await Stasher(table, propagate_trace=True).astash(tx, OutboxRecord("t", "stasher", b"v"))
                    prepared = await Stasher(table, propagate_trace=True).aprepare(tx)
                    await prepared.stash(OutboxRecord("t", "prepared", b"v"))
                    await prepared.stash_many([OutboxRecord("t", "many", b"v")] * 2)
                    await stasher.astash(tx, OutboxRecord("t", "off", b"v"), table=table)
            return traceparent_of(span)
        finally:
            await engine.dispose()

    expected = asyncio.run(main())
    assert rows(binding) == [{"traceparent": expected}] * 5 + [{}]


def test_a_no_op_without_opentelemetry(sqlite, monkeypatch) -> None:
    _, table, engine, binding = sqlite
    monkeypatch.setattr(tracing, "_propagator", tracing._UNSET)  # forget that it was found
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes `import opentelemetry...` fail
    with engine.begin() as tx:
        stasher.stash(tx, OutboxRecord("t", "k", b"v", [("a", "b")]), table=table, propagate_trace=True)
        Stasher(table, propagate_trace=True).stash_many(tx, [OutboxRecord("t", "k", b"v")])
    assert not tracing.available()
    assert rows(binding) == [{"a": "b"}, {}]


def test_the_header_reaches_each_database(dialect: str, database_url: str, table_name: str, tracer) -> None:
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        with tracer.start_as_current_span("request") as span, engine.begin() as tx:
            Stasher(table_name, propagate_trace=True).stash_many(tx, [OutboxRecord("t", "k", b"v", [("x", b"\x00")])])
        assert rows(binding) == [{"x": b"\x00", "traceparent": traceparent_of(span)}]
    finally:
        engine.dispose()
        binding.dispose()
