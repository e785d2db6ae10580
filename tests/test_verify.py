"""The ordering-and-loss verifier: goharvest's FAQ examples exactly, loss, unexpected
records, many keys; then a real topic, and the ``reaper verify`` command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import ClassVar

import pytest

from pyharvest._commands import verify as verify_command
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.verify import VerifyError, VerifyReport, expected_from_records, parse_identity, verify, verify_topic

R = ["R0", "R1", "R2"]


def check(received: str, expected: list[str] = R, key: str = "k") -> VerifyReport:
    return verify([(key, x) for x in expected], [(key, x) for x in received.split()])


# ---------------------------------------------------------------------- the FAQ's examples


@pytest.mark.parametrize("received", ["R0 R1 R2", "R0 R1 R1 R2", "R0 R1 R1 R1 R2", "R0 R0 R1 R2 R2"])
def test_in_order_with_one_off_duplicates_is_ok(received):
    report = check(received)
    assert report.ok, report
    assert report.duplicate_count == len(received.split()) - 3
    assert report.reorder_count == 0 and not report.lost


def test_one_off_duplicate_is_counted_with_an_example():
    report = check("R0 R1 R1 R1 R2")
    assert report.duplicate_count == 2
    assert [(d.key, d.identity, d.extra_copies) for d in report.duplicates] == [("k", "R1", 2)]
    assert "duplicates" in str(report)


def test_r0_r2_r1_is_a_reorder():
    report = check("R0 R2 R1")
    assert not report.ok
    assert report.reorder_count == 1 and not report.lost
    (r,) = report.reordered["k"]
    assert (r.identity, r.position, r.expected_index, r.after, r.after_index) == ("R1", 2, 1, "R2", 2)
    assert r.excerpt == ("R0", "R2", "R1")
    assert "#1 (R1) came after #2 (R2), at position 2: R0 R2 >R1<" in str(report)


def test_replayed_sequence_is_a_reorder():
    report = check("R0 R1 R2 R0 R1 R2")
    assert not report.ok
    assert not report.lost and report.duplicate_count == 0
    first = report.reordered["k"][0]
    assert (first.identity, first.position) == ("R0", 3)  # the mid-point, where R0 follows R2
    assert first.excerpt == ("R0", "R1", "R2", "R0", "R1", "R2")


def test_late_repeat_is_a_reorder_not_a_duplicate():
    report = check("R0 R1 R2 R1")
    assert not report.ok and report.reorder_count == 1 and report.duplicate_count == 0


def test_gap_is_a_loss_not_a_reorder():
    report = check("R0 R2")
    assert not report.ok
    assert dict(report.lost) == {"k": ("R1",)} and report.lost_count == 1
    assert report.reorder_count == 0


def test_gap_filled_late_is_a_reorder_not_a_loss():
    report = check("R2 R0 R1")
    assert not report.lost
    assert report.reorder_count == 2


def test_missing_tail_and_missing_key_are_lost():
    report = verify([("a", 1), ("a", 2), ("b", 1)], [("a", 1)])
    assert dict(report.lost) == {"a": (2,), "b": (1,)}
    assert (report.expected_count, report.received_count) == (3, 1)
    assert "lost (2 records in 2 keys)" in str(report)


def test_unexpected_records_and_keys():
    report = verify([("a", 1), ("a", 2)], [("a", 1), ("a", 99), ("a", 99), ("z", 1), ("a", 2)])
    assert not report.ok
    assert report.unexpected_count == 3
    assert report.unexpected == (("a", 99), ("a", 99), ("z", 1))
    assert not report.lost and report.reorder_count == 0 and report.duplicate_count == 0


def test_identity_repeating_within_a_key():
    expected = ["set", "unset", "set"]
    assert check("set unset set", expected).ok
    assert check("set set unset set set", expected).ok
    assert dict(check("set set", expected).lost) == {"k": ("unset", "set")}
    assert check("set unset set unset", expected).reorder_count == 1


def test_many_keys_interleaved_with_one_bad_key():
    keys = [f"key-{i}" for i in range(200)]
    expected = [(k, f"{k}/{n}") for n in range(20) for k in keys]
    received = list(expected)
    # Swap two records of one key: a reorder there, nothing anywhere else.
    i = received.index(("key-7", "key-7/3"))
    j = received.index(("key-7", "key-7/4"))
    received[i], received[j] = received[j], received[i]
    report = verify(expected, received)
    assert report.reorder_count == 1 and list(report.reordered) == ["key-7"]
    assert not report.lost and report.unexpected_count == 0


def test_a_million_messages_in_a_few_seconds():
    expected = [(f"k{i % 5000}", i) for i in range(1_000_000)]
    received = list(expected)
    received.insert(1234, received[1233])  # one immediate duplicate
    started = time.monotonic()
    report = verify(expected, iter(received))
    assert time.monotonic() - started < 10
    assert report.ok and report.duplicate_count == 1 and report.received_count == 1_000_001


def test_examples_are_capped_but_counts_are_not():
    expected = [("k", i) for i in range(100)]
    received = list(reversed(expected))
    report = verify(expected, received, max_examples=3)
    assert report.reorder_count == 99 and len(report.reordered["k"]) == 3


def test_outbox_records_as_expected_input():
    records = [
        OutboxRecord("t", "k", value="a", headers=[("id", "1")]),
        OutboxRecord("t", "k", value="b", headers=[("id", b"2")]),
    ]
    assert expected_from_records(records) == [("k", b"a"), ("k", b"b")]
    assert verify(records, [("k", b"a"), ("k", b"b")]).ok
    assert verify(records, [("k", b"1"), ("k", b"2")], identity="header:id").ok
    assert not verify(records, [("k", b"2"), ("k", b"1")], identity="header:id").ok


def test_report_is_frozen_and_readable():
    report = check("R0 R1 R1 R2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.received_count = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        report.lost["k"] = ()  # type: ignore[index]
    assert str(report).startswith("OK: expected 3, received 4; lost 0, reordered 0, duplicates 1, unexpected 0")


def test_identity_spec_is_checked():
    with pytest.raises(VerifyError, match="header:NAME"):
        parse_identity("key")
    with pytest.raises(VerifyError):
        parse_identity("header:")


# ---------------------------------------------------------------------- the command's file


def test_expected_file_parsing(tmp_path):
    import io

    lines = '{"key": "a", "id": "1"}\n\n{"key": "a", "id": null}\n'
    assert verify_command.read_expected(io.StringIO(lines)) == [("a", "1"), ("a", None)]
    with pytest.raises(verify_command.ExpectedFileError, match=r"<expected>:2: not JSON"):
        verify_command.read_expected(io.StringIO('{"key": "a", "id": "1"}\n{oops\n'))
    with pytest.raises(verify_command.ExpectedFileError, match=r":1: key must be a string"):
        verify_command.read_expected(io.StringIO('{"key": 1, "id": "1"}\n'))
    with pytest.raises(verify_command.ExpectedFileError, match=r":1: expected an object"):
        verify_command.read_expected(io.StringIO('["a", "1"]\n'))


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reaper")
    sub = parser.add_subparsers(dest="command")
    verify_command.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_command_rejects_a_bad_file_before_connecting(tmp_path, capsys):
    bad = tmp_path / "expected.jsonl"
    bad.write_text("not json\n")
    argv = ["verify", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--expected", str(bad)]
    assert run_command(argv) == 2
    assert "expected.jsonl:1: not JSON" in capsys.readouterr().err
    assert run_command([*argv[:-1], str(tmp_path / "missing")]) == 2
    bad.write_text('{"key": "a", "id": "1"}\n')
    assert run_command([*argv, "--identity", "offset"]) == 2


# ---------------------------------------------------------------------- reading a topic, with Kafka faked


class FakeMessage:
    def __init__(self, key, value, headers=None, error=None):
        self._key, self._value, self._headers, self._error = key, value, headers, error

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def error(self):
        return self._error


class FakeReader:
    """confluent-kafka's Consumer as verify_topic uses it: metadata, assign, consume, close."""

    script: ClassVar[list[list[FakeMessage]]] = []
    partitions: ClassVar[dict[str, list[int]]] = {}
    made: ClassVar[list[FakeReader]] = []

    def __init__(self, config):
        self.config = config
        self.assigned = []
        self.closed = False
        FakeReader.made.append(self)

    def list_topics(self, topic, timeout):
        t = None
        if topic in self.partitions:
            t = type("T", (), {"error": None, "partitions": dict.fromkeys(self.partitions[topic])})()
        return type("MD", (), {"topics": {} if t is None else {topic: t}})()

    def assign(self, partitions):
        self.assigned = [(p.topic, p.partition, p.offset) for p in partitions]

    def consume(self, n, timeout):
        if self.script:
            return self.script.pop(0)
        time.sleep(min(timeout, 0.01))  # nothing came within the (shortened) timeout
        return []

    def close(self):
        self.closed = True


