"""Asset resolution: turn a manifest's asset URI into a verified local file.

Schemes:
- a plain path (relative to the manifest's folder) or ``file://`` URI;
- ``pkg://DISTRIBUTION/PATH``: a file inside an installed distribution (found through its RECORD);
- ``http(s)://``: downloaded once into ``MLMS_HOME/cache/`` under its sha256;
- ``artifact://MODEL/FRAMEWORK``: a conversion mlms-nb builds itself (``mlms convert``).

A declared sha256 that does not match refuses the asset; for downloads nothing is cached.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

from mlms_nb._fs import sha256_file
from mlms_nb.errors import AssetError, ChecksumMismatchError
from mlms_nb.paths import cache_dir

_CHUNK = 1 << 20
_SCHEMES: dict[str, Callable[[str], Path]] = {}  # scheme -> resolver, filled by the layers that own a scheme


def register_scheme(scheme: str, resolver: Callable[[str], Path]) -> None:
    """Let ``resolver(uri) -> Path`` resolve ``scheme://...`` URIs (``artifact://`` is registered by
    :mod:`mlms_nb.frameworks.convert`, which builds the artifacts); the sha256 check still applies."""
    _SCHEMES[scheme.lower()] = resolver


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
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return _download(uri, sha256)
    if scheme == "pkg":
        return verify_sha256(_package_file(uri, parsed), sha256, uri)
    if scheme in _SCHEMES:
        return verify_sha256(_SCHEMES[scheme](uri), sha256, uri)
    if scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
    elif scheme and len(scheme) > 1:  # one letter would be a Windows drive
        raise AssetError(f"asset {uri}: unsupported scheme {scheme!r}; use a path, file://, pkg://, http(s):// or artifact://")
    else:
        path = Path(uri).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
    if not path.exists():
        raise AssetError(f"asset {uri}: no such file {path}")
    return verify_sha256(path, sha256, uri)


def _package_file(uri: str, parsed: urllib.parse.ParseResult) -> Path:
    dist_name, rel = parsed.netloc, parsed.path.lstrip("/")
    if not dist_name or not rel:
        raise AssetError(f"asset {uri}: expected pkg://DISTRIBUTION/PATH")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise AssetError(f"asset {uri}: package {dist_name!r} is not installed (pip install {dist_name})") from None
    path = Path(dist.locate_file(rel))
    if not path.is_file():
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
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(uri, timeout=60) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
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
