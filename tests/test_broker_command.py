"""``reaper broker``: the embedded broker in the foreground, stopped by Ctrl-C or SIGTERM with its port freed."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest

from benchmarks.children import python_module
from pyharvest.bindings.kafka.embedded import free_port
from tests.helpers.waiting import wait_until


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start(port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*python_module("pyharvest"), "broker", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM])
def test_broker_serves_kafka_clients_and_a_signal_stops_it_and_frees_the_port(stop_with):
    from confluent_kafka import Consumer, Producer

    port = free_port()
    proc = start(port)
    try:
        wait_until(lambda: port_open(port) or proc.poll() is not None, 60, "the broker to listen", interval=0.1)
        assert proc.poll() is None, proc.communicate()
        bootstrap = f"127.0.0.1:{port}"
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("greetings", b"hello", b"k")
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
        try:
            assert "greetings" in consumer.list_topics(timeout=10).topics
        finally:
            consumer.close()
        proc.send_signal(stop_with)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"bootstrap.servers={bootstrap}" in out
    assert "Traceback" not in err
    assert not port_open(port)
    with socket.socket() as s:  # free for the next broker (connections of the clients may linger in TIME_WAIT)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_port_in_use_is_a_one_line_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*python_module("pyharvest"), "broker", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 1
    assert f"reaper broker: error: port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_port_is_a_usage_error():
    result = subprocess.run(
        [*python_module("pyharvest"), "broker", "--port", "99999"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "TCP port" in result.stderr
