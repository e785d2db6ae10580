"""The SQL binding: mark, purge and reset over a SQLAlchemy engine."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from itertools import islice
from operator import attrgetter
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.sql.change_feed import OutboxChangeFeed
from pyharvest.bindings.sql.mark_cursor import LateRowScanner, MarkCursor
from pyharvest.bindings.sql.quarantine import QuarantinedKey, QuarantineTable
from pyharvest.bindings.sql.schema import init_db_command, missing_table, table_missing
from pyharvest.bindings.sql.shard_schema import check_shardable
from pyharvest.bindings.sql.statements import OutboxStatements
from pyharvest.core.errors import TableLockedError
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import QuarantineEntry
from pyharvest.plugins.api import (
    CleanupHorizon,
    Dialect,
    MalformedRowError,
    MarkStrategy,
    OutboxTable,
    is_lock_timeout,
)

__all__ = ["ID_BATCH", "MalformedRowHandler", "SqlBinding"]

log = logging.getLogger("pyharvest.bindings.sql")

# Ids per purge/reset statement where the dialect binds one array (no list limit): bounds a
# statement's size and the time its row locks are held.
ID_BATCH = 1000

MalformedRowHandler = Callable[[MalformedRowError], None]
_by_id = attrgetter("id")
# Compiles to ``SELECT 1`` (``SELECT 1 FROM DUAL`` on Oracle).
_PING: sa.Select[Any] = sa.select(sa.literal_column("1"))


class SqlBinding:
    """A :class:`~pyharvest.core.ports.database.DatabaseBinding` for one outbox table.

    Thread-safe: each call checks a connection out of the engine's small pool, so the mark
    thread and the purge/reset thread never share one.

    A row that cannot be decoded (see :class:`MalformedRowError`) is marked like any other
    but left out of the result: it is logged at ERROR with its id and passed to
    ``on_malformed``. It stays marked by this leader, so it neither stalls the mark nor
    blocks other keys; each new leader id logs it again until someone fixes or deletes it.

    It is also a :class:`~pyharvest.core.ports.database.QuarantineBinding`. With ``quarantine``
    (a :class:`QuarantineTable`, whose table exists), marks skip every row of a quarantined
    key; without it the mark statement is the plain one, and the first :meth:`quarantine`
    call creates the table and switches the mark over.
    """

    def __init__(
        self,
        engine: sa.Engine,
        outbox: OutboxTable,
        dialect: Dialect,
        *,
        marker: MarkStrategy | None = None,
        on_malformed: MalformedRowHandler | None = None,
        display_url: str = "",
        quarantine: QuarantineTable | None = None,
        change_feed: OutboxChangeFeed | None = None,
        lock_timeout: float | None = None,
        init_db: str | None = None,
        mark_lookback: float = 0.0,
        late_row_scan_interval: float = 5.0,
        late_rows: LateRowScanner | None = None,
    ) -> None:
        self.engine = engine
        #: Seconds the engine's sessions wait for a lock (``limits.lockTimeout``); None: unbounded.
        self.lock_timeout = lock_timeout
        # Each kind of statement's last TableLockedError, until that kind succeeds again: new
        # rows may be marked while a console's FOR UPDATE keeps in-flight rows from their purge.
        self._lock_errors: dict[str, TableLockedError] = {}
        #: The ``reaper init-db`` command a missing or unsharded table's error advises, as the
        #: harvester's configuration gives it (``reaper init-db -f reaper.yaml``); None spells out
        #: the data source.
        self.init_db = init_db
        self.outbox = outbox
        self.dialect = dialect
        self.quarantine_table: QuarantineTable | None = None
        self._quarantine_lock = threading.Lock()
        self._custom_marker = marker is not None
        self.marker = marker or dialect.mark_strategy(outbox)
        self._late_row = self._late_row_statement(outbox)
        if quarantine is not None:
            self._enable_quarantine(quarantine)
        #: Marks start past what their leader id marked ``mark_lookback`` seconds ago
        #: (``limits.markLookback``; 0: every mark from the lowest id), where the strategy
        #: takes a start (``after``): see :mod:`pyharvest.bindings.sql.mark_cursor`.
        self.cursor: MarkCursor | None = None
        self.late_rows = late_rows
        if mark_lookback > 0 and "after" in inspect.signature(self.marker.mark).parameters:
            self.cursor = MarkCursor(mark_lookback)
            if self.late_rows is None and not dialect.capabilities.commits_in_id_order:
                self.late_rows = LateRowScanner(engine, late_row_scan_interval, str(outbox.name))
        self._mark_lookback, self._late_row_scan_interval = mark_lookback, late_row_scan_interval
        self._scanned = False  # whether the late-row scanner looks below this binding's cursor
        self.on_malformed = on_malformed
        self.malformed_rows = 0
        self._display_url = display_url
        self._id_batch = min(ID_BATCH, dialect.capabilities.list_limit or ID_BATCH)
        statements = OutboxStatements.build(outbox, dialect)
        self._purge, self._reset, self._reset_own = statements.purge, statements.reset, statements.reset_own
        self._count, self._oldest = statements.count, statements.oldest
        # The ping's look at the table: reads no row, fails if the table is gone.
        self._table_probe: sa.Select[Any] = (
            sa.select(sa.literal_column("1")).select_from(outbox.table).where(sa.false())
        )
        self._owns_engine = True
        self._shardable: set[int] = set()  # shard counts the table was found ready for
        #: Where the dialect can listen (PostgreSQL), what wakes an idle engine; shared by shards.
        self.change_feed = change_feed or OutboxChangeFeed(engine, dialect, outbox.name)

    def for_shard(self, shards: int, shard: int) -> SqlBinding:
        """A binding on the same engine whose marks take only the rows of ``shard`` of
        ``shards`` (the table needs the key hash column: ``reaper init-db --shards N``).
        Disposing it leaves the engine to this binding."""
        if shards not in self._shardable:
            init_db = init_db_command(self.engine, self.outbox.name, f" --shards {shards}", init_db=self.init_db)
            check_shardable(self.engine, self.outbox, self.dialect, shards, init_db)
            self._shardable.add(shards)
        shard_filter = functools.partial(self.dialect.shard_filter, shards=shards, shard=shard)
        outbox = self.outbox.where(shard_filter)
        part = SqlBinding(
            self.engine, outbox, self.dialect, on_malformed=self.on_malformed, display_url=self._display_url,
            quarantine=self.quarantine_table, change_feed=self.change_feed, lock_timeout=self.lock_timeout,
            init_db=self.init_db, mark_lookback=self._mark_lookback,
            late_row_scan_interval=self._late_row_scan_interval, late_rows=self.late_rows,
        )
        part._owns_engine = False
        # The shard's backlog, counted through its index.
        part._count = part._count.where(shard_filter(self.outbox.table))
        return part

    def __repr__(self) -> str:
        return (
            f"SqlBinding(dialect={self.dialect.name!r}, table={str(self.outbox.name)!r}, "
            f"layout={self.outbox.layout!r}, url={self._display_url!r})"
        )

    @staticmethod
    def _late_row_statement(marking: OutboxTable) -> sa.Select[Any]:
        """The lowest id at or below ``:floor`` that a mark under ``:leader_id`` would take:
        what :class:`~pyharvest.bindings.sql.mark_cursor.LateRowScanner` asks (a plain read,
        no lock)."""
        leader = sa.bindparam("leader_id", type_=marking.leader_id.type)
        floor = sa.bindparam("floor", type_=marking.id.type)
        return sa.select(sa.func.min(marking.id)).where(marking.id <= floor, marking.unmarked_by(leader))

    def mark(self, leader_id: str, limit: int) -> list[OutboxRecord]:
        if limit <= 0:
            return []
        cursor, after = self.cursor, 0
        with self.engine.connect() as conn:
            try:
                if cursor is None:
                    rows = self.marker.mark(conn, leader_id, limit)
                else:
                    after = cursor.start(leader_id)
                    rows = self.marker.mark(conn, leader_id, limit, after=after)
            except sa.exc.DBAPIError as e:
                raise self._explained(e, "mark") from e
        self._lock_errors.pop("mark", None)
        if cursor is not None:
            cursor.marked(leader_id, after, limit, len(rows), max((row[0] for row in rows), default=after))
            if not self._scanned and self.late_rows is not None:
                self._scanned = True
                self.late_rows.add(cursor, lambda: self._late_row)
        decode = self.outbox.decode
        records: list[OutboxRecord] = []
        append = records.append
        for row in rows:
            try:
                append(decode(row))
            except MalformedRowError as e:
                self._malformed(e)
        records.sort(key=_by_id)
        return records

    def _malformed(self, error: MalformedRowError) -> None:
        self.malformed_rows += 1
        log.error("refusing malformed outbox row in %s (left marked, not published): %s", self.outbox.name, error)
        if self.on_malformed is not None:
            try:
                self.on_malformed(error)
            except Exception:  # noqa: BLE001 - a faulty handler must not break the mark
                log.exception("on_malformed handler failed")

    def purge(self, ids: Sequence[int]) -> int:
        return self._by_ids(self._purge, ids)

    def reset(self, ids: Sequence[int], leader_id: str | None = None) -> int:
        if self.cursor is not None and ids:
            # Unmarked again below the cursor: the next mark under that leader id starts there.
            self.cursor.rewind(leader_id, min(ids) - 1)
        if leader_id is None:
            return self._by_ids(self._reset, ids, what="reset")
        return self._by_ids(self._reset_own, ids, {"own_leader_id": leader_id}, what="reset")

    def _by_ids(
        self, statement: sa.Executable, ids: Sequence[int], extra: dict[str, Any] | None = None, what: str = "purge"
    ) -> int:
        if not ids:
            return 0
        total = 0
        it = iter(ids)
        try:
            with self.engine.begin() as conn:
                while chunk := list(islice(it, self._id_batch)):
                    result: Any = conn.execute(statement, {"ids": chunk, **(extra or {})})
                    total += result.rowcount
        except sa.exc.DBAPIError as e:
            raise self._explained(e, what) from e
        self._lock_errors.pop(what, None)
        return total

    # ------------------------------------------------------------------ quarantine

    def _enable_quarantine(self, q: QuarantineTable) -> None:
        self.quarantine_table = q
        if not self._custom_marker:
            # One attribute assignment: a mark already running finishes with the old statement.
            marking = self.outbox.where(q.row_filter)
            self.marker = self.dialect.mark_strategy(marking)
            self._late_row = self._late_row_statement(marking)

    def enable_quarantine(self) -> QuarantineTable:
        """Create the quarantine table if missing and make marks skip quarantined keys."""
        with self._quarantine_lock:
            q = self.quarantine_table
            if q is None:
                q = QuarantineTable.for_outbox(self.outbox)
                q.create(self.engine)
                self._enable_quarantine(q)
            return q

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> int:
        """Park the keys of these poison records (they stay in the outbox); a key already
        parked keeps its first entry. Returns how many keys were newly parked."""
        if not entries:
            return 0
        q = self.enable_quarantine()
        with self.engine.begin() as conn:
            return q.park(conn, entries)

    def quarantined(self, key: str | None = None) -> list[QuarantinedKey]:
        """The parked keys (oldest first), or the one given; [] without a quarantine table."""
        q = self.quarantine_table or QuarantineTable.for_outbox(self.outbox)
        if self.quarantine_table is None and not q.exists(self.engine):
            return []
        with self.engine.connect() as conn:
            return q.list(conn, key)

    def replay(self, key: str) -> bool:
        """Lift the quarantine of ``key``: its records flow again, oldest (the poison record)
        first. False if the key was not quarantined."""
        q = self.quarantine_table or QuarantineTable.for_outbox(self.outbox)
        if self.quarantine_table is None and not q.exists(self.engine):
            return False
        with self.engine.begin() as conn:
            return q.replay(conn, key)

    def discard(self, key: str) -> QuarantinedKey | None:
        """Delete the poison record of ``key`` and lift its quarantine: the key resumes with
        the record after it. None if the key was not quarantined."""
        q = self.quarantine_table or QuarantineTable.for_outbox(self.outbox)
        if self.quarantine_table is None and not q.exists(self.engine):
            return None
        with self.engine.begin() as conn:
            return q.discard(conn, self.outbox, key)

    # ------------------------------------------------------------------ probes

    def count(self) -> int:
        """Rows in the outbox (the backlog, marked or not)."""
        with self.engine.connect() as conn:
            return int(conn.execute(self._count).scalar_one())

    def oldest_create_time(self) -> datetime | None:
        """The ``create_time`` of the row with the smallest id (through the primary key's
        index, not a scan); None when the outbox is empty."""
        with self.engine.connect() as conn:
            oldest: datetime | None = conn.execute(self._oldest).scalar()
            return oldest

    def cleanup_horizon(self) -> CleanupHorizon | None:
        """Who holds the database's clean-up back, and for how long (the dialect's
        ``pyharvest_cleanup_horizon``); None where the database does not say."""
        with self.engine.connect() as conn:
            return self.dialect.cleanup_horizon(conn)

    def ping(self) -> None:
        """``SELECT 1``, then a look at the outbox table that reads no row: raises if the
        database does not answer, :class:`~pyharvest.core.errors.TableNotFoundError` if the
        table is gone (dropped while the harvester runs)."""
        with self.engine.connect() as conn:
            conn.execute(_PING).scalar_one()
            try:
                conn.execute(self._table_probe).all()
            except sa.exc.DBAPIError as e:
                raise self._explained(e) from e

    @property
    def lock_error(self) -> TableLockedError | None:
        """Why the binding's marks, purges or resets cannot go on: the last
        :class:`~pyharvest.core.errors.TableLockedError` of a kind of statement that has not
        succeeded since; None while none waits on a lock. What readiness reports
        (:class:`~pyharvest.core.telemetry.health.DatabaseProbe`)."""
        errors = list(self._lock_errors.values())
        return errors[-1] if errors else None

    def _explained(self, error: sa.exc.DBAPIError, what: str = "") -> Exception:
        """``error``, or the missing table's error (with its ``init-db`` hint, as at start) when
        that is what it was: asked of the database, not read from the driver's message; or,
        for a statement that waited too long for a lock, the error naming who holds locks on
        the table. Only for a statement that failed on a connection that worked: a database
        that does not answer is not asked again."""
        if error.connection_invalidated:
            return error
        if is_lock_timeout(self.dialect.capabilities, error):
            locked = self._locked()
            if what:
                self._lock_errors[what] = locked
            return locked
        if table_missing(self.engine, self.outbox.name):
            return missing_table(self.engine, self.outbox.name, self.dialect, init_db=self.init_db)
        return error

    def _locked(self) -> TableLockedError:
        waited = self.lock_timeout or 0.0
        try:
            with self.engine.connect() as conn:
                holders = self.dialect.lock_holders(conn, self.outbox.name, older_than=waited)
        except sa.exc.SQLAlchemyError as e:  # the database would not say: the error says so
            log.debug("could not ask who holds locks on %s: %s", self.outbox.name, e)
            holders = []
        return TableLockedError(str(self.outbox.name), waited, tuple(h.describe() for h in holders))

    # ------------------------------------------------------------------ change feed

    def watch(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """:class:`~pyharvest.core.ports.database.ChangeFeed`: ``wake`` on the stasher's notifications,
        where the dialect can listen; None otherwise (the engine polls)."""
        return self.change_feed.watch(wake)

    @property
    def feed_connected(self) -> bool | None:
        feed = self.change_feed
        return feed.connected if feed.supported and feed.watching else None

    def dispose(self) -> None:
        if self._owns_engine:
            if self.late_rows is not None:
                self.late_rows.close()
            self.change_feed.close()
            self.engine.dispose()
