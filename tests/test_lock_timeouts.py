"""The pieces of a bounded lock wait, without a database: each dialect's session statements,
the error that names the holders, the holder's one-line description, the default, and what
readiness says while a binding's statements cannot get their locks. The same against real
databases: tests/test_locked_outbox.py."""

from __future__ import annotations

import pytest

from pyharvest import Limits
from pyharvest.core.errors import ConfigError
from pyharvest.core.telemetry.health import DatabaseProbe
from pyharvest.errors import TableLockedError
from pyharvest.plugins.api import LockHolder, is_lock_timeout, load_dialect


class DriverError(Exception):
    """A driver's exception carrying a SQLSTATE, as psycopg's do."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__("canceling statement due to lock timeout")
        self.sqlstate = sqlstate


def test_each_dialect_bounds_its_sessions_wait_for_a_lock():
    assert load_dialect("postgresql").lock_timeout_statements(2.5) == ["SET lock_timeout = '2500ms'"]
    # Whole seconds only: a wait of 0.2 s is bounded at 1 s, not unbounded at 0.
    assert load_dialect("mysql").lock_timeout_statements(0.2) == [
        "SET SESSION innodb_lock_wait_timeout = 1", "SET SESSION lock_wait_timeout = 1",
    ]
    assert load_dialect("mssql").lock_timeout_statements(2.5) == ["SET LOCK_TIMEOUT 2500"]
    assert load_dialect("sqlite").lock_timeout_statements(2.5) == []


def test_a_lock_timeout_is_told_from_other_errors_by_its_code():
    postgresql = load_dialect("postgresql").capabilities
    assert is_lock_timeout(postgresql, DriverError("55P03"))
    assert not is_lock_timeout(postgresql, DriverError("40P01"))  # a deadlock is retried as any error
    assert not is_lock_timeout(load_dialect("sqlite").capabilities, DriverError("55P03"))


def test_the_error_names_the_table_the_wait_and_the_holders():
    e = TableLockedError("outbox", 2.5, ("pid 42 (AccessExclusiveLock, transaction open 12s: LOCK TABLE outbox)",
                                         "pid 43 (RowShareLock)"))
    assert str(e) == (
        "outbox table 'outbox' is locked: a statement waited 2.5s (limits.lockTimeout) for a lock held by pid 42 "
        "(AccessExclusiveLock, transaction open 12s: LOCK TABLE outbox) (and pid 43 (RowShareLock)); retrying until "
        "it is released (that session commits or rolls back, or is ended)"
    )
    assert "the database does not say which" in str(TableLockedError("outbox", 1, ()))


def test_a_holder_is_described_in_one_line():
    long_query = "SELECT id\n  FROM outbox WHERE " + "x = 1 AND " * 30
    described = LockHolder("pid 7", "RowShareLock", 61.4, "idle in transaction", long_query).describe()
    assert described.startswith("pid 7 (RowShareLock, transaction open 61s, idle in transaction: SELECT id FROM outbox")
    assert described.endswith("...)") and "\n" not in described
    assert LockHolder("thread 3", "").describe() == "thread 3"


def test_the_wait_defaults_to_the_poll_deadline_and_zero_leaves_it_to_the_database():
    # A mark that waits past maxPollInterval is thrown away anyway.
    assert Limits(heartbeat_timeout=4.0).resolve().lock_timeout == 2.0
    assert Limits(lock_timeout=0).resolve().lock_timeout == 0
    assert Limits.from_mapping({"lockTimeout": "750ms"}).resolve().lock_timeout == 0.75
    with pytest.raises(ConfigError, match=r"limits\.lockTimeout"):
        Limits(lock_timeout=-1).resolve()


class Binding:
    def __init__(self) -> None:
        self.lock_error: TableLockedError | None = None

    def ping(self) -> None:  # a row lock blocks no ping
        pass


def test_readiness_names_the_lock_while_the_bindings_statements_wait_on_it():
    binding, probe = Binding(), DatabaseProbe()
    assert probe.state(binding) == (None, None)  # no ping has answered yet
    binding.lock_error = TableLockedError("outbox", 1.0, ("pid 42 (RowShareLock)",))
    answers, why = probe.state(binding)
    assert answers is False and why is not None and "pid 42" in why and "is locked" in why
    binding.lock_error = None
    assert probe.state(binding)[0] is not False
