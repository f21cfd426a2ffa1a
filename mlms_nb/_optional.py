"""Optional dependencies, imported lazily through one helper.

``require("torch")`` returns the module or raises :class:`~mlms_nb.errors.FrameworkNotInstalledError` with a
sentence naming the pip extra that installs it; ``is_available("torch")`` says whether it would import, without
importing it. Every framework and optional library mlms-nb uses is listed in `EXTRAS` with its extra.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from mlms_nb._quiet import quiet
from mlms_nb.errors import FrameworkNotInstalledError

#: top-level module -> (what to call it in a sentence, the mlms-nb extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("PyTorch", "torch"),
    "efficientnet_lite_pytorch": ("efficientnet-lite-pytorch", "torch"),
    "safetensors": ("safetensors", "torch"),
    "transformers": ("Hugging Face transformers", "zoo"),
    "onnx": ("onnx", "onnx"),
    "onnxruntime": ("ONNX Runtime", "onnx"),
    "tensorflow": ("TensorFlow", "tf"),
    "keras": ("Keras", "tf"),
    "google": ("protobuf", "tf"),
    "tf2onnx": ("tf2onnx", "convert"),
    "onnxscript": ("onnxscript", "convert"),  # google.protobuf: reading TensorFlow profiles (.xplane.pb)
    "scipy": ("SciPy", "analysis"),
    "soundfile": ("soundfile", "audio"),
    "soxr": ("soxr", "audio"),
    "tokenizers": ("tokenizers", "text"),
    "bokeh": ("Bokeh", "analysis"),
    "matplotlib": ("matplotlib", "analysis"),
    "opentelemetry": ("OpenTelemetry", "otel"),
    "pynvml": ("nvidia-ml-py", "gpu"),
    "cupti": ("cupti-python", "gpu"),
    "pypapi": ("python-papi", "papi"),
    "IPython": ("IPython", "jupyter"),
    "nbclient": ("nbclient", "jupyter"),
    "dask": ("Dask", "distributed"),
    "distributed": ("Dask distributed", "distributed"),
}


def install_hint(module: str) -> str:
    """``pip install 'mlms-nb[EXTRA]'`` for a module listed in `EXTRAS`, else ``pip install MODULE``."""
    top = module.split(".")[0]
    if top in EXTRAS:
        return f"pip install 'mlms-nb[{EXTRAS[top][1]}]'"
    return f"pip install {top}"


def require(module: str, purpose: str | None = None) -> ModuleType:
    """Import ``module`` (dotted names allowed) or raise a one-sentence FrameworkNotInstalledError.

    ``purpose`` says what needed it ("measuring machine ceilings"); the sentence names the extra to install.
    """
    try:
        if module in sys.modules:
            return importlib.import_module(module)
        with quiet(label=f"import {module}"):  # TensorFlow's C++ start-up lines (absl, oneDNN) come at import
            return importlib.import_module(module)
    except ImportError as exc:
        top = (exc.name or module).split(".")[0]
        label = EXTRAS.get(top, (top, ""))[0]
        need = f"{purpose} needs {label}" if purpose else f"{label} is needed"
        raise FrameworkNotInstalledError(f"{need}, which is not installed: {install_hint(top)}") from None


def is_available(module: str) -> bool:
    """True when ``module`` is installed (found on the path); nothing is imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
