"""One ceilings table: ``machine_ceilings`` (a figure per row, superseded by ``ceilings``, a measurement per row,
which mlms-nb has read since) is dropped -- its figures are a cache, measured again on demand -- and the never-used
``traces.blob`` column goes (trace files live beside the store; ``traces.path`` says where).

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_machine_ceilings_stack_hash", table_name="machine_ceilings")
    op.drop_table("machine_ceilings")
    with op.batch_alter_table("traces") as batch:  # SQLite: copy-and-move; elsewhere ALTER TABLE
        batch.drop_column("blob")


def downgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.add_column(sa.Column("blob", sa.LargeBinary))
    op.create_table(
        "machine_ceilings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("stack_hash", sa.String(16), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("measured_at", sa.String(40), nullable=False),
        sa.Column("how", sa.Text),
    )
    op.create_index("ix_machine_ceilings_stack_hash", "machine_ceilings", ["stack_hash"])
