"""The tests' own rules: they wait on conditions, not on fixed sleeps.

A test that sleeps and then asserts is as slow as its sleep and flaky on a busy machine, and a
sleep before asserting that something did not happen passes vacuously when the machine is slow;
:func:`tests.helpers.waiting.wait_until` (or an Event the code under test sets) waits for what
the test needs. The few fixed sleeps that remain say, in a ``# fixed sleep:`` comment on their
line or the line above, why no condition can be waited on.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MAX_FIXED_SLEEPS = 5
MARK = "# fixed sleep:"
# The one way tests wait polls its condition between checks: that pause is the waiting itself.
POLLING = {TESTS / "helpers" / "waiting.py"}


def _is_sleep(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "sleep":
        return isinstance(func.value, ast.Name) and func.value.id in {"time", "asyncio", "trio", "anyio"}
    if isinstance(func, ast.Name) and func.id == "sleep":
        return True
    # threading.Event().wait(n) on an Event nobody can set is a sleep by another name.
    if isinstance(func, ast.Attribute) and func.attr == "wait" and isinstance(func.value, ast.Call):
        maker = func.value.func
        name = maker.attr if isinstance(maker, ast.Attribute) else getattr(maker, "id", "")
        return name == "Event" and not func.value.args
    return False


def _honours_its_callers_timeout(call: ast.Call, params: set[str]) -> bool:
    """A fake's blocking call (a poll) that waits as long as the code under test asked,
    ``timeout`` being the parameter it was given: the code's wait, not the test's."""
    names = {n.id for arg in call.args for n in ast.walk(arg) if isinstance(n, ast.Name)}
    return "timeout" in names & params


def _said_above(lines: list[str], line: int) -> bool:
    """Whether the comment block right above ``line`` (1-based) begins with the mark."""
    i = line - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if lines[i].strip().startswith(MARK):
            return True
        i -= 1
    return False


def fixed_sleeps() -> list[tuple[Path, int, bool]]:
    """Each fixed sleep in tests/ (helpers included): its file, line and whether it says why."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path in POLLING:
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source, str(path))

        def visit(node: ast.AST, params: set[str], path: Path = path, lines: list[str] = lines) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                params = params | {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
            if isinstance(node, ast.Call) and _is_sleep(node) and not _honours_its_callers_timeout(node, params):
                line = node.lineno
                found.append((path, line, MARK in lines[line - 1] or _said_above(lines, line)))
            for child in ast.iter_child_nodes(node):
                visit(child, params)

        visit(tree, set())
    return found


def test_at_most_five_fixed_sleeps_remain_each_saying_why():
    sleeps = fixed_sleeps()
    where = [f"{p.relative_to(TESTS.parent)}:{line}" for p, line, _ in sleeps]
    assert len(sleeps) <= MAX_FIXED_SLEEPS, (
        f"{len(sleeps)} fixed sleeps in tests/ (at most {MAX_FIXED_SLEEPS}): wait_until() on what the test "
        f"needs instead: {', '.join(where)}"
    )
    unexplained = [w for w, (_, _, said) in zip(where, sleeps, strict=True) if not said]
    assert not unexplained, f"a fixed sleep needs a {MARK!r} comment saying why no condition can be waited on: " + (
        ", ".join(unexplained))


def test_the_count_sees_each_kind_of_sleep(tmp_path):
    # The counter itself: what it must find, and what it must leave alone.
    sample = """
import asyncio, threading, time
from time import sleep
def a(): time.sleep(1)
async def b(): await asyncio.sleep(0.5)
def c(): sleep(2)
def d(): threading.Event().wait(3)
def poll(timeout): time.sleep(min(timeout, 0.01))
def e(stop): stop.wait(1)
"""
    tree = ast.parse(sample)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_sleep(n)]
    assert sorted(c.lineno for c in calls) == [4, 5, 6, 7, 8]
    poll = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "poll")
    assert _honours_its_callers_timeout(next(c for c in calls if c.lineno == 8), {a.arg for a in poll.args.args})
    assert not _honours_its_callers_timeout(next(c for c in calls if c.lineno == 4), set())
