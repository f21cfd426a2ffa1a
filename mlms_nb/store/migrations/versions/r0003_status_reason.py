"""Each framework's row says how its measurement ended: ``status`` (complete | partial | failed | running) and
``reason`` (error | interrupt | signal | timeout | crash). Rows written before were either complete or cut short
by Ctrl-C (the only way an older mlms-nb stored an incomplete sweep), and are filled in so.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("status", sa.String(16)))
        batch.add_column(sa.Column("reason", sa.String(16)))
    rows = sa.table("evaluations", sa.column("complete", sa.Boolean), sa.column("status", sa.String),
                    sa.column("reason", sa.String))
    op.execute(rows.update().where(rows.c.complete == sa.true()).values(status="complete"))
    op.execute(rows.update().where(rows.c.complete == sa.false()).values(status="partial", reason="interrupt"))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("reason")
        batch.drop_column("status")
