"""A Kafka property librdkafka refuses is reported under the YAML key it came from."""

from __future__ import annotations

import pytest

from pyharvest import Config, Limits
from pyharvest.core.config.kafka_origins import property_origin
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.errors import ConfigError, KafkaPropertyError
from tests.helpers.fakes import FakeBinding, FakeKafka

SECTIONS = (("x.producerKafkaConfig", {"acks": "lots"}), ("x.baseKafkaConfig", {"delivery.timeout.ms": -5, "acks": 1}))


@pytest.mark.parametrize(
    ("prop", "origin"),
    [
        ("request.required.acks", "x.producerKafkaConfig[acks]"),  # librdkafka's name for acks; the first section wins
        ("message.timeout.ms", "x.baseKafkaConfig[delivery.timeout.ms]"),  # and for delivery.timeout.ms
        ("session.timeout.ms", "x.limits.heartbeatTimeout"),  # computed by pyharvest
        ("fetch.wait.max.ms", None),  # nobody set it
    ],
)
def test_property_origin(prop, origin):
    assert property_origin(prop, SECTIONS, {"session.timeout.ms": "x.limits.heartbeatTimeout"}) == origin


def refused(prop: str) -> KafkaPropertyError:
    detail = f'Configuration property "{prop}" value 1 is outside allowed range'
    return KafkaPropertyError(f"invalid Kafka client configuration: {detail}", prop, detail)


class RefusingKafka(FakeKafka):
    def __init__(self, client: str, prop: str) -> None:
        super().__init__()
        self.client, self.prop = client, prop

    def producer(self, config):
        if self.client == "producer":
            raise refused(self.prop)
        return super().producer(config)

    def leader_consumer(self, config):
        if self.client == "consumer":
            raise refused(self.prop)
        return super().leader_consumer(config)


@pytest.mark.parametrize(
    ("client", "prop", "kafka_config", "key"),
    [
        ("consumer", "session.timeout.ms", {}, "harvest.limits.heartbeatTimeout"),
        ("producer", "message.timeout.ms", {"delivery.timeout.ms": -5}, "harvest.producerKafkaConfig[delivery.timeout.ms]"),
    ],
)
def test_the_harvester_names_the_key_at_start(client, prop, kafka_config, key):
    cfg = Config(leader_group_id="app", data_source="fake://", producer_kafka_config=kafka_config,
                 limits=Limits(heartbeat_timeout=0.5, min_poll_interval=0.005))
    engine = HarvestEngine(cfg, binding=FakeBinding(), kafka=RefusingKafka(client, prop))
    with pytest.raises(ConfigError) as info:
        engine.start()
    assert str(info.value).startswith(f"{key}: sets Kafka's {prop!r}, and librdkafka refuses it")


def test_a_property_nobody_set_stays_a_kafka_error():
    engine = HarvestEngine(Config(leader_group_id="app", data_source="fake://"), binding=FakeBinding(),
                           kafka=RefusingKafka("consumer", "fetch.wait.max.ms"))
    with pytest.raises(KafkaPropertyError):
        engine.start()


def test_the_sharded_harvester_names_the_key_at_start(tmp_path):
    from pyharvest.bindings.sql import create_binding, create_outbox_table
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url, "outbox", shards=2)
    cfg = Config(leader_group_id="app", data_source=url, shards=2, limits=Limits(heartbeat_timeout=0.5))
    engine = ShardedHarvestEngine(cfg, binding=lambda: create_binding(url, "outbox"),
                                  kafka=RefusingKafka("consumer", "session.timeout.ms"))
    with pytest.raises(ConfigError, match=r"^harvest\.limits\.heartbeatTimeout: "):
        engine.start()
