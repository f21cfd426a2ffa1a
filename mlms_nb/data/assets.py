"""Asset resolution: turn a manifest's asset URI into a verified local file.

Schemes:
- a plain path (relative to the manifest's folder) or ``file://`` URI;
- ``pkg://DISTRIBUTION/PATH``: a file inside an installed distribution (found through its RECORD);
- ``http(s)://``: downloaded once into ``MLMS_HOME/cache/`` under its sha256;
- ``artifact://MODEL/FRAMEWORK``: a conversion mlms-nb builds itself (``mlms convert``);
- a scheme another package declares under the entry-point group ``mlms_nb.asset_schemes``.

Schemes are declared, not registered by an import's side effect (:data:`DECLARED_SCHEMES`): a worker process resolves
what the process that made the manifest resolves.

A declared sha256 that does not match refuses the asset; for downloads nothing is cached.

Where local files may come from. A manifest names files; it must not be able to make mlms-nb read any
file on the machine (``../../etc/passwd``, ``/home/me/.ssh/id_rsa``, ``file:///...``). A plain path or a
``file://`` URI is accepted only when it resolves (symbolic links followed) inside one of:

- the manifest's root: the search folder it was found in (the built-in manifests, or the entry of
  ``MLMS_MANIFEST_PATH`` that holds it), else the folder of the manifest file itself; for a manifest
  built in Python (no file), the current working directory;
- ``MLMS_HOME`` (downloads, converted artifacts) and the built-in manifests' folder (shared labels);
- each folder listed in the environment variable ``MLMS_ALLOW_PATHS`` (separated by ``os.pathsep``,
  ``:`` on Linux): the explicit allowance, e.g. ``MLMS_ALLOW_PATHS=/data/models:/mnt/weights``.

Below those folders, a hidden file or one inside a hidden folder (a name starting with ``.``, such as ``.ssh/id_rsa``
of a manifest saved at the top of a home folder, or ``.env``) is refused too: keys, credentials and settings live
there, and an asset's lines end up in predictions, reports and the history. A folder listed in ``MLMS_ALLOW_PATHS``
is the explicit allowance for that as well (its hidden files are allowed).

``pkg://DIST/PATH`` names a file the distribution installs: ``PATH`` must be listed in its RECORD (or,
without one, lie inside its install folder); ``..`` is refused. Anything else is refused with one
sentence naming the asset and the folder to add to ``MLMS_ALLOW_PATHS``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import time
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Callable

from mlms_nb._fs import owned, sha256_file
from mlms_nb.errors import AssetError, ChecksumMismatchError
from mlms_nb.manifest import manifest_roots
from mlms_nb.paths import builtin_manifest_dir, cache_dir, mlms_home

ALLOW_PATHS_ENV = "MLMS_ALLOW_PATHS"
DOWNLOAD_REPORT_S = 5.0
"""A download says how far it has got every this many seconds (the CLI prints it; a notebook shows the work's step)."""

log = logging.getLogger(__name__)

_CHUNK = 1 << 20

#: Schemes whose resolver lives above this layer, declared here by where it lives (``module:function``, imported on
#: first use): a scheme works in every process that resolves an asset -- an ``--isolate`` worker, an agent -- whatever
#: it imported before. ``artifact://`` builds mlms-nb's own conversions (:mod:`mlms_nb.frameworks.convert`).
DECLARED_SCHEMES: dict[str, str] = {"artifact": "mlms_nb.frameworks.convert:resolve_artifact_uri"}

#: The entry-point group through which another package adds a scheme (``name = "package.module:resolver"``, where
#: ``resolver(uri) -> Path``); the sha256 check still applies to what it returns.
SCHEME_ENTRY_POINTS = "mlms_nb.asset_schemes"

_LOADED: dict[str, Callable[[str], Path] | None] = {}


def scheme_resolver(scheme: str) -> Callable[[str], Path] | None:
    """The resolver of ``scheme`` (declared above, else a package's entry point), loaded once; ``None`` when no one
    declares it."""
    scheme = scheme.lower()
    if scheme not in _LOADED:
        target = DECLARED_SCHEMES.get(scheme)
        if target is None:
            found = importlib.metadata.entry_points(group=SCHEME_ENTRY_POINTS, name=scheme)
            target = next(iter(found)).value if found else None
        _LOADED[scheme] = None if target is None else _load(scheme, target)
    return _LOADED[scheme]


def _load(scheme: str, target: str) -> Callable[[str], Path]:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise AssetError(f"assets of scheme {scheme}:// cannot be resolved here: {target} does not load ({err})") from None


def known_schemes() -> list[str]:
    """Every scheme an asset may use here, as the error message lists them."""
    extra = sorted(DECLARED_SCHEMES.keys() | {ep.name for ep in importlib.metadata.entry_points(group=SCHEME_ENTRY_POINTS)})
    return ["a path", "file://", "pkg://", "http(s)://", *(f"{s}://" for s in extra)]


def verify_sha256(path: Path, expected: str | None, uri: str) -> Path:
    """Return ``path`` when its sha256 equals ``expected`` (or none is declared); else raise."""
    if expected:
        actual = sha256_file(path)
        if actual != expected.lower():
            raise ChecksumMismatchError(
                f"asset {uri} failed its checksum: expected sha256 {expected.lower()}, got {actual}; refusing it")
    return path


def resolve_asset(uri: str, sha256: str | None = None, base_dir: Path | None = None) -> Path:
    """A local, verified file for ``uri``. ``base_dir`` anchors relative paths (the manifest's folder)."""
    if not uri:
        raise AssetError("empty asset URI")
    try:
        parsed = urllib.parse.urlparse(uri)
    except ValueError as err:
        raise AssetError(f"asset {uri}: not a valid URI ({err})") from None
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return _download(uri, sha256)
    if scheme == "pkg":
        return verify_sha256(_package_file(uri, parsed), sha256, uri)
    if scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
    elif scheme and len(scheme) > 1:  # one letter would be a Windows drive
        resolver = scheme_resolver(scheme)
        if resolver is None:
            *rest, last = known_schemes()
            raise AssetError(f"asset {uri}: unsupported scheme {scheme!r}; use {', '.join(rest)} or {last}")
        return verify_sha256(resolver(uri), sha256, uri)
    else:
        path = Path(uri).expanduser()
        if not path.is_absolute():
            path = (Path(base_dir) if base_dir is not None else Path.cwd()) / path
    try:
        confined(path, uri, base_dir)
        if not path.exists():
            raise AssetError(f"asset {uri}: no such file {path}")
        return verify_sha256(path, sha256, uri)
    except (OSError, ValueError) as err:  # a name too long, a NUL byte, a file that cannot be read
        raise AssetError(f"asset {uri}: cannot use {path} ({getattr(err, 'strerror', None) or err})") from None


def manifest_root(base_dir: Path | None) -> Path:
    """The folder a manifest's local assets are confined to (see the module docstring): the search folder that
    holds ``base_dir`` (the built-in manifests or an ``MLMS_MANIFEST_PATH`` folder), else ``base_dir`` itself."""
    if base_dir is None:
        return Path.cwd()
    here = os.path.realpath(base_dir)
    for root in manifest_roots():
        real = os.path.realpath(root)
        if os.path.isdir(real) and os.path.commonpath([here, real]) == real:
            return Path(real)
    return Path(here)


def allowed_roots(base_dir: Path | None = None) -> list[Path]:
    """Every folder a local asset of a manifest in ``base_dir`` may lie in, ``MLMS_ALLOW_PATHS`` last."""
    return [manifest_root(base_dir), mlms_home(), builtin_manifest_dir(), *explicit_roots()]


def explicit_roots() -> list[Path]:
    """The folders of ``MLMS_ALLOW_PATHS``: allowed explicitly, hidden files in them included."""
    return [Path(p).expanduser() for p in os.environ.get(ALLOW_PATHS_ENV, "").split(os.pathsep) if p.strip()]


def _hidden_part(real: str, root_real: str) -> str | None:
    """The first name below ``root_real`` on the way to ``real`` that starts with ``.`` (None when there is none)."""
    rel = os.path.relpath(real, root_real)
    return next((part for part in Path(rel).parts if part.startswith(".") and part not in (".", "..")), None)


def confined(path: Path, uri: str, base_dir: Path | None = None) -> Path:
    """``path`` when it resolves inside one of `allowed_roots` and, unless that folder was allowed explicitly
    (``MLMS_ALLOW_PATHS``), is neither hidden nor inside a hidden folder below it; else an `AssetError` saying how
    to allow it."""
    real = os.path.realpath(path)
    explicit = {os.path.realpath(root) for root in explicit_roots()}
    hidden = None
    for root in allowed_roots(base_dir):
        root_real = os.path.realpath(root)
        if os.path.commonpath([real, root_real]) == root_real:
            part = None if root_real in explicit else _hidden_part(real, root_real)
            if part is None:
                return path
            hidden = hidden or part
    folder = os.path.dirname(real) or real
    if hidden is not None:
        raise AssetError(
            f"asset {uri} resolves to {real}, which is hidden ({hidden}): a manifest's files may not be hidden files "
            f"or lie in hidden folders, where keys and settings live; to allow it, add its folder to "
            f"{ALLOW_PATHS_ENV} (e.g. {ALLOW_PATHS_ENV}={folder})")
    raise AssetError(
        f"asset {uri} resolves to {real}, outside the folders a manifest's files may come from (its own root "
        f"{manifest_root(base_dir)}, MLMS_HOME and the built-in manifests); to allow it, add its folder to "
        f"{ALLOW_PATHS_ENV} (e.g. {ALLOW_PATHS_ENV}={folder})")


def _package_file(uri: str, parsed: urllib.parse.ParseResult) -> Path:
    """A file that distribution ``parsed.netloc`` installs, named by its path relative to site-packages."""
    dist_name, rel = parsed.netloc, parsed.path.lstrip("/")
    if not dist_name or not rel:
        raise AssetError(f"asset {uri}: expected pkg://DISTRIBUTION/PATH")
    parts = PurePosixPath(rel).parts
    if "\\" in rel or any(p in ("..", ".") for p in parts):
        raise AssetError(f"asset {uri}: the path inside package {dist_name!r} must not contain '.', '..' or "
                         "backslashes; name a file the package installs, e.g. pkg://DIST/package/file.bin")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        raise AssetError(f"asset {uri}: package {dist_name!r} is not installed (pip install {dist_name})") from None
    files = dist.files
    path = Path(dist.locate_file(rel))
    if files is not None:
        listed = any(PurePosixPath(str(f)) == PurePosixPath(rel) for f in files)
    else:  # no RECORD: the file must at least lie inside the folder the distribution installs into
        root = os.path.realpath(dist.locate_file(""))
        listed = os.path.commonpath([os.path.realpath(path), root]) == root
    if not listed or not path.is_file():
        raise AssetError(f"asset {uri}: package {dist_name!r} {dist.version} has no file {rel}")
    return path


def _download(uri: str, sha256: str | None) -> Path:
    """Fetch into the cache. With a sha256 the cache key is the digest; without, a hash of the URL."""
    root = cache_dir()
    key = sha256.lower() if sha256 else "url-" + hashlib.sha256(uri.encode()).hexdigest()
    name = Path(urllib.parse.urlparse(uri).path).name or "asset"
    target = root / key[:2] / key / name
    if target.is_file():
        return verify_sha256(target, sha256, uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=owned(".part-"))
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(uri, timeout=60) as response:
            size = int(response.headers.get("Content-Length") or 0)
            log.info("downloading %s (once%s)", uri, f", {size / 2**20:.1f} MiB" if size else "")
            started = last = time.monotonic()
            got = 0
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
                got += len(chunk)
                if time.monotonic() - last >= DOWNLOAD_REPORT_S:
                    last = time.monotonic()
                    log.info("downloading %s: %.1f%s MiB", uri, got / 2**20, f" of {size / 2**20:.1f}" if size else "")
            log.info("downloaded %s: %.1f MiB in %.1f s", uri, got / 2**20, time.monotonic() - started)
        if sha256 and h.hexdigest() != sha256.lower():
            raise ChecksumMismatchError(
                f"asset {uri} failed its checksum: expected sha256 {sha256.lower()}, got {h.hexdigest()}; "
                "refusing it and caching nothing")
        os.replace(tmp_name, target)
    except (urllib.error.URLError, OSError) as err:
        raise AssetError(f"asset {uri}: download failed ({getattr(err, 'reason', err)})") from None
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        if not target.exists():
            shutil.rmtree(target.parent, ignore_errors=True)
    return target
