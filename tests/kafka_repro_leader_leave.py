"""The embedded broker's (Tansu 0.6) stalled rebalance, shown with plain consumers.

    python -m tests.kafka_repro_leader_leave

A and B share a six-partition topic; C joins, and while that rebalance is under way A, the
group leader, closes (LeaveGroup). On Apache Kafka the coordinator picks another leader and B and
C share the partitions within seconds. On Tansu 0.6 every JoinGroup response keeps naming A as
the leader, no SyncGroup completes, and nobody owns a partition for minutes. A leader that is
killed instead (no LeaveGroup) is replaced once its session times out. Not a test: it documents
why ``tests/test_sharded_chaos.py`` stops processes gracefully only in a settled group there.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from pyharvest.bindings.kafka.embedded import EmbeddedBroker
from tests.helpers.waiting import wait_until


class Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.config = {"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                       "partition.assignment.strategy": "cooperative-sticky"}
        self.topic, self.owned, self.stopping = topic, set[int](), threading.Event()
        self.member_id = ""  # the coordinator's answer to its JoinGroup: it is in a rebalance
        self.start()

    def run(self) -> None:
        consumer = Consumer(self.config)
        consumer.subscribe([self.topic], on_assign=lambda c, ps: self.owned.update(p.partition for p in ps),
                           on_revoke=lambda c, ps: self.owned.difference_update(p.partition for p in ps))
        while not self.stopping.is_set():
            consumer.poll(0.1)
            self.member_id = consumer.memberid() or ""
        consumer.close()  # LeaveGroup

    def leave(self) -> None:
        self.stopping.set()
        self.join()


def main() -> None:
    with EmbeddedBroker() as broker:
        bootstrap, topic, group = broker.bootstrap_servers, f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
        admin.create_topics([NewTopic(topic, 6)])[topic].result(15)
        a = Member(bootstrap, group, topic)
        wait_until(lambda: len(a.owned) == 6, 60, "A to own every partition (it leads the group)")
        b = Member(bootstrap, group, topic)
        wait_until(lambda: len(a.owned) + len(b.owned) == 6 and b.owned, 60, "A and B to share the partitions")
        c = Member(bootstrap, group, topic)
        wait_until(lambda: c.member_id, 60, "C's JoinGroup to be answered")  # C's rebalance is under way
        a.leave()
        left = time.monotonic()
        with contextlib.suppress(AssertionError):  # stalled: what B and C own is the finding
            wait_until(lambda: len(b.owned) + len(c.owned) == 6, 60, "B and C to share the partitions", interval=0.1)
        print(f"{time.monotonic() - left:.0f}s after the leader left mid-rebalance, B owns {sorted(b.owned)} "
              f"and C owns {sorted(c.owned)}")
        b.leave()
        c.leave()


if __name__ == "__main__":
    main()
