"""Code steps of a manifest (``preprocess``/``postprocess`` ``code: {source}``): they run only with trust
(:mod:`mlms_nb.trust`), and their source must define ``process(x)``."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from mlms_nb.errors import ManifestError, UntrustedError
from mlms_nb.manifest import Manifest
from mlms_nb.trust import require_trust


class UntrustedCodeError(UntrustedError):
    """A manifest has ``code`` steps, the caller did not pass ``trust=True`` and the manifest file is not trusted."""



def check_code(manifest: Manifest, where: str, trust: bool) -> None:
    """Code steps run with this run's trust, or when the manifest file is trusted (:mod:`mlms_nb.trust`)."""
    try:
        require_trust(manifest.source, "code", trust, f"manifest {manifest.key} (a code step in {where})")
    except UntrustedError as err:
        raise UntrustedCodeError(str(err)) from None


def compile_code(source: str, manifest: Manifest, where: str) -> Callable[[Any], Any]:
    namespace: dict[str, Any] = {"np": np, "numpy": np, "__name__": f"mlms_manifest_{where}"}
    try:
        exec(compile(source, f"<{manifest.key} {where} code>", "exec"), namespace)  # noqa: S102 - trusted by the caller
    except SyntaxError as err:
        raise ManifestError(f"{where}: code step is not valid Python (line {err.lineno}: {err.msg})") from None
    process = namespace.get("process")
    if not callable(process):
        raise ManifestError(f"{where}: code step must define a function process(x)")
    return process
