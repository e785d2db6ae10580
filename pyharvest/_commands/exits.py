"""``reaper``'s exit codes, and how a failure reaches the operator: one line on stderr, no traceback.

Every sub-command returns one of the codes; :func:`exception_exit` is the one place an
exception becomes a message and a code.
"""

from __future__ import annotations

import logging
import sys

from pyharvest.core.errors import ConfigError, HarvestError

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "error_exit", "exception_exit"]

#: Done; for a check, nothing wrong found.
EXIT_OK = 0
#: The command could not do its work, or a check found something wrong.
EXIT_FAILURE = 1
#: Bad usage: an argument, an input file or the configuration is wrong.
EXIT_USAGE = 2

log = logging.getLogger("pyharvest.reaper")


def error_exit(message: str, code: int = EXIT_FAILURE, prog: str = "reaper") -> int:
    """Print ``<prog>: error: <message>`` to stderr and return ``code``."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def exception_exit(error: Exception, prog: str = "reaper") -> int:
    """Report ``error`` as :func:`error_exit` does and return its code.

    A :class:`ConfigError` is bad usage; any other error is a failure. pyharvest's own errors
    already say what to do, so their message is shown as it is; anything else shows its type
    and first line, with the traceback in the debug log.
    """
    if isinstance(error, ConfigError):
        return error_exit(f"invalid configuration: {error}", EXIT_USAGE, prog)
    if isinstance(error, HarvestError):
        return error_exit(str(error), EXIT_FAILURE, prog)
    log.debug("unexpected error", exc_info=error)
    first = str(error).strip().splitlines()
    return error_exit(f"{type(error).__name__}: {first[0] if first else ''}", EXIT_FAILURE, prog)
