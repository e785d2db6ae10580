"""A writer process for tests: stashes batches round-robin over its keys until told to stop.

    python -m tests.helpers.stash_writer URL TABLE TOPIC OUT STOP

Each committed batch is appended to OUT as ``key value`` lines (so a test reads what was
committed, in order, while the process runs); the process stops once the file STOP exists,
and prints how many transactions the outbox refused as ``refused N``. A transaction the
stasher reports as refused because the table changed (:class:`OutboxTableChangedError`) is
run again with the same records, as an application would.
"""

from __future__ import annotations

import os
import sys
import time

import sqlalchemy as sa

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.errors import OutboxTableChangedError
from pyharvest.stasher import Stasher

KEYS = 40
BATCH = 10


def main(url: str, table: str, topic: str, out: str, stop: str) -> None:
    engine = sa.create_engine(url)
    stasher = Stasher(table)  # one for the process's life: it reads the table's shape once
    keys = [f"k{i}" for i in range(KEYS)]
    seq = dict.fromkeys(keys, 0)
    refused = i = 0
    with open(out, "a") as committed:
        while not os.path.exists(stop):
            batch = []
            for _ in range(BATCH):
                key = keys[i % KEYS]
                i += 1
                batch.append((key, f"{key}:{seq[key]}"))
                seq[key] += 1
            while True:
                try:
                    with engine.begin() as tx:
                        for key, value in batch:
                            stasher.stash(tx, OutboxRecord(topic, key, value.encode()))
                    break
                except OutboxTableChangedError:
                    refused += 1
            committed.write("".join(f"{k} {v}\n" for k, v in batch))
            committed.flush()
            # fixed sleep: the writer's pace (an application's commits, not a tight loop on a
            # shared machine); its stop is a file the test creates, no Event to wait on.
            time.sleep(0.002)
    engine.dispose()
    print(f"refused {refused}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
