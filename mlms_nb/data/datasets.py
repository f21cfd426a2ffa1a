"""Datasets: where the inputs of an evaluation come from, iterated in batches.

- `ImageNetSamples`: the 20 labeled ImageNet photos shipped in the ``foolbox`` wheel (``pip install
  --no-deps foolbox``; mlms-nb only reads the files, it never imports foolbox).
- `ImageFolder`: a folder of images, labeled by subfolder name or by a file-name pattern.
- `SyntheticDataset`: random, already preprocessed tensors for performance-only runs.
- `NpzDataset`: a ``.npz`` with ``x`` (already preprocessed, N first) and optionally ``y`` (labels).

`open_dataset` turns what a user types (``imagenet-samples``, ``synthetic:256``, a folder, a ``.npz``)
into one of them. Every dataset yields `Batch` objects in a deterministic order. An image that cannot be
decoded is skipped and recorded in ``dataset.skipped`` as ``(id, reason)``; only a dataset of which no
image at all can be read is an error.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from mlms_nb.errors import DatasetError, MlmsError
from mlms_nb.manifest import Manifest
from mlms_nb.data.feeds import stack
from mlms_nb.data.transforms import ImageDecodeError, Preprocessor

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
_SAMPLE_RE = re.compile(r"^imagenet_(\d+)_(\d+)\.jpg$")


@dataclass
class Batch:
    """``data``: inputs, N first; ``labels``: int64 class ids (-1 = unknown) or None for unlabeled data."""
    data: np.ndarray
    labels: np.ndarray | None
    ids: list[str]

    def __len__(self) -> int:
        return len(self.ids)


def _check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DatasetError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def _check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
        raise DatasetError(f"limit must be None or a non-negative integer, got {limit!r}")
    return int(limit)


class Dataset:
    """The contract: ``name``, ``labeled``, ``len()``, ``iter_batches()``, ``skipped``."""

    name: str = "dataset"
    labeled: bool = False

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def __len__(self) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self)} inputs, labeled={self.labeled})"

    def iter_batches(self, batch_size: int, preprocess: Preprocessor | None, limit: int | None = None,
                     drop_last: bool = False) -> Iterator[Batch]:
        """Batches of ``batch_size`` inputs (the last one smaller unless ``drop_last``), at most ``limit``
        inputs in all. ``skipped`` is reset at the start of each iteration."""
        batch_size = _check_batch_size(batch_size)
        limit = _check_limit(limit)
        self.skipped = []
        return self._batches(batch_size, preprocess, limit, bool(drop_last))

    def _batches(self, batch_size: int, preprocess: Preprocessor | None, limit: int | None,
                 drop_last: bool) -> Iterator[Batch]:
        raise NotImplementedError


# ---------------------------------------------------------------- image files

class _ImageFiles(Dataset):
    """Images on disk with optional labels; decoded and preprocessed by a small thread pool, in order."""

    def __init__(self, name: str, paths: Sequence[Path], ids: Sequence[str], labels: Sequence[int] | None,
                 workers: int | None = None):
        super().__init__()
        self.name = name
        self.paths = [Path(p) for p in paths]
        self.ids = list(ids)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.labeled = self.labels is not None
        self.workers = workers or min(8, os.cpu_count() or 1)

    def __len__(self) -> int:
        return len(self.paths)

    def _batches(self, batch_size, preprocess, limit, drop_last):
        if preprocess is None:
            raise DatasetError(f"dataset {self.name!r} holds image files: iter_batches needs a Preprocessor "
                               "(mlms_nb.data.transforms.Preprocessor(manifest))")
        want = len(self.paths) if limit is None else min(limit, len(self.paths))
        if want == 0:
            return

        def load(i: int):
            try:
                return i, preprocess(self.paths[i]), None
            except ImageDecodeError as err:
                return i, None, str(err)

        data: list[np.ndarray] = []
        idx: list[int] = []
        delivered = 0
        nxt = 0
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="mlms-decode") as pool:
            while delivered + len(data) < want and nxt < len(self.paths):
                # Decode a bounded chunk ahead (memory), never more than the limit still needs.
                need = want - delivered - len(data)
                chunk = range(nxt, min(len(self.paths), nxt + min(need, max(batch_size, 4 * self.workers))))
                nxt = chunk.stop
                for i, arr, reason in pool.map(load, chunk):
                    if delivered + len(data) >= want:
                        break
                    if arr is None:
                        self.skipped.append((self.ids[i], _short(reason, self.paths[i])))
                        continue
                    data.append(arr)
                    idx.append(i)
                    if len(data) == batch_size:
                        yield self._batch(data, idx)
                        delivered += len(data)
                        data, idx = [], []
        if data and not drop_last:
            delivered += len(data)
            yield self._batch(data, idx)
        elif data:
            delivered += len(data)  # read fine, dropped on purpose
        if delivered == 0 and self.skipped:
            first_id, first_reason = self.skipped[0]
            raise DatasetError(f"dataset {self.name!r}: none of its {len(self.skipped)} image(s) could be read "
                               f"(first: {first_id}: {first_reason})")

    def _batch(self, data: list[np.ndarray], idx: list[int]) -> Batch:
        labels = None if self.labels is None else self.labels[idx]
        return Batch(data=stack(data), labels=labels, ids=[self.ids[i] for i in idx])


def _short(reason: str, path: Path) -> str:
    """The reason without the file's path (the id already names it)."""
    return reason.replace(f"cannot decode {path}: ", "")


