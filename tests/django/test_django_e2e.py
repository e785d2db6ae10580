"""End to end: records stashed through Django are published by ``manage.py reaper`` (the
documented example project, its settings extended as a deployment would), running in its own
process on the database of DATABASES; a record of a rolled-back block never is; SIGTERM stops
the command gracefully."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from pyharvest import OutboxRecord
from tests.helpers.django import EXAMPLE, DjangoDatabase
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

pytest.importorskip("django")

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from pyharvest.django import stash, stash_many  # noqa: E402

pytestmark = pytest.mark.kafka

SETTINGS = """\
try:
    import MySQLdb  # mysqlclient, where installed
except ImportError:
    try:
        import pymysql
        pymysql.install_as_MySQLdb()
    except ImportError:
        pass

from mysite.settings import *  # noqa: F403

DATABASES = {{"default": {database!r}}}
PYHARVEST = {{
    "harvest": {{
        "baseKafkaConfig": {{"bootstrap.servers": {bootstrap!r}}},
        "leaderGroupID": {group!r},
        "limits": {{"heartbeatTimeout": "2s", "minPollInterval": "50ms"}},
    }},
}}
"""


def wait_until_empty(db: DjangoDatabase, reaper: subprocess.Popen, timeout: float = 60.0) -> None:
    def empty() -> bool:
        if reaper.poll() is not None:
            _out, err = reaper.communicate()
            pytest.fail(f"manage.py reaper exited with {reaper.returncode}:\n{err}")
        return db.count() == 0

    wait_until(empty, timeout, "the outbox to empty", interval=0.2)


def test_manage_py_reaper_publishes_what_django_committed(
    django_db: DjangoDatabase, kafka_bootstrap: str, topic_name: str, tmp_path
) -> None:
    call_command("migrate", "pyharvest", verbosity=0)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    module = f"e2e_settings_{uuid.uuid4().hex[:8]}"
    database = {k: v for k, v in django_db.settings.items() if k in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")}
    (tmp_path / f"{module}.py").write_text(
        SETTINGS.format(database=database, bootstrap=kafka_bootstrap, group=f"dj-e2e-{uuid.uuid4().hex[:8]}")
    )

    # Before the harvester starts: one committed block, one rolled back.
    with transaction.atomic():
        stash(OutboxRecord(topic_name, "a", b"a0", headers=[("via", "django")]))
        stash_many([OutboxRecord(topic_name, "b", f"b{i}".encode()) for i in range(3)])
    with pytest.raises(RuntimeError), transaction.atomic():
        stash(OutboxRecord(topic_name, "a", b"rolled back"))
        raise RuntimeError("the business change failed")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    reaper = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "manage.py"), "reaper", "--settings", module],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until_empty(django_db, reaper)
        # While it runs: more committed and rolled-back blocks.
        with transaction.atomic():
            stash(OutboxRecord(topic_name, "a", b"a1"))
        with transaction.atomic():
            stash(OutboxRecord(topic_name, "b", b"b3"))
            transaction.set_rollback(True)
        with transaction.atomic():
            stash_many([OutboxRecord(topic_name, "c", b"c0"), OutboxRecord(topic_name, "b", b"b3")])
        wait_until_empty(django_db, reaper)
    finally:
        reaper.send_signal(signal.SIGTERM)
        try:
            _out, err = reaper.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            reaper.kill()
            _out, err = reaper.communicate()
    assert reaper.returncode == 0, err
    assert "SIGTERM received: stopping" in err

    got = read_topic(kafka_bootstrap, topic_name, expect=7)
    per_key = {k: [v for i, v in enumerate(vs) if i == 0 or vs[i - 1] != v] for k, vs in values_per_key(got).items()}
    assert per_key == {"a": [b"a0", b"a1"], "b": [b"b0", b"b1", b"b2", b"b3"], "c": [b"c0"]}
    first = next(h for _p, k, v, h in got if v == b"a0")
    assert ("via", b"django") in first
