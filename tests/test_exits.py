"""How the reaper's commands turn a failure into one line on stderr and an exit code."""

from __future__ import annotations

import pytest

from pyharvest._commands.exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, error_exit, exception_exit
from pyharvest.core.errors import BindingError, ConfigError, HarvestError, TopicError


def test_codes():
    assert (EXIT_OK, EXIT_FAILURE, EXIT_USAGE) == (0, 1, 2)


def test_error_exit_prints_one_line_for_the_named_program(capsys):
    assert error_exit("--key is required", EXIT_USAGE, "reaper quarantine replay") == EXIT_USAGE
    assert capsys.readouterr().err == "reaper quarantine replay: error: --key is required\n"
    assert error_exit("lost 3 records") == EXIT_FAILURE
    assert capsys.readouterr().err == "reaper: error: lost 3 records\n"


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (
            ConfigError("harvest.name", "expected a string"),
            EXIT_USAGE,
            "invalid configuration: harvest.name: expected a string",
        ),
        (BindingError("outbox table 'x' does not exist"), EXIT_FAILURE, "outbox table 'x' does not exist"),
        (TopicError("cannot reach Kafka"), EXIT_FAILURE, "cannot reach Kafka"),
        (HarvestError("cannot start"), EXIT_FAILURE, "cannot start"),
        (OSError("disk on fire\nsecond line"), EXIT_FAILURE, "OSError: disk on fire"),
        (RuntimeError(), EXIT_FAILURE, "RuntimeError: "),
    ],
)
def test_exception_exit_maps_the_error_to_a_code_and_one_line(capsys, error, code, line):
    assert exception_exit(error, "reaper x") == code
    assert capsys.readouterr().err == f"reaper x: error: {line}\n"


def test_an_unexpected_error_leaves_its_traceback_in_the_debug_log(caplog):
    caplog.set_level("DEBUG", logger="pyharvest.reaper")
    try:
        raise KeyError("k")
    except KeyError as e:
        exception_exit(e)
    assert caplog.records[-1].exc_info is not None and caplog.records[-1].exc_info[0] is KeyError