class ImageNetSamples(_ImageFiles):
    """The 20 ImageNet validation photos in the foolbox wheel: ``foolbox/data/imagenet_{NN}_{label}.jpg``.

    Found through the distribution's file list (``importlib.metadata``), never by importing foolbox.
    """

    DISTRIBUTION = "foolbox"

    def __init__(self, workers: int | None = None):
        files = self.locate()
        ids = [p.stem for _, _, p in files]
        super().__init__("imagenet-samples", [p for _, _, p in files], ids, [lab for _, lab, _ in files], workers)

    @classmethod
    def locate(cls) -> list[tuple[int, int, Path]]:
        """``(number, class index, path)`` of each sample, in file-number order."""
        hint = (f"the imagenet-samples photos come with the {cls.DISTRIBUTION} wheel: "
                f"pip install --no-deps {cls.DISTRIBUTION}")
        try:
            dist = importlib.metadata.distribution(cls.DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            raise DatasetError(f"{cls.DISTRIBUTION} is not installed; {hint}") from None
        found: list[tuple[int, int, Path]] = []
        for f in dist.files or []:
            parts = f.parts
            if len(parts) == 3 and parts[:2] == ("foolbox", "data"):
                m = _SAMPLE_RE.match(parts[2])
                if m:
                    path = Path(dist.locate_file(f))
                    if path.is_file():
                        found.append((int(m.group(1)), int(m.group(2)), path))
        if not found:  # no RECORD: look in the folder itself
            folder = Path(dist.locate_file("foolbox/data"))
            if folder.is_dir():
                for path in folder.iterdir():
                    m = _SAMPLE_RE.match(path.name)
                    if m and path.is_file():
                        found.append((int(m.group(1)), int(m.group(2)), path))
        if not found:
            raise DatasetError(f"{cls.DISTRIBUTION} {dist.version} has no foolbox/data/imagenet_*.jpg files; {hint}")
        return sorted(found)


class ImageFolder(_ImageFiles):
    """Every image under ``path`` (``.jpg .jpeg .png .bmp .webp``, recursive, sorted by relative path).

    Labels:
    - ``label_from="subfolder"``: the name of the image's folder, matched exactly against ``labels``
      (the manifest's class names; the first occurrence wins) or read as a class index when numeric;
    - ``label_from="pattern"``: ``pattern`` is a regex searched in the file name, whose named group
      ``label`` is a class index or a class name.
    An image whose label cannot be found gets -1; a folder where no image has a label is unlabeled.
    ``unmatched`` lists the folder names or file names whose label could not be found.
    """

    def __init__(self, path: str | os.PathLike, label_from: str = "subfolder", pattern: str | None = None,
                 labels: list[str] | None = None, workers: int | None = None):
        root = Path(path).expanduser()
        if not root.is_dir():
            raise DatasetError(f"{root} is not a folder")
        if label_from not in ("subfolder", "pattern"):
            raise DatasetError(f"label_from must be 'subfolder' or 'pattern', got {label_from!r}")
        regex = None
        if label_from == "pattern":
            if not pattern:
                raise DatasetError("label_from='pattern' needs a pattern with a named group, e.g. r'_(?P<label>\\d+)\\.'")
            try:
                regex = re.compile(pattern)
            except re.error as err:
                raise DatasetError(f"pattern {pattern!r} is not a valid regular expression ({err})") from None
            if "label" not in regex.groupindex:
                raise DatasetError(f"pattern {pattern!r} needs a named group 'label', e.g. (?P<label>\\d+)")
        files = sorted((p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()),
                       key=lambda p: p.relative_to(root).as_posix())
        if not files:
            raise DatasetError(f"no images found in {root} (looked recursively for "
                               f"{', '.join(IMAGE_EXTENSIONS)})")
        self.root = root
        self.label_from = label_from
        self.pattern = pattern
        self.class_names = list(labels) if labels else None
        index: dict[str, int] = {}
        for i, name in enumerate(self.class_names or []):
            index.setdefault(name, i)
        ids = [p.relative_to(root).as_posix() for p in files]
        self.unmatched: list[str] = []
        found: list[int] = []
        for p, rel in zip(files, ids):
            if regex is not None:
                m = regex.search(p.name)
                text = m.group("label") if m else None
                where = p.name
            else:
                text = p.parent.relative_to(root).as_posix() if p.parent != root else None
                text = Path(text).name if text else None
                where = text
            label = self._label(text, index)
            if label < 0 and where and where not in self.unmatched:
                self.unmatched.append(where)
            found.append(label)
        labeled = any(lab >= 0 for lab in found)
        super().__init__(str(root), files, ids, found if labeled else None, workers)

    def _label(self, text: str | None, index: dict[str, int]) -> int:
        if text is None:
            return -1
        if text in index:
            return index[text]
        if text.isdigit():
            value = int(text)
            if self.class_names is None or value < len(self.class_names):
                return value
        return -1


# ---------------------------------------------------------------- tensors

class SyntheticDataset(Dataset):
    """``count`` random inputs shaped like the manifest's input, already preprocessed (iter_batches ignores
    the preprocessor); unlabeled. Input ``i`` is the same for any batch size (seeded by ``(seed, i)``).
    Floats are standard normal (about what normalization gives); integer types are uniform in 0..255."""

    def __init__(self, manifest: Manifest, count: int = 64, seed: int = 0):
        super().__init__()
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise DatasetError(f"synthetic: count must be a positive integer, got {count!r}")
        spec = manifest.fed_input
        if spec.dynamic:
            raise DatasetError(f"synthetic: {manifest.key}'s input {spec.name or 'input'} has dynamic dimensions "
                               f"{spec.dimensions}; evaluate it on a dataset (a folder of images, a .npz)")
        self.manifest = manifest
        self.count = int(count)
        self.seed = int(seed)
        self.shape = tuple(int(d) for d in spec.dimensions)
        self.dtype = np.dtype(spec.element_type)
        self.name = f"synthetic:{self.count}"
        self.labeled = False

    def __len__(self) -> int:
        return self.count

    def item(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(i)])
        if self.dtype.kind == "f":
            return rng.standard_normal(self.shape, dtype=np.float32).astype(self.dtype, copy=False)
        return rng.integers(0, 256, size=self.shape, dtype=self.dtype)

    def _batches(self, batch_size, preprocess, limit, drop_last):
        n = self.count if limit is None else min(limit, self.count)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            if drop_last and stop - start < batch_size:
                return
            data = np.stack([self.item(i) for i in range(start, stop)])
            yield Batch(data=data, labels=None, ids=[f"synthetic-{i:05d}" for i in range(start, stop)])


