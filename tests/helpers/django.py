"""The documented Django example project, and a Django database as the tests see it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "django"


ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
}


@dataclass
class DjangoDatabase:
    dialect: str
    settings: dict[str, Any]  # DATABASES["default"]

    def engine(self) -> sa.Engine:
        """A SQLAlchemy engine on the same database, through the URL the harvester gets."""
        from pyharvest.django import data_source

        return sa.create_engine(data_source("default"))

    def count(self, table: str = "outbox") -> int:
        engine = self.engine()
        try:
            with engine.connect() as c:
                return int(c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())
        finally:
            engine.dispose()

