"""The dataset contract, and what every format shares.

A `Dataset` has a ``name``, says whether it is ``labeled`` and how many inputs it holds (``size()``: None when a
Python iterator cannot tell), cuts its inputs into chunks (``chunks(n)``: cheap descriptors, in order) and reads a
chunk into a `Batch` (``read(chunk, preprocess)``: decode, preprocess and stack, in a pipeline worker). Reading
goes through :class:`mlms_nb.data.pipeline.Stream` (``iter_batches``), so memory stays bounded by a few batches.
An input that cannot be decoded is skipped and recorded in ``dataset.skipped`` as ``(id, reason)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Iterator

import numpy as np

from mlms_nb.data.pipeline import Batch, Stream, stack_inputs
from mlms_nb.data.transforms import ImageDecodeError
from mlms_nb.errors import DatasetError, InputDecodeError

SKIPPED_ERRORS = (InputDecodeError, ImageDecodeError)
"""The errors that skip one input (recorded with its reason) rather than stop the pass."""


def check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DatasetError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
        raise DatasetError(f"limit must be None or a non-negative integer, got {limit!r}")
    return int(limit)


class Dataset:
    """The contract: ``name``, ``labeled``, ``size()``, ``chunks()``, ``read()``, ``skipped``; ``iter_batches()``."""

    name: str = "dataset"
    labeled: bool = False
    process_readable: bool = True
    """Whether worker processes can read it (it pickles, and its chunks say what to read)."""

    def reads_are_views(self, preprocess) -> bool:
        """Whether reading a chunk costs no work (the batch is a view of memory-mapped data, never skipped): the
        stream then reads it in the consumer, without reader threads (``Stream``)."""
        return False

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def size(self) -> int | None:
        """How many inputs; None when unknown until read (a Python iterator)."""
        return len(self)

    def __len__(self) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        size = self.size()
        return f"{type(self).__name__}({self.name!r}, {'?' if size is None else size} inputs, labeled={self.labeled})"

    def label_ids(self) -> np.ndarray | None:
        """Every input's class id (-1: unknown) when known without reading the inputs; None otherwise (unlabeled,
        or a Python iterator whose labels come as it is read). Checked against the model's classes before it loads."""
        return None

    def chunks(self, size: int) -> Iterator[Any]:
        """Descriptors of ``size`` consecutive inputs each (the last may hold fewer), in order."""
        n = len(self)
        for start in range(0, n, size):
            yield range(start, min(start + size, n))

    def read(self, chunk: Any, preprocess) -> Batch:
        """One chunk as a `Batch` (unreadable inputs in ``Batch.skipped``); called from a worker thread or process."""
        raise NotImplementedError

    def iter_batches(self, batch_size: int, preprocess, limit: int | None = None, drop_last: bool = False,
                     workers: int | None = None, prefetch: int | None = None, reader: str | None = None,
                     niceness: int | None = None) -> Stream:
        """Batches of ``batch_size`` inputs (the last one smaller unless ``drop_last``), at most ``limit`` inputs
        in all, preprocessed by ``workers`` threads (``reader="processes"``: processes) ``prefetch`` batches ahead,
        ``niceness`` steps below this thread's priority (`~mlms_nb.data.batch.lower_priority`).
        ``skipped`` is reset at the start of each iteration. The returned `Stream` is an iterator; its ``stats``
        say where the time went."""
        return Stream(self, preprocess, check_batch_size(batch_size), check_limit(limit), bool(drop_last),
                      workers, prefetch, reader, niceness=niceness)

    def head(self, count: int, preprocess) -> Batch:
        """The first ``count`` readable inputs (fewer when the dataset is smaller), in one batch."""
        with self.iter_batches(count, preprocess, limit=count, prefetch=1) as stream:
            for batch in stream:
                return batch
        raise DatasetError(f"dataset {self.name!r} gave no inputs")


