import logging
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "tests.helpers.fixtures.databases",
    "tests.helpers.fixtures.kafka",
    "tests.helpers.fixtures.schema_registry",
    "tests.helpers.fixtures.secure_kafka",
]


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    """Mark every test that runs against a live database as `db`, so the tox matrix can run
    the database-free tests once (`-m "not db"`) and the rest once per database (`-m db`)."""
    import pytest

    for item in items:
        if "dialect" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)



@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    """A CLI run in-process (``reaper ...`` through ``main``) points the root logger at the
    ``sys.stderr`` of its test, which pytest closes after it: every later test's log line then
    fails with "I/O operation on closed file", and the CI log loses what a failing test said.
    What a test adds to the root logger goes with it (pytest's own capture handlers stay)."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)
