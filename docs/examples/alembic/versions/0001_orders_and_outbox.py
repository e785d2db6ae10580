"""orders, and the outbox their events go through

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

from pyharvest.alembic import create_outbox_table, drop_outbox_table

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("customer", sa.String(100), nullable=False),
        sa.Column("total_cents", sa.Integer, nullable=False),
    )
    create_outbox_table(op)  # the dialect plugin's DDL for this database: the table `reaper init-db` makes


def downgrade() -> None:
    drop_outbox_table(op)
    op.drop_table("orders")
