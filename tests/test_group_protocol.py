"""``groupProtocol``: the leader group on Kafka's classic group protocol or KIP-848's consumer
protocol. Configuration, the client settings each protocol gets, the group session that keeps
``heartbeatTimeout``'s meaning within the broker's bounds, and the group's start (fake clients)."""

from __future__ import annotations

import logging

import pytest

from pyharvest import Config
from pyharvest.core.config.settings import ReaperConfig
from pyharvest.core.election.group_protocol import (
    GroupSession,
    SessionBounds,
    choose_session,
    leader_client_configs,
    shard_client_configs,
    wanted_session,
)
from pyharvest.core.election.neli import ShardGroup
from pyharvest.core.errors import ConfigError, TopicError
from pyharvest.envconfig import apply_env_overrides
from tests.helpers.group_fakes import Clients
from tests.helpers.waiting import wait_until


def test_classic_is_the_default_and_consumer_is_chosen_in_yaml_or_the_environment(tmp_path) -> None:
    assert Config().resolve().group_protocol == "classic"
    (tmp_path / "reaper.yaml").write_text("harvest:\n  groupProtocol: consumer\n")
    loaded = ReaperConfig.load(str(tmp_path / "reaper.yaml")).harvest.resolve()
    assert loaded.group_protocol == "consumer"
    data = apply_env_overrides({"harvest": {}}, {"PYHARVEST_HARVEST__GROUP_PROTOCOL": "consumer"})
    assert ReaperConfig.from_mapping(data).harvest.resolve().group_protocol == "consumer"
    assert Config(group_protocol="consumer").to_mapping()["groupProtocol"] == "consumer"


def test_an_unknown_protocol_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"groupProtocol.*classic, consumer.*'cooperative'"):
        Config(group_protocol="cooperative").resolve()


def test_under_consumer_the_settings_the_broker_owns_are_not_sent() -> None:
    base = {
        "bootstrap.servers": "k:9092",
        "session.timeout.ms": 9000,
        "heartbeat.interval.ms": 100,
        "partition.assignment.strategy": "range",
    }
    consumer, producer = shard_client_configs(base, "g", 2.0, "consumer")
    assert consumer["group.protocol"] == "consumer" and consumer["group.id"] == "g"
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"} & set(consumer)
    assert producer["delivery.timeout.ms"] == 2000  # a heartbeat is worth nothing after the deadline
    single, _ = leader_client_configs(base, "g", 2.0, "consumer")
    assert "session.timeout.ms" not in single and single["group.protocol"] == "consumer"
    classic, _ = shard_client_configs({"bootstrap.servers": "k:9092"}, "g", 2.0)
    assert "group.protocol" not in classic and classic["session.timeout.ms"] == 6000
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"


def test_the_group_session_is_what_heartbeat_timeout_asks_within_the_brokers_bounds() -> None:
    lowered = SessionBounds(min_session_ms=1000, min_heartbeat_ms=500)
    assert choose_session(2.0, lowered) == (GroupSession(6000, 500, 2000), None)  # interval raised to the minimum
    assert choose_session(2.0, lowered)[0] != wanted_session(2.0)
    assert choose_session(5.0, lowered) == (GroupSession(15_000, 1000, 5000), None)
    assert choose_session(5.0, None) == (wanted_session(5.0), None)  # bounds unknown: as asked
    # Apache Kafka's defaults: a longer session than asked is only slower, and said so at start.
    session, note = choose_session(5.0, SessionBounds())
    assert session == GroupSession(45_000, 5000, 5000)
    assert note is not None and "taken over after up to 45s" in note and "group.consumer.min" in note


def test_a_session_shorter_than_the_fencing_deadline_is_refused() -> None:
    with pytest.raises(TopicError, match="still publishes"):
        choose_session(30.0, SessionBounds(max_session_ms=20_000))


class SessionClients(Clients):
    """Fake clients that also set a consumer-protocol group's session."""

    def __init__(self, bounds: SessionBounds | None, speaks: bool = True, refuse: str = "") -> None:
        super().__init__(4)
        self.bounds, self.speaks, self.refuse = bounds, speaks, refuse
        self.sessions: list[tuple[str, GroupSession]] = []

    def check_consumer_protocol(self, config) -> None:
        if not self.speaks:
            raise TopicError("does not speak Kafka's consumer group protocol")

    def session_bounds(self, config) -> SessionBounds | None:
        return self.bounds

    def set_group_session(self, config, group_id: str, session: GroupSession) -> None:
        if self.refuse:
            raise TopicError(self.refuse)
        self.sessions.append((group_id, session))


