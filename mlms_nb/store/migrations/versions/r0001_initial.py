"""The history store as of mlms-nb 39ff0c1: evaluations, traces (with an unused ``blob``), ``machine_ceilings``
(one row per figure) and ``ceilings`` (one row per measurement).

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_long_text = sa.Text().with_variant(sa.dialects.mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("evaluation_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("model_version", sa.String(64), nullable=False),
        sa.Column("framework", sa.String(64), nullable=False),
        sa.Column("framework_version", sa.String(64)),
        sa.Column("stack_hash", sa.String(16), nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("complete", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("dataset", sa.String(500)),
        sa.Column("batch_sizes", sa.Text),
        sa.Column("top1", sa.Float),
        sa.Column("top5", sa.Float),
        sa.Column("median_ms", sa.Float),
        sa.Column("payload", _long_text, nullable=False),
        sa.UniqueConstraint("evaluation_id", "framework", name="uq_evaluations_evaluation_framework"),
    )
    op.create_index("ix_evaluations_model_framework", "evaluations", ["model", "framework"])
    op.create_index("ix_evaluations_stack_hash", "evaluations", ["stack_hash"])
    op.create_index("ix_evaluations_created_at", "evaluations", ["created_at"])
    op.create_table(
        "traces",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("evaluation_id", sa.String(32), nullable=False),
        sa.Column("trace_id", sa.String(64), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("blob", sa.LargeBinary),
        sa.Column("path", sa.Text),
        sa.Column("created_at", sa.String(40)),
    )
    op.create_index("ix_traces_evaluation_id", "traces", ["evaluation_id"])
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
    op.create_table(
        "ceilings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("stack_hash", sa.String(16), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("peak_flops_per_s", sa.Float, nullable=False),
        sa.Column("peak_flops_iqr", sa.Float),
        sa.Column("bandwidth_bytes_per_s", sa.Float, nullable=False),
        sa.Column("bandwidth_iqr", sa.Float),
        sa.Column("ridge_flop_per_byte", sa.Float, nullable=False),
        sa.Column("method", sa.Text),
        sa.Column("measured_at", sa.String(40), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_index("ix_ceilings_stack_hash_device", "ceilings", ["stack_hash", "device"])


def downgrade() -> None:
    for table in ("ceilings", "machine_ceilings", "traces", "evaluations"):
        op.drop_table(table)
