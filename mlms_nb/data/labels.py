"""Class labels of a classifier: ``manifest.outputs[0].labels``, a text file with one label per line, or the name of
one shipped with mlms-nb (``labels: imagenet1k``: ``mlms_nb/_manifests/labels/imagenet1k.txt``).

The URI is resolved with `resolve_asset` (a relative path is relative to the manifest's folder, and
confined like every asset). Files are read once per process (cached on the resolved path, its size and
modification time) and may be at most `MAX_LABELS_BYTES` (16 MiB). When the number of classes is known
(``outputs[0].classes`` in the manifest, or the width of the model's output), a file with another
number of lines is refused with `LabelsMismatchError`.
"""
from __future__ import annotations

import threading
from pathlib import Path

from mlms_nb.errors import AssetError, ManifestError
from mlms_nb.manifest import Manifest, labels_file
from mlms_nb.data.assets import resolve_asset

_CACHE: dict[tuple[str, int, int], tuple[str, ...]] = {}
_LOCK = threading.Lock()
MAX_LABELS_BYTES = 16 << 20


class LabelsMismatchError(AssetError):
    """The labels file has a different number of lines than the output has classes."""


def labels_path(manifest: Manifest) -> Path:
    """The local file holding the manifest's labels."""
    uri = manifest.outputs[0].labels
    if not uri:
        raise ManifestError(f"{manifest.key}: outputs[0].labels is not set; the manifest names no class labels")
    shipped = labels_file(uri)
    if shipped is not None:  # a shorthand; the manifest's validation already refused an unknown one
        return shipped
    base_dir = Path(manifest.source).parent if manifest.source else None
    return resolve_asset(uri, sha256=None, base_dir=base_dir)


def load_labels(manifest: Manifest, classes: int | None = None) -> list[str]:
    """The class names, index = class id (one per line; trailing blank lines dropped, lines stripped).

    ``classes``: the number the model's output has, when known; else ``outputs[0].classes`` when set.
    """
    path = labels_path(manifest).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is None:
        if st.st_size > MAX_LABELS_BYTES:
            raise AssetError(f"labels {path}: {st.st_size:,} bytes, over the {MAX_LABELS_BYTES:,}-byte limit for a "
                             "labels file (one class name per line); check outputs[0].labels")
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
    check_label_count(list(cached), classes, manifest)
    return list(cached)


def check_label_count(names: list[str], classes: int | None, manifest: Manifest) -> None:
    """Refuse labels whose count differs from ``classes`` (the model's), or else from ``outputs[0].classes``."""
    declared = manifest.outputs[0].classes
    expected, said_by = (classes, "the model's output") if classes is not None else (declared, "outputs[0].classes")
    if expected is not None and len(names) != expected:
        raise LabelsMismatchError(
            f"labels {manifest.outputs[0].labels} of {manifest.key} has {len(names):,} lines but {said_by} has "
            f"{expected:,} classes; point outputs[0].labels at a file with one line per class")


def model_classes(manifest: Manifest) -> tuple[int | None, str]:
    """How many classes the model's first output has, as known before the model loads, and who says so:
    ``outputs[0].classes``, else the number of lines of its labels file; ``(None, "")`` when neither is set."""
    out = manifest.outputs[0]
    if out.classes is not None:
        return out.classes, "outputs[0].classes"
    if out.labels:
        return len(load_labels(manifest)), f"its labels file ({out.labels})"
    return None, ""


def label_space_problem(labels, classes: int | None, said_by: str) -> str | None:
    """Why the dataset's class ids cannot be scored against a model of ``classes`` classes (``said_by`` names who
    says so: ``outputs[0].classes``, the labels file, the model's output); None when they fit or cannot be told.
    ``labels``: the dataset's class ids (-1: unknown, skipped); one out of ``0..classes-1`` means the two label
    spaces differ (a 10-class model scored against ImageNet's 1000 ids), so no accuracy figure would be right."""
    import numpy as np

    if classes is None or labels is None:
        return None
    ids = np.asarray(labels).reshape(-1)
    ids = ids[ids >= 0]
    if not ids.size:
        return None
    outside = ids >= classes
    if not outside.any():
        return None
    return (f"the dataset's labels are class ids up to {int(ids.max()):,} ({int(outside.sum()):,} of {ids.size:,} "
            f"at {classes:,} or above) but the model has {classes:,} classes ({said_by}): the label spaces differ, "
            "so top-1/top-5 are n/a; label the data with the model's own class ids (docs/datasets.md)")
