"""Model manifests: what a model is, which framework runs it, its inputs and its declarative steps.

The public API, whatever module it lives in: import it from here (``from mlms_nb.manifest import Manifest``).

- `model`: the `Manifest` (pydantic), `parse_manifest` and `load_manifest`;
- `catalog`: discovery (the built-in folder and ``MLMS_MANIFEST_PATH``), `ManifestCatalog`, `find_manifest`;
- `fields`: the framework, input, output and model fields; `steps`: the pre/post-processing steps;
- `checks`: bounds on the values and the field-path sentences; `yaml_reader`: bounded YAML reading.

Layers inside, top to bottom: catalog > model > steps > fields > checks | yaml_reader (pyproject.toml's contract).
"""
from __future__ import annotations

from mlms_nb.manifest.catalog import (FailedManifest, ManifestCatalog, find_manifest, manifest_paths,
                                      manifest_roots)
from mlms_nb.manifest.fields import (ASSET_FIELDS, FRAMEWORK_ALIASES, FRAMEWORKS, MAX_NAME, MAX_URI, FrameworkOptions,
                                     FrameworkSpec, InputSpec, ModelSpec, OutputSpec, canonical_framework, labels_file,
                                     parse_version, shipped_labels)
from mlms_nb.manifest.model import Manifest, load_manifest, parse_manifest
from mlms_nb.manifest.steps import (POSTPROCESS_OPS, PREPROCESS_OPS, STEP_ARGS, CenterCropArgs, ChunkArgs, CodeArgs,
                                    DecodeArgs, DecodeAudioArgs, NormalizeArgs, ResizeArgs, ResizeFitArgs, SoftmaxArgs,
                                    Step, ToLayoutArgs, TokenizeArgs, TopKArgs)

__all__ = [
    "ASSET_FIELDS", "FRAMEWORKS", "FRAMEWORK_ALIASES", "MAX_NAME", "MAX_URI", "POSTPROCESS_OPS", "PREPROCESS_OPS",
    "STEP_ARGS", "CenterCropArgs", "ChunkArgs", "CodeArgs", "DecodeArgs", "DecodeAudioArgs", "FailedManifest",
    "FrameworkOptions", "FrameworkSpec", "InputSpec", "Manifest", "ManifestCatalog", "ModelSpec", "NormalizeArgs",
    "OutputSpec", "ResizeArgs", "ResizeFitArgs", "SoftmaxArgs", "Step", "ToLayoutArgs", "TokenizeArgs", "TopKArgs",
    "canonical_framework", "find_manifest", "labels_file", "load_manifest", "manifest_paths", "manifest_roots",
    "parse_manifest", "parse_version", "shipped_labels",
]
