"""Exceptions a user may catch. Every message says what was wrong and what to do about it."""

from __future__ import annotations

__all__ = [
    "BindingError",
    "ConfigError",
    "HarvestError",
    "KafkaAuthorizationError",
    "KafkaPropertyError",
    "MissingGrantError",
    "TableLockedError",
    "TableNotFoundError",
    "TopicError",
]


class HarvestError(Exception):
    """Base of pyharvest's own exceptions."""


class ConfigError(HarvestError, ValueError):
    """A configuration value is missing or malformed; the message names the field and the expected form."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


class BindingError(HarvestError):
    """The database binding cannot work: unknown dialect, missing table, wrong columns, no privileges."""


class TableNotFoundError(BindingError):
    """The outbox table does not exist: at start, or dropped while the harvester runs. The
    message gives the command that creates it: ``reaper init-db -f FILE`` for a reaper started
    with ``-f FILE`` (the binding is told: ``create_binding(init_db=...)``), the data source's
    ``reaper init-db --data-source ... --table ...`` otherwise."""

    def __init__(self, table: str, where: str, create: str) -> None:
        super().__init__(f"outbox table {table!r} does not exist {where}; create it with {create}")
        self.table = table
        self.where = where
        self.create = create

    def with_command(self, create: str) -> TableNotFoundError:
        """The same error, advising ``create`` instead."""
        return TableNotFoundError(self.table, self.where, create)


class TableLockedError(BindingError):
    """A statement of the harvester waited for a lock on the outbox table, which another
    session holds, for longer than ``limits.lockTimeout``; it is retried. ``holders`` describe
    the sessions the database names as holding locks on the table (empty where it does not
    say)."""

    def __init__(self, table: str, waited: float, holders: tuple[str, ...]) -> None:
        if holders:
            who = f"held by {holders[0]}" + (f" (and {', '.join(holders[1:])})" if holders[1:] else "")
        else:
            who = "that another session holds (the database does not say which)"
        super().__init__(
            f"outbox table {table!r} is locked: a statement waited {waited:g}s (limits.lockTimeout) for a lock "
            f"{who}; retrying until it is released (that session commits or rolls back, or is ended)"
        )
        self.table = table
        self.waited = waited
        self.holders = holders


class TopicError(HarvestError):
    """Kafka cannot serve the harvester: a client refuses its configuration, no broker answers,
    or a topic it needs is missing and cannot be created."""


class KafkaPropertyError(TopicError):
    """librdkafka refused the value of one property of a client's configuration. ``property``
    is the name librdkafka gave (perhaps an alias of the one set: ``message.timeout.ms`` for
    ``delivery.timeout.ms``); ``detail`` is its message."""

    def __init__(self, message: str, property: str, detail: str) -> None:  # noqa: A002 - librdkafka's word
        super().__init__(message)
        self.property = property
        self.detail = detail


class KafkaAuthorizationError(TopicError):
    """Kafka refused a request for want of an ACL. The message names the principal, the
    operations to grant on which resource, and the ``kafka-acls.sh`` command that grants them;
    ``principal`` is ``None`` where the broker derives it (Kerberos, OAuth, a certificate)."""

    def __init__(
        self, message: str, principal: str | None, operations: tuple[str, ...], resource: str, name: str
    ) -> None:
        super().__init__(message)
        self.principal = principal
        self.operations = operations
        self.resource = resource
        self.name = name


class MissingGrantError(BindingError):
    """The database refused a statement for want of a privilege. The message names the
    privilege, the table and the role, and the ``GRANT`` that gives it."""

    def __init__(self, message: str, privilege: str, table: str, role: str) -> None:
        super().__init__(message)
        self.privilege = privilege
        self.table = table
        self.role = role
