"""The three-node Apache Kafka cluster of ``make kafka-cluster`` (``.ci/kafka/cluster``), as the
cluster fault tests and the cluster benchmark drive it: which node leads a partition or
coordinates a group, stop (SIGTERM), kill (SIGKILL) and restart a node, wait for a full ISR.

Found through ``PYHARVEST_TEST_KAFKA_CLUSTER`` (its bootstrap servers, which ``make test``
exports after starting it). Every node also has a second client listener advertised at a
proxy port (:attr:`Node.proxy_port`): clients that bootstrap at :attr:`KafkaCluster.proxied_bootstrap`
reach every node through a :class:`~tests.helpers.faults.proxy.FaultProxy` the test starts there
(:meth:`KafkaCluster.proxies`), so that a test can cut them off from one node while the
brokers replicate over a listener of their own.

>>> cluster = KafkaCluster.from_environment()
>>> cluster.kill(cluster.leader_of("topic", 0)); cluster.start()
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from pyharvest.bindings.kafka.cluster_probes import offsets_partition
from tests.helpers.faults.proxy import FaultProxy
from tests.helpers.fixtures.kafka import KAFKA_SCRIPT
from tests.helpers.waiting import wait_until

__all__ = ["CLUSTER_ENV", "CLUSTER_SCRIPT", "KafkaCluster", "Node"]

CLUSTER_ENV = "PYHARVEST_TEST_KAFKA_CLUSTER"
CLUSTER_SCRIPT = KAFKA_SCRIPT.parent / "cluster"


@dataclass(frozen=True)
class Node:
    id: int
    port: int
    controller_port: int
    replication_port: int
    fault_port: int
    proxy_port: int


class KafkaCluster:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap_servers = bootstrap
        ports = [int(server.rsplit(":", 1)[1]) for server in bootstrap.split(",")]
        self._env = {**os.environ, "KAFKA_CLUSTER_PORTS": " ".join(map(str, ports))}
        self._admin: AdminClient | None = None
        self.nodes = {
            int(fields[0]): Node(*map(int, fields))
            for fields in (line.split() for line in self._run("nodes").splitlines())
        }

    @classmethod
    def from_environment(cls) -> KafkaCluster | None:
        bootstrap = os.environ.get(CLUSTER_ENV, "").strip()
        return cls(bootstrap) if bootstrap else None

    @property
    def proxied_bootstrap(self) -> str:
        """Bootstrap servers through the proxies of :meth:`proxies`."""
        return ",".join(f"127.0.0.1:{n.proxy_port}" for n in self.nodes.values())

    def _run(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(["bash", str(CLUSTER_SCRIPT), *args], env=self._env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{CLUSTER_SCRIPT} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    # -- faults --------------------------------------------------------------------------

    def start(self, *nodes: int) -> None:
        """Start the nodes that are down (or ``nodes``) and return once all three serve."""
        self._run("start", *map(str, nodes))

    def stop(self, node: int) -> None:
        """SIGTERM: a controlled shutdown (its leaderships move first); returns once it exited."""
        self._run("stop", str(node))

    def kill(self, node: int) -> None:
        """SIGKILL: a crash; returns once it is gone."""
        self._run("kill", str(node))

    def running(self) -> set[int]:
        out = set()
        for n in self.nodes:
            with contextlib.suppress(RuntimeError):
                self._run("pid", str(n))
                out.add(n)
        return out

    @contextlib.contextmanager
    def proxies(self) -> Iterator[dict[int, FaultProxy]]:
        """A FaultProxy per node at its proxy port, in front of its second client listener."""
        with contextlib.ExitStack() as stack:
            yield {
                n.id: stack.enter_context(FaultProxy(upstream=("127.0.0.1", n.fault_port), listen_port=n.proxy_port))
                for n in self.nodes.values()
            }

    # -- what the cluster says ---------------------------------------------------------------

    def admin(self) -> AdminClient:
        """One admin client, kept: librdkafka (2.16) can abort the process when an admin client
        is destroyed with a request still in flight, which a fault makes likely."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                                       "logger": lambda *a: None})
        return self._admin

    def leader_of(self, topic: str, partition: int = 0) -> int | None:
        """The node that leads the partition; None while it has none (or the cluster does not say)."""
        try:
            leader = int(self.admin().list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)
        except Exception:  # noqa: BLE001 - a cluster under a fault: ask again
            return None
        return leader if leader >= 0 else None

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the node that leads it (-1: none)."""
        parts = self.admin().list_topics(topic, timeout=10).topics[topic].partitions
        return {p: int(m.leader) for p, m in parts.items()}

    def coordinator_of(self, group: str) -> int | None:
        """The node that coordinates the group (the leader of its ``__consumer_offsets``
        partition); None while it has none. Not DescribeGroups: librdkafka can abort the process
        on a coordinator request whose coordinator dies meanwhile (seen here twice)."""
        try:
            parts = self.admin().list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"].partitions
            leader = int(parts[offsets_partition(group, len(parts))].leader)
        except Exception:  # noqa: BLE001 - a coordinator moving: ask again
            return None
        return leader if leader >= 0 else None

    def under_replicated(self, topics: Iterable[str] | None = None) -> list[str]:
        """The partitions (of ``topics``, else of every topic) whose ISR is not all replicas."""
        metadata = self.admin().list_topics(timeout=10)
        wanted = set(topics) if topics is not None else set(metadata.topics)
        return [f"{t}[{p}] isr {sorted(m.isrs)} of {sorted(m.replicas)}"
                for t in sorted(wanted) for p, m in sorted(metadata.topics[t].partitions.items())
                if len(m.isrs) < len(m.replicas) or m.leader < 0]

    def wait_full_isr(self, timeout: float = 120.0, topics: Iterable[str] | None = None) -> None:
        """Every node runs, and every partition has all its replicas in sync."""
        left = ["(not checked yet)"]

        def full() -> bool:
            nonlocal left
            try:
                metadata = self.admin().list_topics(timeout=5)
                if len(metadata.brokers) != len(self.nodes):
                    left = [f"{len(metadata.brokers)} of {len(self.nodes)} brokers known"]
                    return False
                left = self.under_replicated(topics)
            except Exception as e:  # noqa: BLE001 - a node coming back: ask again
                left = [str(e)]
            return not left

        wait_until(full, timeout, lambda: f"a full ISR: {left[:5]}", interval=0.25)

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Best effort: a cluster kept across runs recovers every partition after a SIGKILL, so
        tests delete what they created (a node's restart took 31 s with 150 partitions, loaded)."""
        futures = self.admin().delete_topics(list(topics), operation_timeout=10, request_timeout=15)
        for future in futures.values():
            with contextlib.suppress(Exception):
                future.result(20)

    def heal(self) -> None:
        """Every node up and in sync: what each test starts from (a failed one may have left a node down)."""
        if self.running() != set(self.nodes):
            self.start()
        self.wait_full_isr()
