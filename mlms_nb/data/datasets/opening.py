"""`open_dataset`: what a user names (``imagenet-samples``, ``synthetic:256``, a folder, a file, a Python
iterable) as a `Dataset`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlms_nb.data.datasets.arrays import IterableDataset, NpyFolder, NpzDataset, SyntheticDataset
from mlms_nb.data.datasets.base import Dataset
from mlms_nb.data.datasets.files import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, AudioFolder, ImageFolder, ImageNetSamples
from mlms_nb.data.datasets.tables import TABLE_SUFFIXES, TableDataset
from mlms_nb.errors import DatasetError
from mlms_nb.manifest import Manifest

ACCEPTED = ("'imagenet-samples' (20 labeled ImageNet photos; pip install --no-deps foolbox)",
            "'synthetic' or 'synthetic:N' (N random preprocessed inputs, default 64)",
            "a folder of images (.jpg .jpeg .png .bmp .webp; subfolder names are labels), of audio files "
            "(.wav .flac .ogg .mp3) or of .npy arrays",
            "a .npz file with 'x' (preprocessed inputs) and optionally 'y' (labels) and 'target' or "
            "'target:<output>' (ground truth per output)",
            "a Parquet or Arrow file (.parquet .arrow .feather) with a column of image bytes or arrays and "
            "optionally 'label' and 'target' / 'target:<output>'",
            "from Python: any iterable of inputs, (input, label) or (input, targets) pairs, or a function returning "
            "one")


def open_dataset(spec: Any, manifest: Manifest) -> Dataset:
    """The dataset a user names: ``imagenet-samples``, ``synthetic[:N]``, a folder, a ``.npz``, a Parquet or Arrow
    file, a `Dataset`, or (from Python) an iterable or a function returning one.

    None means ``synthetic`` (64 random inputs, no accuracy)."""
    if isinstance(spec, Dataset):
        if isinstance(spec, NpzDataset):
            spec.check(manifest)
        return spec
    if spec is None:  # nothing named: a performance-only run on synthetic inputs
        return SyntheticDataset(manifest)
    if not isinstance(spec, (str, os.PathLike)):
        return IterableDataset(spec)
    text = os.fspath(spec)
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
        return _folder(path, manifest)
    suffix = path.suffix.lower()
    if suffix == ".npz" or suffix in TABLE_SUFFIXES:
        if not path.is_file():
            raise DatasetError(f"{path}: no such file")
        return NpzDataset(path, manifest=manifest) if suffix == ".npz" else TableDataset(path)
    what = "no such file or folder" if not path.exists() else "not a folder or a dataset file"
    raise DatasetError(f"dataset {text!r}: {what}; accepted: " + "; ".join(ACCEPTED))


def _folder(path: Path, manifest: Manifest) -> Dataset:
    """An image, audio or .npy folder: what the folder holds, and for audio the model's input type."""
    labels = _class_names(manifest)
    counts = {"image": 0, "audio": 0, "npy": 0}
    for p in path.rglob("*"):
        suffix = p.suffix.lower()
        key = "image" if suffix in IMAGE_EXTENSIONS else "audio" if suffix in AUDIO_EXTENSIONS else (
            "npy" if suffix == ".npy" else None)
        if key:
            counts[key] += 1
    if manifest.fed_input.type == "audio" or counts["audio"] > max(counts["image"], counts["npy"]):
        return AudioFolder(path, labels=labels)
    if counts["npy"] > counts["image"]:
        return NpyFolder(path, labels=labels)
    return ImageFolder(path, labels=labels)  # says which images it looked for when there are none


def _class_names(manifest: Manifest) -> list[str] | None:
    """The manifest's labels, to match subfolder names; None when it has none. A labels file that cannot be read
    (missing, too long) is refused: ignoring it would score the folder by its numeric names alone, silently."""
    if not manifest.outputs[0].labels:
        return None
    from mlms_nb.data.labels import load_labels

    return load_labels(manifest)
