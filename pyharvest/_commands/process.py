"""What every ``reaper`` command shares as a process: its logging, and how a parsed command
runs (the exit code, one line for an error, a closed pipe). ``reaper`` (:mod:`pyharvest._cli`)
and ``python -m pyharvest._commands.inbox`` both run their commands through it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from pyharvest._commands.exits import EXIT_FAILURE, EXIT_OK, exception_exit

__all__ = ["run_command", "setup_logging"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: int, as_json: bool = False) -> None:
    logging.addLevelName(5, "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter() if as_json else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # librdkafka is chatty at debug level and its own messages already reach us as warnings.
    logging.getLogger("pyharvest.librdkafka").setLevel(max(level, logging.WARNING))


def run_command(args: argparse.Namespace) -> int:
    """Run the command ``args`` was parsed for (its ``func``) and return the process's exit code."""
    from pyharvest.bindings.kafka.librdkafka_logs import flush_librdkafka_logs

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
        return code
    except BrokenPipeError:
        # The reader went away ('reaper verify | head'): what it did not read is not an error
        # to report. Point stdout at nothing, so that the flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - one line for the operator; the traceback at debug level
        flush_librdkafka_logs()
        return exception_exit(e)
    finally:
        flush_librdkafka_logs()
