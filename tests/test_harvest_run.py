"""``Harvest.run()``, the README's embedded harvester: Ctrl-C (SIGINT) and SIGTERM stop it as
they stop ``reaper``: gracefully, leaving the leader group, without a ``KeyboardInterrupt``
traceback; and a standby of the same group takes over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from pyharvest import Config, Harvest, Limits

    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    config = Config(
        base_kafka_config={"bootstrap.servers": sys.argv[1]},
        data_source=sys.argv[2],
        leader_group_id=sys.argv[3],
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    with Harvest(config, on_event=print) as harvest:
        harvest.run()
    print("run() returned", flush=True)
    """
)


class Embedded:
    """The script in a process of its own, its output gathered as it comes."""

    def __init__(self, folder, bootstrap: str, url: str, group: str) -> None:
        script = folder / "embedded.py"
        script.write_text(SCRIPT)
        # Unbuffered: the script prints its events (on_event=print) into a pipe, where Python
        # would hold them in a block buffer until exit, and the test reads them as they come.
        self.proc = subprocess.Popen(
            [sys.executable, str(script), bootstrap, url, group], cwd=folder,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def leads(self) -> bool:
        assert self.proc.poll() is None, self.output
        return "LeaderAcquired" in self.output

    def finish(self) -> int:
        try:
            code = self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return code


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_run_stops_gracefully_on_a_signal_and_leaves_the_group(tmp_path, kafka_bootstrap, sig):
    from pyharvest.bindings.sql import create_outbox_table

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url)
    group = f"run-{uuid.uuid4().hex[:8]}"
    first = Embedded(tmp_path, kafka_bootstrap, url, group)
    standby: Embedded | None = None
    try:
        wait_until(first.leads, 60, "the first process to lead")
        standby = Embedded(tmp_path, kafka_bootstrap, url, group)
        wait_until(lambda: "joined leader group" in standby.output, 60, "the standby to join")
        first.proc.send_signal(sig)
        assert first.finish() == 0, first.output
        out = first.output
        assert f"{sig.name} received: stopping" in out
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
        # Left the group on the way out (a process killed by SIGTERM's default would not).
        assert "lost leader status" in out and "run() returned" in out, out
        wait_until(standby.leads, 60, "the standby to take over")
    finally:
        for p in (first, standby):
            if p is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
                p.finish()


def test_run_outside_the_main_thread_says_what_to_do_instead():
    from pyharvest import Config, Harvest

    harvest = Harvest(Config(data_source="sqlite://", base_kafka_config={"bootstrap.servers": "127.0.0.1:9"}))
    failure: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(harvest.run, failure))
    thread.start()
    thread.join(10)
    [error] = failure
    assert isinstance(error, RuntimeError) and "main thread" in str(error) and "start()" in str(error)


def _capture(call, into: list[BaseException]) -> None:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - handed to the test
        into.append(e)
