"""The history store: every evaluation, one row per framework, in any SQLAlchemy database.

By default a SQLite file, ``$MLMS_HOME/history.sqlite``, in WAL mode with a busy timeout (set on every
connection), written inside ``BEGIN IMMEDIATE`` transactions, so several notebooks or processes can save
at once; ``MLMS_HISTORY_URL`` (or ``HistoryStore(url)``) points it at any SQLAlchemy URL, e.g. a
PostgreSQL server a team shares. Only portable column types are used; JSON is stored as text.

Its tables are in :mod:`mlms_nb.store.tables`; engines and the retry of locked transactions in :mod:`mlms_nb.store.db`.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, TypeVar

import pandas as pd
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from mlms_nb._clock import now_utc
from mlms_nb._fs import alive
from mlms_nb.evaluation.result import Evaluation, EvaluationFormatError
from mlms_nb.paths import mlms_home
from mlms_nb.store.db import (HistoryError, LockedError, damage_hint, engine_for, is_locked, is_sqlite,
                              retry_while_locked, tables_ready)
from mlms_nb.schema.evaluation import HISTORY
from mlms_nb.store.migrate import upgrade
from mlms_nb.store.tables import CEILING_FIGURES, QUERY_COLUMNS, ceilings, evaluations, traces

T = TypeVar("T")


class NotInHistoryError(HistoryError, LookupError):
    """No stored evaluation matches the given row id or evaluation id."""


class BatchSizes(list):
    """The batch sizes of one history row: a list of ints (``row["batch_sizes"] == [1, 8]``) that reads as what it
    is, ``1, 8`` -- not as a shape (``1×8``), which is how a table shows a plain list of ints."""

    def __str__(self) -> str:
        return ", ".join(str(size) for size in self)


def default_url() -> str:
    """``$MLMS_HISTORY_URL``, else the SQLite file ``$MLMS_HOME/history.sqlite``."""
    env = os.environ.get("MLMS_HISTORY_URL", "").strip()
    if env:
        return env
    return f"sqlite:///{(mlms_home() / 'history.sqlite').as_posix()}"


class HistoryStore:
    """Evaluations saved one row per framework; query them as a DataFrame, load them back whole.

    ``url``: an SQLAlchemy URL; default ``$MLMS_HISTORY_URL`` or ``sqlite:///$MLMS_HOME/history.sqlite``.
    """

    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        self.engine = engine_for(self.url)
        self._create_tables()
        from mlms_nb.store.recover import put_back_pending

        self.put_back = put_back_pending(self)  # what an outage kept in unsaved/ for it, written now that it answers

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"HistoryStore({self.display_url!r})"

    # ------------------------------------------------------------------ plumbing
    def _transaction(self, work: Callable[[Any], T], write: bool, what: str,
                     also_retry: Callable[[BaseException], bool] | None = None) -> T:
        """Run ``work(conn)`` in one transaction; retried with backoff while the database is locked (or while
        ``also_retry`` accepts the error)."""
        options = {"mlms_begin": "IMMEDIATE"} if write and is_sqlite(self.engine) else {}

        def attempt_once() -> T:
            with self.engine.connect() as conn:
                if options:
                    conn = conn.execution_options(**options)
                with conn.begin():
                    return work(conn)

        transient = None if also_retry is None else (lambda err: is_locked(err) or also_retry(err))
        try:
            return retry_while_locked(attempt_once, transient, what=what)
        except LockedError as err:
            raise HistoryError(f"history store {self.display_url}: could not {what}: {err}") from None
        except (OperationalError, DBAPIError) as err:
            raise HistoryError(f"history store {self.display_url}: could not {what}: "
                               f"{getattr(err, 'orig', None) or err}{damage_hint(self.engine, err)}") from None

    def _create_tables(self) -> None:
        """Create the tables, or migrate an older store's (:mod:`mlms_nb.store.migrate`), once per URL and process; safe when several processes start at once (another
        process may create a table or index between our check and our CREATE: PostgreSQL then says "already
        exists" or "duplicate key ... pg_type", and we try again)."""
        key = (self.url, os.getpid())
        if key in tables_ready:
            return

        def raced(err: BaseException) -> bool:
            text = str(err).lower()
            return isinstance(err, HistoryError) and ("already exists" in text or "duplicate" in text)

        retry_while_locked(lambda: self._transaction(lambda conn: upgrade(conn, self.display_url), True,
                                                     "create or migrate its tables"), raced, "create its tables")
        tables_ready.add(key)
        self.mark_abandoned()

    def mark_abandoned(self) -> int:
        """Rows still ``running`` whose measuring process (on this host) is gone -- killed outright, so it could
        not say so -- become ``partial`` with reason ``crash``; returns how many."""
        import socket

        host = socket.gethostname()

        def work(conn) -> int:
            rows = conn.execute(select(evaluations.c.id, evaluations.c.framework, evaluations.c.payload)
                                .where(evaluations.c.status == "running")).all()
            fixed = 0
            for row_id, framework, payload in rows:
                data = json.loads(payload)
                outcome = (data.get("outcomes") or {}).get(framework) or {}
                owner_host, _, pid = str(outcome.get("owner", "")).rpartition(" ")
                if owner_host != host or not pid.isdigit() or alive(int(pid)):
                    continue
                measured = sorted({int(b) for b in outcome.get("measured_batch_sizes") or []})
                batch_sizes = json.loads(conn.execute(select(evaluations.c.batch_sizes)
                                                      .where(evaluations.c.id == row_id)).scalar() or "[]")
                outcome.update(status="partial", reason="crash",
                               message=f"{framework}: the process measuring it (pid {pid}) ended without finishing "
                                       "(killed, or it crashed); what it had measured is kept",
                               missing_batch_sizes=[b for b in batch_sizes if b not in measured])
                data.setdefault("outcomes", {})[framework] = outcome
                data["complete"] = False
                conn.execute(update(evaluations).where(evaluations.c.id == row_id).values(
                    status="partial", reason="crash", complete=False, payload=json.dumps(data)))
                fixed += 1
            return fixed

        return self._transaction(work, True, "mark abandoned rows")

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

        # Two writers saving the same evaluation at once: SQLite's BEGIN IMMEDIATE serialises them; on PostgreSQL
        # (read committed) both may find no row and insert, and the second then breaks the unique constraint.
        # Its transaction is rolled back and tried again, when it finds the first one's rows.
        return self._transaction(work, True, f"save evaluation {evaluation.id}", _saved_concurrently)

    def keep(self, evaluation, framework: str) -> int:
        """Write one framework's row of an evaluation as it stands now: inserted the first time, replaced after
        (the runner calls it after every measurement, so what was measured is stored before the next begins);
        returns the row id."""
        row = self._row(evaluation, framework)

        def work(conn) -> int:
            found = conn.execute(select(evaluations.c.id).where(
                (evaluations.c.evaluation_id == evaluation.id) & (evaluations.c.framework == framework))).first()
            if found is None:
                return int(conn.execute(insert(evaluations).values(**row)).inserted_primary_key[0])
            conn.execute(update(evaluations).where(evaluations.c.id == found[0]).values(**row))
            return int(found[0])

        return self._transaction(work, True, f"save {framework} of evaluation {evaluation.id}", _saved_concurrently)

    @staticmethod
    def _row(evaluation, framework: str) -> dict:
        part = evaluation.for_framework(framework)
        software = (evaluation.stack or {}).get("software") or {}
        options = evaluation.options or {}
        acc = part.accuracy
        top1 = top5 = scored = None
        if not acc.empty and "top1" in acc:
            top1, top5 = _float(acc["top1"].iloc[0]), _float(acc["top5"].iloc[0]) if "top5" in acc else None
            scored = int(acc["n"].iloc[0]) if "n" in acc and top1 is not None else None
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
        agent = (evaluation.stack or {}).get("agent") or {}
        outcome = (evaluation.outcomes or {}).get(framework)
        if outcome:
            status, reason = outcome.get("status"), outcome.get("reason")
            status = "failed" if status == "not run" else status
        else:
            status, reason = ("complete", None) if evaluation.complete else ("partial", "interrupt")
        return {
            "evaluation_id": evaluation.id,
            "model": evaluation.model,
            "model_version": evaluation.model_version or "",
            "framework": framework,
            "framework_version": None if version is None else str(version)[:64],
            "stack_hash": evaluation.framework_stack_hash(framework),
            "created_at": evaluation.created_at,
            "complete": status == "complete",
            "status": status,
            "reason": reason,
            "dataset": None if dataset is None else str(dataset)[:500],
            "batch_sizes": json.dumps([int(b) for b in batch_sizes]) if batch_sizes is not None else None,
            "n": scored,
            "top1": top1,
            "top5": top5,
            "median_ms": median,
            "agent": f"{agent.get('name')} at {agent.get('address')}"[:300] if agent else None,
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
        frame = frame.astype({c.name: c.dtype for c in HISTORY.columns
                              if c.dtype in ("int64", "Int64", "float64", "bool")})
        frame["batch_sizes"] = [BatchSizes(json.loads(b) if b else []) for b in frame["batch_sizes"]]
        frame.attrs["note"] = ("one row per evaluation and framework, newest first; top-1 and top-5 (%): of the n "
                               "labelled inputs scored (the frame holds them as fractions 0..1); median (ms): at the "
                               f"smallest batch size; store: {self.display_url}")
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

    # ------------------------------------------------------------------ traces and ceilings
    def add_trace(self, evaluation_id: str, trace_id: str, format: str, path: str) -> int:
        """Record where a trace of an evaluation is (a Parquet folder, or a file) and its format; returns the row id."""
        values = {"evaluation_id": evaluation_id, "trace_id": trace_id, "format": format, "path": str(path),
                  "created_at": now_utc()}
        return self._transaction(lambda conn: int(conn.execute(insert(traces).values(**values)).inserted_primary_key[0]),
                                 True, "save a trace")

    def traces(self, evaluation_id: str | None = None) -> pd.DataFrame:
        """Stored traces, newest first."""
        stmt = select(traces.c.id, traces.c.evaluation_id, traces.c.trace_id, traces.c.format, traces.c.path,
                      traces.c.created_at).order_by(traces.c.id.desc())
        if evaluation_id:
            stmt = stmt.where(traces.c.evaluation_id == evaluation_id)
        rows = self._transaction(lambda conn: [tuple(r) for r in conn.execute(stmt)], False, "list traces")
        return pd.DataFrame(rows, columns=["id", "evaluation_id", "trace_id", "format", "path", "created_at"])

    def ceilings(self, stack_hash: str | None = None) -> pd.DataFrame:
        """Measured machine ceilings, newest first, one row per figure: ``metric`` is ``<device>/<figure>``
        (``cpu/peak_flops_per_s``, ``cpu/bandwidth_bytes_per_s``, ``cpu/ridge_flop_per_byte``) with its ``unit``."""
        cols = [ceilings.c[n] for n in ("id", "stack_hash", "device", "measured_at", "method", *CEILING_FIGURES)]
        stmt = select(*cols).order_by(ceilings.c.measured_at.desc(), ceilings.c.id.desc())
        if stack_hash:
            stmt = stmt.where(ceilings.c.stack_hash == stack_hash)
        rows = self._transaction(lambda conn: [r._mapping for r in conn.execute(stmt)], False, "list ceilings")
        long = [{"id": r["id"], "stack_hash": r["stack_hash"], "metric": f"{r['device']}/{name}", "value": r[name],
                 "unit": unit, "measured_at": r["measured_at"], "how": r["method"] or ""}
                for r in rows for name, unit in CEILING_FIGURES.items()]
        return pd.DataFrame(long, columns=["id", "stack_hash", "metric", "value", "unit", "measured_at", "how"])

    def save_ceilings(self, record: dict) -> int:
        """Store one measurement of a device's ceilings (``Ceilings.to_dict()``: ``stack_hash``, ``device``,
        ``peak_flops_per_s``, ``bandwidth_bytes_per_s``, ``ridge_flop_per_byte``, ``measured_at``, ...);
        returns its row id."""
        missing = [k for k in ("stack_hash", "device", "peak_flops_per_s", "bandwidth_bytes_per_s",
                               "ridge_flop_per_byte", "measured_at") if record.get(k) is None]
        if missing:
            raise HistoryError(f"a ceilings record needs {', '.join(missing)}")
        values = {c.name: record.get(c.name) for c in ceilings.columns if c.name not in ("id", "payload")}
        values["payload"] = json.dumps(record, sort_keys=True, default=str)
        return self._transaction(
            lambda conn: int(conn.execute(insert(ceilings).values(**values)).inserted_primary_key[0]),
            True, "save machine ceilings")

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


def _saved_concurrently(err: BaseException) -> bool:
    """The unique (evaluation_id, framework) constraint, as PostgreSQL (its name) or SQLite (its columns) reports it."""
    text = str(err)
    return isinstance(err, IntegrityError) and ("uq_evaluations_evaluation_framework" in text or
                                                "evaluations.evaluation_id, evaluations.framework" in text)


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