def group_of(clients: Clients, config: dict[str, object] | None = None) -> ShardGroup:
    return ShardGroup(
        clients,
        config or {},
        "app.neli",
        "app",
        "me",
        4,
        heartbeat_timeout=2.0,
        min_poll_interval=0.01,
        poll_duration=0.0,
        group_protocol="consumer",
    )


def test_a_consumer_group_gets_its_session_before_it_joins(caplog: pytest.LogCaptureFixture) -> None:
    clients = SessionClients(SessionBounds(min_session_ms=1000, min_heartbeat_ms=500))
    with caplog.at_level(logging.WARNING, "pyharvest.neli"):
        group_of(clients, {"session.timeout.ms": 1}).start()
    assert clients.sessions == [("app", GroupSession(6000, 500, 2000))]
    assert clients.consumer.config["group.protocol"] == "consumer"
    assert "session.timeout.ms" not in clients.consumer.config
    assert "session.timeout.ms in the Kafka configuration not sent" in caplog.text


def test_a_broker_without_the_protocol_fails_the_start() -> None:
    clients = SessionClients(None, speaks=False)
    with pytest.raises(TopicError, match="consumer group protocol"):
        group_of(clients).start()
    assert clients.consumer.on_assign is None  # never joined


def test_a_refused_session_is_said_at_start_and_the_brokers_applies(caplog: pytest.LogCaptureFixture) -> None:
    clients = SessionClients(SessionBounds(), refuse="cannot set the session of group 'app': not authorised")
    with caplog.at_level(logging.WARNING, "pyharvest.neli"):
        group_of(clients).start()
    assert "the broker allows sessions of 45-60s" in caplog.text
    assert "not authorised; the group keeps the broker's session (group.consumer.session.timeout.ms: 45s)" in (
        caplog.text
    )
    assert clients.consumer.on_assign is not None  # joined, on the broker's session


def test_a_refused_session_is_fatal_when_the_brokers_would_expire_a_live_leader() -> None:
    clients = SessionClients(SessionBounds(min_session_ms=1000, default_session_ms=1500), refuse="refused")
    with pytest.raises(TopicError, match="shorter than heartbeatTimeout"):
        group_of(clients).start()


# -- against brokers ----------------------------------------------------------------------


@pytest.mark.kafka
def test_the_embedded_broker_refuses_the_consumer_protocol_at_start_clearly(embedded_bootstrap: str) -> None:
    from pyharvest.bindings.kafka.confluent import ConfluentClients

    group = ShardGroup(
        ConfluentClients(),
        {"bootstrap.servers": embedded_bootstrap},
        "emb.neli",
        "emb",
        "me",
        2,
        heartbeat_timeout=2.0,
        min_poll_interval=0.05,
        poll_duration=0.0,
        group_protocol="consumer",
    )
    with pytest.raises(TopicError, match=r"does not speak Kafka's consumer group protocol.*groupProtocol: classic"):
        group.start()


@pytest.mark.kafka
def test_a_consumer_group_on_apache_kafka_gets_the_session_heartbeat_timeout_asks(
    kafka_config: dict[str, object],
) -> None:
    import uuid

    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from pyharvest.bindings.kafka.confluent import ConfluentClients
    from tests.helpers.fixtures.kafka import on_embedded_broker

    if on_embedded_broker():
        pytest.skip("the embedded broker speaks only the classic group protocol")
    clients, name = ConfluentClients(), f"gp-{uuid.uuid4().hex[:8]}"
    group = ShardGroup(
        clients,
        kafka_config,
        f"{name}.neli",
        name,
        "me",
        2,
        heartbeat_timeout=2.0,
        min_poll_interval=0.05,
        poll_duration=0.0,
        group_protocol="consumer",
    )
    expected, _ = choose_session(2.0, clients.session_bounds(kafka_config))
    group.start()
    try:
        resource = ConfigResource(ResourceType.GROUP, name)
        admin = AdminClient({"bootstrap.servers": str(kafka_config["bootstrap.servers"])})
        found = admin.describe_configs([resource])[resource].result(10)
        assert int(found["consumer.session.timeout.ms"].value) == expected.session_ms
        assert int(found["consumer.heartbeat.interval.ms"].value) == expected.heartbeat_ms

        # It leads both shards on its heartbeats, and readiness (librdkafka's statistics) holds.
        def leading() -> bool:
            group.pulse()
            return all(lease.pulse() for lease in group.leases) and group.broker_connected is True

        wait_until(leading, 30, "the lone member to lead both shards, connected")
    finally:
        group.close()


