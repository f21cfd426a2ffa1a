"""Datasets of arrays: already preprocessed tensors, or arrays the preprocessor still turns into inputs.

- `SyntheticDataset`: random, already preprocessed tensors for performance-only runs.
- `NpzDataset`: a ``.npz`` with ``x`` (inputs, N first), optionally ``y`` (labels) and ground truth per output,
  ``target`` (the first output) or ``target:<output name>``; ``x`` (and each target) is memory-mapped when stored
  uncompressed (``np.savez``); compressed, ``x`` is read row block by row block and the targets are loaded whole.
- `NpyFolder`: a folder of ``.npy`` files, one input each, labeled by subfolder like an image folder.
- `IterableDataset`: any iterable from Python (a list, a function returning an iterator, a generator).

An array shaped like the model's input (``inputs[0].dimensions``) is used as it is (cast to its element type); any
other array, path or value goes to the preprocessor (a uint8 ``H x W x C`` array is decoded as an image).
"""
from __future__ import annotations

import itertools
import os
import zipfile
from collections.abc import Mapping, Sized
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from mlms_nb.data.datasets.base import Dataset, IndexedIds, cast_to, check_label_keys, read_items, target_key
from mlms_nb.data.datasets.files import LabeledFolder
from mlms_nb.data.batch import Batch
from mlms_nb.errors import DatasetError
from mlms_nb.manifest import Manifest


def shape_fits(shape: tuple, dimensions) -> bool:
    """Whether ``shape`` (no batch axis) fits ``dimensions`` (an axis that is not an int is dynamic)."""
    dims = list(dimensions)
    return len(shape) == len(dims) and all(not isinstance(d, int) or d == s for s, d in zip(shape, dims))


def as_input(value: Any, preprocess) -> Any:
    """One input from ``value``: an array already shaped like the model's input is cast to its element type;
    anything else goes through ``preprocess`` (without one, an array is taken as it is)."""
    manifest = getattr(preprocess, "manifest", None)
    if isinstance(value, np.ndarray) and (preprocess is None or (
            manifest is not None and shape_fits(value.shape, manifest.fed_input.dimensions))):
        return cast_to(manifest, value)
    if preprocess is None:
        if isinstance(value, Mapping):
            return {k: cast_to(None, v) for k, v in value.items()}
        raise DatasetError(f"an input of type {type(value).__name__} needs a Preprocessor to become an array")
    return preprocess(value)


# ---------------------------------------------------------------- random

class SyntheticDataset(Dataset):
    """``count`` random inputs shaped like the manifest's input, already preprocessed (the preprocessor is not
    used); unlabeled. Input ``i`` is the same for any batch size (seeded by ``(seed, i)``). Floats are standard
    normal (about what normalization gives); integer types are uniform in 0..255."""

    kind = "synthetic input"

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

    def read(self, chunk: range, preprocess) -> Batch:
        return Batch(np.stack([self.item(i) for i in chunk]), None, [f"synthetic-{i:05d}" for i in chunk])


# ---------------------------------------------------------------- .npz

READ_ONLY_FRAMEWORKS = ("onnxruntime", "tensorflow")
"""Frameworks whose predictors take a read-only array as it is (ONNX Runtime reads it in place, TensorFlow copies
it into a tensor); torch gets a copy (``torch.from_numpy`` would share, and warn about, an unwritable buffer)."""


