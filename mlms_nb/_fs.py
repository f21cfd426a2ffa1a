"""File helpers: atomic writes, sha256 of a file, an advisory folder lock.

A reader never sees half a file: everything mlms-nb writes goes to a temporary file in the same folder first
and is moved in place with ``os.replace``; a failure (or an interrupt) removes the temporary file. A process
killed outright (SIGKILL, the OOM killer) cannot remove its own: every temporary name carries its owner's pid
(:func:`owned`), and :func:`sweep_orphans`, run at the start of each evaluation, removes those whose owner is gone.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

_CHUNK_BYTES = 1 << 20
_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, per process


_OWNER = re.compile(r"~(\d+)~")


def owned(prefix: str) -> str:
    """A temporary name's prefix that says which process owns it: ``prefix~PID~``."""
    return f"{prefix}~{os.getpid()}~"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(folder: str | os.PathLike, depth: int = 0) -> list[Path]:
    """Remove the temporary files and folders (names from :func:`owned`, starting with ``.`` or ``mlms``) in
    ``folder``, and ``depth`` levels below it, whose owning process no longer runs; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _OWNER.search(entry.name)
        if match and entry.name.startswith((".", "mlms")) and not alive(int(match.group(1))):
            try:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                removed.append(entry)
            except OSError:
                pass
        elif depth > 0 and entry.is_dir() and not entry.is_symlink():
            removed += sweep_orphans(entry, depth - 1)
    return removed


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", mode_bits: int | None = 0o644) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing (``mode`` "wb" or "w"); on a clean exit it replaces
    ``path`` atomically, on an error it is removed. ``mode_bits``: permissions of the result (None keeps
    mkstemp's private 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=owned(f".{path.name}."), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        if mode_bits is not None:
            os.chmod(tmp, mode_bits)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    with atomic_write(path, "w") as handle:
        handle.write(text)
    return Path(path)


@contextlib.contextmanager
def temp_path_beside(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """A fresh temporary file name in ``path``'s folder, for writers that want a path, not a handle (the
    ONNX exporter, Keras' save); the caller moves it in place with ``os.replace``. Removed if still there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=owned(".tmp-"), suffix=suffix)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, memo: bool = True) -> str:
    """Hex sha256 of a file. ``memo=True`` remembers it per process by (path, size, mtime); ``memo=False``
    reads the file afresh (for artifacts, where a tampered file must be noticed)."""
    path = Path(path)
    key = None
    if memo:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key in _DIGESTS:
            return _DIGESTS[key]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    hexdigest = digest.hexdigest()
    if key is not None:
        _DIGESTS[key] = hexdigest
    return hexdigest


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock on ``folder/.lock`` across processes (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: os.replace still keeps files whole
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
