"""Inbox throughput: messages per second applied exactly once into a database.

    python -m benchmarks.inbox_bench                                   # PostgreSQL + embedded broker
    python -m benchmarks.inbox_bench --bootstrap 127.0.0.1:19092       # on a running broker (make kafka)
    python -m benchmarks.inbox_bench --handler insert --messages 100000
    python -m benchmarks.inbox_bench --handler batch-insert             # a batch handler
    python -m benchmarks.inbox_bench --database sqlite:///tmp/inbox.db

A topic is filled first (every message carries the harvester's identity headers, so the
dedupe table does its full work), then one inbox drains it; the clock runs from the
partitions' assignment to the last commit, so the group join is not counted. Handlers:

* ``noop``   — applies nothing itself: the cost of the inbox (dedupe lookups and inserts,
               fenced checkpoints, commits);
* ``update`` — one ``UPDATE counters SET n = n + 1`` per message (a round trip each);
* ``insert`` — one ``INSERT`` per message;
* ``batch-insert`` — a batch handler: one row per message, the transaction's rows in one
                     ``executemany``;
* ``batch-bulk``   — the same rows through ``pyharvest.inbox.BulkInsert`` (``COPY`` on
                     PostgreSQL, ``executemany`` elsewhere);
* ``batch-copy``   — the same rows written with psycopg's ``COPY`` (PostgreSQL only): what a
                     batch handler gains by leaving ``executemany`` behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import uuid

import sqlalchemy as sa

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def fill(bootstrap: str, topic: str, messages: int, partitions: int) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(15)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
        }
    )
    outbox = b"bench/outbox"
    start = time.perf_counter()
    for i in range(messages):
        producer.produce(
            topic,
            key=f"key-{i % 1000}",
            value=b'{"amount": 1}',
            headers=[("pyharvest-outbox", outbox), ("pyharvest-record-id", str(i + 1).encode())],
        )
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(120)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, object]:
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker
    from pyharvest.inbox import BulkInsert, Inbox, InboxConfig, InboxLimits, InboxMessage

    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(args.database)
    md = sa.MetaData()
    counters = sa.Table(
        f"{prefix}_counters",
        md,
        sa.Column("k", sa.Integer, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    events = sa.Table(
        f"{prefix}_events",
        md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("delivery_id", sa.String(32), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=True),
    )
    md.create_all(engine)
    with engine.begin() as c:
        c.execute(sa.insert(counters), [{"k": 0, "n": 0}])
    bump = sa.update(counters).where(counters.c.k == 0).values(n=counters.c.n + 1)
    add = sa.insert(events)

    def noop(tx: sa.Connection, m: InboxMessage) -> None:
        pass

    def update(tx: sa.Connection, m: InboxMessage) -> None:
        tx.execute(bump)

    def insert(tx: sa.Connection, m: InboxMessage) -> None:
        tx.execute(add, {"delivery_id": m.delivery_id, "body": m.value})

    def batch_insert(tx: sa.Connection, messages: list[InboxMessage]) -> None:
        tx.execute(add, [{"delivery_id": m.delivery_id, "body": m.value} for m in messages])

    write_events = BulkInsert(events, ["delivery_id", "body"])

    def batch_bulk(tx: sa.Connection, messages: list[InboxMessage]) -> None:
        write_events(tx, [(m.delivery_id, m.value) for m in messages])

    def batch_copy(tx: sa.Connection, messages: list[InboxMessage]) -> None:
        # The inbox's own transaction, on the driver's connection under SQLAlchemy's.
        driver = tx.connection.driver_connection
        statement = f"COPY {events.name} (delivery_id, body) FROM STDIN"
        with driver.cursor() as cursor, cursor.copy(statement) as copy:  # type: ignore[union-attr]
            for m in messages:
                copy.write_row((m.delivery_id, m.value))

    handlers = {"noop": noop, "update": update, "insert": insert}
    batch_handlers = {"batch-insert": batch_insert, "batch-bulk": batch_bulk, "batch-copy": batch_copy}
    try:
        with contextlib.nullcontext(None) if args.bootstrap else EmbeddedBroker() as broker:
            bootstrap = args.bootstrap or broker.bootstrap_servers
            topic = f"{prefix}-in"
            fill_seconds = fill(bootstrap, topic, args.messages, args.partitions)
            config = InboxConfig(
                base_kafka_config={
                    "bootstrap.servers": bootstrap,
                    "session.timeout.ms": 6000,
                    "fetch.max.bytes": 52428800,
                    "queued.min.messages": 200000,
                },
                group_id=f"{prefix}-group",
                topics=[topic],
                data_source=args.database,
                checkpoint_table=f"{prefix}_cp",
                dedupe_table=f"{prefix}_dd",
                dead_letter_table=f"{prefix}_dl",
                limits=InboxLimits(max_batch_size=args.batch_size, max_batch_duration=args.batch_duration),
            )
            if args.handler in batch_handlers:
                inbox = Inbox(config, batch_handler=batch_handlers[args.handler]).start()
            else:
                inbox = Inbox(config, handlers[args.handler]).start()
            try:
                while not inbox.stats.assigned:
                    inbox.join(0.01)
                start = time.perf_counter()
                cpu0 = time.process_time()
                while (s := inbox.stats).applied + s.duplicates_dropped < args.messages:
                    if inbox.join(0.005):
                        raise RuntimeError("the inbox stopped early")
                seconds = time.perf_counter() - start
                cpu = time.process_time() - cpu0
                stats = inbox.stats
            finally:
                inbox.stop()
                inbox.join(60)
    finally:
        with engine.begin() as c:
            for t in ("counters", "events", "cp", "dd", "dl"):
                c.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}_{t}"))
        engine.dispose()
    return {
        "database": sa.make_url(args.database).get_backend_name(),
        "handler": args.handler,
        "messages": args.messages,
        "partitions": args.partitions,
        "batch_size": args.batch_size,
        "seconds": round(seconds, 3),
        "messages_per_second": round(args.messages / seconds),
        "process_cpu_seconds": round(cpu, 2),
        "commits": stats.commits,
        "fill_seconds": round(fill_seconds, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default="", help="a running broker (default: start the embedded one)")
    p.add_argument("--database", default=DEFAULT_DATABASE)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--handler", choices=("noop", "update", "insert", "batch-insert", "batch-bulk", "batch-copy"), default="noop")
    p.add_argument("--batch-size", type=int, default=5000)
    p.add_argument("--batch-duration", type=float, default=0.5, help="seconds")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result))  # noqa: T201 - the report
    print(  # noqa: T201 - the report
        f"{result['handler']}: {result['messages_per_second']:,} messages/s "
        f"({result['messages']:,} in {result['seconds']} s, {result['commits']} commits)"
    )  # noqa: T201 - the report


if __name__ == "__main__":
    main()