class NpzDataset(Dataset):
    """A ``.npz`` file: ``x`` (already preprocessed inputs, N first) and optionally ``y`` (class ids).

    With a manifest (here or through the preprocessor) ``x``'s shape is checked against ``inputs[0].dimensions``
    and cast to its ``element_type``; otherwise ``x`` is given as is. ``x`` is never loaded whole: memory-mapped
    when the archive stores it uncompressed (``np.savez``), decompressed block by block in order otherwise."""

    kind = "array"

    def __init__(self, path: str | os.PathLike, manifest: Manifest | None = None):
        super().__init__()
        self.path = Path(path).expanduser()
        self.name = str(self.path)
        try:
            with zipfile.ZipFile(self.path) as archive:
                names = [n[:-4] if n.endswith(".npy") else n for n in archive.namelist()]
                if "x" not in names:
                    raise DatasetError(f"{self.path}: expected an array named 'x' (inputs, N first); "
                                       f"it has {', '.join(names) or 'no arrays'}")
                info = archive.getinfo("x.npy")
                with archive.open(info) as member:
                    shape, fortran, dtype = _npy_header(member)
                    header_len = member.tell()
                self.compressed = info.compress_type != zipfile.ZIP_STORED
                self._data_offset = None if self.compressed else _member_offset(self.path, info) + header_len
                self.targets = {key: _member_array(self.path, archive, name) for name in names
                                if (key := target_key(name)) is not None}
            self.names = names
            y = None
            if "y" in names:
                with np.load(self.path, allow_pickle=False) as npz:
                    y = npz["y"]
        except DatasetError:
            raise
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: no such file") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
            raise DatasetError(f"{self.path}: not a readable .npz file ({err})") from None
        if dtype.hasobject:
            raise DatasetError(f"{self.path}: 'x' holds Python objects; save numeric arrays (allow_pickle is off)")
        if len(shape) < 1:
            raise DatasetError(f"{self.path}: 'x' must have a leading batch dimension, got a scalar")
        self.shape, self.dtype, self.fortran = tuple(shape), dtype, fortran
        self._map: np.memmap | None = None
        self._plain: np.ndarray | None = None  # the map as a plain array (what `read` slices)
        self._planned: tuple[Manifest | None, bool] | None = None  # (the manifest checked, reads are views)
        self.y = None
        if y is not None:
            y = np.asarray(y).reshape(-1)
            if len(y) != shape[0]:
                raise DatasetError(f"{self.path}: 'y' has {len(y)} labels but 'x' has {shape[0]} inputs")
            if y.dtype.kind not in "iu":
                raise DatasetError(f"{self.path}: 'y' must hold integer class ids, got {y.dtype}")
            self.y = y.astype(np.int64)
        self.labeled = self.y is not None
        for key, target in self.targets.items():
            if target.ndim < 1 or len(target) != shape[0] or target.dtype.kind not in "biuf":
                raise DatasetError(f"{self.path}: {'target' + (':' + key if key else '')!r} must hold numbers, one "
                                   f"per input ({shape[0]}), N first; got {target.dtype} shaped {list(target.shape)}")
        self.manifest = manifest
        if manifest is not None:
            self.check(manifest)
        else:
            check_label_keys(self, None)

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getstate__(self) -> dict:
        """Pickled for a reader process without its memory maps (the worker maps the file again), so what travels
        does not grow with the dataset."""
        targets = {key: ("memmap", t.filename, t.dtype, t.offset, t.shape) if isinstance(t, np.memmap) else t
                   for key, t in self.targets.items()}
        return {**self.__dict__, "_map": None, "_plain": None, "_planned": None, "targets": targets}

    def __setstate__(self, state: dict) -> None:
        state["targets"] = {key: np.memmap(t[1], dtype=t[2], mode="r", offset=t[3], shape=t[4])
                            if isinstance(t, tuple) else t for key, t in state["targets"].items()}
        self.__dict__.update(state)

    @property
    def x(self) -> np.ndarray:
        """``x`` memory-mapped (read-only), or loaded whole when the archive compresses it."""
        if self._data_offset is not None and not self.fortran:
            if self._map is None:
                self._map = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self._data_offset, shape=self.shape)
                self._plain = self._map.view(np.ndarray)
            return self._map
        with np.load(self.path, allow_pickle=False) as npz:
            return npz["x"]

    def label_ids(self) -> np.ndarray | None:
        return self.y

    def check(self, manifest: Manifest) -> None:
        """Raise `DatasetError` unless ``x`` is shaped ``(N, *inputs[0].dimensions)`` and every label-like array is
        one mlms-nb reads (`check_label_keys`)."""
        check_label_keys(self, manifest)
        dims = list(manifest.fed_input.dimensions)
        actual = list(self.shape[1:])
        if not shape_fits(tuple(actual), dims):
            raise DatasetError(
                f"{self.path}: 'x' holds inputs shaped {actual} (without the batch), but {manifest.key} expects "
                f"{dims} ({manifest.fed_input.layout} without the batch); the .npz must be preprocessed already")

    def chunks(self, size: int) -> Iterator[Any]:
        if self.manifest is not None:
            self.reads_are_views(None)
        if self._data_offset is not None and not self.fortran:
            yield from super().chunks(size)
            return
        # compressed: decompress in order, here in the feeder thread, one block of rows at a time
        row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        with zipfile.ZipFile(self.path) as archive, archive.open("x.npy") as member:
            _npy_header(member)
            for start in range(0, len(self), size):
                stop = min(start + size, len(self))
                raw = member.read(row * (stop - start))
                rows = np.frombuffer(raw, dtype=self.dtype).reshape((stop - start, *self.shape[1:]),
                                                                   order="F" if self.fortran else "C")
                yield range(start, stop), rows

    def reads_are_views(self, preprocess) -> bool:
        """Uncompressed ``x`` of the element type the model takes, for a framework that reads a read-only array
        in place (:data:`READ_ONLY_FRAMEWORKS`): each batch is a slice of the memory map, no copy. ``x`` is checked
        against the manifest first (`check`), once per manifest: a pass reads thousands of chunks."""
        manifest = getattr(preprocess, "manifest", None) or self.manifest
        if self._planned is None or self._planned[0] is not manifest:
            if manifest is not None:
                self.check(manifest)
            self._planned = (manifest, self._data_offset is not None and not self.fortran and manifest is not None
                             and manifest.framework.name in READ_ONLY_FRAMEWORKS
                             and np.dtype(manifest.fed_input.element_type) == self.dtype)
        return self._planned[1]

    def read(self, chunk, preprocess) -> Batch:
        manifest = getattr(preprocess, "manifest", None) or self.manifest
        views = self.reads_are_views(preprocess)
        if isinstance(chunk, tuple):
            chunk, rows = chunk
            rows = cast_to(manifest, rows)
        elif views:  # a slice of the map's plain view (slicing a memmap runs Python): read as the model reads it
            rows = (self._plain if self._map is not None else self.x.view(np.ndarray))[chunk.start:chunk.stop]
        else:
            rows = cast_to(manifest, np.array(self.x[chunk.start:chunk.stop]))  # read from disk here, in the worker
        labels = None if self.y is None else self.y[chunk.start:chunk.stop]
        targets = {key: np.array(t[chunk.start:chunk.stop]) for key, t in self.targets.items()} or None
        return Batch(rows, labels, IndexedIds(self.path.name, chunk), targets=targets)


