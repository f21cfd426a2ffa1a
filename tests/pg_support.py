"""A real PostgreSQL server for the tests: Debian's ``initdb`` + ``pg_ctl`` in a temporary data directory, listening
on loopback only, on a free port; stopped and removed at the end.

As root the server runs as the ``postgres`` user (``runuser -u postgres``; PostgreSQL refuses to run as root) with
a data directory that user owns; otherwise as the current user. Without the binaries the tests that need it are
skipped with a sentence naming ``apt-get install postgresql``.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

DATABASE_PREFIX = "mlms_test"


def postgres_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: on PATH, else Debian's newest ``/usr/lib/postgresql/N/bin``."""
    found = shutil.which("initdb"), shutil.which("pg_ctl")
    if all(found):
        return Path(os.path.realpath(found[0])).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One server in a temporary data directory: :meth:`start`, :meth:`new_database` (an SQLAlchemy URL of a fresh,
    empty database), :meth:`stop` (which also removes the directory)."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="mlms-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self.databases = 0
        self.log = self.root / "server.log"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}\n{log}")
        return done

    def pause(self) -> None:
        """Stop the server at once (``-m immediate``, as a crash or a network cut would), keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)

    def resume(self) -> None:
        """Start the paused server again, on the same port."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def start(self) -> "PostgresServer":
        if self.as_root:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
                  "--no-sync")
        for attempt in range(5):  # another process may take the free port between our probe and the bind
            self.port = _free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50")
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
                          "start")
                return self
            except RuntimeError:
                if attempt == 4:
                    raise
                time.sleep(0.2)
        return self

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """Create an empty database; its SQLAlchemy URL (psycopg 3 driver)."""
        import psycopg

        self.databases += 1
        name = f"{DATABASE_PREFIX}_{os.getpid()}_{self.databases}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if self.port and (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server on loopback for the whole session (started on first use, ~2 s)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed here: apt-get install postgresql "
                    "(scripts/setup.sh does it when run as root)")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is missing: pip install -e '.[postgres]'")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root needs the 'postgres' user to run the server as: apt-get install postgresql")
    server = PostgresServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """An SQLAlchemy URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.new_database()
