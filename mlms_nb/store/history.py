"""The history store: every evaluation, one row per framework, in any SQLAlchemy database.

By default a SQLite file, ``$MLMS_HOME/history.sqlite``, in WAL mode with a busy timeout (set on every
connection), written inside ``BEGIN IMMEDIATE`` transactions, so several notebooks or processes can save
at once; ``MLMS_HISTORY_URL`` (or ``HistoryStore(url)``) points it at any SQLAlchemy URL, e.g. a
PostgreSQL server a team shares. Only portable column types are used; JSON is stored as text.

Tables:

- ``evaluations``: one row per evaluation x framework, with the columns people filter and sort on and
  ``payload``, that framework's part of the `Evaluation` as JSON (lossless);
- ``traces``: trace files or blobs belonging to an evaluation (filled by the tracing work);
- ``machine_ceilings``: measured peak FLOP/s and memory bandwidth per stack hash, one row per figure;
- ``ceilings``: one row per measurement of a device's ceilings (``mlms_nb.theory.ceilings``), keyed by stack
  hash and device, with the whole measurement as JSON; saving one also adds its figures to ``machine_ceilings``.
"""
from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from typing import Any, Callable, TypeVar

import pandas as pd
from sqlalchemy import (
    Boolean, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text, UniqueConstraint, delete,
    event, func, insert, select,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from mlms_nb._clock import now_utc
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation, EvaluationFormatError
from mlms_nb.paths import mlms_home
from mlms_nb.schema.evaluation import HISTORY

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
WRITE_ATTEMPTS = 10

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
    Column("dataset", String(500)),
    Column("batch_sizes", Text),  # JSON list
    Column("top1", Float),
    Column("top5", Float),
    Column("median_ms", Float),  # at the smallest batch size
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
    Column("blob", LargeBinary),
    Column("path", Text),
    Column("created_at", String(40)),
)

machine_ceilings = Table(
    "machine_ceilings", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stack_hash", String(16), nullable=False, index=True),
    Column("metric", String(64), nullable=False),
    Column("value", Float, nullable=False),
    Column("unit", String(32), nullable=False),
    Column("measured_at", String(40), nullable=False),
    Column("how", Text),
)

