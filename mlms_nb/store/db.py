"""Engines and transactions of the history store: one engine per URL per process; SQLite in WAL mode with a
busy timeout, written inside ``BEGIN IMMEDIATE``; PostgreSQL through psycopg 3 (``postgresql://`` URLs without a
driver use it when it is installed: the ``postgres`` extra); every lock or serialization failure retried with
backoff by :func:`retry_while_locked`, the one retry loop of the store."""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any, Callable, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from mlms_nb.errors import MlmsError

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
WRITE_ATTEMPTS = 10
LOCK_TIMEOUT_S = 60.0
"""How long a write waits, in all, for a store another process holds locked (``MLMS_HISTORY_LOCK_TIMEOUT_S``)."""


def lock_timeout_s() -> float:
    """``$MLMS_HISTORY_LOCK_TIMEOUT_S`` (seconds), else :data:`LOCK_TIMEOUT_S`."""
    try:
        return max(float(os.environ.get("MLMS_HISTORY_LOCK_TIMEOUT_S", LOCK_TIMEOUT_S)), 0.0)
    except ValueError:
        return LOCK_TIMEOUT_S


def busy_timeout_ms() -> int:
    """SQLite's own wait per statement: within the overall lock timeout."""
    return int(min(BUSY_TIMEOUT_MS, lock_timeout_s() * 1000 / 4))


class HistoryError(MlmsError):
    """The history store cannot be opened, written or read; or what was asked for is not in it."""


class LockedError(HistoryError):
    """The store stayed locked by another process past the lock timeout."""


# ---------------------------------------------------------------- engines (one per URL per process)

_engines: dict[tuple[str, int], Engine] = {}
tables_ready: set[tuple[str, int]] = set()  # (url, pid) whose tables this process has created or checked
_lock = threading.Lock()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _make_engine(url: str) -> Engine:
    from sqlalchemy import create_engine

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise HistoryError(f"history URL {url!r} is not an SQLAlchemy URL (e.g. sqlite:///path/history.sqlite "
                           "or postgresql+psycopg://user@host/db)") from None
    kwargs: dict[str, Any] = {}
    if parsed.drivername == "postgresql" and _has_module("psycopg") and not _has_module("psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")  # SQLAlchemy's default driver is psycopg2
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            os.makedirs(os.path.dirname(os.path.abspath(database)) or ".", exist_ok=True)
        kwargs["connect_args"] = {"timeout": busy_timeout_ms() / 1000}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as err:
        raise HistoryError(f"the history URL {parsed.render_as_string(hide_password=True)!r} needs a database "
                           f"driver that is not installed ({err}); for PostgreSQL: pip install 'mlms-nb[postgres]' and "
                           "a postgresql:// or postgresql+psycopg:// URL") from None
    if is_sqlite(engine):
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    """Busy timeout + WAL on every connection; our own BEGIN (IMMEDIATE for writes) instead of pysqlite's."""

    busy_ms = busy_timeout_ms()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001
        dbapi_connection.isolation_level = None  # autocommit at the driver: SQLAlchemy's "begin" event begins
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            # switching to WAL needs a moment alone with the file
            mode = retry_while_locked(lambda: cursor.execute("PRAGMA journal_mode = WAL").fetchone(),
                                      what="switch to WAL")
            if mode and str(mode[0]).lower() != "wal":
                log.debug("SQLite journal mode is %s (WAL not available for this database)", mode[0])
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # noqa: ANN001
        mode = conn.get_execution_options().get("mlms_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def engine_for(url: str) -> Engine:
    key = (url, os.getpid())
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make_engine(url)
    return engine


def damage_hint(engine: Engine, err: BaseException) -> str:
    """How to recover when SQLite says the file itself is damaged (not locked, not a query's fault); "" otherwise."""
    import sqlite3

    if not is_sqlite(engine) or type(getattr(err, "orig", None)) is not sqlite3.DatabaseError:
        return ""
    path = engine.url.database
    return (f"; the file is damaged: move it aside (mv {path} {path}.damaged) and the next run starts a new store "
            f"(`sqlite3 {path}.damaged .recover | sqlite3 {path}` may save its rows; `mlms history import "
            "MLMS_HOME/unsaved` puts back the results kept there)")


def is_locked(err: BaseException) -> bool:
    text = str(getattr(err, "orig", None) or err).lower()
    return any(s in text for s in ("database is locked", "database table is locked", "database is busy",
                                   "sqlite_busy", "deadlock detected", "could not serialize access"))


def _backoff(attempt: int) -> float:
    return min(0.02 * 2 ** attempt, 2.0) * (0.5 + random.random())


def retry_while_locked(attempt_once: Callable[[], T], is_transient: Callable[[BaseException], bool] = None,
                       what: str = "write") -> T:
    """``attempt_once()``, retried with jittered exponential backoff (up to ``WRITE_ATTEMPTS`` tries) while it
    raises an error ``is_transient`` accepts (default: the database is locked or busy); the last error is raised."""
    transient = is_transient or is_locked
    give_up_at = time.monotonic() + lock_timeout_s()
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return attempt_once()
        except Exception as err:
            if not transient(err) or attempt == WRITE_ATTEMPTS - 1 or time.monotonic() >= give_up_at:
                if transient(err) and is_locked(err):
                    raise LockedError(f"{getattr(err, 'orig', None) or err} (another process held it locked past "
                                      f"{lock_timeout_s():g} s; set MLMS_HISTORY_LOCK_TIMEOUT_S to wait longer)") from err
                raise
            if attempt == 0 and is_locked(err):
                log.warning("mlms: the history store is locked by another process; retrying for up to %g s",
                            lock_timeout_s())
            log.debug("history %s: database busy, retrying (%d)", what, attempt + 1)
            time.sleep(min(_backoff(attempt), max(give_up_at - time.monotonic(), 0.0)))
    raise AssertionError("unreachable")  # pragma: no cover
