"""The reaper command: one-line errors and non-zero exits for bad input, never a traceback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid

import pytest

from benchmarks.children import python_module
from tests.helpers.cli import assert_one_line_error, reaper


def test_missing_config_file():
    assert_one_line_error(reaper("-f", "/no/such/reaper.yaml"), "cannot read configuration file")


def test_invalid_config_names_the_field(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text("harvest:\n  limits:\n    heartbeatTimeout: soon\n")
    result = reaper("-f", str(cfg))
    assert result.returncode == 2
    assert_one_line_error(result, "harvest.limits.heartbeatTimeout", "not a duration")


def test_unknown_arguments_are_a_usage_error():
    result = reaper("--frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_print_config_masks_secrets(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        "  baseKafkaConfig:\n    bootstrap.servers: k:9094\n    sasl.password: alice-secret\n"
        "  dataSource: postgresql+psycopg://app:hunter2@db/app\n"
    )
    result = reaper("-f", str(cfg), "--print-config")
    assert result.returncode == 0, result.stderr
    assert "alice-secret" not in result.stdout and "hunter2" not in result.stdout
    assert "k:9094" in result.stdout and "***" in result.stdout


@pytest.mark.kafka
def test_unreachable_database_is_a_one_line_error(tmp_path, kafka_bootstrap):
    from pyharvest.bindings.kafka.embedded import free_port

    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n"
        f"  dataSource: postgresql+psycopg://postgres:pw@127.0.0.1:{free_port()}/test\n"
    )
    result = reaper("-f", str(cfg))
    assert_one_line_error(result)
    assert "pw@" not in result.stderr


def test_unreachable_broker_is_a_one_line_error(tmp_path):
    from pyharvest.bindings.kafka.embedded import free_port

    db = tmp_path / "outbox.db"
    assert reaper("init-db", "--data-source", f"sqlite:///{db}").returncode == 0
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:{free_port()}\n"
        f"  dataSource: sqlite:///{db}\n"
    )
    assert_one_line_error(reaper("-f", str(cfg)), "cannot reach Kafka")


def test_missing_table_says_to_run_init_db(tmp_path, kafka_bootstrap):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n"
        f"  dataSource: sqlite:///{tmp_path / 'empty.db'}\n"
        "  outboxTable: nosuchtable\n"
    )
    assert_one_line_error(reaper("-f", str(cfg)), "nosuchtable", "init-db")


def test_injection_through_the_table_name_is_refused(tmp_path):
    result = reaper("init-db", "--data-source", f"sqlite:///{tmp_path / 'x.db'}", "--table", "outbox; DROP TABLE x")
    assert_one_line_error(result, "outbox; DROP TABLE x")


@pytest.mark.parametrize("binding", ["postgresql", "sqlite"])
def test_schema_prints_ddl(binding):
    result = reaper("schema", "--binding", binding)
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE" in result.stdout.upper()
    assert "leader_id" in result.stdout


def test_schema_with_unknown_binding_lists_the_installed_ones():
    assert_one_line_error(reaper("schema", "--binding", "nosuchdb"), "nosuchdb", "postgresql")


def test_init_db_is_idempotent(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert reaper("init-db", "--data-source", url).returncode == 0
    second = reaper("init-db", "--data-source", url)
    assert second.returncode == 0, second.stderr


def test_a_duration_without_a_unit_names_the_key_and_the_units(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text("harvest:\n  limits:\n    heartbeatTimeout: 5000\n")
    result = reaper("-f", str(cfg))
    assert result.returncode == 2
    assert_one_line_error(result, "harvest.limits.heartbeatTimeout", "5000 has no unit", "'5000ms'", "'5000s'")


def test_a_kafka_property_librdkafka_refuses_names_its_yaml_key(tmp_path):
    db = tmp_path / "outbox.db"
    assert reaper("init-db", "--data-source", f"sqlite:///{db}").returncode == 0
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  dataSource: sqlite:///{db}\n"
        "  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:9\n"
        "  producerKafkaConfig:\n    delivery.timeout.ms: -5\n"
    )
    result = reaper("-f", str(cfg))
    assert result.returncode == 2
    assert_one_line_error(result, "harvest.producerKafkaConfig[delivery.timeout.ms]", "allowed range")


@pytest.mark.kafka
def test_a_derived_kafka_property_names_the_limit_it_comes_from(tmp_path, kafka_bootstrap):
    db = tmp_path / "outbox.db"
    assert reaper("init-db", "--data-source", f"sqlite:///{db}").returncode == 0
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  dataSource: sqlite:///{db}\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n"
        "  limits:\n    heartbeatTimeout: 5000s\n"
    )
    result = reaper("-f", str(cfg))
    assert result.returncode == 2
    assert_one_line_error(result, "harvest.limits.heartbeatTimeout", "session.timeout.ms", "allowed range")


def librdkafka_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "pyharvest.librdkafka" in line]


def write_inbox_yaml(tmp_path, bootstrap: str, extra: str = "") -> str:
    cfg = tmp_path / "inbox.yaml"
    cfg.write_text(
        "inbox:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {bootstrap}\n{extra}"
        "  groupID: billing\n"
        "  topics: [payments]\n"
        f"  dataSource: sqlite:///{tmp_path / 'inbox.db'}\n"
    )
    (tmp_path / "shop.py").write_text("def apply(tx, message):\n    pass\n")
    return str(cfg)


def test_inbox_with_an_unreachable_broker_fails_fast_in_one_line(tmp_path):
    from pyharvest.bindings.kafka.embedded import free_port

    cfg = write_inbox_yaml(tmp_path, f"127.0.0.1:{free_port()}")
    result = subprocess.run(
        [*python_module("pyharvest"), "inbox", "-f", cfg, "--handler", "shop:apply"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert_one_line_error(result, "cannot reach Kafka", "within 10s")
    # librdkafka retried the connection hundreds of times: one line, then one count.
    logged = librdkafka_lines(result.stderr)
    assert 1 <= len(logged) <= 2, result.stderr
    assert "Connection refused" in logged[0]


def test_reaper_collapses_librdkafka_repeats(tmp_path):
    from pyharvest.bindings.kafka.embedded import free_port

    db = tmp_path / "outbox.db"
    assert reaper("init-db", "--data-source", f"sqlite:///{db}").returncode == 0
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        f"harvest:\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:{free_port()}\n  dataSource: sqlite:///{db}\n"
    )
    result = reaper("-f", str(cfg))
    assert_one_line_error(result, "cannot reach Kafka")
    logged = librdkafka_lines(result.stderr)
    assert 1 <= len(logged) <= 2, result.stderr
    if len(logged) == 2:
        assert "more time" in logged[1]
    # The count comes before the error, which is the last word.
    assert result.stderr.rstrip().splitlines()[-1].startswith("reaper: error:")


def test_inbox_names_the_key_of_a_kafka_property_librdkafka_refuses(tmp_path):
    cfg = write_inbox_yaml(tmp_path, "127.0.0.1:9", "    session.timeout.ms: 15000000\n")
    result = subprocess.run(
        [*python_module("pyharvest"), "inbox", "-f", cfg, "--handler", "shop:apply"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert_one_line_error(result, "inbox.baseKafkaConfig[session.timeout.ms]", "allowed range")


@pytest.mark.parametrize(
    ("harvest", "fragments"),
    [
        ("  outboxTable: \"out'box\"\n", ("outboxTable", "not a valid table name")),
        ("  dataSource: nosuchdb://h/x\n", ("nosuchdb",)),
        ("  limits:\n    heartbeatTimeout: 5000s\n", ("harvest.limits.heartbeatTimeout", "session.timeout.ms")),
        ("  baseKafkaConfig:\n    acks: lots\n", ("harvest.baseKafkaConfig[acks]",)),
    ],
)
def test_print_config_refuses_what_reaper_refuses(tmp_path, harvest, fragments):
    cfg = tmp_path / "reaper.yaml"
    base = "" if "dataSource" in harvest else f"  dataSource: sqlite:///{tmp_path / 'x.db'}\n"  # no key twice
    cfg.write_text(f"harvest:\n{base}{harvest}")
    printed = reaper("-f", str(cfg), "--print-config")
    assert_one_line_error(printed, *fragments)
    assert printed.stdout == ""


@pytest.mark.parametrize("harvest", ["  outboxTable: \"out'box\"\n", "  dataSource: nosuchdb://h/x\n"])
def test_print_config_and_reaper_refuse_with_the_same_line(tmp_path, harvest):
    cfg = tmp_path / "reaper.yaml"
    base = "" if "dataSource" in harvest else f"  dataSource: sqlite:///{tmp_path / 'x.db'}\n"  # no key twice
    cfg.write_text(f"harvest:\n{base}{harvest}")
    printed, run = reaper("-f", str(cfg), "--print-config"), reaper("-f", str(cfg))
    assert_one_line_error(run)
    assert printed.stderr.splitlines()[-1] == run.stderr.splitlines()[-1]


def test_inbox_print_config_refuses_a_property_librdkafka_refuses(tmp_path):
    cfg = write_inbox_yaml(tmp_path, "127.0.0.1:9", "    fetch.wait.max.ms: -1\n")
    result = reaper("inbox", "-f", cfg, "--print-config")
    assert result.returncode == 2
    assert_one_line_error(result, "inbox.baseKafkaConfig[fetch.wait.max.ms]")


def test_the_handler_is_imported_from_the_current_directory(tmp_path):
    from pathlib import Path

    from pyharvest.bindings.kafka.embedded import free_port

    # The installed console script, not 'python -m' (which puts the current directory on the path itself).
    script = Path(sys.executable).with_name("reaper")
    cfg = write_inbox_yaml(tmp_path, f"127.0.0.1:{free_port()}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(script), "inbox", "-f", cfg, "--handler", "shop:apply"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )
    # It got past the import to the broker check.
    assert "No module named" not in result.stderr
    assert_one_line_error(result, "cannot reach Kafka")
    missing = subprocess.run(
        [str(script), "inbox", "-f", cfg, "--handler", "nosuchmodule:apply"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )
    assert_one_line_error(missing, "--handler", "nosuchmodule")


def test_help_says_where_the_handler_is_imported_from():
    result = reaper("inbox", "--help")
    assert "current directory" in " ".join(result.stdout.split())


def test_a_mistyped_command_is_unknown_with_a_close_match():
    result = reaper("brokr")
    assert result.returncode == 2
    assert_one_line_error(result, "unknown command 'brokr'", "did you mean 'broker'?", "init-db")
    assert "-f" not in result.stderr.split("(or")[0]  # not "-f is required"


def test_a_postgres_url_gets_a_hint_to_write_postgresql_psycopg():
    result = reaper("init-db", "--data-source", "postgres://app:secret@127.0.0.1:5432/app")
    assert_one_line_error(result, "postgresql+psycopg://")
    assert "secret" not in result.stderr


def test_run_has_a_description():
    result = reaper("run", "--help")
    assert result.returncode == 0
    assert "leader group" in result.stdout


def test_a_reader_that_goes_away_is_no_broken_pipe_traceback():
    # 'reaper schema … | head -1': the reader closes the pipe before reaper writes.
    proc = subprocess.Popen(
        [*python_module("pyharvest"), "schema", "--binding", "postgresql", "--statements"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(60)
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err, err


# ---------------------------------------------------------------------- an operator's first incident


def installed_reaper(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """The ``reaper`` console script itself, as an operator runs it."""
    script = os.path.join(os.path.dirname(sys.executable), "reaper")
    assert os.path.exists(script), "the package is not installed with its console script"
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_an_unknown_flag_is_named_and_version_answers():
    unknown = installed_reaper("--frobnicate")
    assert unknown.returncode == 2 and "--frobnicate" in unknown.stderr
    assert "-f/--file" not in unknown.stderr
    from importlib.metadata import version

    shown = installed_reaper("--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"reaper (pyharvest) {version('pyharvest')}"
    assert_one_line_error(installed_reaper("run"), "required: -f/--file")


@pytest.mark.parametrize(
    ("data_source", "module", "fragments"),
    [
        ("postgresql+psycopg9://u@127.0.0.1:9/db", None, ("harvest.dataSource", "no driver 'psycopg9'", "psycopg,")),
        ("mysql+mysqldb://u@127.0.0.1:9/db", "MySQLdb", ("'mysqldb' driver", "pip install 'pyharvest[mysqlclient]'")),
    ],
    ids=["unknown-driver", "driver-not-installed"],
)
def test_print_config_loads_the_driver_as_the_run_does(tmp_path, data_source, module, fragments):
    # Asked of a fresh interpreter, as the command is: a test may have aliased it in this one
    # (PyMySQL's install_as_MySQLdb).
    if module is not None and subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0:
        pytest.skip(f"{module} is installed here")
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  dataSource: {data_source}\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:9\n")
    printed, run = installed_reaper("-f", str(cfg), "--print-config"), installed_reaper("-f", str(cfg))
    assert_one_line_error(printed, *fragments)
    assert_one_line_error(run, *fragments)
    assert printed.stdout == "" and "NoSuchModuleError" not in run.stderr
    assert "reaper starting" not in run.stderr and "starting harvester" not in run.stderr  # refused first


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  dataSource: sqlite:///{tmp_path / 'x.db'}\n  outboxTable: a\n  outboxTable: b\n")
    assert_one_line_error(
        installed_reaper("-f", str(cfg), "--print-config"), str(cfg), "line 4", "'outboxTable' is given twice",
        "first on line 3",
    )


def test_yaml_errors_name_the_file(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text("harvest:\n  dataSource: [\n")
    result = installed_reaper("-f", str(cfg))
    assert result.returncode == 2 and "<unicode string>" not in result.stderr
    assert f'in "{cfg}", line 3' in result.stderr


@pytest.mark.parametrize(
    ("harvest", "path"),
    [
        ("  shards: 0\n", "harvest.shards"),
        ("  shards: two\n", "harvest.shards"),
        ("  outboxTable: \"a b\"\n", "harvest.outboxTable"),
        ("  poisonPolicy: ignore\n", "harvest.poisonPolicy"),
    ],
)
def test_errors_name_the_full_path_and_come_before_starting(tmp_path, harvest, path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  dataSource: sqlite:///{tmp_path / 'x.db'}\n{harvest}")
    result = installed_reaper("-f", str(cfg))
    assert_one_line_error(result, f"invalid configuration: {path}: ")
    assert "reaper starting" not in result.stderr and "starting harvester" not in result.stderr


@pytest.mark.kafka
def test_the_init_db_command_an_error_suggests_runs_as_printed(tmp_path, kafka_bootstrap):
    import shlex

    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n"
        f"  dataSource: sqlite:///{tmp_path / 'fresh.db'}\n"
        "  outboxTable: orders_outbox\n"
        "logging:\n  level: error\n"
    )
    run = installed_reaper("-f", "reaper.yaml", cwd=str(tmp_path))
    assert_one_line_error(run, "'orders_outbox' does not exist", "`reaper init-db -f reaper.yaml`")
    command = run.stderr.split("`")[1]
    created = installed_reaper(*shlex.split(command)[1:], cwd=str(tmp_path))
    assert created.returncode == 0, created.stderr
    assert "orders_outbox" in created.stdout and "is ready" in created.stdout


def _missing_table_hint(port: int) -> str:
    """The ``init-db`` command a reaper's ``/readyz`` names for its missing table."""
    from tests.helpers.ops import readyz

    error = readyz(port)[1].get("errors", {}).get("database", "")
    return error.split("`")[1] if "does not exist" in error else ""


