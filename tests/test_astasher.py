"""The async stasher on live databases through their async drivers (no pytest-asyncio:
each test runs its coroutine with ``asyncio.run``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest
import sqlalchemy as sa

from pyharvest import stasher
from pyharvest.bindings.sql import GOHARVEST, create_binding, create_outbox_table
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher import Stasher
from tests.helpers.fixtures.databases import selected_dialects
from tests.helpers.stash_counts import CountedText, counting

pytest.importorskip("greenlet", reason="SQLAlchemy's asyncio needs greenlet")
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine  # noqa: E402

# (dialect, async driver): each runs where its database and driver are available.
DRIVERS = [
    ("postgresql", "psycopg"),
    ("postgresql", "asyncpg"),
    ("sqlite", "aiosqlite"),
    ("mysql", "aiomysql"),
    ("mysql", "asyncmy"),
]


def aiomysql_cannot_send_bytes() -> bool:
    """aiomysql 0.3.2 calls PyMySQL's ``escape_bytes_prefixed``, which PyMySQL 1.2.3 turned
    into a placeholder string: every bytes parameter fails with "'str' object is not callable"
    (https://github.com/aio-libs/aiomysql/issues/1080, fix pending in aio-libs/aiomysql#1081)."""
    import pymysql.converters  # type: ignore[import-untyped]

    return isinstance(getattr(pymysql.converters, "escape_bytes_prefixed", None), str)


@pytest.fixture(params=[d for d in DRIVERS if d[0] in selected_dialects()], ids=lambda d: f"{d[0]}-{d[1]}")
def async_driver(request: pytest.FixtureRequest) -> tuple[str, str]:
    pytest.importorskip(request.param[1])
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def writes_bytes(async_driver: tuple[str, str], request: pytest.FixtureRequest) -> None:
    """For tests that send bytes (the native layout's values): a known driver bug is an
    expected failure, and a strict one, so that the fix is noticed."""
    if async_driver[1] == "aiomysql" and aiomysql_cannot_send_bytes():
        request.applymarker(
            pytest.mark.xfail(
                raises=TypeError, strict=True, reason="aiomysql 0.3.2 with PyMySQL >= 1.2.3: aiomysql#1080"
            )
        )


@pytest.fixture
def dialect(async_driver: tuple[str, str]) -> str:
    """Overrides the shared fixture: the dialect follows the async driver under test."""
    return async_driver[0]


@pytest.fixture
def outbox(database_url: str, table_name: str, async_driver: tuple[str, str]) -> Iterator[tuple[str, str, object]]:
    """(async URL, table, sync binding): write through the async driver, read back with the
    harvester's own (sync) binding."""
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    url = sa.make_url(database_url).set(drivername=f"{async_driver[0]}+{async_driver[1]}")
    yield url.render_as_string(hide_password=False), table_name, binding
    binding.dispose()


def run(url: str, body: Callable[[AsyncEngine], Awaitable[None]]) -> None:
    """Run ``body`` with an async engine, disposed on the same event loop."""

    async def main() -> None:
        engine = create_async_engine(url)
        try:
            await body(engine)
        finally:
            await engine.dispose()

    asyncio.run(main())


def read_back(binding) -> list[tuple[str, str, bytes | None, tuple[object, ...]]]:
    return [(r.topic, r.key, r.value, tuple(r.headers)) for r in binding.mark(str(uuid.uuid4()), 100)]


RECORDS = [
    OutboxRecord("t", "k1", b"\x00\xffbinary", [("h", "text"), ("b", b"\x00\x01")]),
    OutboxRecord("t", "k2", "text é", ()),
    OutboxRecord("t.other", "k3", None, [("only", "header")]),  # a tombstone
]
EXPECTED = [
    ("t", "k1", b"\x00\xffbinary", (("h", "text"), ("b", b"\x00\x01"))),
    ("t", "k2", "text é".encode(), ()),
    ("t.other", "k3", None, (("only", "header"),)),
]


def test_commit_makes_records_visible_and_they_round_trip(outbox, writes_bytes) -> None:
    url, table, binding = outbox

    async def body(engine: AsyncEngine) -> None:
        async with engine.begin() as tx:
            await stasher.astash(tx, RECORDS[0], table=table)
            prepared = await Stasher(table).aprepare(tx)
            await prepared.stash(RECORDS[1])
            assert await prepared.stash_many([RECORDS[2]]) == 1
            assert await prepared.stash_many([]) == 0

    run(url, body)
    assert read_back(binding) == EXPECTED


def test_async_session_and_stash_many(outbox, writes_bytes) -> None:
    url, table, binding = outbox

    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            assert await Stasher(table).astash_many(session, RECORDS) == 3

    run(url, body)
    assert read_back(binding) == EXPECTED


def test_rollback_leaves_none(outbox, writes_bytes) -> None:
    url, table, binding = outbox

    async def failing_transaction(engine: AsyncEngine) -> None:
        async with engine.begin() as tx:
            await (await Stasher(table).aprepare(tx)).stash_many(RECORDS)
            await stasher.astash(tx, RECORDS[0], table=table)
            raise RuntimeError("caller fails")

    async def body(engine: AsyncEngine) -> None:
        with pytest.raises(RuntimeError, match="caller fails"):
            await failing_transaction(engine)
        async with AsyncSession(engine) as session:
            await stasher.astash(session, RECORDS[0], table=table)
            await session.rollback()

    run(url, body)
    assert read_back(binding) == []


def test_invalid_records_are_refused_before_anything_is_written(outbox) -> None:
    url, table, binding = outbox

    async def body(engine: AsyncEngine) -> None:
        async with engine.begin() as tx:  # the caller catches the error and commits anyway
            prepared = await Stasher(table).aprepare(tx)
            with pytest.raises(InvalidRecordError, match="key"):
                await prepared.stash_many([RECORDS[0], OutboxRecord("t", "", b"v")])
            with pytest.raises(InvalidRecordError, match="topic"):
                renamed = OutboxRecord("t", "k", b"v")
                renamed.topic = "bad topic!"  # after it was built: the stash checks again
                await prepared.stash(renamed)
            with pytest.raises(InvalidRecordError, match="header"):
                await stasher.astash(tx, OutboxRecord("t", "k", b"v", [("h", 1)]), table=table)  # type: ignore[list-item]

    run(url, body)
    assert read_back(binding) == []


def test_goharvest_layout_is_recognised_through_the_async_driver(outbox, dialect: str, database_url: str) -> None:
    if dialect != "postgresql":
        pytest.skip("the goharvest layout is PostgreSQL's")
    url, _, _ = outbox
    table = f"{outbox[1]}_gh"  # dropped with the fixture's table (same prefix)
    create_outbox_table(database_url, table, layout=GOHARVEST)
    binding = create_binding(database_url, table)

    async def body(engine: AsyncEngine) -> None:
        async with engine.begin() as tx:
            prepared = await Stasher(table).aprepare(tx)
            assert prepared.outbox.layout == GOHARVEST
            await prepared.stash(OutboxRecord("t", "k", "text", [("a", b"utf8")]))
            with pytest.raises(InvalidRecordError, match="not UTF-8"):
                await prepared.stash(OutboxRecord("t", "k", b"\xff"))

    try:
        run(url, body)
        assert read_back(binding) == [("t", "k", b"text", (("a", "utf8"),))]
    finally:
        binding.dispose()


def test_wrong_kind_of_transaction_is_refused(tmp_path) -> None:
    pytest.importorskip("aiosqlite")
    url = f"sqlite:///{tmp_path / 'x.db'}"

    async def body(engine: AsyncEngine) -> None:
        async with engine.connect() as conn:
            with pytest.raises(TypeError, match="use astash"):
                stasher.stash(conn, RECORDS[0])  # type: ignore[arg-type]
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match="use astash"):
                stasher.stash(session, RECORDS[0])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="AsyncConnection or AsyncSession"):
            await Stasher().aprepare(object())  # type: ignore[arg-type]
        with pytest.raises(InvalidRecordError):  # validation comes before the connection
            await stasher.astash(object(), "not a record")  # type: ignore[arg-type]

    sync_engine = sa.create_engine(url)
    with sync_engine.connect() as conn:

        async def sync_given() -> None:
            with pytest.raises(TypeError, match="AsyncConnection or AsyncSession"):
                await stasher.astash(conn, RECORDS[0])  # type: ignore[arg-type]

        asyncio.run(sync_given())
    sync_engine.dispose()
    run("sqlite+aiosqlite:///" + str(tmp_path / "x.db"), body)


