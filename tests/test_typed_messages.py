"""Typed messages against a real schema registry (Apicurio Registry, its Confluent-compatible
API) and Apache Kafka: values serialised at stash time arrive framed and decode; what a schema
or the registry refuses is refused at stash time with nothing written; publishing never asks
the registry; CloudEvents headers read back with the SDK.

The outbox is SQLite (stored bytes are bytes on every database; the binary round trip per
database is tests/test_harvest_e2e.py's)."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

pytest.importorskip("confluent_kafka.schema_registry.avro", reason="needs pyharvest[schema-registry]")

from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer  # noqa: E402
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

from pyharvest import Config, Harvest, Limits, OutboxRecord  # noqa: E402
from pyharvest.bindings.sql import create_outbox_table  # noqa: E402
from pyharvest.stasher import (  # noqa: E402
    CloudEvents,
    SchemaMismatchError,
    SchemaRegistryError,
    Stasher,
    registry_client,
)
from tests.helpers.faults.proxy import FaultProxy  # noqa: E402
from tests.helpers.outbox import outbox_count, wait_empty  # noqa: E402
from tests.helpers.topics import create_topic, read_topic  # noqa: E402

pytestmark = pytest.mark.kafka

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "pyharvest.test",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
               {"name": "lines", "type": {"type": "array", "items": {
                   "type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}]}}}],
}
# v2 adds a field with a default: BACKWARD compatible (a v2 reader reads v1 records).
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
# A new field without a default: a v2 reader could not read v1 records, so BACKWARD refuses it.
ORDER_BAD = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "n", "type": "int"}]}
ORDER_JSON = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number"},
                   "customer": {"type": "object", "properties": {"age": {"type": "integer"}}}},
    "required": ["id", "amount"],
}


@pytest.fixture
def outbox(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url, "outbox")
    return url


@pytest.fixture
def topic() -> str:
    return f"typed-{uuid.uuid4().hex[:10]}"


def order(i: int, **extra: object) -> dict[str, object]:
    return {"id": f"o{i}", "amount": float(i), "lines": [{"sku": f"s{i}"}], **extra}


def stash(url: str, stasher: Stasher, records: list[OutboxRecord]) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as tx:
            stasher.stash_many(tx, records)
    finally:
        engine.dispose()


def harvest_all(url: str, bootstrap: str, expect: int, topic: str) -> list[tuple[int, str, bytes | None, list]]:
    config = Config(
        base_kafka_config={"bootstrap.servers": bootstrap}, leader_group_id=f"typed-{uuid.uuid4().hex[:8]}",
        data_source=url, outbox_table="outbox", limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    with Harvest(config):
        wait_empty(url, "outbox", 60)
    return read_topic(bootstrap, topic, expect=expect)


def stored_values(url: str) -> list[bytes]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [row[0] for row in c.execute(sa.text("SELECT kafka_value FROM outbox ORDER BY id"))]
    finally:
        engine.dispose()


def test_avro_values_are_framed_at_stash_and_published_as_stored(schema_registry_url, kafka_bootstrap, outbox, topic):
    client = registry_client(schema_registry_url)
    stasher = Stasher(value_serializer=AvroSerializer(client, json.dumps(ORDER_V1)))
    create_topic(kafka_bootstrap, topic, partitions=1)
    stash(outbox, stasher, [OutboxRecord(topic, f"k{i % 3}", order(i)) for i in range(30)])
    stored = stored_values(outbox)
    # Confluent's framing: magic byte 0, then the schema id.
    assert all(v[0] == 0 for v in stored) and len({v[1:5] for v in stored}) == 1
    got = harvest_all(outbox, kafka_bootstrap, 30, topic)
    # The harvester published the stored bytes unchanged: it has no registry to ask.
    assert sorted(v for _p, _k, v, _h in got) == sorted(stored)
    decode = AvroDeserializer(client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    per_key: dict[str, list[object]] = {}
    for _p, key, value, _h in got:
        per_key.setdefault(key, []).append(decode(value, ctx)["id"])
    assert per_key == {f"k{k}": [f"o{i}" for i in range(30) if i % 3 == k] for k in range(3)}


def test_a_backlog_written_across_a_schema_change_decodes_row_by_row(schema_registry_url, kafka_bootstrap, outbox, topic):
    client = registry_client(schema_registry_url)
    v1, v2 = AvroSerializer(client, json.dumps(ORDER_V1)), AvroSerializer(client, json.dumps(ORDER_V2))
    create_topic(kafka_bootstrap, topic, partitions=1)
    stash(outbox, Stasher(value_serializer=v1), [OutboxRecord(topic, "k", order(i)) for i in range(5)])
    stash(outbox, Stasher(value_serializer=v2), [OutboxRecord(topic, "k", order(i, currency="SEK")) for i in range(5, 10)])
    ids = {v[1:5] for v in stored_values(outbox)}
    assert len(ids) == 2  # every row says which schema wrote it
    got = harvest_all(outbox, kafka_bootstrap, 10, topic)
    decode = AvroDeserializer(client)  # the writer's schema of each message, from its id
    ctx = SerializationContext(topic, MessageField.VALUE)
    decoded = [decode(value, ctx) for _p, _k, value, _h in got]
    assert [d["id"] for d in decoded] == [f"o{i}" for i in range(10)]
    assert [d.get("currency") for d in decoded] == [None] * 5 + ["SEK"] * 5
    # A consumer on v2 reads the v1 records too, with the default filled in.
    as_v2 = AvroDeserializer(client, json.dumps(ORDER_V2))
    assert [as_v2(value, ctx)["currency"] for _p, _k, value, _h in got] == ["EUR"] * 5 + ["SEK"] * 5


def test_json_schema_values_are_checked_with_the_failing_field_named(schema_registry_url, outbox, topic):
    client = registry_client(schema_registry_url)
    stasher = Stasher(value_serializer=JSONSerializer(json.dumps(ORDER_JSON), client))
    stash(outbox, stasher, [OutboxRecord(topic, "k", {"id": "a", "amount": 2})])
    with pytest.raises(SchemaMismatchError, match=r"at \$\.customer\.age: 'old' is not of type 'integer'"):
        stash(outbox, stasher, [OutboxRecord(topic, "k", {"id": "b", "amount": 3, "customer": {"age": "old"}})])
    with pytest.raises(SchemaMismatchError, match="'amount' is a required property"):
        stash(outbox, stasher, [OutboxRecord(topic, "k", {"id": "c"})])
    (value,) = stored_values(outbox)  # the refused transactions wrote nothing
    assert JSONDeserializer(json.dumps(ORDER_JSON))(value, SerializationContext(topic, MessageField.VALUE)) == {
        "id": "a", "amount": 2}


def test_avro_refusals_name_the_field_and_write_nothing(schema_registry_url, outbox, topic):
    stasher = Stasher(value_serializer=AvroSerializer(registry_client(schema_registry_url), json.dumps(ORDER_V1)))
    engine = sa.create_engine(outbox)
    with engine.begin() as tx:
        for bad, why in [
            ({"id": "a", "amount": "x", "lines": []}, "Order.amount is <x> of type <class 'str'> expected double"),
            ({"id": "a", "lines": []}, "Order.amount"),
            ({"id": "a", "amount": 1.0, "lines": [{"sku": 3}]}, "Line.sku is <3> of type <class 'int'> expected string"),
        ]:
            with pytest.raises(SchemaMismatchError, match=f"topic '{topic}' \\(key 'k'\\).*{re.escape(why)}"):
                stasher.stash(tx, OutboxRecord(topic, "k", bad))
        assert tx.execute(sa.text("SELECT count(*) FROM outbox")).scalar() == 0
    engine.dispose()


def test_protobuf_values_are_framed_and_decode_without_the_registry(schema_registry_url, outbox, topic):
    from google.protobuf import wrappers_pb2

    serializer = ProtobufSerializer(wrappers_pb2.StringValue, registry_client(schema_registry_url),
                                    {"use.deprecated.format": False})
    stash(outbox, Stasher(value_serializer=serializer), [OutboxRecord(topic, "k", wrappers_pb2.StringValue(value="hi"))])
    (value,) = stored_values(outbox)
    assert value[0] == 0
    # Apicurio answers ?format=serialized with 500, so the deserialiser is built without a client.
    decode = ProtobufDeserializer(wrappers_pb2.StringValue, {"use.deprecated.format": False})
    assert decode(value, SerializationContext(topic, MessageField.VALUE)).value == "hi"
    with pytest.raises(SchemaMismatchError, match="StringValue"):
        stash(outbox, Stasher(value_serializer=serializer), [OutboxRecord(topic, "k", {"value": "not a message"})])


def test_an_incompatible_schema_is_refused_when_first_registered(schema_registry_url, outbox, topic):
    client = registry_client(schema_registry_url)
    stash(outbox, Stasher(value_serializer=AvroSerializer(client, json.dumps(ORDER_V1))), [OutboxRecord(topic, "k", order(1))])
    bad = Stasher(value_serializer=AvroSerializer(client, json.dumps(ORDER_BAD)))
    with pytest.raises(SchemaRegistryError, match=r"refused the schema as incompatible .*HTTP 409"):
        stash(outbox, bad, [OutboxRecord(topic, "k", order(2, n=1))])
    assert outbox_count(outbox, "outbox") == 1


def test_auto_registration_off_refuses_an_unregistered_schema(schema_registry_url, outbox, topic):
    serializer = AvroSerializer(registry_client(schema_registry_url), json.dumps(ORDER_V1),
                                conf={"auto.register.schemas": False})
    with pytest.raises(SchemaRegistryError, match="refused the request"):
        stash(outbox, Stasher(value_serializer=serializer), [OutboxRecord(topic, "k", order(1))])
    assert outbox_count(outbox, "outbox") == 0


def test_a_registry_that_goes_away_costs_only_uncached_schemas(schema_registry_url, outbox, topic):
    host, port = schema_registry_url.split("//", 1)[1].split("/", 1)[0].split(":")
    with FaultProxy(upstream=(host, int(port))) as proxy:
        via = f"http://{proxy.address[0]}:{proxy.address[1]}/apis/ccompat/v7"
        cached = Stasher(value_serializer=AvroSerializer(registry_client(via, timeout=2), json.dumps(ORDER_V1)))
        stash(outbox, cached, [OutboxRecord(topic, "k", order(1))])  # registers, and caches the id
        proxy.refuse()
        stash(outbox, cached, [OutboxRecord(topic, "k", order(2))])  # still stashes
        uncached = Stasher(value_serializer=AvroSerializer(registry_client(via, timeout=2), json.dumps(ORDER_V2)))
        with pytest.raises(SchemaRegistryError, match=f"registry at {via} could not be reached"):
            stash(outbox, uncached, [OutboxRecord(f"{topic}-other", "k", order(3))])
        proxy.heal()
        proxy.blackhole()  # accepts and never answers: bounded by the client's timeout
        started = time.monotonic()
        with pytest.raises(SchemaRegistryError, match="could not be reached"):
            stash(outbox, uncached, [OutboxRecord(f"{topic}-other", "k", order(3))])
        assert time.monotonic() - started < 60  # bounded, not a hang (the timeout is 2 s)
    assert outbox_count(outbox, "outbox") == 2


def test_a_registry_client_without_a_timeout_is_refused(schema_registry_url):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry_url}), json.dumps(ORDER_V1))
    with pytest.raises(ValueError, match="has no timeout.*registry_client"):
        Stasher(value_serializer=serializer)


def test_cloudevents_headers_read_back_with_the_sdk(schema_registry_url, kafka_bootstrap, outbox, topic):
    try:  # cloudevents 2 keeps the 1.x API under v1
        from cloudevents.v1.kafka import KafkaMessage, from_binary
    except ImportError:
        from cloudevents.kafka import KafkaMessage, from_binary

    client = registry_client(schema_registry_url)
    stasher = Stasher(
        value_serializer=AvroSerializer(client, json.dumps(ORDER_V1)),
        cloud_events=CloudEvents(source="/shop/orders", type=lambda r: f"com.example.{r.topic}.created"),
    )
    create_topic(kafka_bootstrap, topic, partitions=1)
    own = OutboxRecord(topic, "k", order(1), headers=[("ce_type", "com.example.order.refunded"), ("trace", "t1")])
    stash(outbox, stasher, [OutboxRecord(topic, "k", order(0)), own])
    got = harvest_all(outbox, kafka_bootstrap, 2, topic)
    events = []
    for _p, key, value, headers in got:
        message = KafkaMessage(headers={k: v for k, v in headers}, key=key.encode(), value=value)
        events.append(from_binary(message, data_unmarshaller=lambda b: b))
    first, second = events
    assert first["specversion"] == "1.0" and first["source"] == "/shop/orders"
    assert first["type"] == f"com.example.{topic}.created" and second["type"] == "com.example.order.refunded"
    assert first["id"] != second["id"] and first["time"] and first["datacontenttype"] == "application/avro"
    decode = AvroDeserializer(client)
    assert decode(first.data, SerializationContext(topic, MessageField.VALUE))["id"] == "o0"


def test_the_inbox_hands_its_handler_decoded_values_and_dead_letters_what_does_not_decode(
    schema_registry_url, kafka_bootstrap, tmp_path, topic
):
    from pyharvest.inbox import Inbox, InboxTables
    from tests.helpers.inbox.tools import identity, inbox_config, produce
    from tests.helpers.waiting import wait_until

    client = registry_client(schema_registry_url)
    encode = AvroSerializer(client, json.dumps(ORDER_V1))
    ctx = SerializationContext(topic, MessageField.VALUE)
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, [
        ("k1", encode(order(1), ctx), identity("g/o", 1)),
        ("k2", b"\x00\x00\x00\xff\xffnot avro", identity("g/o", 2)),  # a schema id no registry has
        ("k3", encode(order(3), ctx), identity("g/o", 3)),
    ])
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    config = inbox_config({"bootstrap.servers": kafka_bootstrap}, url, topic, "typed", error_policy="dead-letter")
    seen: list[tuple[str | None, object]] = []
    with Inbox(config, lambda tx, m: seen.append((m.key_text, m.value)), value_deserializer=AvroDeserializer(client)):
        wait_until(lambda: any(k == "k3" for k, _ in seen), 60, "the last message, which decodes")
        dead = InboxTables.build("typed_cp", "typed_dd", "typed_dl").dead_letter
        engine = sa.create_engine(url)

        def stored() -> list[tuple[str, str]]:
            with engine.connect() as c:
                return [tuple(r) for r in c.execute(sa.select(dead.c.status, dead.c.error))]

        wait_until(lambda: stored(), 30, "the undecodable message's dead letter")
        engine.dispose()
    # The batch that met the bad value rolled back and was applied again without it: the
    # handler's last calls are what committed.
    assert seen[-2:] == [("k1", order(1)), ("k3", order(3))] and all(k != "k2" for k, _ in seen)
    ((status, error),) = stored()
    assert status == "dead" and "did not decode with AvroDeserializer" in error
