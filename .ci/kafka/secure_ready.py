"""Exit 0 once the secured Kafka answers its super user over SASL_SSL and serves groups.

argv[1] is the super user's client settings (librdkafka ``key=value`` lines: the script's
``admin.properties``), argv[2] how many seconds to try. As ``ready.py`` does for the plain
broker, it waits for metadata and for the group coordinator (asking a group's committed
offsets creates ``__consumer_offsets``), and it checks that SCRAM logins work: an
authentication failure ends the wait at once, naming it.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def read_properties(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                out[key.strip()] = value.strip()
    return out


def main(properties: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    config = {**read_properties(properties), "log_level": 0, "logger": lambda *a: None}
    while True:
        try:
            meta = AdminClient(config).list_topics(timeout=max(0.5, deadline - time.monotonic()))
            if meta.brokers:
                consumer = Consumer({**config, "group.id": "pyharvest-kafka-ready", "enable.auto.commit": False})
                try:
                    consumer.committed([TopicPartition("pyharvest-kafka-ready", 0)],
                                       timeout=max(1.0, deadline - time.monotonic()))
                    return 0
                finally:
                    consumer.close()
        except KafkaException as e:
            if "Authentication" in str(e) or time.monotonic() >= deadline:
                print(f"not ready: {e}", file=sys.stderr)
                return 1
        if time.monotonic() >= deadline:
            print("not ready: no broker in the metadata", file=sys.stderr)
            return 1
        time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0))