@pytest.fixture
def reader(monkeypatch):
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", FakeReader)
    FakeReader.made, FakeReader.script, FakeReader.partitions = [], [], {"t": [1, 0]}
    return FakeReader


def test_reading_a_topic_assigns_every_partition_from_the_start_and_commits_nothing(reader):
    from confluent_kafka import OFFSET_BEGINNING

    reader.script = [[FakeMessage(b"k", b"R0"), FakeMessage(b"\xff", b"x")], [FakeMessage(b"k", b"R1")]]
    report = verify_topic("x:9092", "t", [("k", "R0"), ("k", "R1"), (b"\xff", "x")], idle=0.05)
    assert report.ok, report
    consumer = reader.made[0]
    assert consumer.assigned == [("t", 0, OFFSET_BEGINNING), ("t", 1, OFFSET_BEGINNING)]
    assert consumer.config["enable.auto.commit"] is False and consumer.closed


def test_what_has_not_arrived_at_the_timeout_is_lost(reader):
    reader.script = [[FakeMessage(b"k", b"R0")]]
    report = verify_topic("x:9092", "t", [("k", "R0"), ("k", "R1")], timeout=0.3, idle=0.05)
    assert dict(report.lost) == {"k": (b"R1",)}


def test_a_fatal_consumer_error_means_the_topic_cannot_be_read(reader):
    from confluent_kafka import KafkaError

    reader.script = [[FakeMessage(None, None, error=KafkaError(KafkaError._FATAL, "fenced", fatal=True))]]
    with pytest.raises(VerifyError, match="cannot read topic 't'"):
        verify_topic("x:9092", "t", [], timeout=2, idle=0.05)
    assert reader.made[0].closed


