"""``reaper demo``: see the whole pipeline work in one command.

Starts the embedded broker (unless ``--bootstrap-servers`` names a real one), creates an
outbox (a temporary SQLite file unless ``--data-source`` names a real database), stashes a
workload from several concurrent writers, harvests it while printing throughput, reads the
topic back and checks it: every record, once, in order per key. Leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["DemoResult", "register", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    records: int
    keys: int
    received: int
    lost: int
    duplicates: int
    reordered: int
    harvest_seconds: float
    stash_seconds: float

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.reordered == 0 and self.received >= self.records

    @property
    def rate(self) -> float:
        return self.records / self.harvest_seconds if self.harvest_seconds > 0 else 0.0


def _progress(label: str, done: int, total: int, extra: str = "", stream: TextIO = sys.stderr) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    stream.write(f"\r{label:<10} [{'#' * filled}{'.' * (width - filled)}] {done:>8}/{total} {extra}   ")
    stream.flush()


def run_demo(
    *,
    records: int = 20_000,
    keys: int = 200,
    writers: int = 4,
    data_source: str | None = None,
    bootstrap_servers: str | None = None,
    topic: str | None = None,
    group: str | None = None,
    quiet: bool = False,
) -> DemoResult:
    import sqlalchemy as sa

    from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker
    from pyharvest.bindings.sql import create_outbox_table
    from pyharvest.verify import verify_topic

    out = open(os.devnull, "w") if quiet else sys.stderr  # noqa: SIM115
    topic = topic or f"pyharvest-demo-{uuid.uuid4().hex[:6]}"
    table = f"outbox_demo_{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        stack.callback(out.close if quiet else (lambda: None))
        if bootstrap_servers is None:
            out.write("starting the embedded Kafka-compatible broker...\n")
            broker = stack.enter_context(EmbeddedBroker())
            bootstrap_servers = broker.bootstrap_servers
        if data_source is None:
            folder = tempfile.mkdtemp(prefix="pyharvest-demo-")
            stack.callback(shutil.rmtree, folder, True)
            data_source = f"sqlite:///{folder}/outbox.db"
        out.write(f"outbox {table!r} at {data_source.split('@')[-1]}, topic {topic!r} at {bootstrap_servers}\n")
        create_outbox_table(data_source, table)
        engine = sa.create_engine(data_source)
        stack.callback(engine.dispose)
        stack.callback(_drop_table, engine, table)

        # NewTopic's documented import path; confluent_kafka.admin re-exports it without listing it in an __all__.
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        admin.create_topics([NewTopic(topic, 4)])[topic].result(15)
        del admin  # a live client would log complaints when the embedded broker stops

        # Each writer owns a share of the keys, so every key's records are causally ordered.
        expected: list[tuple[str, bytes]] = []
        lock = threading.Lock()
        written = [0]
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                mine = [f"key-{k}" for k in range(keys) if k % writers == w]
                share = records // writers + (1 if w < records % writers else 0)
                seq = dict.fromkeys(mine, 0)
                n = 0
                while n < share:
                    batch = []
                    with engine.begin() as tx:
                        prepared = stasher.Stasher(table).prepare(tx)
                        for _ in range(min(100, share - n)):
                            key = mine[n % len(mine)]
                            value = f"{key}#{seq[key]}".encode()
                            seq[key] += 1
                            prepared.stash(OutboxRecord(topic, key, value, headers=[("demo-writer", str(w))]))
                            batch.append((key, value))
                            n += 1
                    with lock:
                        expected.extend(batch)
                        written[0] += len(batch)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        started = time.monotonic()
        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(min(writers, keys))]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            _progress("stashing", written[0], records, stream=out)
            time.sleep(0.1)
        _progress("stashing", written[0], records, stream=out)
        out.write("\n")
        if errors:
            raise errors[0]
        stash_seconds = time.monotonic() - started

        config = Config(
            base_kafka_config={"bootstrap.servers": bootstrap_servers},
            leader_group_id=group or f"pyharvest-demo-{uuid.uuid4().hex[:6]}",
            data_source=data_source,
            outbox_table=table,
            limits=Limits(heartbeat_timeout=2.0, min_metrics_interval=1.0),
        )
        harvest = Harvest(config)
        harvest.start()
        try:
            while not harvest.is_leader:
                time.sleep(0.05)
            began = time.monotonic()
            while True:
                purged = harvest.metrics.records_purged
                elapsed = time.monotonic() - began
                rate = purged / elapsed if elapsed > 0 else 0.0
                _progress("harvesting", min(purged, records), records,
                          f"{rate:>8.0f} rec/s  in flight {harvest.in_flight_records:>4}", stream=out)
                if purged >= records:
                    break
                time.sleep(0.1)
            harvest_seconds = time.monotonic() - began
            out.write("\n")
        finally:
            harvest.stop()
            harvest.join(30)

        out.write("reading the topic back...\n")
        report = verify_topic(bootstrap_servers, topic, expected, timeout=60)
        return DemoResult(
            records=records,
            keys=keys,
            received=report.received_count,
            lost=report.lost_count,
            duplicates=report.duplicate_count,
            reordered=report.reorder_count,
            harvest_seconds=harvest_seconds,
            stash_seconds=stash_seconds,
        )


def _drop_table(engine: sa.Engine, table: str) -> None:
    import sqlalchemy as sa

    with suppress(Exception), engine.begin() as c:  # best effort clean-up of a demo table
        c.execute(sa.text(f"DROP TABLE {engine.dialect.identifier_preparer.quote(table)}"))


def print_summary(result: DemoResult, stream: TextIO = sys.stdout) -> None:
    rows = [
        ("records stashed", f"{result.records}"),
        ("keys", f"{result.keys}"),
        ("records received", f"{result.received}"),
        ("lost", f"{result.lost}"),
        ("duplicates", f"{result.duplicates}"),
        ("order per key", "held" if result.reordered == 0 else f"BROKEN ({result.reordered} violations)"),
        ("harvest rate", f"{result.rate:,.0f} records/s"),
        ("stash rate", f"{result.records / result.stash_seconds:,.0f} records/s" if result.stash_seconds else "-"),
        ("verdict", "OK" if result.ok else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    print("-" * (width + 24), file=stream)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=stream)
    print("-" * (width + 24), file=stream)


def cmd_demo(args: argparse.Namespace) -> int:
    result = run_demo(
        records=args.records,
        keys=args.keys,
        writers=args.writers,
        data_source=args.data_source,
        bootstrap_servers=args.bootstrap_servers,
        topic=args.topic,
        group=args.group,
    )
    print_summary(result)
    return 0 if result.ok else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    about = (
        "Stash a sample workload into an outbox, harvest it into Kafka and read the topic back, checking "
        "that every record arrived once and in order per key. By default on a temporary SQLite file and the "
        "embedded broker (nothing to install or start); leaves nothing running."
    )
    p = sub.add_parser(
        "demo", help="try the relay end to end: stash, harvest and verify a sample workload (SQLite, embedded broker)",
        description=about,
    )
    p.add_argument("--records", type=int, default=20_000, help="records to stash (default 20000)")
    p.add_argument("--keys", type=int, default=200, help="distinct keys (default 200)")
    p.add_argument("--writers", type=int, default=4, help="concurrent writers (default 4)")
    p.add_argument("--data-source", default=None, help="a database URL instead of a temporary SQLite file")
    p.add_argument("--bootstrap-servers", default=None, help="a real broker instead of the embedded one")
    p.add_argument("--topic", default=None,
                   help="the topic to publish to (default: pyharvest-demo-<random>; name it on a shared cluster)")
    p.add_argument("--group", default=None,
                   help="the leader group id and the name of its leader topic (default: pyharvest-demo-<random>)")
    p.set_defaults(func=cmd_demo)
