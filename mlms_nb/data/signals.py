"""Preprocessing of input types beyond images: audio files and text.

Audio (``type: audio``): ``decode_audio {sample_rate, channels}`` reads a WAV/FLAC/OGG file with ``soundfile``
(float32 samples in -1..1; an array passes through as samples already), averages the channels to mono (or keeps
them, channels first) and resamples to ``sample_rate`` Hz -- ``soxr`` (very high quality) when it is installed,
else SciPy's polyphase filter (``resample_poly``, Kaiser window). ``chunk {size, hop, context}`` then cuts the
last axis into ordered chunks of ``size`` samples every ``hop``, each prefixed by ``context`` samples of what came
before (zeros before the start), the last one zero-padded: ``(chunks, ..., context + size)``, one model call each.

Text (``type: text``): ``tokenize {tokenizer, max_length, ids, attention_mask, type_ids}`` encodes a string with a
``tokenizers`` JSON file (an asset URI; no network), truncates and pads to ``max_length`` and gives a mapping input
name -> int array: the ids, and the mask and type ids where the step names their inputs.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from mlms_nb._optional import is_available, require
from mlms_nb.errors import DatasetError
from mlms_nb.manifest import ChunkArgs, DecodeAudioArgs, Manifest, TokenizeArgs


class AudioDecodeError(DatasetError):
    """One audio file could not be read (datasets skip it and record why)."""


def decode_audio(item: Any, args: DecodeAudioArgs) -> np.ndarray:
    """Samples at ``args.sample_rate``: ``(samples,)`` mono, or ``(channels, samples)``; float32."""
    if isinstance(item, np.ndarray):
        samples, rate = np.asarray(item, dtype=np.float32), args.sample_rate
        frames = samples if samples.ndim == 2 else samples[:, None]
    else:
        soundfile = require("soundfile", "reading audio files (decode_audio)")
        try:
            frames, rate = soundfile.read(os.fspath(item), dtype="float32", always_2d=True)
        except Exception as err:  # noqa: BLE001 - libsndfile raises its own errors for unreadable files
            raise AudioDecodeError(f"cannot decode {os.fspath(item)}: {type(err).__name__}: "
                                   f"{str(err).splitlines()[0] if str(err) else ''}") from None
    x = frames.mean(axis=1) if args.channels == "mono" else frames.T
    return resample(np.ascontiguousarray(x, dtype=np.float32), int(rate), args.sample_rate)


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``x`` (samples on the last axis) from ``rate`` to ``target`` Hz: soxr when installed, else SciPy's
    ``resample_poly`` (up/down by the rates' greatest common divisor)."""
    if rate == target:
        return x
    if is_available("soxr"):
        import soxr

        if x.ndim == 1:
            return np.asarray(soxr.resample(x, rate, target), dtype=np.float32)
        return np.ascontiguousarray(np.asarray(soxr.resample(x.T, rate, target), dtype=np.float32).T)
    signal = require("scipy", "resampling audio (decode_audio)").signal
    g = math.gcd(rate, target)
    return signal.resample_poly(x, target // g, rate // g, axis=-1).astype(np.float32)


def chunk(x: np.ndarray, args: ChunkArgs) -> np.ndarray:
    """Ordered chunks of the last axis: ``(chunks, ..., context + size)`` (see the module docstring)."""
    x = np.asarray(x)
    size, hop, context = args.size, args.hop or args.size, args.context
    length = x.shape[-1]
    n = max(1, math.ceil(max(length - size, 0) / hop) + 1)
    total = (n - 1) * hop + size
    padded = np.zeros(x.shape[:-1] + (context + total,), dtype=x.dtype)
    padded[..., context:context + min(length, total)] = x[..., :total]
    return np.stack([padded[..., i * hop:i * hop + context + size] for i in range(n)])


class Tokenize:
    """One tokenize step, its tokenizer loaded once (thread-safe for encoding)."""

    def __init__(self, args: TokenizeArgs, manifest: Manifest, ids_to: str):
        from mlms_nb.data.assets import resolve_asset

        tokenizers = require("tokenizers", "tokenizing text (tokenize)")
        base = Path(manifest.source).parent if manifest.source else None
        path = resolve_asset(args.tokenizer, None, base)
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the Rust side raises plain Exceptions for a bad file
            raise DatasetError(f"preprocess tokenize.tokenizer: {path} is not a tokenizers JSON file ({err})") from None
        self.args = args
        self.targets = {"ids": ids_to, "attention_mask": args.attention_mask, "type_ids": args.type_ids}
        self.dtypes = {name: np.dtype(spec.element_type) for name, spec in
                       zip([s.name for s in manifest.inputs], manifest.inputs) if name}

    def __call__(self, text: Any) -> dict[str, np.ndarray]:
        if isinstance(text, Path):
            text = text.read_text(encoding="utf-8")
        if not isinstance(text, str):
            raise DatasetError(f"tokenize takes a string (or a pathlib.Path of a text file), got {type(text).__name__}")
        encoding = self.tokenizer.encode(text)
        length = self.args.max_length
        values = {"ids": encoding.ids, "attention_mask": encoding.attention_mask, "type_ids": encoding.type_ids}
        out = {}
        for key, target in self.targets.items():
            if not target:
                continue
            row = np.zeros(length, dtype=self.dtypes.get(target, np.dtype(np.int64)))
            got = values[key][:length]
            row[:len(got)] = got
            out[target] = row
        return out