@pytest.mark.kafka
def test_a_table_dropped_under_a_reaper_started_with_f_names_init_db_f(tmp_path, kafka_bootstrap):
    # Mid-run, the error is the binding's own, not the start-up one reaper rewrites: it names
    # the file too, not --data-source and --table.
    import shlex

    from tests.helpers.ops import LOCAL, readyz
    from tests.helpers.reapers import ReaperProcess
    from tests.helpers.waiting import wait_until

    db = tmp_path / "outbox.db"
    config = {
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            "dataSource": f"sqlite:///{db}",
            "outboxTable": "orders_outbox",
            "leaderGroupID": f"hint-{uuid.uuid4().hex[:8]}",
            "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "ioErrorBackoff": "50ms"},
        },
        "metrics": LOCAL,
    }
    # The table first: a reaper that starts before it exists exits at start-up (a race the
    # test lost once in CI, when init-db came second), and the mid-run drop is what is tested.
    import yaml

    (tmp_path / "reaper.yaml").write_text(yaml.safe_dump(config))
    created = installed_reaper("init-db", "-f", "reaper.yaml", cwd=str(tmp_path))
    assert created.returncode == 0, created.stderr
    with ReaperProcess(config, tmp_path) as reaper:
        port = int(reaper.ops_url().rsplit(":", 1)[1])
        wait_until(lambda: readyz(port)[0] == 200, 60, "the reaper to be ready")
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE orders_outbox")
        hint: list[str] = []
        wait_until(lambda: bool(hint.append(_missing_table_hint(port)) or hint[-1]), 60, "/readyz to name the table")
        assert hint[-1] == "reaper init-db -f reaper.yaml", hint[-1]
        wait_until(lambda: "does not exist" in reaper.log(), 30, "the log to name the missing table")
        assert "`reaper init-db -f reaper.yaml`" in reaper.log() and "--data-source" not in reaper.log()
        recreated = installed_reaper(*shlex.split(hint[-1])[1:], cwd=str(tmp_path))  # as printed
        assert recreated.returncode == 0, recreated.stderr
        wait_until(lambda: readyz(port)[0] == 200, 60, "the reaper to be ready on the new table")


