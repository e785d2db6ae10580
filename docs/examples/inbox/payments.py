"""An inbox with a batch handler: each transaction's payments in one executemany.

DATA_SOURCE=postgresql+psycopg://app@localhost/app BOOTSTRAP_SERVERS=localhost:9092 python payments.py
"""

import json
import os

import sqlalchemy as sa

from pyharvest.inbox import Inbox, InboxConfig, InboxMessage

payments = sa.Table(
    "payments",
    sa.MetaData(),
    sa.Column("delivery_id", sa.String(32), primary_key=True),  # the same on every redelivery
    sa.Column("account", sa.String(50), nullable=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
)
insert_payment = sa.insert(payments)


def apply_payments(tx: sa.Connection, messages: list[InboxMessage]) -> None:
    """One transaction's messages, after dedupe, each partition's in offset order."""
    tx.execute(
        insert_payment,
        [
            {"delivery_id": m.delivery_id, "account": m.key_text, "amount": json.loads(m.value or b"0")}
            for m in messages
        ],
    )


if __name__ == "__main__":
    data_source = os.environ.get("DATA_SOURCE", "postgresql+psycopg://app@localhost/app")
    payments.metadata.create_all(sa.create_engine(data_source))
    config = InboxConfig(
        base_kafka_config={"bootstrap.servers": os.environ.get("BOOTSTRAP_SERVERS", "localhost:9092")},
        group_id=os.environ.get("GROUP_ID", "payments-inbox"),
        topics=[os.environ.get("TOPIC", "payments")],
        data_source=data_source,
    )
    with Inbox(config, batch_handler=apply_payments) as inbox:
        inbox.join()
