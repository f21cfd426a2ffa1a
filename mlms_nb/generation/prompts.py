"""Prompts for the generate loop, as token ids (``int64`` arrays, one per prompt), and the tokenizer that makes them.

The dataset (``dataset=`` / ``--dataset``) may be:

- ``synthetic`` or ``synthetic:N`` (the default): N (16) prompts of ``prompt_length`` seeded random token ids;
- a ``.txt`` file: one prompt per non-empty line, tokenized;
- a ``.jsonl`` or Parquet file: the ``prompt_column`` (default ``prompt``, ``text`` or ``input_ids``): text is
  tokenized, lists of integers are token ids;
- a ``.npz`` file of token ids: ``input_ids`` (2-D, with ``attention_mask`` to drop padding, or ragged as an object
  array), or else every array in it one prompt;
- from Python: a string, a list of strings, or a list of token-id lists / arrays.

Text needs a tokenizer: the manifest's ``tokenizer`` (a ``tokenizer.json``, or a GPT-2 style ``vocab.json`` /
``encoder.json`` with ``merges.txt`` / ``vocab.bpe`` beside it, read by the ``tokenizers`` package), or the
``tokenizer.json`` of the model's ``save_pretrained`` folder. Nothing is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import DatasetError
from mlms_nb.manifest import Manifest

SYNTHETIC_PROMPTS = 16
COLUMNS = ("prompt", "text", "input_ids")
VOCABS = ("vocab.json", "encoder.json")
MERGES = ("merges.txt", "vocab.bpe")


def tokenizer_path(manifest: Manifest) -> Path | None:
    """The local tokenizer file a manifest names (``tokenizer``), or its model folder's ``tokenizer.json``."""
    if manifest.tokenizer:
        from mlms_nb.data.assets import resolve_asset

        if manifest.source is None and Path(manifest.tokenizer).is_absolute():  # the caller's own folder
            return Path(manifest.tokenizer)
        base = Path(manifest.source).parent if manifest.source else None
        return resolve_asset(manifest.tokenizer, None, base)
    folder = manifest.model.graph_path
    if folder:
        base = Path(manifest.source).parent if manifest.source else Path.cwd()
        path = Path(folder).expanduser()
        path = path if path.is_absolute() else base / path
        for name in ("tokenizer.json",) + VOCABS:
            if (path / name).is_file():
                return path / name
    return None


def load_tokenizer(path: str | Path) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json``, a GPT-2 style vocabulary with its merges beside it, or a
    folder holding either."""
    tokenizers = require("tokenizers", "reading a tokenizer")
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in ("tokenizer.json",) + VOCABS if (path / n).is_file()]
        if not found:
            raise DatasetError(f"tokenizer folder {path} has no tokenizer.json, vocab.json or encoder.json")
        path = found[0]
    if not path.is_file():
        raise DatasetError(f"tokenizer {path}: no such file")
    try:
        if path.name in VOCABS:
            merges = next((path.parent / n for n in MERGES if (path.parent / n).is_file()), None)
            if merges is None:
                raise DatasetError(f"tokenizer {path}: a BPE vocabulary needs its merges ({' or '.join(MERGES)}) "
                                   "in the same folder")
            return tokenizers.ByteLevelBPETokenizer(str(path), str(merges))
        return tokenizers.Tokenizer.from_file(str(path))
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001 - tokenizers raises its own Exception type on a bad file
        raise DatasetError(f"tokenizer {path}: the tokenizers package cannot read it ({str(err)[:200]})") from None


class Prompts:
    """Token-id prompts and where they came from (``name``), with the tokenizer when there is one (to decode)."""

    def __init__(self, ids: list[np.ndarray], name: str, tokenizer: Any = None):
        if not ids:
            raise DatasetError(f"dataset {name}: no prompts in it")
        empty = [i for i, p in enumerate(ids) if len(p) == 0]
        if empty:
            raise DatasetError(f"dataset {name}: prompt {empty[0]} has no tokens; each prompt needs at least one")
        self.ids, self.name, self.tokenizer = ids, name, tokenizer

    def __len__(self) -> int:
        return len(self.ids)

    def decode(self, ids) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(list(map(int, ids)))


def open_prompts(dataset: Any, manifest: Manifest, vocab_size: int, prompt_length: int = 16,
                 column: str | None = None, limit: int | None = None) -> Prompts:
    """The prompts of ``dataset`` (see the module docstring), at most ``limit``; every id checked against the
    model's vocabulary."""
    tokenizer_cache: list = []

    def tokenizer() -> Any:
        if not tokenizer_cache:
            path = tokenizer_path(manifest)
            if path is None:
                raise DatasetError(f"text prompts need a tokenizer: give the manifest a tokenizer (a tokenizer.json, "
                                   f"or vocab.json with merges.txt) or pass token ids; {manifest.key} has none")
            tokenizer_cache.append(load_tokenizer(path))
        return tokenizer_cache[0]

    name, items = _items(dataset, prompt_length, vocab_size, column)
    ids = []
    for item in items[:limit] if limit else items:
        if isinstance(item, str):
            ids.append(np.asarray(tokenizer().encode(item).ids, dtype=np.int64))
        else:
            ids.append(_token_ids(item, name))
    for i, prompt in enumerate(ids):
        if len(prompt) and (prompt.min() < 0 or prompt.max() >= vocab_size):
            raise DatasetError(f"dataset {name}: prompt {i} holds token id {int(prompt.max() if prompt.max() >= vocab_size else prompt.min())}, "
                               f"outside the model's vocabulary of {vocab_size}")
    return Prompts(ids, name, tokenizer_cache[0] if tokenizer_cache else _maybe_tokenizer(manifest))


