"""Trace spans per batch: one per mark, per published batch and per purge, never per record.

Named and attributed by OpenTelemetry's messaging semantic conventions
(``messaging.system=kafka``, ``messaging.operation.name`` and ``.type``, the destination,
``messaging.batch.message_count``). The engine only says where a batch begins and ends; what
records it is installed from outside (:mod:`pyharvest.bindings.ops.tracing` plugs in
OpenTelemetry), so core imports no tracing library. Without a recorder, or while OpenTelemetry
has no tracer provider configured, a batch costs one attribute read and an empty ``with``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["BatchSpans", "Description", "Span", "SpanRecorder", "install_recorder", "recorder"]


class Span(Protocol):
    def set(self, key: str, value: str | int | bool) -> None: ...

    def fail(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


#: What a span is: its name, its kind (``client``, ``producer``...) and its attributes.
Description = tuple[str, str, Mapping[str, str | int | bool]]


class SpanRecorder(Protocol):
    def start(self, describe: Callable[[], Description]) -> Span | None:
        """A started span, or None while tracing is off; ``describe`` is called only when one starts."""
        ...


_recorder: SpanRecorder | None = None


def install_recorder(new: SpanRecorder | None) -> None:
    """Record the engines' spans with ``new`` from now on (None: stop)."""
    global _recorder
    _recorder = new


def recorder() -> SpanRecorder | None:
    return _recorder


class _Count:
    """What a ``with`` block sets on its span: the number of messages, once known."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def count(self, n: int) -> None:
        if self.span is not None:
            self.span.set("messaging.batch.message_count", n)


class BatchSpans:
    """The spans of one engine: its outbox table and, when sharded, its shard."""

    def __init__(self, outbox_table: str, shard: int | None = None, delivery: str = "at-least-once") -> None:
        self._table = outbox_table
        self._base: dict[str, str | int | bool] = {"messaging.system": "kafka", "db.collection.name": outbox_table}
        if shard is not None:
            self._base["pyharvest.shard"] = shard
        self._delivery = delivery

    @contextmanager
    def _span(self, describe: Callable[[], Description]) -> Iterator[_Count]:
        # ``describe`` runs only when a span starts: while tracing is off, a batch costs this.
        current = _recorder
        span = None
        if current is not None:

            def described() -> Description:
                name, kind, attributes = describe()
                return name, kind, {**self._base, **attributes}

            span = current.start(described)
        if span is None:
            yield _Count(None)
            return
        try:
            yield _Count(span)
        except BaseException as e:
            span.fail(e)
            raise
        finally:
            span.end()

    def mark(self) -> AbstractContextManager[_Count]:
        """Around a mark: the rows it took, once known (``count``)."""
        return self._span(lambda: (f"mark {self._table}", "client", {
            "messaging.operation.name": "mark", "messaging.operation.type": "receive",
        }))

    def publish(self, records: Sequence[OutboxRecord]) -> AbstractContextManager[_Count]:
        """Around handing ``records`` to Kafka (exactly once: their transaction, to its commit)."""

        def describe() -> Description:
            attributes: dict[str, str | int | bool] = {
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
                "messaging.batch.message_count": len(records),
                "pyharvest.delivery": self._delivery,
            }
            topics = {r.topic for r in records}
            if len(topics) != 1:
                return "send", "producer", attributes
            (topic,) = topics
            attributes["messaging.destination.name"] = topic
            return f"send {topic}", "producer", attributes

        return self._span(describe)

    def purge(self, count: int) -> AbstractContextManager[_Count]:
        """Around deleting ``count`` published rows."""
        return self._span(lambda: (f"purge {self._table}", "client", {
            "messaging.operation.name": "purge", "messaging.operation.type": "settle",
            "messaging.batch.message_count": count,
        }))
