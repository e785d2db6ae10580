"""What the documentation says about the project itself stays true: which broker the tests use,
what needs installing for what, tables that render as tables, a map (docs/architecture.md)
that names every module, and references to modules that are there."""

from __future__ import annotations

import re

from tests.helpers.doc_names import MAP, broken_reference, broken_references, map_paths, unmapped_modules
from tests.helpers.layering import ROOT


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


# Extras for working on pyharvest itself, from a checkout: not a user's install.
DEVELOPER_EXTRAS = {"test", "docs", "lint", "benchmarks"}


def user_extras() -> set[str]:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return set(extras) - DEVELOPER_EXTRAS


def test_the_index_lists_every_extra_for_users():
    listed = section((ROOT / "docs" / "index.md").read_text(), "## Install").split("Extras:", 1)[1]
    named = set(re.findall(r"`([a-z][a-z-]*)`", listed.split("\n\n", 1)[0]))
    assert named & user_extras() == user_extras(), f"docs/index.md omits {sorted(user_extras() - named)}"
    readme = set(re.findall(r"^\| `([a-z-]+)` \|", (ROOT / "README.md").read_text(), re.MULTILINE))
    assert user_extras() <= readme, f"README.md's table omits {sorted(user_extras() - readme)}"


def test_the_configuration_page_names_every_section_a_file_takes():
    from pyharvest.core.config.yaml_files import FILE_SECTIONS

    opening = (ROOT / "docs" / "configuration.md").read_text().split("```", 1)[0]
    assert {s for s in FILE_SECTIONS if f"`{s}:`" in opening} == set(FILE_SECTIONS)


def test_every_readme_table_is_whole():
    # A table row after a paragraph renders as text: each table's rows follow one another.
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i > 0 and lines[i - 1].strip() and not lines[i - 1].startswith("|"):
            raise AssertionError(f"README.md:{i + 1}: a table row that follows text: {line}")
    layout = section("\n".join(lines), "## Layout")
    assert "| `docs/` |" in layout


def test_the_map_names_every_module():
    """docs/architecture.md names each module of core/, bindings/, plugins/ and pyharvest/ (a
    package by its folder), by its path or from a folder it named before."""
    assert unmapped_modules() == []


def test_every_path_the_map_names_is_there():
    _, missing = map_paths(MAP.read_text())
    assert missing == []


def test_the_map_check_reads_paths_from_their_folder():
    text = "| `core/` | `telemetry/`: `events.py`; `bindings/ops/` `probes.py` |\n\n`spans.py` alone\n"
    named, missing = map_paths(text)
    assert {ROOT / "core" / "telemetry" / "events.py", ROOT / "bindings" / "ops" / "probes.py"} <= named
    assert ROOT / "bindings" / "kafka" / "probes.py" not in named
    assert missing == ["spans.py (in: `spans.py` alone...)"]


def test_comments_and_docs_name_modules_that_are_there():
    """A dotted reference to a module of core, bindings or plugins (``pyharvest.core.<package>.<module>``, or
    a Sphinx role relative to its module, ``:mod:`.y```) names a module that exists, and a name
    that module holds."""
    folders = ("core", "bindings", "plugins", "pyharvest", "tests", "benchmarks", "docs")
    assert broken_references(folders) == []


def test_the_reference_check_sees_a_missing_module_and_name():
    modules = {"pyharvest.core.outbox.records": ROOT / "core" / "outbox" / "records.py"}
    prefix = "pyharvest.core"
    assert broken_reference(f"{prefix}.outbox.records.OutboxRecord", modules) is None
    assert broken_reference(f"{prefix}.outbox.records.Nothing", modules) == f"{prefix}.outbox.records has no Nothing"
    assert broken_reference(f"{prefix}.progress", modules) == "no such module"


def _setup_py():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pyharvest_setup_py", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines only: setup() runs as __main__
    return module


def test_the_package_index_description_has_no_relative_link():
    from tests.helpers.release import relative_links

    readme = (ROOT / "README.md").read_text()
    assert len(relative_links(readme)) >= 20  # what a package index would show dead
    description = _setup_py().long_description()
    assert not relative_links(description), relative_links(description)
    # Every path it names instead is in the checkout (and so in the sdist: MANIFEST.in grafts docs/).
    named = set(re.findall(r"`(docs/[\w-][^`\s]*|CHANGELOG\.md)`", description))
    assert {"docs/operations.md", "docs/dialects/", "CHANGELOG.md"} <= named
    assert [p for p in named if not (ROOT / p).exists()] == []
    assert "graft docs" in (ROOT / "MANIFEST.in").read_text().splitlines()


def test_with_a_repository_address_the_description_links_to_its_files():
    from tests.helpers.release import relative_links

    readme = (ROOT / "README.md").read_text()
    description = _setup_py().index_description(readme, "https://forge.example/pyharvest/")
    assert not relative_links(description)
    assert "[operations](https://forge.example/pyharvest/blob/HEAD/docs/operations.md#harvesting-in-shards)" in description
    assert description.count("](https://forge.example/pyharvest/blob/HEAD/") == len(relative_links(readme))
