"""The contract between the engine and a database: mark, purge, reset.

The engine depends on nothing else of a database. A binding must be safe to call from two
threads at once: the mark loop calls :meth:`DatabaseBinding.mark` while the delivery
thread calls :meth:`DatabaseBinding.purge` and :meth:`DatabaseBinding.reset`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pyharvest.core.records import OutboxRecord

__all__ = ["DatabaseBinding"]


@runtime_checkable
class DatabaseBinding(Protocol):
    def mark(self, leader_id: str, limit: int) -> list[OutboxRecord]:
        """Atomically mark up to ``limit`` of the oldest rows whose leader id is null or differs
        from ``leader_id``, setting it to ``leader_id``; return them sorted by id.

        A mark that raises may still have committed on the server; the engine then forces a
        remark under a fresh leader id, so marked-but-unseen rows are picked up again.
        """
        ...

    def purge(self, ids: Sequence[int]) -> int:
        """Delete the rows with these ids (published and acknowledged); return how many went."""
        ...

    def reset(self, ids: Sequence[int]) -> int:
        """Clear the leader id of these rows so that they are marked again; return how many."""
        ...

    def dispose(self) -> None:
        """Release connections. Called once, when the harvester stops."""
        ...