ceilings = Table(
    "ceilings", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stack_hash", String(16), nullable=False),
    Column("device", String(64), nullable=False),  # cpu | cuda:N
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

CEILING_FIGURES = (("peak_flops_per_s", "FLOP/s"), ("bandwidth_bytes_per_s", "bytes/s"),
                   ("ridge_flop_per_byte", "FLOP/byte"))
"""The figures of a ``ceilings`` row that are also written to ``machine_ceilings`` (metric ``<device>/<name>``)."""

QUERY_COLUMNS = HISTORY.names
"""Columns of :meth:`HistoryStore.query` (everything but the payload; see :data:`mlms_nb.schema.evaluation.HISTORY`)."""


class HistoryError(MlmsError):
    """The history store cannot be opened, written or read; or what was asked for is not in it."""


class NotInHistoryError(HistoryError, LookupError):
    """No stored evaluation matches the given row id or evaluation id."""


def default_url() -> str:
    """``$MLMS_HISTORY_URL``, else the SQLite file ``$MLMS_HOME/history.sqlite``."""
    env = os.environ.get("MLMS_HISTORY_URL", "").strip()
    if env:
        return env
    return f"sqlite:///{(mlms_home() / 'history.sqlite').as_posix()}"


# ---------------------------------------------------------------- engines (one per URL per process)

_engines: dict[tuple[str, int], Engine] = {}
_ready: set[tuple[str, int]] = set()
_lock = threading.Lock()


def _is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _make_engine(url: str) -> Engine:
    from sqlalchemy import create_engine

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise HistoryError(f"history URL {url!r} is not an SQLAlchemy URL (e.g. sqlite:///path/history.sqlite "
                           "or postgresql+psycopg://user@host/db)") from None
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            os.makedirs(os.path.dirname(os.path.abspath(database)) or ".", exist_ok=True)
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as err:
        raise HistoryError(f"the history URL {parsed.render_as_string(hide_password=True)!r} needs a database "
                           f"driver that is not installed ({err}); install it, e.g. `pip install psycopg` for "
                           "postgresql+psycopg://") from None
    if _is_sqlite(engine):
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    """Busy timeout + WAL on every connection; our own BEGIN (IMMEDIATE for writes) instead of pysqlite's."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001
        dbapi_connection.isolation_level = None  # autocommit at the driver: SQLAlchemy's "begin" event begins
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            for attempt in range(WRITE_ATTEMPTS):
                try:
                    mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
                    break
                except Exception as err:  # switching to WAL needs a moment alone with the file
                    if not _is_locked(err) or attempt == WRITE_ATTEMPTS - 1:
                        raise
                    time.sleep(_backoff(attempt))
            if mode and str(mode[0]).lower() != "wal":
                log.debug("SQLite journal mode is %s (WAL not available for this database)", mode[0])
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        mode = conn.get_execution_options().get("mlms_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


def _engine_for(url: str) -> Engine:
    key = (url, os.getpid())
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make_engine(url)
    return engine


def _is_locked(err: BaseException) -> bool:
    text = str(getattr(err, "orig", None) or err).lower()
    return any(s in text for s in ("database is locked", "database table is locked", "database is busy",
                                   "sqlite_busy", "deadlock detected", "could not serialize access"))


def _backoff(attempt: int) -> float:
    return min(0.02 * 2 ** attempt, 2.0) * (0.5 + random.random())


# ---------------------------------------------------------------- the store

class HistoryStore:
    """Evaluations saved one row per framework; query them as a DataFrame, load them back whole.

    ``url``: an SQLAlchemy URL; default ``$MLMS_HISTORY_URL`` or ``sqlite:///$MLMS_HOME/history.sqlite``.
    """

    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        self.engine = _engine_for(self.url)
        self._create_tables()

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"HistoryStore({self.display_url!r})"

    # ------------------------------------------------------------------ plumbing
    def _transaction(self, work: Callable[[Any], T], write: bool, what: str) -> T:
        """Run ``work(conn)`` in one transaction; retry with backoff while the database is locked."""
        options = {"mlms_begin": "IMMEDIATE"} if write and _is_sqlite(self.engine) else {}
        for attempt in range(WRITE_ATTEMPTS):
            try:
                with self.engine.connect() as conn:
                    if options:
                        conn = conn.execution_options(**options)
                    with conn.begin():
                        return work(conn)
            except (OperationalError, DBAPIError) as err:
                if _is_locked(err) and attempt < WRITE_ATTEMPTS - 1:
                    log.debug("history %s: database busy, retrying (%d)", what, attempt + 1)
                    time.sleep(_backoff(attempt))
                    continue
                raise HistoryError(f"history store {self.display_url}: could not {what}: "
                                   f"{getattr(err, 'orig', None) or err}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _create_tables(self) -> None:
        """Create the tables once per URL and process; safe when several processes start at once."""
        key = (self.url, os.getpid())
        if key in _ready:
            return
        for attempt in range(WRITE_ATTEMPTS):
            try:
                self._transaction(lambda conn: metadata.create_all(conn, checkfirst=True), True, "create its tables")
                break
            except HistoryError as err:
                # Another process created the same table or index between our check and our CREATE
                # (PostgreSQL says "already exists" or "duplicate key ... pg_type").
                if "already exists" in str(err).lower() or "duplicate" in str(err).lower():
                    if attempt < WRITE_ATTEMPTS - 1:
                        time.sleep(_backoff(attempt))
                        continue
                raise
        _ready.add(key)

    # ------------------------------------------------------------------ writing
    def save(self, evaluation) -> list[int]:
        """Store an evaluation, one row per framework, in one transaction; returns the row ids in the
        order of ``evaluation.frameworks``. Saving the same evaluation again stores nothing new and
        returns the existing rows' ids."""
        frameworks = list(evaluation.frameworks)
        if not frameworks:
            raise HistoryError("cannot save an evaluation with no frameworks")
        rows = [self._row(evaluation, fw) for fw in frameworks]

        def work(conn) -> list[int]:
            existing = dict(conn.execute(
                select(evaluations.c.framework, evaluations.c.id)
                .where(evaluations.c.evaluation_id == evaluation.id)).all())
            ids = []
            for row in rows:
                if row["framework"] in existing:
                    ids.append(int(existing[row["framework"]]))
                    continue
                result = conn.execute(insert(evaluations).values(**row))
                ids.append(int(result.inserted_primary_key[0]))
            return ids

        return self._transaction(work, True, f"save evaluation {evaluation.id}")

    @staticmethod
    def _row(evaluation, framework: str) -> dict:
        part = evaluation.for_framework(framework)
        software = (evaluation.stack or {}).get("software") or {}
        options = evaluation.options or {}
        acc = part.accuracy
        top1 = top5 = None
        if not acc.empty and "top1" in acc:
            top1, top5 = _float(acc["top1"].iloc[0]), _float(acc["top5"].iloc[0]) if "top5" in acc else None
        median = None
        lat = part.latency
        if not lat.empty and {"batch_size", "median_ms"} <= set(lat.columns):
            smallest = lat[lat["batch_size"] == lat["batch_size"].min()]
            median = _float(smallest["median_ms"].iloc[0])
        batch_sizes = options.get("batch_sizes")
        if batch_sizes is None and not lat.empty and "batch_size" in lat:
            batch_sizes = sorted({int(b) for b in lat["batch_size"]})
        dataset = options.get("dataset")
        if dataset is None and not acc.empty and "dataset" in acc:
            dataset = acc["dataset"].iloc[0]
        version = software.get(framework)
        return {
            "evaluation_id": evaluation.id,
            "model": evaluation.model,
            "model_version": evaluation.model_version or "",
            "framework": framework,
            "framework_version": None if version is None else str(version)[:64],
            "stack_hash": evaluation.framework_stack_hash(framework),
            "created_at": evaluation.created_at,
            "complete": bool(evaluation.complete),
            "dataset": None if dataset is None else str(dataset)[:500],
            "batch_sizes": json.dumps([int(b) for b in batch_sizes]) if batch_sizes is not None else None,
            "top1": top1,
            "top5": top5,
            "median_ms": median,
            "payload": part.to_json(),
        }

    def delete(self, ref: int | str) -> int:
        """Delete one row (int id) or all rows of an evaluation (its id or a unique prefix); returns how many."""
        ids = self._resolve(ref)

        def work(conn) -> int:
            return conn.execute(delete(evaluations).where(evaluations.c.id.in_(ids))).rowcount

        return int(self._transaction(work, True, f"delete {ref!r}"))

    # ------------------------------------------------------------------ reading
    def query(self, model: str | None = None, framework: str | None = None, version: str | None = None,
              stack_hash: str | None = None, complete: bool | None = None, limit: int | None = None) -> pd.DataFrame:
        """Stored rows, newest first, without their payload (see ``QUERY_COLUMNS``).

        ``version`` is an npm-style range over the model (manifest) version, e.g. ``^1.0`` or ``>=1.2 <2``.
        """
        spec = None
        if version:
            import semantic_version

            try:
                spec = semantic_version.NpmSpec(str(version))
            except ValueError as err:
                raise HistoryError(f"version: {version!r} is not an npm-style range ({err})") from None
        if limit is not None and limit < 0:
            raise HistoryError(f"limit: expected a count >= 0, got {limit}")
        cols = [evaluations.c[name] for name in QUERY_COLUMNS]
        stmt = select(*cols)
        if model:
            stmt = stmt.where(evaluations.c.model == model)
        if framework:
            stmt = stmt.where(evaluations.c.framework == framework)
        if stack_hash:
            stmt = stmt.where(evaluations.c.stack_hash == stack_hash)
        if complete is not None:
            stmt = stmt.where(evaluations.c.complete == bool(complete))
        stmt = stmt.order_by(evaluations.c.created_at.desc(), evaluations.c.id.desc())
        if limit is not None and spec is None:
            stmt = stmt.limit(int(limit))

        def work(conn) -> list:
            out = []
            for row in conn.execute(stmt):
                if spec is not None and not _in_range(row.model_version, spec):
                    continue
                out.append(tuple(row))
                if limit is not None and len(out) >= limit:
                    break
            return out

        rows = self._transaction(work, False, "query")
        frame = pd.DataFrame(rows, columns=list(QUERY_COLUMNS))
        frame = frame.astype({c.name: c.dtype for c in HISTORY.columns if c.dtype in ("int64", "float64", "bool")})
        frame["batch_sizes"] = [json.loads(b) if b else [] for b in frame["batch_sizes"]]
        frame.attrs["note"] = ("one row per evaluation and framework, newest first; top1/top5: fractions of the "
                               "dataset's inputs; median_ms: median latency at the smallest batch size; "
                               f"store: {self.display_url}")
        return frame

    def _resolve(self, ref: int | str) -> list[int]:
        """Row ids for a row id (int) or an evaluation id (full, or a unique prefix of at least 6 hex digits)."""
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise HistoryError(f"expected a row id (int) or an evaluation id (str), got {type(ref).__name__}")

        def work(conn) -> list[tuple[int, str]]:
            if isinstance(ref, int):
                stmt = select(evaluations.c.id, evaluations.c.evaluation_id).where(evaluations.c.id == ref)
                return [tuple(r) for r in conn.execute(stmt)]
            key = ref.strip().lower()
            stmt = select(evaluations.c.id, evaluations.c.evaluation_id).where(evaluations.c.evaluation_id == key)
            found = [tuple(r) for r in conn.execute(stmt.order_by(evaluations.c.id))]
            if not found and len(key) >= 6 and all(c in "0123456789abcdef" for c in key):
                stmt = (select(evaluations.c.id, evaluations.c.evaluation_id)
                        .where(evaluations.c.evaluation_id.like(key + "%")).order_by(evaluations.c.id))
                found = [tuple(r) for r in conn.execute(stmt)]
            return found

        found = self._transaction(work, False, "look up an evaluation")
        if not found:
            what = f"row {ref}" if isinstance(ref, int) else f"evaluation {ref!r}"
            raise NotInHistoryError(f"{what} is not in the history store {self.display_url}; "
                                    "`mlms history` lists what is")
        if len({e for _, e in found}) > 1:
            raise HistoryError(f"evaluation id prefix {ref!r} matches several evaluations; give more digits")
        return [int(i) for i, _ in found]

    def load(self, ref: int | str):
        """The `Evaluation` stored as row ``ref`` (int: that framework's part) or under evaluation id ``ref``
        (str, or a unique prefix: all its frameworks put back together)."""

        ids = self._resolve(ref)

        def work(conn) -> list[tuple[int, str]]:
            stmt = (select(evaluations.c.id, evaluations.c.payload)
                    .where(evaluations.c.id.in_(ids)).order_by(evaluations.c.id))
            return [tuple(r) for r in conn.execute(stmt)]

        parts = []
        for row_id, payload in self._transaction(work, False, "load an evaluation"):
            try:
                part = Evaluation.from_json(payload)
            except EvaluationFormatError as err:
                raise HistoryError(f"history row {row_id}: {err}") from None
            part.history_ids = [row_id]
            parts.append(part)
        return Evaluation.combine(parts)

    def __len__(self) -> int:
        return int(self._transaction(
            lambda conn: conn.execute(select(func.count()).select_from(evaluations)).scalar_one(), False, "count"))

    # ------------------------------------------------------------------ for the tracing and theory work
    def add_trace(self, evaluation_id: str, trace_id: str, format: str, blob: bytes | None = None,
                  path: str | None = None) -> int:
        """Record a trace (its bytes or where its file is) for an evaluation; returns the row id."""
        if (blob is None) == (path is None):
            raise HistoryError("a trace is stored either as bytes (blob=...) or as a file path (path=...)")

        values = {"evaluation_id": evaluation_id, "trace_id": trace_id, "format": format, "blob": blob,
                  "path": None if path is None else str(path), "created_at": now_utc()}
        return self._transaction(lambda conn: int(conn.execute(insert(traces).values(**values)).inserted_primary_key[0]),
                                 True, "save a trace")

    def traces(self, evaluation_id: str | None = None) -> pd.DataFrame:
        """Stored traces (without blobs), newest first."""
        stmt = select(traces.c.id, traces.c.evaluation_id, traces.c.trace_id, traces.c.format, traces.c.path,
                      traces.c.created_at).order_by(traces.c.id.desc())
        if evaluation_id:
            stmt = stmt.where(traces.c.evaluation_id == evaluation_id)
        rows = self._transaction(lambda conn: [tuple(r) for r in conn.execute(stmt)], False, "list traces")
        return pd.DataFrame(rows, columns=["id", "evaluation_id", "trace_id", "format", "path", "created_at"])

    def add_ceiling(self, stack_hash: str, metric: str, value: float, unit: str, how: str = "") -> int:
        """Record a measured machine ceiling (e.g. peak FLOP/s) for a stack hash; returns the row id."""

        values = {"stack_hash": stack_hash, "metric": metric, "value": float(value), "unit": unit,
                  "measured_at": now_utc(), "how": how}
        return self._transaction(
            lambda conn: int(conn.execute(insert(machine_ceilings).values(**values)).inserted_primary_key[0]),
            True, "save a machine ceiling")

    def ceilings(self, stack_hash: str | None = None) -> pd.DataFrame:
        """Measured machine ceilings, newest first."""
        cols = [machine_ceilings.c[n] for n in ("id", "stack_hash", "metric", "value", "unit", "measured_at", "how")]
        stmt = select(*cols).order_by(machine_ceilings.c.measured_at.desc(), machine_ceilings.c.id.desc())
        if stack_hash:
            stmt = stmt.where(machine_ceilings.c.stack_hash == stack_hash)
        rows = self._transaction(lambda conn: [tuple(r) for r in conn.execute(stmt)], False, "list ceilings")
        return pd.DataFrame(rows, columns=[c.name for c in cols])

    def save_ceilings(self, record: dict) -> int:
        """Store one measurement of a device's ceilings (``Ceilings.to_dict()``: ``stack_hash``, ``device``,
        ``peak_flops_per_s``, ``bandwidth_bytes_per_s``, ``ridge_flop_per_byte``, ``measured_at``, ...);
        its figures also go to ``machine_ceilings``. Returns the ``ceilings`` row id."""
        missing = [k for k in ("stack_hash", "device", "peak_flops_per_s", "bandwidth_bytes_per_s",
                               "ridge_flop_per_byte", "measured_at") if record.get(k) is None]
        if missing:
            raise HistoryError(f"a ceilings record needs {', '.join(missing)}")
        values = {c.name: record.get(c.name) for c in ceilings.columns if c.name not in ("id", "payload")}
        values["payload"] = json.dumps(record, sort_keys=True, default=str)
        figures = [{"stack_hash": record["stack_hash"], "metric": f"{record['device']}/{name}",
                    "value": float(record[name]), "unit": unit, "measured_at": record["measured_at"],
                    "how": record.get("method") or ""} for name, unit in CEILING_FIGURES]

        def work(conn) -> int:
            row_id = int(conn.execute(insert(ceilings).values(**values)).inserted_primary_key[0])
            conn.execute(insert(machine_ceilings), figures)
            return row_id

        return self._transaction(work, True, "save machine ceilings")

    def load_ceilings(self, stack_hash: str, device: str) -> dict | None:
        """The newest stored ceilings measurement (as saved) for a stack hash and device; None when there is none."""
        stmt = (select(ceilings.c.payload).where(ceilings.c.stack_hash == stack_hash, ceilings.c.device == device)
                .order_by(ceilings.c.measured_at.desc(), ceilings.c.id.desc()).limit(1))
        payload = self._transaction(lambda conn: conn.execute(stmt).scalar_one_or_none(), False, "load ceilings")
        if payload is None:
            return None
        try:
            return json.loads(payload)
        except ValueError as err:
            raise HistoryError(f"stored ceilings for {stack_hash}/{device} are not valid JSON ({err})") from None


def _float(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if v != v or v in (float("inf"), float("-inf")) else v


def _in_range(version: str, spec) -> bool:
    import semantic_version

    try:
        return semantic_version.Version.coerce(str(version)) in spec
    except ValueError:
        return False


def save(evaluation, url: str | None = None) -> list[int]:
    """Shortcut: ``HistoryStore(url).save(evaluation)``."""
    return HistoryStore(url).save(evaluation)
