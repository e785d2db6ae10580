"""Shared by the inbox tests: producing test messages, configs, an 'applied' table."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from confluent_kafka import Producer

from pyharvest.inbox import OUTBOX_HEADER, RECORD_ID_HEADER, InboxConfig, InboxLimits, InboxMessage

Msg = tuple[str | None, bytes | None, list[tuple[str, bytes]]]


def produce(bootstrap: str, topic: str, messages: Sequence[Msg], partition: int | None = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[object] = []
    for key, value, headers in messages:
        kwargs: dict[str, object] = {
            "key": key,
            "value": value,
            "headers": headers,
            "on_delivery": lambda err, _m: errors.append(err) if err else None,
        }
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, **kwargs)
    assert producer.flush(30) == 0
    assert not errors, errors


def identity(outbox: str, record_id: int) -> list[tuple[str, bytes]]:
    return [(OUTBOX_HEADER, outbox.encode()), (RECORD_ID_HEADER, str(record_id).encode())]


def inbox_config(kafka_config: dict, database_url: str, topic: str, prefix: str, **kw: object) -> InboxConfig:
    limits = kw.pop("limits", None) or InboxLimits(
        max_batch_duration=0.05, poll_duration=0.05, replay_poll_interval=0.2, io_error_backoff=0.2
    )
    return InboxConfig(
        base_kafka_config={**kafka_config, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        group_id=str(kw.pop("group_id", f"inbox-{uuid.uuid4().hex[:8]}")),
        topics=[topic],
        data_source=database_url,
        checkpoint_table=f"{prefix}_cp",
        dedupe_table=f"{prefix}_dd",
        dead_letter_table=f"{prefix}_dl",
        limits=limits,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def applied_table(name: str) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("msg_key", sa.String(100), nullable=True),
        sa.Column("msg_value", sa.String(100), nullable=True),
        sa.Column("delivery_id", sa.String(32), nullable=False),
    )


def recording_handler(table: sa.Table) -> Callable[[sa.Connection, InboxMessage], None]:
    insert = sa.insert(table)

    def handler(tx: sa.Connection, m: InboxMessage) -> None:
        tx.execute(
            insert,
            {
                "kafka_offset": m.offset,
                "msg_key": m.key_text,
                "msg_value": None if m.value is None else m.value.decode(),
                "delivery_id": m.delivery_id,
            },
        )

    return handler


def rows(engine: sa.Engine, table: sa.Table) -> list[tuple[int, str | None, str | None, str]]:
    with engine.connect() as c:
        return [
            tuple(r)
            for r in c.execute(
                sa.select(table.c.kafka_offset, table.c.msg_key, table.c.msg_value, table.c.delivery_id).order_by(
                    table.c.id
                )
            )
        ]  # type: ignore[misc]