@pytest.mark.kafka
def test_an_unsharded_table_under_reaper_f_shards_names_init_db_f_shards(tmp_path, kafka_bootstrap):
    import shlex

    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(
        "harvest:\n"
        f"  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n"
        f"  dataSource: sqlite:///{tmp_path / 'outbox.db'}\n"
        f"  leaderGroupID: shards-hint-{uuid.uuid4().hex[:8]}\n"
        "logging:\n  level: error\n"
    )
    assert installed_reaper("init-db", "-f", "reaper.yaml", cwd=str(tmp_path)).returncode == 0
    run = installed_reaper("-f", "reaper.yaml", "--shards", "2", cwd=str(tmp_path))
    assert_one_line_error(run, "has no index for 2 shards", "`reaper init-db -f reaper.yaml --shards 2`")
    assert "--data-source" not in run.stderr
    command = run.stderr.split("`")[1]
    readied = installed_reaper(*shlex.split(command)[1:], cwd=str(tmp_path))
    assert readied.returncode == 0, readied.stderr


def test_the_library_suggests_init_db_with_the_data_source(tmp_path):
    import shlex

    import sqlalchemy as sa

    from pyharvest.bindings.sql import check_table
    from pyharvest.core.errors import TableNotFoundError
    from pyharvest.plugins.api import load_dialect, parse_table_name

    url = f"sqlite:///{tmp_path / 'lib.db'}"
    engine = sa.create_engine(url)
    with pytest.raises(TableNotFoundError) as missing:
        check_table(engine, parse_table_name("orders_outbox"), load_dialect("sqlite"))
    engine.dispose()
    command = str(missing.value).split("`")[1]
    assert f"--data-source '{url}'" in command
    created = installed_reaper(*shlex.split(command)[1:])
    assert created.returncode == 0, created.stderr

