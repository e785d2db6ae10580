"""The stasher and its prepared stashers (sync and async): the insert into the caller's
transaction, through the stasher's plan for the connection's engine (:mod:`.plans`: the
statement, the limits, the checks and the encoding). The public surface is :mod:`pyharvest.stasher`."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import sqlalchemy as sa

from pyharvest.core.outbox.records import OutboxRecord, check_record
from pyharvest.plugins.api import GOHARVEST, NATIVE, OutboxTable, TableName, parse_table_name
from pyharvest.stasher import tables
from pyharvest.stasher.batch import BatchStasher
from pyharvest.stasher.errors import DEFAULT_MAX_RECORD_BYTES
from pyharvest.stasher.notify import anotify, wake_on_commit
from pyharvest.stasher.plans import StashPlan, trace_headers
from pyharvest.stasher.tables import TableShape, ashape_of, shape_of
from pyharvest.stasher.typed import CloudEvents, Typing, ValueSerializer

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session

    AsyncTx = AsyncConnection | AsyncSession | async_scoped_session[Any]

__all__ = ["AsyncPreparedStasher", "PreparedStasher", "Stasher", "astash", "stash"]


def _connection(tx: sa.Connection | Session) -> sa.Connection:
    if isinstance(tx, sa.Connection):
        return tx
    if type(tx).__module__.startswith("sqlalchemy.ext.asyncio"):
        # Calling an AsyncSession's connection() here would only make a coroutine.
        raise TypeError(f"{type(tx).__name__} is asynchronous: use astash / Stasher.aprepare")
    connection = getattr(tx, "connection", None)
    if connection is None:
        raise TypeError(f"stash needs a SQLAlchemy Connection or Session, got {type(tx).__name__}")
    conn: sa.Connection = connection()  # Session.connection(): the session's transaction
    return conn


async def _async_connection(tx: AsyncTx) -> AsyncConnection:
    # Imported here: the sync stasher must not need greenlet, which SQLAlchemy's asyncio does.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(tx, AsyncConnection):
        return tx
    if isinstance(tx, AsyncSession | async_scoped_session):
        return await tx.connection()  # the session's transaction, begun if need be
    raise TypeError(f"astash needs a SQLAlchemy AsyncConnection or AsyncSession, got {type(tx).__name__}")


C = TypeVar("C")


class _Prepared(Generic[C]):
    """What the sync and async prepared stashers share: a connection and the stasher's plan
    for its engine. Only the execute differs."""

    __slots__ = ("_conn", "_plan", "propagate_trace")

    def __init__(self, conn: C, plan: StashPlan, propagate_trace: bool = False) -> None:
        self._conn = conn
        self._plan = plan
        self.propagate_trace = propagate_trace

    @property
    def connection(self) -> C:
        """The connection (and so the transaction) this stasher writes on."""
        return self._conn

    @property
    def outbox(self) -> OutboxTable:
        return self._plan.outbox

    @property
    def _insert(self) -> sa.Insert:
        return self._plan.insert

    def encode(self, record: OutboxRecord) -> dict[str, Any]:
        """``record`` validated, traced and encoded into the insert's parameters (the trace
        current now: a batch's records each carry their own stash's)."""
        return self._plan.encode(record, OutboxTable.now(), trace_headers(self.propagate_trace))


class PreparedStasher(_Prepared[sa.Connection]):
    """Stashes records on one connection with one statement; see :meth:`Stasher.prepare`."""

    __slots__ = ()

    @property
    def bulk(self) -> bool:
        """Whether a large enough :meth:`stash_many` goes through the dialect's bulk writer."""
        return self._plan.writers is not None

    def stash(self, record: OutboxRecord) -> None:
        self._plan.execute(self._conn, self.encode(record))

    def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany (or the dialect's bulk writer,
        e.g. ``COPY``, for a large enough batch); return how many."""
        params = self._plan.encode_many(records, trace_headers(self.propagate_trace))
        self._plan.write(self._conn, params)
        return len(params)

    def write(self, params: list[dict[str, Any]]) -> None:
        """Insert encoded records (:meth:`encode`): through the dialect's bulk writer when the
        batch is large enough, else one executemany."""
        self._plan.write(self._conn, params)


class AsyncPreparedStasher(_Prepared["AsyncConnection"]):
    """:class:`PreparedStasher` for an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`;
    see :meth:`Stasher.aprepare`."""

    __slots__ = ()

    async def stash(self, record: OutboxRecord) -> None:
        await _aexecute(self._conn, self._plan, self.encode(record))

    async def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany; return how many."""
        params = self._plan.encode_many(records, trace_headers(self.propagate_trace))
        if params:
            await _aexecute(self._conn, self._plan, params)
        return len(params)


async def _aexecute(conn: AsyncConnection, plan: StashPlan, params: dict[str, Any] | list[dict[str, Any]]) -> None:
    try:
        await conn.execute(plan.insert, params)
    except sa.exc.DBAPIError as e:
        plan.raise_refused(e, conn.sync_engine)


async def _awake(conn: AsyncConnection, plan: StashPlan) -> None:
    if plan.notify is not None:
        await anotify(conn, plan.outbox.name, plan.notify)
    elif conn.sync_connection is not None:  # no notify statement: a datagram on commit, if configured
        wake_on_commit(conn.sync_connection, plan.outbox.name)


class Stasher:
    """Stashes records into one outbox table; cheap to create, safe to share between threads
    and event loops.

    ``propagate_trace=True`` adds the current OpenTelemetry trace's ``traceparent`` and
    ``tracestate`` headers to each record without a ``traceparent`` (after validation; a
    no-op without OpenTelemetry or outside a span).

    ``bulk=False`` keeps every write an ``INSERT`` (by default a large ``stash_many`` uses the
    dialect's bulk writer, such as PostgreSQL's ``COPY``, which SQLAlchemy's statement events
    do not see).

    Before anything is written, a record is refused (:class:`KeyTooLongError`) if its key is
    longer than the table's key column, and (:class:`RecordTooLargeError`) if its key, value and
    headers come to more than ``max_record_bytes`` (default: what the harvester's producer
    publishes at librdkafka's default ``message.max.bytes``, once it has added its own headers;
    a larger record would fail at publish and park its key; ``None``: no limit).
    A missing table raises :class:`OutboxTableMissingError`, saying how to create it.

    ``value_serializer`` (a confluent-kafka ``Serializer``: ``AvroSerializer``, ``JSONSerializer``,
    ``ProtobufSerializer``) turns each record's value into the framed bytes stored, with the
    record topic's ``SerializationContext``, before the record is checked: a value its schema
    refuses raises :class:`~pyharvest.stasher.SchemaMismatchError` and a registry that refuses
    the schema or cannot be reached :class:`~pyharvest.stasher.SchemaRegistryError`, and nothing
    is written. The harvester publishes the stored bytes as they are, never asking the registry.
    ``cloud_events`` (:class:`~pyharvest.stasher.CloudEvents`) adds the CloudEvents binary-mode
    headers. See docs/typed-messages.md.
    """

    def __init__(
        self,
        table: str | TableName = "outbox",
        *,
        layout: str | None = None,
        propagate_trace: bool = False,
        bulk: bool = True,
        max_record_bytes: int | None = DEFAULT_MAX_RECORD_BYTES,
        value_serializer: ValueSerializer | None = None,
        cloud_events: CloudEvents | None = None,
    ) -> None:
        self.table = parse_table_name(table)
        if layout is not None and layout not in (NATIVE, GOHARVEST):
            raise ValueError(f"unknown outbox layout {layout!r}; expected {NATIVE!r} or {GOHARVEST!r}")
        if max_record_bytes is not None and (
            isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int) or max_record_bytes < 1
        ):
            raise ValueError(f"max_record_bytes must be a positive number of bytes or None, got {max_record_bytes!r}")
        self.layout = layout
        self.propagate_trace = propagate_trace
        self.bulk = bulk
        self.max_record_bytes = max_record_bytes
        self.value_serializer = value_serializer
        self.cloud_events = cloud_events
        #: How a record's value becomes what is stored (None: stored as given).
        self._typing = Typing(value_serializer, cloud_events) if value_serializer or cloud_events else None
        # engine → this stasher's plan there; weak, so that a disposed engine does not linger.
        # Per engine, not per stasher: one stasher may serve several databases.
        self._plans: weakref.WeakKeyDictionary[sa.Engine, StashPlan] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return (
            f"Stasher(table={str(self.table)!r}, layout={self.layout!r}, "
            f"propagate_trace={self.propagate_trace!r}, bulk={self.bulk!r}, "
            f"max_record_bytes={self.max_record_bytes!r}"
            + (f", value_serializer={type(self.value_serializer).__name__}" if self.value_serializer else "")
            + (f", cloud_events={self.cloud_events!r}" if self.cloud_events else "")
            + ")"
        )

    def _plan(self, conn: sa.Connection) -> StashPlan:
        """This stasher's plan for ``conn``'s engine, made on first use there (and again when
        the table's shape was forgotten): the look-ups of one stash happen once per engine."""
        engine = conn.engine
        plan = self._plans.get(engine)
        if plan is None or plan.stale:
            made_after = tables.forgotten
            plan = self._make_plan(conn.dialect, shape_of(conn, self.table), made_after)
            self._plans[engine] = plan
        return plan

    async def _aplan(self, conn: AsyncConnection) -> StashPlan:
        # The same plans as the sync path's: an AsyncEngine wraps a sync Engine.
        engine = conn.sync_engine
        plan = self._plans.get(engine)
        if plan is None or plan.stale:
            made_after = tables.forgotten
            plan = self._make_plan(conn.dialect, await ashape_of(conn, self.table), made_after)
            self._plans[engine] = plan
        return plan

    def _make_plan(self, dialect: sa.Dialect, shape: TableShape, made_after: int) -> StashPlan:
        return StashPlan.make(
            dialect, shape, self.table, self.layout, self.bulk, self.max_record_bytes, made_after, self._typing
        )

    def prepare(self, tx: sa.Connection | Session) -> PreparedStasher:
        """A stasher bound to ``tx``'s connection (and so to its transaction)."""
        conn = _connection(tx)
        plan = self._plan(conn)
        plan.wake(conn)  # PostgreSQL: NOTIFY on commit, now and then
        return PreparedStasher(conn, plan, self.propagate_trace)

    async def aprepare(self, tx: AsyncTx) -> AsyncPreparedStasher:
        """:meth:`prepare` for an ``AsyncConnection`` or ``AsyncSession``."""
        conn = await _async_connection(tx)
        plan = await self._aplan(conn)
        await _awake(conn, plan)
        return AsyncPreparedStasher(conn, plan, self.propagate_trace)

    def batch(self, tx: sa.Connection | Session, flush_every: int = 100) -> BatchStasher:
        """A buffering writer: records reach the database in batches of ``flush_every``, and
        the rest before the transaction commits, takes a savepoint or runs any other statement,
        so always inside ``tx``'s transaction and always visible to its queries::

            with engine.begin() as tx, Stasher("outbox").batch(tx) as out:
                for r in records:
                    out.stash(r)
        """
        if flush_every < 1:
            raise ValueError("flush_every must be at least 1")
        return BatchStasher(self.prepare(tx), flush_every)

    def stash(self, tx: sa.Connection | Session, record: OutboxRecord) -> None:
        if self._typing is not None:
            record = self._typing.apply(record)  # serialised first: what is checked is what is stored
        size, value = check_record(record)  # before touching the connection at all
        conn = _connection(tx)
        plan = self._plan(conn)
        params = plan.encode_checked(record, size, value, OutboxTable.now(), trace_headers(self.propagate_trace))
        plan.wake(conn)  # once the record passed: a refused one sends nothing
        plan.execute(conn, params)

    def stash_many(self, tx: sa.Connection | Session, records: Iterable[OutboxRecord]) -> int:
        conn = _connection(tx)
        plan = self._plan(conn)
        params = plan.encode_many(records, trace_headers(self.propagate_trace))
        plan.wake(conn)
        plan.write(conn, params)
        return len(params)

    async def astash(self, tx: AsyncTx, record: OutboxRecord) -> None:
        if self._typing is not None:
            record = self._typing.apply(record)
        size, value = check_record(record)  # before touching the connection (or beginning a session's transaction)
        conn = await _async_connection(tx)
        plan = await self._aplan(conn)
        params = plan.encode_checked(record, size, value, OutboxTable.now(), trace_headers(self.propagate_trace))
        await _awake(conn, plan)
        await _aexecute(conn, plan, params)

    async def astash_many(self, tx: AsyncTx, records: Iterable[OutboxRecord]) -> int:
        conn = await _async_connection(tx)
        plan = await self._aplan(conn)
        params = plan.encode_many(records, trace_headers(self.propagate_trace))
        await _awake(conn, plan)
        if params:
            await _aexecute(conn, plan, params)
        return len(params)


# One shared Stasher per (table, propagate_trace) for the module-level functions.
_default_stashers: dict[tuple[str, bool], Stasher] = {}


def _default_stasher(table: str, propagate_trace: bool) -> Stasher:
    key = (table, propagate_trace)
    stasher = _default_stashers.get(key)
    if stasher is None:
        stasher = _default_stashers[key] = Stasher(table, propagate_trace=propagate_trace)
    return stasher


def stash(
    tx: sa.Connection | Session, record: OutboxRecord, table: str = "outbox", *, propagate_trace: bool = False
) -> None:
    """Write ``record`` into the outbox ``table`` within ``tx``'s transaction.

    ``tx`` is the SQLAlchemy ``Connection`` or ORM ``Session`` of the service's own change:
    the record commits with it or not at all, and the harvester publishes it after the commit,
    in order with the other records of its key. Nothing is committed here.

    The record is checked before anything is written; :class:`~pyharvest.errors.InvalidRecordError`
    (or its subclasses :class:`KeyTooLongError` and :class:`RecordTooLargeError`, over
    :data:`DEFAULT_MAX_RECORD_BYTES`) says which field is wrong, and
    :class:`OutboxTableMissingError` how to create a missing table. ``propagate_trace=True``
    adds the current OpenTelemetry trace's headers. For many records, or another size limit,
    use a :class:`Stasher`.

    >>> with engine.begin() as tx:                                    # doctest: +SKIP
    ...     tx.execute(orders.insert(), {"id": 42})
    ...     stash(tx, OutboxRecord("orders", key="order-42", value=b'{"status": "paid"}'))
    """
    _default_stasher(table, propagate_trace).stash(tx, record)


async def astash(tx: AsyncTx, record: OutboxRecord, table: str = "outbox", *, propagate_trace: bool = False) -> None:
    """Write ``record`` into ``table`` within the transaction of ``tx``, an ``AsyncConnection``
    or ``AsyncSession``."""
    await _default_stasher(table, propagate_trace).astash(tx, record)
