"""The ``reaper`` command as a test runs it: in a child process on the installed package, and
what a refusal must look like (one ``reaper: error:`` line, no traceback)."""

from __future__ import annotations

import subprocess

from benchmarks.children import python_module

__all__ = ["assert_one_line_error", "reaper"]


def reaper(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``reaper *args``, its output captured."""
    return subprocess.run(
        [*python_module("pyharvest"), *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """``result`` failed with one error line holding every fragment, and no traceback."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("reaper: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], result.stderr
