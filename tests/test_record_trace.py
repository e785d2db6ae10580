"""One record's path through the engine, traced on the fakes (tests/helpers/record_trace.py):
the publishing pipeline stays small enough to hold in one's head, in each delivery mode."""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.children import python_module
from tests.helpers.record_trace import Trace

# Issue 46's bound: a record crosses at most this many pyharvest modules from mark to purge.
MAX_MODULES = 12


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    # A fresh process: nothing another test installed (a tracer provider) joins the path.
    done = subprocess.run(python_module("tests.helpers.record_trace", "--json"), capture_output=True, text=True,
                          timeout=120, check=True)
    out = {}
    for line in done.stdout.splitlines():
        data = json.loads(line)
        out[data["mode"]] = Trace([tuple(c) for c in data["calls"]], {tuple(b) for b in data["bounces"]})
    return out


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_record_crosses_few_modules_and_no_call_comes_back(mode, traces):
    trace = traces[mode]
    report = trace.report()
    # The path really was traced: the mark's caller, the window, the purge.
    assert any(fn == "HarvestEngine._lead_step" for _, fn in trace.calls), report
    assert any(fn == "Settlement.purge" for _, fn in trace.calls), report
    assert len(trace.modules) <= MAX_MODULES, report
    assert not trace.bounces, report
    # Neither mode reaches into the other's modules.
    other = "transaction" if mode == "at-least-once" else "key_window"
    assert not [m for m in trace.modules if other in m], report
