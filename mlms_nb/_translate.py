"""The framework warnings that matter to a user, each translated into one sentence of ours.

:mod:`mlms_nb._quiet` keeps what the frameworks print out of the user's way (in ``$MLMS_HOME/logs/frameworks.log``).
A few of those messages change what the numbers mean -- a session that runs on another execution provider than
the one asked for, a layer built without its input shape, a NaN in a postprocessing step -- so each of them, when
heard, also becomes one sentence of ours (:data:`CATALOGUE`): the evaluation stores and shows it among its warnings
(``Evaluation.warnings``: the notebook's output, the CLI's table) and a CLI verb that made no evaluation prints it
once on stderr. The raw text stays in the log.

Matching is on what is stable: the Python warning's category and a fixed phrase of its message (the frameworks'
own sentence templates, checked against the installed frameworks by tests/test_translate.py), or a fixed phrase of
an ONNX Runtime log line. Each sentence is heard once per process run of a verb (:func:`heard_since`).

Bottom layer: imports nothing from mlms_nb.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Translation:
    """One catalogue entry: where the message comes from (``warning``: a Python warning of ``category``;
    ``line``: a framework's log line or logger record), the stable phrase that identifies it, and our sentence
    (``str.format`` fields: the phrase's named groups)."""
    key: str
    source: str
    category: str | None
    phrase: str
    sentence: str

    def match(self, source: str, category: str | None, text: str) -> str | None:
        if source != self.source or (self.category is not None and category != self.category):
            return None
        found = re.search(self.phrase, text)
        return self.sentence.format(**found.groupdict()) if found else None


CATALOGUE: tuple[Translation, ...] = (
    Translation(
        "onnxruntime-provider-missing", "warning", "UserWarning",
        r"Specified provider '(?P<provider>\w+)' is not in available provider names",
        "onnxruntime: the {provider} asked for is not in this onnxruntime build, so the session ran on the providers "
        "it has (onnxruntime.get_available_providers()); for CUDA install onnxruntime-gpu"),
    Translation(
        "onnxruntime-nodes-not-on-provider", "line", None,
        r"Some nodes were not assigned to the preferred execution providers",
        "onnxruntime: some nodes of the graph run on the CPU instead of the execution provider asked for (ONNX Runtime "
        "puts shape operations there on purpose; other nodes add copies between devices to the measured latency)"),
    Translation(
        "torch-not-deterministic", "warning", "UserWarning",
        r"(?P<op>\S+) does not have a deterministic implementation, but you set "
        r"'torch.use_deterministic_algorithms\(True, warn_only=True\)'",
        "torch: {op} has no deterministic implementation, so its outputs may differ from run to run even though "
        "deterministic algorithms were asked for"),
    Translation(
        "torch-tf32", "warning", "UserWarning", r"\bTF32\b",
        "torch: a TF32 (TensorFloat-32) setting was changed or is not available here: float32 matrix products may "
        "run with a 10-bit mantissa on GPUs that have it, and differ from the other frameworks' float32 results"),
    Translation(
        "keras-unbuilt-layer", "warning", "UserWarning",
        r"layer '(?P<layer>[^']+)', however the layer does not have a `build\(\)` method implemented and it looks "
        r"like it has unbuilt state",
        "keras: layer '{layer}' was built without knowing its input shape (it has no build() method and sublayers "
        "not built yet), so its weights are made at its first call; give the model an Input(shape=...) before "
        "converting or timing it"),
    Translation(
        "keras-mask-dropped", "warning", "UserWarning",
        r"Layer '(?P<layer>[^']+)' \(of type \w+\) was passed an input with a mask attached to it\. However, this "
        r"layer does not support masking",
        "keras: layer '{layer}' does not support masking and drops the mask it was given: padded positions take "
        "part in its output"),
    Translation(
        "numpy-invalid", "warning", "RuntimeWarning", r"invalid value encountered in (?P<op>\w+)",
        "a computation produced NaN (numpy: invalid value in {op}): outputs, metrics or statistics computed from "
        "it may be NaN"),
    Translation(
        "numpy-overflow", "warning", "RuntimeWarning",
        r"(?P<what>overflow|divide by zero) encountered in (?P<op>\w+)",
        "a computation gave ±inf (numpy: {what} in {op}): outputs, metrics or statistics computed from it may be "
        "infinite or NaN"),
)

_lock = threading.Lock()
_heard: list[str] = []  # every sentence heard in this process, in order (a sentence may repeat)


def translate(source: str, category: str | None, text: str) -> str | None:
    """Our sentence for one framework message (``source``: ``warning`` or ``line``; ``category``: the Python
    warning's class name), or None when it is not in :data:`CATALOGUE`."""
    for entry in CATALOGUE:
        sentence = entry.match(source, category, text)
        if sentence is not None:
            return sentence
    return None


def hear(source: str, category: str | None, text: str) -> str | None:
    """Translate a message and remember the sentence (for :func:`heard_since`); returns it (None: not ours to
    translate)."""
    sentence = translate(source, category, text)
    if sentence is not None:
        with _lock:
            _heard.append(sentence)
    return sentence


def hear_sentences(sentences: list[str]) -> None:
    """Remember sentences another process (an isolated worker) heard and translated, as if heard here."""
    with _lock:
        _heard.extend(sentences)


def mark() -> int:
    """Where the sentences heard from now on start (for :func:`heard_since`)."""
    with _lock:
        return len(_heard)


def heard_since(start: int) -> list[str]:
    """The sentences heard since :func:`mark` returned ``start``, each once, in the order first heard."""
    with _lock:
        return list(dict.fromkeys(_heard[start:]))


def add_heard(warnings: list[str], start: int) -> list[str]:
    """Append to ``warnings`` the sentences heard since ``start`` that it does not hold yet; returns those added."""
    added = [s for s in heard_since(start) if s not in warnings]
    warnings.extend(added)
    return added
