"""What a dialect plugin declares as data: its :class:`DialectOptions`, the answer of its one
required hook (``pyharvest_dialect``).

As SQLAlchemy's dialects declare what their database does (``update_returning = True``) rather
than writing the same method out again, a plugin states its name, the backends it serves, its
:class:`~pyharvest.plugins.api.Capabilities`, how its outbox table is created, how it marks,
where it keeps a row's shard and how it spells an upsert; :class:`~pyharvest.plugins.api.Dialect`
turns them into behaviour. The hooks remain for what really differs in code (PostgreSQL's
``COPY``, SQLite's index look-up, each database's key hash guard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyharvest.plugins.api.capabilities import Capabilities
from pyharvest.plugins.api.ddl import TableOptions
from pyharvest.plugins.api.marking import MarkOptions
from pyharvest.plugins.api.upsert import MergeForm

__all__ = ["DialectOptions"]


@dataclass(frozen=True)
class DialectOptions:
    """A dialect plugin's declarations; every field but ``name`` has the generic default."""

    #: The dialect's name: the same as its entry-point name.
    name: str
    #: SQLAlchemy backend names (``make_url(...).get_backend_name()``) this dialect serves when
    #: no dialect is named explicitly, e.g. ``("mysql", "mariadb")``; by default its name. Empty:
    #: never chosen from a URL. The first also compiles its statements for review.
    url_backends: tuple[str, ...] | None = None
    #: What the database can do: the flags code outside the plugins asks.
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: The outbox table's ``CREATE TABLE`` per layout it supports, compiled from the table's
    #: description (``native`` is pyharvest's own; a layout not named here is not supported
    #: unless ``pyharvest_outbox_ddl`` creates it).
    tables: Mapping[str, TableOptions] = field(default_factory=dict)
    #: How the shared strategies mark (``pyharvest_mark_strategy`` replaces them).
    mark: MarkOptions = field(default_factory=MarkOptions)
    #: The database keeps a row's shard in a generated column (``pyharvest_shard_ddl`` adds it):
    #: a shard's rows are read through it rather than the key hash expression.
    shard_column: bool = False
    #: An upsert is a ``MERGE`` of this form (:class:`~pyharvest.plugins.api.UpsertFromSelect`
    #: compiled for each of the dialect's backends); None: ``pyharvest_upsert_from_select``
    #: builds the database's own, or the database has none.
    merge: MergeForm | None = None

    def backends(self) -> tuple[str, ...]:
        return (self.name,) if self.url_backends is None else tuple(self.url_backends)
