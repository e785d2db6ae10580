"""The conformance suite against every built-in dialect with a live database here."""

from __future__ import annotations

import pytest

from pyharvest.testing.conformance import DialectConformance


class TestBuiltinDialects(DialectConformance):
    @pytest.fixture
    def conformance_data_source(self, database_url: str) -> str:
        return database_url

    @pytest.fixture
    def conformance_table(self, table_name: str) -> str:
        return table_name