def _maybe_tokenizer(manifest: Manifest) -> Any:
    try:
        path = tokenizer_path(manifest)
        return load_tokenizer(path) if path else None
    except Exception:  # noqa: BLE001 - decoding is a convenience; the prompts are token ids already
        return None


def _token_ids(item: Any, name: str) -> np.ndarray:
    arr = np.asarray(item)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise DatasetError(f"dataset {name}: a prompt must be text or a flat list of integer token ids, got "
                           f"{arr.dtype} of shape {arr.shape}")
    return arr.astype(np.int64)


def _items(dataset: Any, prompt_length: int, vocab_size: int, column: str | None) -> tuple[str, list]:
    if dataset is None or (isinstance(dataset, str) and (dataset == "synthetic" or dataset.startswith("synthetic:"))):
        text = dataset or "synthetic"
        count = text.partition(":")[2]
        if count and not count.isdigit():
            raise DatasetError(f"dataset {text}: expected synthetic or synthetic:N (N prompts)")
        n = int(count) if count else SYNTHETIC_PROMPTS
        rng = np.random.default_rng(0)
        return f"synthetic:{n} ({prompt_length} tokens)", list(rng.integers(0, vocab_size, size=(n, prompt_length)))
    if isinstance(dataset, str) and not Path(dataset).expanduser().exists():
        raise DatasetError(f"dataset {dataset}: no such file (prompts: a .txt, .jsonl, .parquet or .npz file, or "
                           "synthetic)")
    if isinstance(dataset, (str, Path)):
        return str(dataset), _file_items(Path(dataset).expanduser(), column)
    if isinstance(dataset, (list, tuple)):
        return f"python:{len(dataset)} prompts", list(dataset)
    if isinstance(dataset, np.ndarray) and dataset.ndim == 2:
        return f"python:{len(dataset)} prompts", list(dataset)
    raise DatasetError(f"a generate dataset is a prompts file, synthetic[:N], a string, a list of strings or of "
                       f"token-id lists; got a {type(dataset).__name__}")


def _file_items(path: Path, column: str | None) -> list:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            if "input_ids" in data:
                ids = data["input_ids"]
                if "attention_mask" in data:
                    mask = data["attention_mask"].astype(bool)
                    return [row[m] for row, m in zip(ids, mask)]
                return list(ids) if ids.ndim == 2 else [ids]
            return [data[key].reshape(-1) for key in data.files]
    if suffix in (".jsonl", ".parquet"):
        rows = _table(path, suffix)
        if not rows:
            return []
        name = column or next((c for c in COLUMNS if c in rows[0]), None)
        if name is None or name not in rows[0]:
            raise DatasetError(f"dataset {path}: no column {column or ' / '.join(COLUMNS)}; it has "
                               f"{', '.join(map(str, rows[0]))}: name the prompts' column with prompt_column")
        return [row[name] for row in rows]
    raise DatasetError(f"dataset {path}: prompts come from a .txt, .jsonl, .parquet or .npz file, not "
                       f"{suffix or 'a file without a suffix'}")


def _table(path: Path, suffix: str) -> list[dict]:
    if suffix == ".parquet":
        pq = require("pyarrow.parquet", "reading Parquet prompts")
        return pq.read_table(path).to_pylist()
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetError(f"dataset {path}: line {number} is not JSON ({err.msg})") from None
    return rows
