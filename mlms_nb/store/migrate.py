"""Bringing a history store's schema up to date at open, with Alembic (the revisions are in
:mod:`mlms_nb.store.migrations`, written with Alembic's dialect-neutral operations, so SQLite, PostgreSQL and the
others SQLAlchemy speaks take the same path; SQLite's ALTERs go through Alembic's batch mode).

A store Alembic has never seen (written by mlms-nb before the migrations existed) is recognised by its tables and
stamped with the revision it matches, then upgraded; a new store is created by running every revision. A store
written by a newer mlms-nb (a revision this one does not know) is refused with a sentence.
"""
from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from mlms_nb.store.db import HistoryError

MIGRATIONS = Path(__file__).with_name("migrations")


def script_directory() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS), version_locations=[str(MIGRATIONS / "versions")])


def head() -> str:
    return script_directory().get_current_head()


def recognise(conn: sa.Connection) -> str | None:
    """The revision an unversioned store's tables match (None: no tables, a new store)."""
    inspector = sa.inspect(conn)
    tables = set(inspector.get_table_names())
    if "evaluations" not in tables:
        return None
    if "machine_ceilings" in tables or "blob" in {c["name"] for c in inspector.get_columns("traces")}:
        return "0001"
    columns = {c["name"] for c in inspector.get_columns("evaluations")}
    if "status" not in columns:
        return "0002"
    if "agent" not in columns:
        return "0003"
    if "n" not in columns:
        return "0004"
    return head()


def upgrade(conn: sa.Connection, where: str) -> None:
    """Bring the store on ``conn`` (inside the caller's transaction) to the newest revision."""
    quiet = logging.getLogger("alembic")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # Alembic narrates each step at INFO; the CLI logs INFO to stderr
    try:
        _upgrade(conn, where)
    finally:
        quiet.setLevel(level)


def _upgrade(conn: sa.Connection, where: str) -> None:
    script = script_directory()
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(conn, opts={"render_as_batch": True}).get_current_revision()
    if current is None:
        found = recognise(conn)
        if found is not None:
            _stamp(conn, found)
            current = found
    if current == script.get_current_head():
        return
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            raise HistoryError(f"history store {where} was written by a newer mlms-nb (schema revision {current}); "
                               "upgrade mlms-nb to open it") from None

    def steps(revision, context):  # noqa: ANN001 - Alembic's callback
        return script._upgrade_revs("head", revision)

    with EnvironmentContext(config, script, fn=steps) as env:
        env.configure(connection=conn, render_as_batch=True)
        env.run_migrations()


def _stamp(conn: sa.Connection, revision: str) -> None:
    from alembic.runtime.migration import MigrationContext

    MigrationContext.configure(conn).stamp(script_directory(), revision)
