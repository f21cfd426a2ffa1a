"""The way in for a causal language model given without a manifest: a local folder written by ``save_pretrained``
(``config.json`` + safetensors, and its tokenizer files when saved beside it), or a live ``transformers`` causal LM;
each becomes a ``task: text-generation`` manifest in PyTorch. A Hugging Face hub id with no local copy is refused in
one sentence: nothing is downloaded at run time."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest, parse_manifest

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
INPUTS = [{"name": "input_ids", "type": "tensor", "element_type": "int64", "dimensions": [None]}]
OUTPUTS = [{"name": "logits", "type": "tensor"}]


def causal_lm_source(model: Any, scenario: str, inputs: Any = None) -> bool:
    """True when ``model`` is a causal LM given without a manifest: a ``save_pretrained`` folder, a hub id asked to
    generate, or a live causal LM (an object with ``config`` and ``generate``) with no ``inputs`` description."""
    if isinstance(model, Manifest):
        return False
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return True
        text = str(model)
        return (scenario.startswith("generate") and not path.exists() and not text.endswith((".yaml", ".yml"))
                and "/" in text and bool(HUB_ID.match(text)))
    return inputs is None and hasattr(model, "config") and hasattr(model, "generate")


def causal_lm_manifest(model: Any) -> Manifest:
    """The ``task: text-generation`` PyTorch manifest of a folder or a live causal LM (see the module)."""
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser()
        if not path.is_dir():
            raise MlmsError(f"{model!r} is not a local folder: mlms-nb downloads nothing at run time; save the model "
                            "once with save_pretrained(folder) (or huggingface-cli download) and give that folder")
        name = re.sub(r"[^a-z0-9._-]+", "-", path.resolve().name.lower()).strip("-._") or "causal-lm"
        tokenizer = next((str(path / n) for n in ("tokenizer.json", "vocab.json") if (path / n).is_file()), None)
        data = {"name": name, "framework": {"name": "torch"}, "task": "text-generation", "inputs": INPUTS,
                "outputs": OUTPUTS, "model": {"graph_path": str(path.resolve())}, "tokenizer": tokenizer,
                "description": f"the causal LM saved in {path.resolve()}"}
        return parse_manifest({k: v for k, v in data.items() if v is not None}, source=None)
    name = re.sub(r"[^a-z0-9._-]+", "-", type(model).__name__.lower()).strip("-._") or "causal-lm"
    return parse_manifest({"name": name, "framework": {"name": "torch"}, "task": "text-generation", "inputs": INPUTS,
                           "outputs": OUTPUTS, "model": {"instance": model}}, source=None)
