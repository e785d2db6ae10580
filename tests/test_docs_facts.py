"""What the documentation says about the project itself stays true: which broker the tests use,
what needs installing for what, and tables that render as tables."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def section(text: str, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of any level."""
    start = text.index(heading)
    rest = text[start + len(heading):]
    found = re.search(r"^#{1,6} ", rest, re.MULTILINE)
    return rest[: found.start()] if found else rest


def test_the_broker_that_hid_acknowledged_messages_is_named_as_the_embedded_one():
    ops = (ROOT / "docs" / "operations.md").read_text()
    broker = section(ops, "## A broker for development")
    embedded, apache = broker.split("**Apache Kafka for development")
    assert "acknowledge messages and then not serve" in embedded
    assert "acknowledge messages and then not serve" not in apache


def test_the_tests_are_not_said_to_run_on_the_embedded_broker():
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"embedded broker the demo and the tests use", readme)
    assert "the tests run on Apache Kafka" in readme


def test_make_test_is_not_listed_under_nothing_else_to_install():
    index = (ROOT / "docs" / "index.md").read_text()
    assert "make test" not in section(index, "## Try it without installing anything else")
    assert "Java 17+" in section(index, "## Run the tests")


def test_every_readme_table_is_whole():
    # A table row after a paragraph renders as text: each table's rows follow one another.
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i > 0 and lines[i - 1].strip() and not lines[i - 1].startswith("|"):
            raise AssertionError(f"README.md:{i + 1}: a table row that follows text: {line}")
    layout = section("\n".join(lines), "## Layout")
    assert "| `docs/` |" in layout