def test_limits_are_checked_before_anything_is_written(outbox) -> None:
    from pyharvest.errors import KeyTooLongError, RecordTooLargeError

    url, table, binding = outbox

    async def body(engine: AsyncEngine) -> None:
        for bad, error in [(OutboxRecord("t", "k" * 256, "v"), KeyTooLongError),
                           (OutboxRecord("t", "k", "v" * 2_000_000), RecordTooLargeError)]:
            with pytest.raises(error):
                async with engine.begin() as tx:
                    await stasher.astash(tx, bad, table=table)
            with pytest.raises(error):
                async with engine.begin() as tx:
                    await (await Stasher(table).aprepare(tx)).stash_many([OutboxRecord("t", "k", "v"), bad])

    run(url, body)
    assert read_back(binding) == []


def test_each_record_is_checked_once_and_the_plan_made_once(outbox, writes_bytes, monkeypatch) -> None:
    url, table, binding = outbox
    calls = {"checks": 0, "limits": 0, "plans": 0}
    counting(monkeypatch, calls)
    out = Stasher(table)
    records = [OutboxRecord("t", f"k{i}", CountedText("é" * 10), [("h", "v")]) for i in range(4)]

    async def body(engine: AsyncEngine) -> None:
        async with engine.begin() as tx:
            await out.astash(tx, records[0])
            assert await out.astash_many(tx, records[1:3]) == 2
            await (await out.aprepare(tx)).stash(records[3])
        async with AsyncSession(engine) as session, session.begin():
            assert await (await out.aprepare(session)).stash_many(records) == 4

    encodings = CountedText.encodings
    run(url, body)
    assert calls == {"checks": 8, "limits": 8, "plans": 1}
    assert CountedText.encodings - encodings == 8
    assert [r[2] for r in read_back(binding)] == [("é" * 10).encode()] * 8
