"""Exit 0 once the Kafka at argv[1] answers metadata and its group coordinator is up.

An open port is not enough: a KRaft broker accepts connections before it has registered with
its controller, and the first consumer group waits for ``__consumer_offsets`` to be created.
Asking a group's committed offsets creates that topic, so the first test does not pay for it.
argv[2] is how many seconds to try.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def main(bootstrap: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    quiet = {"bootstrap.servers": bootstrap, "log_level": 0, "logger": lambda *a: None}
    while True:
        try:
            meta = AdminClient(quiet).list_topics(timeout=max(0.5, deadline - time.monotonic()))
            if meta.brokers:
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
            print("not ready: no broker in the metadata", file=sys.stderr)
            return 1
        time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0))