def test_reapers_preflight_accepts_a_consumer_group_with_the_refused_settings_left_out() -> None:
    from pyharvest._cli import check_harvest_config

    cfg = Config(
        data_source="sqlite://",
        group_protocol="consumer",
        base_kafka_config={"bootstrap.servers": "k:9092", "session.timeout.ms": 10_000},
    ).resolve()
    check_harvest_config(cfg)  # librdkafka would refuse session.timeout.ms beside group.protocol=consumer


def test_a_broker_maximum_below_the_asked_session_is_said_as_such() -> None:
    # The maximum caps the session: the advice is about the maximum, not the minimums.
    session, note = choose_session(5.0, SessionBounds(min_session_ms=1000, max_session_ms=10_000, min_heartbeat_ms=500))
    assert session.session_ms == 10_000
    assert note is not None and "shorter session than asked" in note
    assert "Raise group.consumer.max.session.timeout.ms" in note and "Lower the broker's minimums" not in note


def test_a_session_timeout_in_the_base_config_is_said_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    group = ShardGroup(Clients(1), {"session.timeout.ms": 30_000}, "app.neli", "app", "me", 1,
                       heartbeat_timeout=5.0, min_poll_interval=0.01, poll_duration=0.0)
    with caplog.at_level(logging.WARNING, "pyharvest"):
        group.start()
    group.close()
    [line] = [r.getMessage() for r in caplog.records if "session.timeout.ms" in r.getMessage()]
    assert "session.timeout.ms=30000" in line and "3 x limits.heartbeatTimeout, 15000 ms" in line
    assert "limits.heartbeatTimeout: 10s would give it" in line
    caplog.clear()
    quiet = ShardGroup(Clients(1), {"session.timeout.ms": 15_000}, "app.neli", "app", "me", 1,
                       heartbeat_timeout=5.0, min_poll_interval=0.01, poll_duration=0.0)
    with caplog.at_level(logging.WARNING, "pyharvest"):
        quiet.start()  # already what heartbeatTimeout gives: nothing to say
    quiet.close()
    assert not [r for r in caplog.records if "session.timeout.ms" in r.getMessage()]


@pytest.mark.kafka
def test_a_session_timeout_in_the_base_config_makes_no_producer_warn(
    kafka_config: dict[str, object], caplog: pytest.LogCaptureFixture, tmp_path
) -> None:
    import uuid

    from pyharvest import Harvest, Limits
    from pyharvest.bindings.sql import create_outbox_table

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url)
    cfg = Config(
        base_kafka_config={**kafka_config, "session.timeout.ms": 6000},
        leader_group_id=f"confwarn-{uuid.uuid4().hex[:8]}",
        data_source=url,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    caplog.set_level(logging.DEBUG, logger="pyharvest")
    with Harvest(cfg) as harvest:
        wait_until(lambda: harvest.is_leader, 60, "the harvester to lead")
    assert not [r for r in caplog.records if "CONFWARN" in r.getMessage()], [
        r.getMessage() for r in caplog.records if "CONFWARN" in r.getMessage()]
    # 6000 is what heartbeatTimeout 2s gives: honoured as it stands, so nothing is said.
    assert not [r for r in caplog.records if "is not the leader group's session" in r.getMessage()]


def test_the_single_leader_assigns_stickily_and_an_instance_id_makes_it_static() -> None:
    single, _ = leader_client_configs({"bootstrap.servers": "k:9092", "partition.assignment.strategy": "range"},
                                      "g", 2.0)
    # range gave the one partition to the member id sorting first: a join took leadership.
    assert single["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.instance.id" not in single
    static, _ = leader_client_configs({"bootstrap.servers": "k:9092"}, "g", 2.0, instance_id="reaper-0")
    assert static["group.instance.id"] == "reaper-0"
    sharded, _ = shard_client_configs({"bootstrap.servers": "k:9092"}, "g", 2.0, instance_id="reaper-1")
    assert sharded["group.instance.id"] == "reaper-1"


def test_instance_id_is_a_valid_kafka_id_and_needs_the_classic_protocol() -> None:
    assert Config(instance_id=" reaper-0 ").resolve().instance_id == "reaper-0"
    assert Config.from_mapping({"instanceID": "pod-2"}).instance_id == "pod-2"
    assert Config().resolve().instance_id == ""  # never derived from the name: namesakes would fence each other
    with pytest.raises(ConfigError, match=r"instanceID: 'a b' is not a valid Kafka group.instance.id"):
        Config(instance_id="a b").resolve()
    # librdkafka's static member leaves a consumer-protocol group only for the session's length.
    with pytest.raises(ConfigError, match=r"instanceID: static membership needs groupProtocol: classic"):
        Config(instance_id="reaper-0", group_protocol="consumer").resolve()
