"""The manifest of a converted copy: the source manifest with another framework and the copy as its graph.

``converted_manifest(manifest, "tensorflow", path)`` keeps the name, version, inputs, outputs, pre- and
post-processing; sets ``framework`` (any version), ``model.graph_path`` (the file) with its sha256, and drops the
source's ``architecture``, ``weights_path`` and other framework-only fields (``entrypoint`` and the like: the
copy is a data file, it runs no code). The copies :func:`~mlms_nb.frameworks.converters.to_tensorflow` writes take
NHWC images, so an image input's layout and dimensions are made NHWC and a ``to_layout`` step is set to match.
"""
from __future__ import annotations

from pathlib import Path

from mlms_nb._fs import sha256_file
from mlms_nb.manifest import Manifest, parse_manifest

_MODEL_KEYS = ("graph_path", "sha256", "weights")


def converted_manifest(manifest: Manifest, framework: str, path: str | Path) -> Manifest:
    """``manifest`` as it describes the copy at ``path`` run by ``framework`` (see the module docstring)."""
    data = manifest.to_dict()
    data.pop("source", None)
    data["framework"] = {"name": framework}
    model = {k: v for k, v in data.get("model", {}).items() if k in _MODEL_KEYS}
    model.update(graph_path=str(Path(path).resolve()), sha256={"graph_path": sha256_file(path, memo=False)},
                 weights="pretrained")
    data["model"] = model
    if framework == "tensorflow":
        for spec in data.get("inputs", []):
            if spec.get("layout", "NCHW") == "NCHW" and len(spec.get("dimensions") or []) == 3:
                c, h, w = spec["dimensions"]
                spec.update(layout="NHWC", dimensions=[h, w, c])
        steps = [s for s in data.get("preprocess", []) if "to_layout" not in s]
        if any(s.get("layout") == "NHWC" for s in data.get("inputs", [])) and steps:
            steps.append({"to_layout": {"layout": "NHWC"}})
        data["preprocess"] = steps
    return parse_manifest(data)
