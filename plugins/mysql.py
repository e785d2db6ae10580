"""MySQL 8 and MariaDB 10.6+, through mysqlclient (``mysql+mysqldb``, the ``mysqlclient`` extra),
PyMySQL (``mysql+pymysql``, the ``mysql`` extra: pure Python) or the MariaDB connector.

mysqlclient is the recommended driver: 0.6x PyMySQL's CPU per marked row (PyMySQL decodes
every row in Python; docs/performance.md). Nothing here depends on the driver:
SQLAlchemy's dialect of each classifies lost connections, and error numbers are read where
each driver keeps them (plugins/api/grants.py).

Mark: :class:`LockingReadMark`, a locking read of the rows and an update of their id range
(neither MySQL nor MariaDB has ``UPDATE … RETURNING``). The binding's sessions run at READ
COMMITTED: under InnoDB's default REPEATABLE READ the locking read would also take gap and
next-key locks, blocking services inserting new outbox rows until the mark commits.

Timestamps are ``DATETIME(6)`` holding UTC (the stasher converts); the column default
``CURRENT_TIMESTAMP(6)`` is in the writer's session time zone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from pyharvest.plugins.api import (
    NATIVE,
    SHARD_EXPRESSION,
    Capabilities,
    CleanupHorizon,
    DialectOptions,
    LockHolder,
    MarkQuery,
    MarkStrategy,
    OutboxTable,
    TableOptions,
    hookimpl,
    shard_column,
)

_preparer = mysql.dialect().identifier_preparer

_NATIVE_DDL = TableOptions(
    types={"create_time": mysql.DATETIME(fsp=6), "kafka_value": mysql.LONGBLOB(), "kafka_headers": mysql.LONGTEXT()},
    # A TEXT column takes no literal default (before MySQL 8.0.13).
    defaults={"create_time": "CURRENT_TIMESTAMP(6)", "kafka_headers": None},
    # utf8mb4 for any Unicode key; binary collation so comparisons are exact.
    table_kwargs={"mysql_engine": "InnoDB", "mysql_default_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"},
)

DIALECT = DialectOptions(
    name="mysql",
    url_backends=("mysql", "mariadb"),
    capabilities=Capabilities(
        account_grantees=True, privilege_errors=(1142, 1143),  # table, column access denied
        lock_timeout_errors=(1205,),  # ER_LOCK_WAIT_TIMEOUT: a row lock or a metadata lock (LOCK TABLES)
        driver_packages=(
            ("pymysql", "pyharvest[mysql]"), ("mysqldb", "pyharvest[mysqlclient]"),
            ("mysqlconnector", "mysql-connector-python"), ("mariadbconnector", "mariadb"),
            ("asyncmy", "asyncmy"), ("aiomysql", "aiomysql"),
        ),
    ),
    tables={NATIVE: _NATIVE_DDL},
    # The mark: LockingReadMark (pyharvest_mark_strategy), not the generic transactional one.
    shard_column=True,  # a virtual column (pyharvest_shard_ddl), indexed with the id
)


class LockingReadMark:
    """The mark in two statements and a commit: ``SELECT <the rows> … ORDER BY id LIMIT n FOR
    UPDATE``, then ``UPDATE … SET leader_id = :leader_id WHERE id BETWEEN :lo AND :hi AND <not
    marked by :leader_id, every row filter>``, commit.

    The generic mark (:class:`~pyharvest.plugins.api.TransactionalMark`) selects the ids, updates
    them and reads the rows back: four round trips, two of them carrying the ids as a list of
    literals. Here the locking read returns the rows themselves, with ``:leader_id`` in place of
    the leader column (what the update writes), and the update names the read's first and last
    id instead of a list. The read's row locks keep the rows as read until the commit.

    The range can also hold a row the read did not return: one whose id was allocated before
    the read but inserted after it passed (ids are handed out before commit). The update's
    count says so (it matches every row the read locked, and no other when there is none);
    then the transaction is rolled back, marking nothing, and the mark runs again with the ids
    as a list, which marks exactly the rows it read. ``by_range=False`` always does that.
    """

    def __init__(self, query: MarkQuery, *, by_range: bool = True) -> None:
        self.query = query
        self.by_range = by_range
        o = query.outbox
        ids: sa.BindParameter[Any] = sa.bindparam("ids", expanding=True)
        self._by_ids = sa.update(o.table).where(o.id.in_(ids)).values(leader_id=query.leader())
        self._by_range = (
            sa.update(o.table)
            .where(o.id.between(sa.bindparam("lo", type_=o.id.type), sa.bindparam("hi", type_=o.id.type)))
            .where(o.unmarked_by(query.leader()))
            .values(leader_id=query.leader())
        )
        self._reads: dict[int, sa.Select[Any]] = {}

    def read(self, limit: int) -> sa.Select[Any]:
        """The row choice (:meth:`MarkQuery.oldest`'s) selecting whole rows, the leader column
        replaced by ``:leader_id``."""
        found = self._reads.get(limit)
        if found is None:
            q = self.query
            columns = [q.leader().label(c.name) if c.name == "leader_id" else c for c in q.outbox.columns]
            found = self._reads[limit] = q.oldest(limit).with_only_columns(*columns)
        return found

    def statements(self, limit: int) -> Sequence[sa.Executable]:
        return [self.read(limit), self._by_range if self.by_range else self._by_ids]

    def mark(self, connection: sa.Connection, leader_id: str, limit: int, after: int = 0) -> Sequence[Sequence[Any]]:
        read, params = self.read(limit), {"leader_id": leader_id, "after": after}
        if self.by_range:
            with connection.begin() as transaction:
                rows = connection.execute(read, params).all()
                if not rows:
                    return rows
                bounds = {"leader_id": leader_id, "lo": rows[0][0], "hi": rows[-1][0]}
                if connection.execute(self._by_range, bounds).rowcount == len(rows):
                    return rows
                transaction.rollback()
        with connection.begin():
            rows = connection.execute(read, params).all()
            if rows:
                connection.execute(self._by_ids, {"leader_id": leader_id, "ids": [row[0] for row in rows]})
            return rows


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


@hookimpl
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy:
    return LockingReadMark(MarkQuery(table))


@hookimpl
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any]:
    return {"isolation_level": "READ COMMITTED"}


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    t, column = table.name.quoted(_preparer), _preparer.quote(shard_column(shards))
    return [
        f"ALTER TABLE {t} ADD COLUMN {column} SMALLINT AS ({SHARD_EXPRESSION.format(shards=int(shards))}) VIRTUAL, "
        f"ADD INDEX {_preparer.quote(index)} ({column}, id)"
    ]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # A CHECK constraint added later would check the existing rows too: a trigger checks new ones only.
    schema = f"{_preparer.quote(table.name.schema)}." if table.name.schema else ""
    return [
        f"CREATE TRIGGER {schema}{_preparer.quote(name)} BEFORE INSERT ON {table.name.quoted(_preparer)} "
        f"FOR EACH ROW IF NEW.kafka_key_hash IS NULL THEN "
        f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{name}: a row needs its kafka_key_hash'; END IF"
    ]


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    # Rows apply in order, so a key's last row wins; the unique key is whichever the table has.
    # The update reads the source's columns (``VALUES(c)`` is deprecated since MySQL 8.0.20,
    # and the ``AS new`` row alias cannot follow a SELECT).
    names = [c.name for c in source.selected_columns]
    insert = mysql.insert(target).from_select(names, source.order_by(*order))
    others = [c for c in names if c not in keys] or list(keys[:1])  # only keys: a no-op update
    return insert.on_duplicate_key_update({c: source.selected_columns[c] for c in others})


@hookimpl
def pyharvest_lock_timeout_statements(seconds: float) -> Sequence[str]:
    # Whole seconds only: InnoDB's wait for a row lock, and the wait for a metadata lock (a
    # LOCK TABLES or an ALTER in another session).
    whole = max(1, math.ceil(seconds))
    return [f"SET SESSION innodb_lock_wait_timeout = {whole}", f"SET SESSION lock_wait_timeout = {whole}"]


# InnoDB does not say which session holds a lock once the wait is over, nor (without the
# metadata_lock_info plugin) who holds a table lock: the transactions open longer than the wait
# that ran out are the suspects. Other accounts' sessions need the PROCESS privilege to be seen.
_OPEN_TRANSACTIONS = sa.text("""
SELECT t.trx_mysql_thread_id, TIMESTAMPDIFF(SECOND, t.trx_started, NOW()), COALESCE(p.COMMAND, ''),
       COALESCE(t.trx_query, p.INFO, '')
FROM information_schema.INNODB_TRX t LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_mysql_thread_id <> CONNECTION_ID() AND t.trx_started <= NOW() - INTERVAL :older SECOND
ORDER BY t.trx_started
LIMIT 10
""")


@hookimpl
def pyharvest_lock_holders(connection: sa.Connection, table: Any, older_than: float) -> Sequence[LockHolder]:
    rows = connection.execute(_OPEN_TRANSACTIONS, {"older": max(0, math.floor(older_than))}).all()
    return [
        LockHolder(f"thread {thread}", "", float(age), str(command).lower(), str(query))
        for thread, age, command, query in rows
    ]


# InnoDB keeps undo logs for the oldest read view of the whole server: the history list
# length says how far purge is behind, the oldest transaction who holds it (most likely).
_HISTORY = sa.text("SELECT `count` FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'")
_OLDEST_TRANSACTION = sa.text("""
SELECT t.trx_mysql_thread_id, TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6, COALESCE(p.COMMAND, ''),
       COALESCE(t.trx_query, p.INFO, '')
FROM information_schema.INNODB_TRX t LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
ORDER BY t.trx_started
LIMIT 1
""")


@hookimpl
def pyharvest_cleanup_horizon(connection: sa.Connection) -> CleanupHorizon:
    behind = connection.execute(_HISTORY).scalar()
    row = connection.execute(_OLDEST_TRANSACTION).first()
    if row is None:
        return CleanupHorizon(age_seconds=0.0, behind=None if behind is None else int(behind), behind_unit=_BEHIND)
    thread, seconds, command, query = row
    said = LockHolder(f"thread {thread}", "", None, str(command).lower(), str(query)).describe()
    return CleanupHorizon(said, max(0.0, float(seconds)), None if behind is None else int(behind), _BEHIND)


_BEHIND = "history list length"
