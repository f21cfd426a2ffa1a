"""The history store's tables (SQLAlchemy Core, portable column types; JSON is stored as text).

- ``evaluations``: one row per evaluation x framework (written as soon as that framework measured something and
  updated after every measurement; ``status``/``reason`` say whether it is complete and why not), with the columns people filter and sort on and ``payload``,
  that framework's part of the `Evaluation` as JSON (lossless);
- ``traces``: where the trace files of an evaluation are (a Parquet folder per framework) and their format;
- ``ceilings``: one row per measurement of a device's ceilings (:mod:`mlms_nb.theory.ceilings`), keyed by stack
  hash and device, with the whole measurement as JSON.
"""
from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text, UniqueConstraint
from sqlalchemy.dialects import mysql

from mlms_nb.schema.evaluation import HISTORY

LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

metadata = MetaData()

evaluations = Table(
    "evaluations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("evaluation_id", String(32), nullable=False),
    Column("model", String(200), nullable=False),
    Column("model_version", String(64), nullable=False),
    Column("framework", String(64), nullable=False),
    Column("framework_version", String(64)),
    Column("stack_hash", String(16), nullable=False),
    Column("created_at", String(40), nullable=False),  # ISO 8601, UTC: sorts as text
    Column("complete", Boolean(create_constraint=False), nullable=False),
    Column("status", String(16)),  # complete | partial | failed | running (NULL in rows older than the column)
    Column("reason", String(16)),  # error | interrupt | signal | timeout | crash, when not complete
    Column("dataset", String(500)),
    Column("batch_sizes", Text),  # JSON list
    Column("n", Integer),  # labelled inputs top1/top5 were measured on (NULL: no accuracy)
    Column("top1", Float),
    Column("top5", Float),
    Column("median_ms", Float),  # at the smallest batch size
    Column("agent", String(300)),  # the mlms agent that measured it: "NAME at ADDRESS" (NULL: the caller's process)
    Column("payload", LongText, nullable=False),  # that framework's Evaluation JSON
    UniqueConstraint("evaluation_id", "framework", name="uq_evaluations_evaluation_framework"),
)
Index("ix_evaluations_model_framework", evaluations.c.model, evaluations.c.framework)
Index("ix_evaluations_stack_hash", evaluations.c.stack_hash)
Index("ix_evaluations_created_at", evaluations.c.created_at)

traces = Table(
    "traces", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("evaluation_id", String(32), nullable=False, index=True),
    Column("trace_id", String(64), nullable=False),
    Column("format", String(32), nullable=False),  # parquet | chrome-json | otlp ...
    Column("path", Text),
    Column("created_at", String(40)),
)

ceilings = Table(
    "ceilings", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stack_hash", String(16), nullable=False),
    Column("device", String(64), nullable=False),  # e.g. cpu/torch/2/float32 (ceilings_key)
    Column("peak_flops_per_s", Float, nullable=False),
    Column("peak_flops_iqr", Float),
    Column("bandwidth_bytes_per_s", Float, nullable=False),
    Column("bandwidth_iqr", Float),
    Column("ridge_flop_per_byte", Float, nullable=False),
    Column("method", Text),
    Column("measured_at", String(40), nullable=False),
    Column("payload", Text, nullable=False),  # the whole measurement as JSON
)
Index("ix_ceilings_stack_hash_device", ceilings.c.stack_hash, ceilings.c.device)

CEILING_FIGURES = {"peak_flops_per_s": "FLOP/s", "bandwidth_bytes_per_s": "bytes/s", "ridge_flop_per_byte": "FLOP/byte"}
"""The figures of a ``ceilings`` row and their units (:meth:`HistoryStore.ceilings` lists them one per row)."""

QUERY_COLUMNS = HISTORY.names
"""Columns of :meth:`HistoryStore.query` (everything but the payload; see :data:`mlms_nb.schema.evaluation.HISTORY`)."""
