pytest_plugins = ["tests.helpers.fixtures.databases", "tests.helpers.fixtures.kafka", "tests.helpers.fixtures.secure_kafka"]


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    """Mark every test that runs against a live database as `db`, so the tox matrix can run
    the database-free tests once (`-m "not db"`) and the rest once per database (`-m db`)."""
    import pytest

    for item in items:
        if "dialect" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