class IndexedIds(Sequence):
    """The ids ``name[i]`` of the inputs at ``positions`` (a range) of a dataset, spelled only when read: a batch's
    ids then cost nothing per input during a pass (a ``.npz`` of 10k small inputs spent as long spelling them as
    scoring its outputs). A sequence of str like a list (``==`` compares with any sequence); a slice is another
    `IndexedIds`; `tolist` spells them all at once."""

    __slots__ = ("name", "positions", "_spelled")

    def __init__(self, name: str, positions: range):
        self.name, self.positions = name, positions
        self._spelled: list[str] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return IndexedIds(self.name, self.positions[index])
        return f"{self.name}[{self.positions[index]}]"

    def __iter__(self) -> Iterator[str]:
        if self._spelled is None:
            self.tolist()
        return iter(self._spelled)

    def tolist(self) -> list[str]:
        """The ids, spelled once (the scores and the outputs frame both read them)."""
        if self._spelled is None:
            name = self.name
            self._spelled = [f"{name}[{i}]" for i in self.positions]
        return list(self._spelled)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IndexedIds):
            return self.name == other.name and list(self.positions) == list(other.positions)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # like a list

    def __repr__(self) -> str:
        return repr(self.tolist()) if len(self) <= 4 else f"IndexedIds({self.name!r}, {self.positions!r})"

    def __reduce__(self):
        return IndexedIds, (self.name, self.positions)


def read_items(ids: Sequence[str], load: Callable[[int], Any], labels: np.ndarray | None,
               positions: Sequence[int], targets: dict[str, Any] | None = None) -> Batch:
    """A batch of the inputs at ``positions`` (``load(position)`` gives one input's data); inputs whose load raises
    a skipping error are left out and listed in ``Batch.skipped``. ``labels`` and ``targets`` (output name ->
    array) are indexed by the same positions."""
    data, kept, skipped = [], [], []
    for i in positions:
        try:
            data.append(load(i))
            kept.append(i)
        except SKIPPED_ERRORS as err:
            skipped.append((ids[i], short_reason(str(err))))
    kept_targets = None if targets is None else {name: np.asarray(t[kept]) if kept else np.asarray(t[:0])
                                                 for name, t in targets.items()}
    if not data:
        return Batch(np.empty((0,)), None if labels is None else labels[:0], [], skipped, targets=kept_targets)
    return Batch(stack_inputs(data), None if labels is None else labels[kept], [ids[i] for i in kept], skipped,
                 targets=kept_targets)


def target_key(name: str) -> str | None:
    """The output a dataset's array or column named ``name`` is the ground truth of: ``target`` -> ``""`` (the
    model's first output), ``target:mask`` -> ``mask``; None for any other name."""
    if name == "target":
        return ""
    if name.startswith("target:") and len(name) > len("target:"):
        return name[len("target:"):]
    return None


LABEL_LIKE = ("label", "labels", "targets", "class", "classes", "class_ids", "Y", "y_true", "gt", "ground_truth")
"""Array names that look like labels or targets but that mlms-nb does not read: refused with the name to use."""


def check_label_keys(npz, manifest) -> None:
    """Refuse an array that looks like labels but would be ignored (``labels``, ``targets``...), and, for a
    classifier, a ``target`` of one integer per input (class ids are ``y``; ``target`` is compared value by value
    with the output), each with the name to use (docs/datasets.md)."""
    classifier = manifest is not None and manifest.outputs[0].type == "classification"
    ids_name = "'y' (integer class ids, for top-1/top-5 accuracy)"
    truth_name = "'target' or 'target:<output>' (ground truth compared with the output's values)"
    for name in getattr(npz, "names", ()):
        if name in LABEL_LIKE:
            use = ids_name if classifier else truth_name if manifest is not None else f"{ids_name} or {truth_name}"
            raise DatasetError(f"{npz.path}: an array named {name!r} is not read by mlms-nb; rename it {use}")
    target = npz.targets.get("")
    if classifier and target is not None and target.ndim == 1 and target.dtype.kind in "iu":
        raise DatasetError(f"{npz.path}: 'target' holds one integer per input, class ids, but 'target' is compared "
                           f"value by value with the output; rename it {ids_name}")


def short_reason(reason: str) -> str:
    """The reason without a leading ``cannot decode <path>: `` (the input's id already names it)."""
    if reason.startswith("cannot decode ") and ": " in reason:
        return reason.split(": ", 1)[1]
    return reason


def cast_to(manifest, data: Any) -> Any:
    """Already-preprocessed data cast to the first input's element type (contiguous)."""
    array = np.asarray(data, dtype=None if manifest is None else np.dtype(manifest.fed_input.element_type))
    return array if array.flags.c_contiguous else array.copy()  # (ascontiguousarray would make a scalar 1-d)
