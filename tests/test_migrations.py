"""The history store's Alembic migrations (mlms_nb/store/migrations): a store written by mlms-nb at 39ff0c1 (before
the migrations existed) opens, is upgraded in place and reads back; so does one of the previous revision, on SQLite
and on a real PostgreSQL server (tests/pg_support.py); a new store gets exactly the tables
mlms_nb.store.tables declares; a store from a newer mlms-nb is refused with a sentence."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from mlms_nb.evaluation.result import Evaluation
from mlms_nb.store.db import HistoryError
from mlms_nb.store.history import HistoryStore
from mlms_nb.store.migrate import head
from mlms_nb.store.tables import metadata

DATA = Path(__file__).parent / "data"

# The DDL SQLAlchemy emitted for mlms_nb/history.py's tables at 39ff0c1 (SQLite dialect), verbatim.
SCHEMA_39FF0C1 = """
CREATE TABLE ceilings (
	id INTEGER NOT NULL, stack_hash VARCHAR(16) NOT NULL, device VARCHAR(64) NOT NULL,
	peak_flops_per_s FLOAT NOT NULL, peak_flops_iqr FLOAT, bandwidth_bytes_per_s FLOAT NOT NULL, bandwidth_iqr FLOAT,
	ridge_flop_per_byte FLOAT NOT NULL, method TEXT, measured_at VARCHAR(40) NOT NULL, payload TEXT NOT NULL,
	PRIMARY KEY (id)
);
CREATE INDEX ix_ceilings_stack_hash_device ON ceilings (stack_hash, device);
CREATE TABLE evaluations (
	id INTEGER NOT NULL, evaluation_id VARCHAR(32) NOT NULL, model VARCHAR(200) NOT NULL,
	model_version VARCHAR(64) NOT NULL, framework VARCHAR(64) NOT NULL, framework_version VARCHAR(64),
	stack_hash VARCHAR(16) NOT NULL, created_at VARCHAR(40) NOT NULL, complete BOOLEAN NOT NULL,
	dataset VARCHAR(500), batch_sizes TEXT, top1 FLOAT, top5 FLOAT, median_ms FLOAT, payload TEXT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_evaluations_evaluation_framework UNIQUE (evaluation_id, framework)
);
CREATE INDEX ix_evaluations_stack_hash ON evaluations (stack_hash);
CREATE INDEX ix_evaluations_created_at ON evaluations (created_at);
CREATE INDEX ix_evaluations_model_framework ON evaluations (model, framework);
CREATE TABLE machine_ceilings (
	id INTEGER NOT NULL, stack_hash VARCHAR(16) NOT NULL, metric VARCHAR(64) NOT NULL, value FLOAT NOT NULL,
	unit VARCHAR(32) NOT NULL, measured_at VARCHAR(40) NOT NULL, how TEXT, PRIMARY KEY (id)
);
CREATE INDEX ix_machine_ceilings_stack_hash ON machine_ceilings (stack_hash);
CREATE TABLE traces (
	id INTEGER NOT NULL, evaluation_id VARCHAR(32) NOT NULL, trace_id VARCHAR(64) NOT NULL, format VARCHAR(32) NOT NULL,
	blob BLOB, path TEXT, created_at VARCHAR(40), PRIMARY KEY (id)
);
CREATE INDEX ix_traces_evaluation_id ON traces (evaluation_id);
"""


def old_store(path: Path, complete: bool = True) -> Path:
    """A store as mlms-nb at 39ff0c1 left it: its DDL, one evaluation row per framework whose payload is a format-1
    evaluation recorded by that mlms-nb (tests/data/evaluation_format1.json), a trace row and a ceilings figure."""
    payload = json.loads((DATA / "evaluation_format1.json").read_text())
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_39FF0C1)
    for fw in payload["frameworks"]:
        db.execute("INSERT INTO evaluations (evaluation_id, model, model_version, framework, framework_version, "
                   "stack_hash, created_at, complete, dataset, batch_sizes, top1, top5, median_ms, payload) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (payload["id"], payload["model"], payload["model_version"], fw, "1.0", "0123456789abcdef",
                    payload["created_at"], complete, "imagenet-samples", "[1, 8]", 0.5, 0.9, 2.5,
                    json.dumps({**payload, "frameworks": [fw], "complete": complete})))
    db.execute("INSERT INTO traces (evaluation_id, trace_id, format, blob, path, created_at) VALUES (?, ?, ?, ?, ?, ?)",
               (payload["id"], "t1", "parquet", None, "/somewhere/trace", payload["created_at"]))
    db.execute("INSERT INTO machine_ceilings (stack_hash, metric, value, unit, measured_at, how) "
               "VALUES ('0123456789abcdef', 'peak_flops_per_s', 1e11, 'FLOP/s', '2025-01-01', 'numpy matmul')")
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize("complete", [True, False])
def test_a_store_written_at_39ff0c1_opens_and_reads_after_migration(tmp_path, complete):
    path = old_store(tmp_path / "history.sqlite", complete)
    store = HistoryStore(f"sqlite:///{path}")
    rows = store.query()
    assert sorted(rows["framework"]) == ["onnxruntime", "torch"]
    expected = ("complete", None) if complete else ("partial", "interrupt")
    assert {(r["status"], r["reason"]) for r in rows.to_dict("records")} == {expected}
    ev = store.load("0f1e2d3c4b5a")
    assert ev.model == "resnet50" and sorted(ev.frameworks) == ["onnxruntime", "torch"]
    assert sorted(set(ev.latency["batch_size"])) == [1, 8] and not ev.latency.empty
    assert list(store.traces()["path"]) == ["/somewhere/trace"]
    tables = set(sa.inspect(store.engine).get_table_names())
    assert "machine_ceilings" not in tables and {"evaluations", "traces", "ceilings", "alembic_version"} <= tables
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == head()
    # and it takes new rows, and opens again without migrating twice
    ev.id = "f" * 32
    store.keep(ev, "torch")
    assert len(HistoryStore(f"sqlite:///{path}").query()) == 3


def test_a_new_store_has_exactly_the_declared_tables(tmp_path):
    store = HistoryStore(f"sqlite:///{tmp_path / 'new.sqlite'}")
    inspector = sa.inspect(store.engine)
    for table in metadata.sorted_tables:
        assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.columns.keys()), table.name
        assert {i["name"] for i in inspector.get_indexes(table.name)} == {i.name for i in table.indexes}, table.name


def test_a_store_from_a_newer_mlms_nb_is_refused(tmp_path):
    path = tmp_path / "newer.sqlite"
    HistoryStore(f"sqlite:///{path}")
    db = sqlite3.connect(path)
    db.execute("UPDATE alembic_version SET version_num = '9999'")
    db.commit()
    db.close()
    import mlms_nb.store.db as db_module

    db_module.tables_ready.clear()  # as a new process would
    with pytest.raises(HistoryError, match="newer mlms-nb .*upgrade mlms-nb"):
        HistoryStore(f"sqlite:///{path}")


def store_at(url: str, revision: str) -> None:
    """A store as the mlms-nb of schema ``revision`` made it: its migrations run up to there, and no further."""
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext

    from mlms_nb.store.migrate import MIGRATIONS, script_directory

    script, config = script_directory(), Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        with EnvironmentContext(config, script, fn=lambda rev, ctx: script._upgrade_revs(revision, rev)) as env:
            env.configure(connection=conn, render_as_batch=True)
            env.run_migrations()
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'previous.sqlite'}"
    return request.getfixturevalue("postgres_url")


def test_a_store_of_the_previous_schema_opens_after_migration(empty_url, real_evaluation):
    """A store of schema 0003 (no ``agent``, no ``n`` column), on SQLite and on a real PostgreSQL server: a row it
    holds reads back, with ``n`` filled in from its payload's accuracy, and the migrated store records which agent
    measured a new row."""
    store_at(empty_url, "0003")
    scored = Evaluation.from_json(real_evaluation.to_json())
    scored.accuracy = pd.DataFrame([{"n": 2, "top1": 0.5, "top5": 1.0, "framework": "torch", "dataset": "mine",
                                     "skipped": 0, "reason": ""}])
    engine = sa.create_engine(empty_url)
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "0003"
        assert not {"agent", "n"} & {c["name"] for c in sa.inspect(conn).get_columns("evaluations")}
        row = HistoryStore._row(scored, "torch")
        assert row.pop("n") == 2 and row.pop("agent") is None
        conn.execute(sa.table("evaluations", *(sa.column(k) for k in row)).insert().values(**row))
    engine.dispose()
    store = HistoryStore(empty_url)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == head() != "0003"
    old = store.load(scored.id)
    assert old.latency.equals(real_evaluation.latency) and store.query()["agent"].isna().all()
    assert store.query()["n"].tolist() == [2]  # filled in from the payload
    remote = Evaluation.from_json(real_evaluation.to_json())
    remote.id = "a" * 32
    remote.stack["agent"] = {"name": "b2", "address": "tcp://10.0.0.2:40000"}
    store.keep(remote, "torch")
    rows = store.query().set_index("evaluation_id")
    assert rows.loc[remote.id, "agent"] == "b2 at tcp://10.0.0.2:40000" and pd.isna(rows.loc[scored.id, "agent"])
    assert pd.isna(rows.loc[remote.id, "n"])  # synthetic inputs: no accuracy, no n
