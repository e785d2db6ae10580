"""Runs the embedded broker for its owner, and stops it when the owner goes away.

``python -I broker_guard.py BINARY ARGS…`` starts the broker and reads
its own standard input, a pipe whose write end only the owning process holds. The owner may
stop without cleaning up (SIGKILL, a SIGTERM with no handler, a crashed test worker); the
operating system then closes the pipe, the read returns, and the broker is stopped, so that
neither its port nor its memory outlives the process that asked for it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from types import FrameType

# A broker that ignores SIGTERM this long is killed.
STOP_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.1


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python broker_guard.py BINARY [ARGS...]\n")
        return 2
    # A plain flag, polled: an Event's lock is not safe to take in a signal handler, which
    # may interrupt the main thread while it holds that very lock.
    stopping: list[bool] = []

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.append(True)

    # Before the broker starts: a stop asked for during start-up must not be lost.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_owner() -> None:
        # Returns at end of file: the owner closed the pipe or no longer exists.
        sys.stdin.buffer.read()
        stopping.append(True)

    threading.Thread(target=watch_owner, daemon=True).start()
    if stopping:
        return 0
    # The broker gets no stdin: it must not hold the owner's pipe open itself.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)  # noqa: S603 - the owner's fixed command
    while not stopping:
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(POLL_SECONDS)
    _stop(proc)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
