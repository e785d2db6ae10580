"""Follow one record through the engine on its fakes: which pyharvest modules and calls it
crosses from its mark to its purge, and whether any call goes A -> B -> A between modules.

Every pyharvest call on any thread counts, from the call of the mark that returns the record
to the return of the purge that deletes its row, except leader election's pulses (they run
whatever is marked): one record alone in the outbox, so what runs meanwhile is its path. It runs in a process of its own
(tests/test_record_trace.py starts one): what an earlier test left installed, say an
OpenTelemetry tracer, would add its modules to the path. Print each delivery mode's trace::

    python -m tests.helpers.record_trace

tests/test_record_trace.py holds the pipeline to the bounds it promises.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from tests.helpers.engine import make, make_exactly_once
from tests.helpers.fakes import FakeBinding, FakeKafka, FakeTransactionalKafka
from tests.helpers.waiting import wait_until

__all__ = ["Trace", "trace_one_record"]

KEY = "traced-key-7f3a"


@dataclass
class Trace:
    """The record's calls, in order: ``(module, function)``, and the call chains that went
    from a module into another and back into the first (``A -> B -> A``)."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    bounces: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def modules(self) -> list[str]:
        seen: dict[str, None] = {}
        for module, _ in self.calls:
            seen.setdefault(module, None)
        return list(seen)

    def report(self) -> str:
        lines = [f"{len(self.modules)} modules, {len(set(self.calls))} distinct calls ({len(self.calls)} in all)"]
        lines += [f"  {m}" for m in self.modules]
        lines += [f"  bounce: {a} -> {b} -> {c}" for a, b, c in sorted(self.bounces)]
        return "\n".join(lines)


def _module(frame: FrameType) -> str:
    return frame.f_globals.get("__name__", "")


def _ours(name: str) -> bool:
    return name.startswith("pyharvest.")


# Not the record's path: leader election's pulses run on the same loop, whatever is marked.
_ASIDE = ("pyharvest.core.election.",)


class _Tracer:
    """Counts every pyharvest call on any thread from the call of the mark that returns the
    record to the return of the purge that deletes its row, except leader election's."""

    def __init__(self, rid: int) -> None:
        self.trace = Trace()
        self.rid = rid
        self.active = False
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done:
            return
        code = frame.f_code
        owner = frame.f_locals.get("self") if code.co_name in ("mark", "purge") else None
        if isinstance(owner, FakeBinding):
            if code.co_name == "mark" and event == "call" and self.rid in owner.rows:
                self.active = True
            elif code.co_name == "purge" and event == "return" and self.active and self.rid not in owner.rows:
                self.done = True
            return
        if event != "call" or not self.active:
            return
        name = _module(frame)
        if not _ours(name):
            return
        chain = []
        caller = frame.f_back
        while caller is not None:
            module = _module(caller)
            if module.startswith(_ASIDE):
                return
            if _ours(module):
                chain.append(module)
            caller = caller.f_back
        if name.startswith(_ASIDE):
            return
        with self.lock:
            self.trace.calls.append((name, code.co_qualname))
            # A -> B -> A: this call's module called a second module that calls back into it.
            distinct = [m for i, m in enumerate(chain) if i == 0 or chain[i - 1] != m]
            if len(distinct) >= 2 and distinct[0] != name and distinct[1] == name:
                self.trace.bounces.add((name, distinct[0], name))


def trace_one_record(mode: str = "at-least-once") -> Trace:
    """Harvest one record on the fakes in ``mode`` and return the calls it crossed from its
    mark until its row was purged."""
    binding = FakeBinding()
    rid = binding.insert("data", KEY, b"traced")
    tracer = _Tracer(rid)
    if mode == "exactly-once":
        engine = make_exactly_once(binding, FakeTransactionalKafka())
    else:
        engine = make(binding, FakeKafka())
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        with engine:
            wait_until(lambda: len(binding) == 0, 30, "the traced record's purge")
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return tracer.trace


def main(argv: list[str]) -> None:
    """Print each mode's trace; with ``--json``, one line of JSON per mode (calls and bounces)."""
    for m in ("at-least-once", "exactly-once"):
        trace = trace_one_record(m)
        if "--json" in argv:
            print(json.dumps({"mode": m, "calls": trace.calls, "bounces": sorted(trace.bounces)}))
        else:
            print(f"{m}: {trace.report()}")


if __name__ == "__main__":
    main(sys.argv[1:])
