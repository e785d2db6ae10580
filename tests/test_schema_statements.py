"""``reaper schema --statements``: the DDL and every statement the harvester runs, compiled for
the database without connecting to it, through the real command."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.children import python_module


def reaper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*python_module("pyharvest"), *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("binding", ["postgresql", "mysql", "sqlite", "mssql", "oracle"])
def test_prints_ddl_then_every_statement_for_each_database(binding: str) -> None:
    out = reaper("schema", "--binding", binding, "--table", "app.orders", "--statements")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "CREATE TABLE" in text
    for what in ("-- mark", "-- purge", "-- reset", "-- backlog count"):
        assert what in text
    assert "quarantine" not in text  # the default policy has no quarantine table


@pytest.mark.parametrize("binding", ["mssql", "oracle"])
def test_quarantine_policy_shows_the_key_filter_in_the_mark(binding: str) -> None:
    out = reaper("schema", "--binding", binding, "--statements", "--poison-policy", "quarantine")
    assert out.returncode == 0, out.stderr
    mark = out.stdout.split("-- mark", 1)[1].split("-- purge", 1)[0]
    assert "NOT (EXISTS (SELECT *\nFROM outbox_quarantine" in mark
    assert "-- quarantine: park a key" in out.stdout


def test_sql_server_mark_locks_with_a_hint_and_a_literal_top() -> None:
    out = reaper("schema", "--binding", "mssql", "--statements")
    mark = out.stdout.split("-- mark", 1)[1]
    assert "SELECT TOP 1000 oldest.id" in mark and "WITH (UPDLOCK, ROWLOCK)" in mark and "OUTPUT inserted.id" in mark


def test_unknown_binding_is_a_clear_error() -> None:
    out = reaper("schema", "--binding", "nosuchdb", "--statements")
    assert out.returncode != 0
    assert "no pyharvest dialect named 'nosuchdb' is installed" in out.stderr


@pytest.mark.parametrize("binding", ["postgresql", "mysql"])
def test_a_modulo_is_printed_as_sql_not_as_the_drivers_escape(binding: str) -> None:
    # psycopg and PyMySQL take %s parameters, so their dialects escape a literal % as %%.
    out = reaper("schema", "--binding", binding, "--statements", "--shards", "2")
    assert out.returncode == 0, out.stderr
    assert "%%" not in out.stdout
    assert "% 2" in out.stdout


def test_the_oldest_rows_age_is_read_through_the_primary_key() -> None:
    out = reaper("schema", "--binding", "postgresql", "--statements")
    age = out.stdout.split("-- the oldest row's create_time", 1)[1]
    assert "ORDER BY outbox.id" in age and "LIMIT" in age and "WHERE" not in age.split(";")[0]