class NpzDataset(Dataset):
    """A ``.npz`` file: ``x`` (already preprocessed inputs, N first) and optionally ``y`` (class ids).

    With a manifest (here or through the preprocessor given to iter_batches) ``x``'s shape is checked
    against ``inputs[0].dimensions`` and cast to its ``element_type``; otherwise ``x`` is given as is.
    """

    def __init__(self, path: str | os.PathLike, manifest: Manifest | None = None):
        super().__init__()
        self.path = Path(path).expanduser()
        self.name = str(self.path)
        try:
            with np.load(self.path, allow_pickle=False) as npz:
                keys = list(npz.files)
                if "x" not in keys:
                    raise DatasetError(f"{self.path}: expected an array named 'x' (inputs, N first); "
                                       f"it has {', '.join(keys) or 'no arrays'}")
                self.x = npz["x"]
                self.y = npz["y"] if "y" in keys else None
        except MlmsError:
            raise
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: no such file") from None
        except (OSError, ValueError) as err:
            raise DatasetError(f"{self.path}: not a readable .npz file ({err})") from None
        if self.x.ndim < 1:
            raise DatasetError(f"{self.path}: 'x' must have a leading batch dimension, got a scalar")
        if self.y is not None:
            self.y = np.asarray(self.y).reshape(-1)
            if len(self.y) != len(self.x):
                raise DatasetError(f"{self.path}: 'y' has {len(self.y)} labels but 'x' has {len(self.x)} inputs")
            if self.y.dtype.kind not in "iu":
                raise DatasetError(f"{self.path}: 'y' must hold integer class ids, got {self.y.dtype}")
            self.y = self.y.astype(np.int64)
        self.labeled = self.y is not None
        self.manifest = manifest
        if manifest is not None:
            self.check(manifest)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def check(self, manifest: Manifest) -> None:
        """Raise `DatasetError` unless ``x`` is shaped ``(N, *inputs[0].dimensions)``."""
        spec = manifest.fed_input
        expected = list(spec.dimensions)
        actual = list(self.x.shape[1:])
        if len(actual) != len(expected) or any(isinstance(e, int) and e != a for e, a in zip(expected, actual)):
            raise DatasetError(
                f"{self.path}: 'x' holds inputs shaped {actual} (without the batch), but {manifest.key} expects "
                f"{expected} ({spec.layout} without the batch); the .npz must be preprocessed already")

    def _batches(self, batch_size, preprocess, limit, drop_last):
        manifest = preprocess.manifest if preprocess is not None else self.manifest
        dtype = None
        if manifest is not None:
            self.check(manifest)
            dtype = np.dtype(manifest.fed_input.element_type)
        n = len(self) if limit is None else min(limit, len(self))
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            if drop_last and stop - start < batch_size:
                return
            data = self.x[start:stop]
            data = np.ascontiguousarray(data, dtype=dtype) if dtype is not None else np.ascontiguousarray(data)
            labels = None if self.y is None else self.y[start:stop]
            yield Batch(data=data, labels=labels, ids=[f"{self.path.name}[{i}]" for i in range(start, stop)])


