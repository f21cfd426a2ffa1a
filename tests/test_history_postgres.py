"""A history shared on a real PostgreSQL server (issue 15 item 3): several OS processes, as agents would, saving
real evaluations into one database at once lose nothing; the store's behaviour tests themselves run on
PostgreSQL too (tests/test_history.py, parametrized). The server is Debian's, started by tests/pg_support.py on
loopback in a temporary data directory."""
from __future__ import annotations

import multiprocessing as mp

import pandas as pd
import pytest

from mlms_nb._clock import new_id
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.store.history import HistoryStore

WRITERS, EACH = 4, 25


def _save_copies(url: str, payload: str, count: int, barrier) -> list[str]:
    """In a spawned process: wait for the other writers, then save ``count`` copies of the evaluation, each with
    a new id, one transaction each; returns the ids saved."""
    base = Evaluation.from_json(payload)
    store = HistoryStore(url)
    barrier.wait(timeout=120)
    saved = []
    for _ in range(count):
        ev = Evaluation.from_json(payload)
        ev.id = new_id()
        store.save(ev)
        saved.append(ev.id)
    assert base.id not in saved
    return saved


def _save_same(url: str, payload: str, barrier) -> list[int]:
    """In a spawned process: save one and the same evaluation as the others do, at the same moment."""
    store = HistoryStore(url)
    barrier.wait(timeout=120)
    return store.save(Evaluation.from_json(payload))


def _in_processes(target, args_per_process: list[tuple]) -> list:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(args_per_process))
        with ctx.Pool(len(args_per_process)) as pool:
            return pool.starmap(target, [(*args, barrier) for args in args_per_process], chunksize=1)


@pytest.mark.slow  # 4 spawned interpreters importing mlms_nb: ~5 s quiet, 20 s on a loaded 2-core machine
def test_four_processes_save_100_real_evaluations_and_lose_none(real_evaluation, postgres_url):
    payload = real_evaluation.to_json()
    HistoryStore(postgres_url)  # the tables, before the writers race to create them too
    results = _in_processes(_save_copies, [(postgres_url, payload, EACH)] * WRITERS)
    ids = [i for r in results for i in r]
    assert len(ids) == len(set(ids)) == WRITERS * EACH

    store = HistoryStore(postgres_url)
    assert len(store) == WRITERS * EACH
    rows = store.query()
    assert len(rows) == WRITERS * EACH and set(rows["evaluation_id"]) == set(ids)
    assert set(rows["model"]) == {"efficientnet_lite0"} and set(rows["framework"]) == {"torch"}
    want_median = real_evaluation.latency["median_ms"].iloc[0]
    assert rows["median_ms"].tolist() == pytest.approx([want_median] * len(rows))
    for row_id in rows["id"]:
        loaded = store.load(int(row_id))
        assert loaded.id in ids and loaded.frameworks == ["torch"]
        pd.testing.assert_frame_equal(loaded.latency, real_evaluation.latency)
        assert loaded.samples.keys() == real_evaluation.samples.keys()
        assert all((loaded.samples[k] == real_evaluation.samples[k]).all() for k in loaded.samples)


@pytest.mark.slow  # 4 spawned interpreters, as above
def test_the_same_evaluation_saved_at_once_is_stored_once(real_evaluation, postgres_url):
    """Read committed lets two writers both find no row; the one that loses the unique constraint tries again and
    gets the winner's row ids."""
    payload = real_evaluation.to_json()
    HistoryStore(postgres_url)
    results = _in_processes(_save_same, [(postgres_url, payload)] * WRITERS)
    store = HistoryStore(postgres_url)
    assert len(store) == 1 and all(r == results[0] for r in results)
    assert store.load(real_evaluation.id).id == real_evaluation.id


def test_postgres_url_without_a_driver_uses_psycopg(postgres_url):
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    store = HistoryStore(plain)
    assert store.engine.dialect.driver == "psycopg" and len(store) == 0


