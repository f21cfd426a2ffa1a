"""Datasets: where the inputs of an evaluation come from, streamed in batches with bounded memory.

Formats (one module each): files (`ImageNetSamples`, `ImageFolder`, `AudioFolder`), arrays (`SyntheticDataset`,
`NpzDataset`, `NpyFolder`, `IterableDataset` for any Python iterable), tables (`TableDataset`: Parquet, Arrow).
`open_dataset` turns what a user names into one of them. Every dataset yields `Batch` objects in a deterministic
order through the background pipeline (:mod:`mlms_nb.data.pipeline`). An input that cannot be decoded is skipped
and recorded in ``dataset.skipped`` as ``(id, reason)``; only a dataset of which no input at all can be read is an
error.
"""
from mlms_nb.data.datasets.arrays import IterableDataset, NpyFolder, NpzDataset, SyntheticDataset, as_input, shape_fits
from mlms_nb.data.datasets.base import Dataset
from mlms_nb.data.datasets.files import (
    AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, AudioFolder, FileDataset, ImageFolder, ImageNetSamples,
)
from mlms_nb.data.datasets.opening import ACCEPTED, open_dataset
from mlms_nb.data.datasets.tables import TableDataset
from mlms_nb.data.pipeline import Batch, Stream, StreamStats

__all__ = ["ACCEPTED", "AUDIO_EXTENSIONS", "IMAGE_EXTENSIONS", "AudioFolder", "Batch", "Dataset", "FileDataset",
           "ImageFolder", "ImageNetSamples", "IterableDataset", "NpyFolder", "NpzDataset", "Stream", "StreamStats",
           "SyntheticDataset", "TableDataset", "as_input", "open_dataset", "shape_fits"]
