"""Each framework's row says how many labelled inputs its top-1/top-5 were measured on (``n``), so a 100% on 2
inputs and an 85% on 20 are told apart in the history listing. Rows written before are filled in from their
payload's accuracy frame where it has one (NULL where it has none, or cannot be read).

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from mlms_nb.evaluation.codec import EvaluationFormatError, from_json

    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("n", sa.Integer))
    rows = sa.table("evaluations", sa.column("id", sa.Integer), sa.column("framework", sa.String),
                    sa.column("top1", sa.Float), sa.column("payload", sa.Text), sa.column("n", sa.Integer))
    conn = op.get_bind()
    scored = conn.execute(sa.select(rows.c.id, rows.c.framework, rows.c.payload).where(rows.c.top1.is_not(None)))
    for row_id, framework, payload in scored.all():
        try:
            accuracy = from_json(payload)["accuracy"]
        except EvaluationFormatError:
            continue
        mine = accuracy[accuracy["framework"] == framework] if "framework" in accuracy else accuracy.iloc[:0]
        if not mine.empty and "n" in mine:
            conn.execute(rows.update().where(rows.c.id == row_id).values(n=int(mine["n"].iloc[0])))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("n")