def test_an_unreachable_server_is_a_sentence(postgres_server):
    url = f"postgresql+psycopg://postgres@127.0.0.1:{postgres_server.port}/no_such_database"
    with pytest.raises(MlmsError, match="history store .*no_such_database"):
        HistoryStore(url)


def test_a_new_postgres_store_has_exactly_the_declared_tables_at_the_migrations_head(postgres_url):
    """The Alembic migrations (mlms_nb/store/migrations) build on PostgreSQL what mlms_nb.store.tables declares."""
    import sqlalchemy as sa

    from mlms_nb.store.migrate import head
    from mlms_nb.store.tables import metadata

    store = HistoryStore(postgres_url)
    inspector = sa.inspect(store.engine)
    for table in metadata.sorted_tables:
        assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.columns.keys()), table.name
        indexes = {i["name"] for i in inspector.get_indexes(table.name) if not i.get("duplicates_constraint")}
        assert indexes == {i.name for i in table.indexes}, table.name  # (a unique constraint's own index aside)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == head()


@pytest.mark.slow  # a server of its own and an `mlms eval` with two 1.5 s timed loops: ~10 s
def test_a_run_cut_off_by_an_outage_is_complete_once_the_server_is_back(tmp_path, monkeypatch):
    """The server stops (immediate, as a crash would) while `mlms eval` times its second batch size; the run finishes,
    keeps the whole result in unsaved/, and once the server is back the first open of the store completes the row the
    outage left half written: no crash that did not happen (issue 23 item 4)."""
    pytest.importorskip("onnxruntime")
    from tests.faults.models import Mlms, fault_env, manifest, tiny_onnx
    from tests.pg_support import PostgresServer, postgres_bin_dir

    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed here: apt-get install postgresql")
    server = PostgresServer(postgres_bin_dir()).start()  # its own server: the session's one stays up
    try:
        url = server.new_database()
        HistoryStore(url)  # its tables
        tiny_onnx(tmp_path / "tiny.onnx")
        path, home = manifest(tmp_path, "tiny", "tiny.onnx"), tmp_path / "home"
        env = fault_env(home, MLMS_HISTORY_URL=url)
        run = Mlms(["eval", str(path), "--dataset", "synthetic:4", "--batch-sizes", "1,2", "--min-time", "1.5",
                    "--min-repeats", "1", "--warmup", "1", "--json"], env)
        run.wait_for("timing onnxruntime at batch size 2")  # batch size 1 is in the store
        server.pause()
        rc, out, err = run.finish()
        assert rc == 1 and "unsaved" in err, err
        kept = list((home / "unsaved").glob("*.json"))
        assert len(kept) == 1

        server.resume()
        import sqlalchemy

        with sqlalchemy.create_engine(url).connect() as conn:  # what the outage left: batch size 1, unfinished
            [(status,)] = conn.execute(sqlalchemy.text("SELECT status FROM evaluations")).all()
        assert status != "complete"
        monkeypatch.setenv("MLMS_HOME", str(home))
        [row] = HistoryStore(url).query().to_dict("records")  # the first open puts the whole result back
        assert (row["status"], row["complete"], list(row["batch_sizes"])) == ("complete", True, [1, 2])
        stored = HistoryStore(url).load(int(row["id"]))
        assert sorted(stored.latency["batch_size"]) == [1, 2] and stored.id == kept[0].stem
        assert not list((home / "unsaved").glob("*.json")) and (home / "unsaved" / "imported" / kept[0].name).exists()
    finally:
        server.stop()


def test_history_import_puts_back_a_file_into_any_store(real_evaluation, tmp_path, postgres_url, monkeypatch):
    import mlms_nb

    monkeypatch.setenv("MLMS_HOME", str(tmp_path / "home"))
    file = tmp_path / "kept.json"
    file.write_text(real_evaluation.to_json())
    frame = mlms_nb.history_import(file, url=postgres_url)
    assert list(frame["evaluation_id"].unique()) == [real_evaluation.id] and frame["complete"].all()
    with pytest.raises(MlmsError, match="no such file"):
        mlms_nb.history_import(tmp_path / "missing.json", url=postgres_url)
