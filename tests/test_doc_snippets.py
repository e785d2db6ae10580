"""Every Python block of README.md and docs/**/*.md runs, against SQLite and the session's broker.

Each page's blocks run in order in one interpreter (``tests/helpers/doc_snippets_driver.py``), in a
fresh directory, so a page may build on its earlier blocks as a reader would. The pages name
the servers a reader has (``postgresql+psycopg://app@localhost/app``, ``localhost:9092``); the
test points those at SQLite in the page's directory and at the session's broker (Apache Kafka
by default; :data:`PLACEHOLDERS`). The topics and groups the pages name (``orders``,
``billing-api``...) get a suffix of their own per run (:func:`kafka_names`): a broker kept
across runs, or shared by concurrent ones, would otherwise hand a page an earlier run's
records or members. Nothing else changes.

A page controls its blocks with HTML comments, invisible once rendered:

``<!-- snippet: setup ... -->``
    hidden Python run at that point of the page: the tables and objects a block assumes
    (``accounts``, ``records``…). Never the code a reader needs to copy.
``<!-- snippet: check ... -->``
    hidden Python that checks what a block did, run at that point of the page.
``<!-- snippet: runs-until-stopped ready="TEXT" -->`` before a block
    a block that runs until interrupted (``harvest.run()``, ``harvest.join()``): it must print
    TEXT (or, without ``ready``, keep running for a few seconds), then stop cleanly on SIGINT
    (Ctrl-C: a ``KeyboardInterrupt``, or its own handler's graceful return) and let the page go on.
``<!-- snippet: skip REASON -->`` before a block
    a block that cannot run here; the reason says where the same code is proven instead.
``<!-- snippet: requires MODULE -->`` before a block (and its setup)
    the block needs an optional extra (``pyspark``): skipped, with the rest of the page,
    where MODULE cannot be imported; CI installs every extra, so there it runs.

A block made only of ``--8<--`` includes shows an example file that its own tests run
(``tests/test_alembic.py``, ``tests/django/``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.children import python_module

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGE_TIMEOUT = 240.0
STOP_TIMEOUT = 30.0
SETTLE = 5.0

#: The servers the pages name, and what the test runs them against ("{broker}": the session's broker).
PLACEHOLDERS = {
    "postgresql+psycopg://app@localhost/app": "sqlite:///app.db",
    "postgresql+asyncpg://app@localhost/app": "sqlite+aiosqlite:///app.db",
    "localhost:9092": "{broker}",
    "broker:9092": "{broker}",
    "http://localhost:8081": "{registry}",
}
#: A page that names the schema registry runs against the session's (the schema_registry_url fixture).
REGISTRY_PLACEHOLDER = "http://localhost:8081"

#: Where a quoted name is a Kafka topic or group: a record's or a produce call's topic, a
#: consumer's topics, a group id, the topic ``verify_topic`` reads.
KAFKA_NAME = re.compile(
    r"""(?:\b(?:OutboxRecord|produce|NewTopic)\(\s*|\btopics=\[\s*|\b(?:leader_group_id|group_id)=\s*"""
    r"""|\bverify_topic\([^,()]*,\s*)(["'])(?P<name>[\w.-]+)\1"""
)

FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*$")
MARKER = re.compile(r"^[ \t]*<!--[ \t]*snippet:[ \t]*(?P<what>[\w-]+)(?P<rest>.*?)(?:-->)?[ \t]*$")


@dataclass
class Block:
    path: str
    line: int  # the first line of code, 1-based
    code: str
    mode: str  # run | setup | until-stopped | skip
    reason: str = ""
    ready: str | None = None
    requires: str | None = None  # a module the block needs (an optional extra)


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    pending: tuple[str, str] | None = None  # the marker for the next fenced block
    requires: str | None = None  # the module the next fenced block needs
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if marker and marker["what"] in ("setup", "check"):
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("-->"))
            code = "\n".join(lines[i + 1:end])
            blocks.append(Block(str(page), i + 2, code, "setup"))
            i = end + 1
            continue
        if marker:
            if not lines[i].rstrip().endswith("-->"):
                raise AssertionError(f"{page}:{i + 1}: a snippet marker fits on one line")
            if marker["what"] == "requires":
                requires = marker["rest"].strip()
                i += 1
                continue
            if marker["what"] not in ("skip", "runs-until-stopped"):
                raise AssertionError(f"{page}:{i + 1}: unknown snippet marker {marker['what']!r}")
            pending = (marker["what"], marker["rest"].strip())
        elif fence:
            indent = len(fence["indent"])
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(line[indent:] for line in lines[i + 1:end])
            block = Block(str(page), i + 2, code, "run", requires=requires)
            requires = None
            what, rest = pending or ("", "")
            if what == "skip":
                if not rest:
                    raise AssertionError(f"{page}:{i + 1}: a skipped snippet says why")
                block.mode, block.reason = "skip", rest
            elif what == "runs-until-stopped":
                block.mode = "until-stopped"
                ready = re.fullmatch(r'ready="(.*)"', rest)
                block.ready = ready[1] if ready else None
            elif all(line.startswith("--8<--") or not line.strip() for line in code.split("\n")):
                block.mode, block.reason = "skip", "an included example file, run by its own tests"
            blocks.append(block)
            pending = None
            i = end + 1
            continue
        elif lines[i].strip():
            pending = None  # a marker belongs to the block right after it
        i += 1
    return blocks


def kafka_names(blocks: list[Block]) -> set[str]:
    """The topics and groups a page's blocks name, found where a name is one (:data:`KAFKA_NAME`)."""
    return {m["name"] for b in blocks for m in KAFKA_NAME.finditer(b.code)}


def substituted(code: str, broker: str, names: Collection[str] = (), run: str = "", registry: str = "") -> str:
    """``code`` against this run's servers: the placeholders replaced, and each quoted literal
    of ``names`` (anywhere on the page, so that a hidden setup block agrees) given ``-run``."""
    for placeholder, actual in PLACEHOLDERS.items():
        code = code.replace(placeholder, actual.format(broker=broker, registry=registry))
    if names:
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        literal = re.compile(r"""(["'])(""" + alternatives + r""")\1""")
        code = literal.sub(lambda m: f"{m[1]}{m[2]}-{run}{m[1]}", code)
    return code


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_page_with_python_is_checked() -> None:
    # A renamed fence (```py) would silently escape the check.
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"^\s*```(py|python3|pycon)\s*$", text, re.MULTILINE), f"{page}: use ```python"


def test_markers_parse() -> None:
    for page in PAGES:
        for block in blocks_of(page):
            assert block.mode != "until-stopped" or block.ready is None or block.ready


@pytest.mark.timeout(PAGE_TIMEOUT + 60)
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.mode != "skip" for b in blocks_of(p))], ids=_ids)
def test_page_snippets_run(page: Path, kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blocks = [b for b in blocks_of(page) if b.mode != "skip"]
    import importlib.util

    missing = [b for b in blocks if b.requires and importlib.util.find_spec(b.requires) is None]
    if missing:
        # What follows a block may build on it: the page stops there.
        blocks = blocks[: blocks.index(missing[0])]
        if not any(b.mode != "setup" for b in blocks):
            pytest.skip(f"{page.name} needs {missing[0].requires}: an optional extra not installed here")
    names, run = kafka_names(blocks), uuid.uuid4().hex[:8]
    registry = (
        request.getfixturevalue("schema_registry_url") if any(REGISTRY_PLACEHOLDER in b.code for b in blocks) else ""
    )
    spec = [
        {"path": b.path, "line": b.line, "code": substituted(b.code, kafka_bootstrap, names, run, registry),
         "mode": b.mode}
        for b in blocks
    ]
    (tmp_path / "blocks.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        python_module("tests.helpers.doc_snippets_driver", "blocks.json"), cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output: list[str] = []
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + PAGE_TIMEOUT

    def fail(why: str) -> None:
        proc.kill()
        proc.wait()
        pytest.fail(f"{why}\n--- output ---\n{''.join(output)}", pytrace=False)

    current: Block | None = None
    started = 0.0
    interrupted_at: float | None = None
    ended = False
    while not ended:
        now = time.monotonic()
        if now > deadline:
            fail(f"{page.name}: still running after {PAGE_TIMEOUT:.0f} s")
        if interrupted_at is not None and now - interrupted_at > STOP_TIMEOUT:
            assert current is not None
            fail(f"{current.path}:{current.line}: did not stop within {STOP_TIMEOUT:.0f} s of SIGINT")
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            line = ""
        if line is None:
            ended = True
            break
        if line:
            output.append(line)
            progress = re.match(r"@@snippet (\d+) (start|stopped|returned)", line)
            if progress and progress[2] == "start":
                current, started, interrupted_at = blocks[int(progress[1])], time.monotonic(), None
            elif progress and progress[2] == "returned" and interrupted_at is None:
                assert current is not None
                fail(f"{current.path}:{current.line}: returned before it was stopped")
            elif progress:  # stopped as asked (by KeyboardInterrupt, or by its own handler): the page goes on
                current, interrupted_at = None, None
        if current is not None and current.mode == "until-stopped" and interrupted_at is None:
            since_start = "".join(output[-200:]).rsplit("@@snippet", 1)[-1]
            if (current.ready is not None and current.ready in since_start) or (
                current.ready is None and time.monotonic() - started > SETTLE
            ):
                proc.send_signal(signal.SIGINT)
                interrupted_at = time.monotonic()
    code = proc.wait(timeout=STOP_TIMEOUT)
    text = "".join(output)
    if code != 0:
        fail(f"{page.name}: a block failed (exit status {code})")
    if "Traceback" in text or "Exception in thread" in text:
        fail(f"{page.name}: the blocks ran, but something raised on the way")