# ---------------------------------------------------------------- from a user's words

ACCEPTED = ("'imagenet-samples' (20 labeled ImageNet photos; pip install --no-deps foolbox)",
            "'synthetic' or 'synthetic:N' (N random preprocessed inputs, default 64)",
            "a folder of images (.jpg .jpeg .png .bmp .webp; subfolder names are labels)",
            "a .npz file with 'x' (preprocessed inputs) and optionally 'y' (labels)")


def open_dataset(spec: str | os.PathLike | Dataset | None, manifest: Manifest) -> Dataset:
    """The dataset a user names: ``imagenet-samples``, ``synthetic[:N]``, a folder or a ``.npz`` file.

    A `Dataset` passes through; None means ``synthetic`` (64 random inputs, no accuracy)."""
    if isinstance(spec, Dataset):
        if isinstance(spec, NpzDataset):
            spec.check(manifest)
        return spec
    if spec is None:  # nothing named: a performance-only run on synthetic inputs
        return SyntheticDataset(manifest)
    text = os.fspath(spec) if not isinstance(spec, str) else spec
    key = text.strip().lower()
    if key in ("imagenet-samples", "imagenet_samples"):
        return ImageNetSamples()
    if key == "synthetic" or key.startswith("synthetic:"):
        count_text = key.partition(":")[2].strip()
        if not count_text:
            return SyntheticDataset(manifest)
        if not count_text.isdigit() or int(count_text) < 1:
            raise DatasetError(f"{text!r}: expected synthetic:N with N a positive integer")
        return SyntheticDataset(manifest, count=int(count_text))
    path = Path(text).expanduser()
    if path.is_dir():
        return ImageFolder(path, labels=_class_names(manifest))
    if path.suffix.lower() == ".npz":
        if not path.is_file():
            raise DatasetError(f"{path}: no such file")
        return NpzDataset(path, manifest=manifest)
    what = "no such file or folder" if not path.exists() else "not a folder or a .npz file"
    raise DatasetError(f"dataset {text!r}: {what}; accepted: " + "; ".join(ACCEPTED))


def _class_names(manifest: Manifest) -> list[str] | None:
    """The manifest's labels, to match subfolder names; None when it has none or they cannot be read
    (numeric subfolder names still work then)."""
    if not manifest.outputs[0].labels:
        return None
    from mlms_nb.data.labels import load_labels

    try:
        return load_labels(manifest)
    except MlmsError:
        return None
