"""A user's script, type-checked by mypy --strict against the installed wheel (never run).

It uses the public API the README shows: if the wheel lost its ``py.typed`` marker, or a
public name lost its annotations, mypy fails on this file.
"""

from __future__ import annotations

import sqlalchemy as sa

import pyharvest
from pyharvest import Config, Harvest, OutboxRecord, stasher
from pyharvest.events import Event


def debit(engine: sa.Engine, account: int, amount: int) -> None:
    with engine.begin() as tx:
        tx.execute(sa.text("UPDATE accounts SET balance = balance - :a WHERE id = :id"), {"a": amount, "id": account})
        stasher.stash(tx, OutboxRecord("accounts", key=str(account), value=b"{}", headers=[("source", "billing")]))


def on_event(event: Event) -> None:
    print(event)


def run() -> None:
    config = Config(
        base_kafka_config={"bootstrap.servers": "localhost:9092"},
        data_source="postgresql+psycopg://app@localhost/app",
        leader_group_id="billing-api",
    )
    with Harvest(config, on_event=on_event) as harvest:
        harvest.join()


VERSION: str = pyharvest.__version__
