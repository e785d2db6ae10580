"""Exit 0 once the Kafka at argv[1] answers metadata and its group coordinator is up.

An open port is not enough: a KRaft broker accepts connections before it has registered with
its controller, and the first consumer group waits for ``__consumer_offsets`` to be created.
Asking a group's committed offsets creates that topic, so the first test does not pay for it.
argv[2] is how many seconds to try; argv[3] (default 1) how many brokers the metadata must list: a
cluster's node that has not registered with the active controller is not listed, and none is
while the controllers' quorum has no leader.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def main(bootstrap: str, seconds: float, brokers: int = 1) -> int:
    deadline = time.monotonic() + seconds
    quiet = {"bootstrap.servers": bootstrap, "log_level": 0, "logger": lambda *a: None}
    while True:
        try:
            meta = AdminClient(quiet).list_topics(timeout=max(0.5, deadline - time.monotonic()))
            if len(meta.brokers) >= brokers:
                consumer = Consumer({**quiet, "group.id": "pyharvest-kafka-ready", "enable.auto.commit": False})
                try:
                    consumer.committed([TopicPartition("pyharvest-kafka-ready", 0)], timeout=max(1.0, deadline - time.monotonic()))
                    return 0
                finally:
                    consumer.close()
        except KafkaException as e:
            if time.monotonic() >= deadline:
                print(f"not ready: {e}", file=sys.stderr)
                return 1
        if time.monotonic() >= deadline:
            print(f"not ready: {len(meta.brokers)} of {brokers} broker(s) in the metadata", file=sys.stderr)
            return 1
        time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0,
                          int(sys.argv[3]) if len(sys.argv) > 3 else 1))
