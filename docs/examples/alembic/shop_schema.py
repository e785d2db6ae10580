"""The application's own tables (the outbox is not among them: its migration creates it)."""

import sqlalchemy as sa

metadata = sa.MetaData()

orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.String(100), nullable=False),
    sa.Column("total_cents", sa.Integer, nullable=False),
)