def _member_array(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """Array ``name`` of the archive: memory-mapped when stored uncompressed, else loaded whole."""
    info = archive.getinfo(name + ".npy")
    with archive.open(info) as member:
        shape, fortran, dtype = _npy_header(member)
        header_len = member.tell()
    if info.compress_type == zipfile.ZIP_STORED and not fortran and not dtype.hasobject and shape:
        return np.memmap(path, dtype=dtype, mode="r", offset=_member_offset(path, info) + header_len, shape=shape)
    with np.load(path, allow_pickle=False) as npz:
        return npz[name]


def _npy_header(f) -> tuple[tuple, bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the .npy whose start ``f`` is at; leaves ``f`` at the data."""
    major, _ = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    return read(f)


def _member_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """Where a stored zip member's bytes start in the file (after its local header)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise ValueError("bad local zip header")
        name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        return info.header_offset + 30 + name_len + extra_len


# ---------------------------------------------------------------- a folder of .npy

class NpyFolder(LabeledFolder):
    """Every ``.npy`` file under ``path``, one input each (an array shaped like the model's input, or one the
    preprocessor turns into it), labeled by subfolder or file-name pattern like `ImageFolder`."""

    kind = "array file"
    extensions = (".npy",)

    def read(self, chunk: range, preprocess) -> Batch:
        return read_items(self.ids, lambda i: as_input(np.load(self.paths[i], allow_pickle=False), preprocess),
                          self.labels, chunk)


# ---------------------------------------------------------------- from Python

class IterableDataset(Dataset):
    """Inputs from Python. ``source``: a list or tuple (read again for each framework), a function returning a
    new iterable each time it is called, or an iterator / generator (read once: one framework). Each item is an
    input (an array, a path, a mapping name -> array), a pair ``(input, label)`` with an integer class id, or a
    pair ``(input, targets)`` with ground truth: an array (or a float) for the first output, or a mapping output
    name -> array; the first item says which (``labeled``, ``targeted``)."""

    kind = "input"
    process_readable = False  # its items come from an iterator in this process

    def __init__(self, source: Iterable | Callable[[], Iterable], name: str | None = None):
        super().__init__()
        if isinstance(source, (str, bytes, os.PathLike)) or not (callable(source) or isinstance(source, Iterable)):
            raise DatasetError(f"a Python dataset must be an iterable or a function returning one, got "
                               f"{type(source).__name__}")
        self.source = source
        self.one_shot = not callable(source) and iter(source) is source
        self.name = name or ("python:" + (getattr(source, "__name__", None) or type(source).__name__))
        self._pulled: list = []  # items a one-shot iterator gave before the pass (head), replayed first
        self._started = False
        first = self._peek()
        self.labeled = _is_pair(first)
        self.targeted = _is_target_pair(first)

    def size(self) -> int | None:
        return len(self.source) if isinstance(self.source, Sized) and not callable(self.source) else None

    def __len__(self) -> int:
        size = self.size()
        if size is None:
            raise DatasetError(f"dataset {self.name!r} does not know its length (an iterator)")
        return size

    def _peek(self) -> Any:
        if self.one_shot:
            if not self._pulled:
                self._pulled.extend(itertools.islice(self.source, 1))
            items = self._pulled
        else:
            items = list(itertools.islice(iter(self._fresh()), 1))
        if not items:
            raise DatasetError(f"dataset {self.name!r} is empty" + (
                " (an iterator read already? pass a list, or a function returning a new iterator)"
                if self.one_shot else ""))
        return items[0]

    def _fresh(self) -> Iterable:
        return self.source() if callable(self.source) else self.source

    def _items(self) -> Iterator:
        if not self.one_shot:
            return iter(self._fresh())
        if self._started:
            raise DatasetError(f"dataset {self.name!r} is an iterator and was read already: pass a list, or a "
                               "function returning a new iterator, to read it again (e.g. for a second framework)")
        self._started = True
        return itertools.chain(self._pulled, self.source)

    def chunks(self, size: int) -> Iterator[Any]:
        items = self._items()
        for start in itertools.count(0, size):
            block = list(itertools.islice(items, size))
            if not block:
                return
            yield start, block

    def read(self, chunk, preprocess) -> Batch:
        start, block = chunk
        ids = [f"{self.name}[{start + k}]" for k in range(len(block))]
        values = [item[0] if self.labeled or self.targeted else item for item in block]
        labels = targets = None
        if self.labeled:
            for k, item in enumerate(block):
                if not _is_pair(item):
                    raise DatasetError(f"{ids[k]}: expected an (input, label) pair like the first item")
            labels = np.asarray([int(item[1]) for item in block], dtype=np.int64)
        if self.targeted:
            targets = _stack_targets(ids, [item[1] if _is_target_pair(item) else None for item in block])
        return read_items(ids, lambda k: as_input(values[k], preprocess), labels, range(len(block)), targets)

    def head(self, count: int, preprocess) -> Batch:
        if not self.one_shot:
            return super().head(count, preprocess)
        if len(self._pulled) < count:  # keep them: the pass replays them before the rest
            self._pulled.extend(itertools.islice(self.source, count - len(self._pulled)))
        batch = self.read((0, self._pulled[:count]), preprocess)
        if not len(batch):
            raise DatasetError(f"dataset {self.name!r} gave no readable inputs")
        return batch


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (int, np.integer))


def _is_target_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (np.ndarray, Mapping, list, float,
                                                                               np.floating))


def _stack_targets(ids: list[str], items: list[Any]) -> dict[str, np.ndarray]:
    """Each item's targets (an array for the first output, or a mapping output name -> array) stacked per output."""
    per_output: dict[str, list] = {}
    for k, targets in enumerate(items):
        if targets is None:
            raise DatasetError(f"{ids[k]}: expected an (input, targets) pair like the first item")
        named = {str(n): v for n, v in targets.items()} if isinstance(targets, Mapping) else {"": targets}
        if k and set(named) != set(per_output):
            raise DatasetError(f"{ids[k]}: targets for {', '.join(sorted(named)) or 'the first output'}, but the "
                               f"first item's are for {', '.join(sorted(per_output)) or 'the first output'}")
        for name, value in named.items():
            per_output.setdefault(name, []).append(np.asarray(value))
    try:
        return {name: np.stack(arrays) for name, arrays in per_output.items()}
    except ValueError:
        raise DatasetError(f"{ids[0]}..{ids[-1]}: targets of different shapes in one batch; inputs of dynamic size "
                           "run one at a time (batch size 1)") from None
