"""Each framework's row says which mlms agent measured it (``agent``: its name and address, from
``Evaluation.stack["agent"]``), so a history shared by several agents tells their rows apart; NULL for rows measured
in the caller's own process, and for every row written before.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("agent", sa.String(300)))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("agent")
