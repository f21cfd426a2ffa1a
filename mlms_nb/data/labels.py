"""Class labels of a classifier: ``manifest.outputs[0].labels``, a text file with one label per line.

The URI is resolved with `resolve_asset` (a relative path is relative to the manifest's folder). Files
are read once per process (cached on the resolved path, its size and modification time).
"""
from __future__ import annotations

import threading
from pathlib import Path

from mlms_nb.errors import AssetError, ManifestError
from mlms_nb.manifest import Manifest
from mlms_nb.data.assets import resolve_asset

_CACHE: dict[tuple[str, int, int], tuple[str, ...]] = {}
_LOCK = threading.Lock()


def labels_path(manifest: Manifest) -> Path:
    """The local file holding the manifest's labels."""
    uri = manifest.outputs[0].labels
    if not uri:
        raise ManifestError(f"{manifest.key}: outputs[0].labels is not set; the manifest names no class labels")
    base_dir = Path(manifest.source).parent if manifest.source else None
    return resolve_asset(uri, sha256=None, base_dir=base_dir)


def load_labels(manifest: Manifest) -> list[str]:
    """The class names, index = class id (one per line; trailing blank lines dropped, lines stripped)."""
    path = labels_path(manifest).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise AssetError(f"labels {path}: cannot read them as UTF-8 text ({err})") from None
        lines = [line.strip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        cached = tuple(lines)
        with _LOCK:
            _CACHE[key] = cached
    return list(cached)