def test_a_topic_missing_from_the_metadata_is_not_readable(reader):
    with pytest.raises(VerifyError, match="topic 'absent' is not readable: not in metadata"):
        verify_topic("x:9092", "absent", [], timeout=0.1)


# ---------------------------------------------------------------------- a real topic


def produce(bootstrap: str, topic: str, messages: list[tuple[str, str]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "linger.ms": 5})
    failures: list[object] = []
    for key, value in messages:
        producer.produce(
            topic, key=key, value=value, headers=[("id", f"id-{value}")],
            on_delivery=lambda err, _m: failures.append(err) if err else None,
        )
    assert producer.flush(20) == 0 and not failures, failures


@pytest.mark.kafka
def test_verify_topic_counts_a_deliberate_duplicate(kafka_bootstrap, topic_name, tmp_path, capsys):
    from tests.helpers.topics import create_topic

    create_topic(kafka_bootstrap, topic_name, partitions=3)
    keys = [f"key-{i}" for i in range(6)]
    expected = [(k, f"{k}:{n}") for n in range(5) for k in keys]
    sent = list(expected)
    sent.insert(sent.index(("key-2", "key-2:3")) + 1, ("key-2", "key-2:3"))  # R3 R3: one-off duplicate
    produce(kafka_bootstrap, topic_name, sent)

    report = verify_topic(kafka_bootstrap, topic_name, expected, timeout=30, idle=0.5)
    assert report.ok, report
    assert (report.expected_count, report.received_count, report.duplicate_count) == (30, 31, 1)
    assert [(d.key, d.identity) for d in report.duplicates] == [("key-2", b"key-2:3")]

    # The same topic judged by a header, and against a record that never went out.
    by_header = [(k, f"id-{v}") for k, v in expected] + [("key-5", "id-never-sent")]
    report = verify_topic(kafka_bootstrap, topic_name, by_header, identity="header:id", timeout=10, idle=0.5)
    assert not report.ok
    assert dict(report.lost) == {"key-5": (b"id-never-sent",)} and report.duplicate_count == 1

    # And through the command: exit 0 and the report on stdout.
    file = tmp_path / "expected.jsonl"
    file.write_text("".join(json.dumps({"key": k, "id": v}) + "\n" for k, v in expected))
    argv = ["verify", "--bootstrap-servers", kafka_bootstrap, "--topic", topic_name, "--expected", str(file), "--timeout", "10"]
    assert run_command(argv) == 0
    assert capsys.readouterr().out.startswith("OK: expected 30, received 31; lost 0, reordered 0, duplicates 1")


@pytest.mark.kafka
def test_verify_topic_reports_a_reorder(kafka_bootstrap, topic_name):
    from tests.helpers.topics import create_topic

    create_topic(kafka_bootstrap, topic_name, partitions=1)
    produce(kafka_bootstrap, topic_name, [("k", "R0"), ("k", "R2"), ("k", "R1")])
    report = verify_topic(kafka_bootstrap, topic_name, [("k", "R0"), ("k", "R1"), ("k", "R2")], timeout=10, idle=0.5)
    assert not report.ok and report.reorder_count == 1 and not report.lost


@pytest.mark.kafka
def test_verify_topic_names_a_missing_topic(kafka_bootstrap):
    with pytest.raises(VerifyError, match="not readable"):
        verify_topic(kafka_bootstrap, "no-such-topic-here", [], timeout=2,
                     consumer_config={"allow.auto.create.topics": False})
