"""What the user typed, turned into the manifests to run, one per framework: the one place that decides it, for
evaluate, diverge (layer and output level) and the fleet.

``model`` may be a name (``NAME`` or ``NAME@RANGE``, built-in or found through ``MLMS_MANIFEST_PATH``), a manifest
path, a `Manifest`, or a live ``torch.nn.Module`` / ``keras.Model`` (described by ``live``: inputs, outputs,
preprocess, postprocess; :func:`mlms_nb.frameworks.live.manifest_for`).

- A framework the model has a manifest for runs that manifest.
- A framework it has none for runs the copy the kept converters make of its PyTorch manifest, when that manifest
  builds its module (entrypoint, architecture, live object: an ``nn.Module`` to export) and the framework is one
  they convert to (:data:`~mlms_nb.frameworks.converters.manifests.CONVERTIBLE`); by name and by path alike. A
  causal LM (``task: text-generation``) runs in that framework as is: its step model there exports (ONNX Runtime)
  or ports (TensorFlow, keras-hub) the PyTorch model when it opens.
- Else that framework is refused with one sentence, before anything runs.

A conversion that fails is not a refusal: with ``failed`` (a dict) that framework is left out and its sentence is
put there, so the others still run (its outcome says why).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlms_nb.errors import MlmsError, UnknownModelError
from mlms_nb.frameworks.converters.manifests import CONVERTIBLE, converted_copies
from mlms_nb.frameworks.live import check_trust, manifest_for
from mlms_nb.frameworks.modelfiles import file_kind
from mlms_nb.manifest import Manifest, canonical_framework, find_manifest
from mlms_nb.options import spell


def manifests_for(model: Any, frameworks: list[str], *, explicit: bool = True, trust: bool = False,
                  live: tuple = (None, None, None, None), failed: dict[str, str] | None = None) -> list[Manifest]:
    """The manifests to run ``model`` in ``frameworks`` (canonical names), in that order (see the module doc).
    ``explicit``: the frameworks were asked for (else they are the default, and a manifest runs in its own)."""
    frameworks = [canonical_framework(fw) for fw in dict.fromkeys(frameworks)]
    if not isinstance(model, (str, Path, Manifest)):
        model = manifest_for(model, *live)
    elif any(x is not None for x in live):
        raise MlmsError("inputs, outputs, preprocess and postprocess describe a live model object; a model name or "
                        "manifest already describes them")
    if isinstance(model, (str, Path)) and file_kind(model) is not None and Path(model).exists():
        raise MlmsError(f"{model} is a model file, not a manifest: write a manifest whose model.graph_path names it "
                        "(docs/byom.md), or pass the loaded model object with inputs=...")
    if isinstance(model, Path) or (isinstance(model, str) and (model.endswith((".yaml", ".yml")) or "/" in model)):
        model = find_manifest(model)
    if isinstance(model, Manifest):
        if not explicit or frameworks == [model.framework.name]:
            return [model]
        return _with_copies(model, frameworks, trust, failed)
    found: dict[str, Manifest] = {}
    missing: dict[str, UnknownModelError] = {}
    for fw in frameworks:
        try:
            found[fw] = find_manifest(model, framework=fw)
        except UnknownModelError as err:  # no manifest in this framework: its PyTorch one may convert
            missing[fw] = err
    if not missing:
        return [found[fw] for fw in frameworks]
    source = found.get("torch")
    if source is None:
        try:
            source = find_manifest(model, framework="torch")
        except UnknownModelError:
            raise next(iter(missing.values())) from None
    if not _convertible(source, list(missing)):
        raise next(iter(missing.values()))
    copies = _with_copies(source, ["torch", *missing], trust, failed)
    made = {m.framework.name: m for m in copies}
    return [found.get(fw) or made[fw] for fw in frameworks if fw in found or fw in made]


def _convertible(manifest: Manifest, others: list[str]) -> bool:
    if manifest.task == "text-generation":  # a causal LM's step model exports or ports it when opened
        return manifest.framework.name == "torch" and set(others) <= set(CONVERTIBLE)
    eager = manifest.framework.name == "torch" and not manifest.model.graph_path  # an nn.Module we can export
    return eager and set(others) <= set(CONVERTIBLE)


def _generating_in(manifest: Manifest, framework: str) -> Manifest:
    """A text-generation manifest run by ``framework``: the same causal LM (its step model there exports or ports
    the PyTorch model when it opens, cached by sha256; a failure then is that framework's outcome)."""
    spec = manifest.framework.model_copy(update={"name": framework, "version": "*"})
    return manifest.model_copy(update={"framework": spec})


def _with_copies(manifest: Manifest, frameworks: list[str], trust: bool,
                 failed: dict[str, str] | None) -> list[Manifest]:
    """``manifest`` where its framework is asked, its converted copies for the other ``frameworks``; refused with
    one sentence when it cannot be converted to them."""
    others = [fw for fw in frameworks if fw != manifest.framework.name]
    if not _convertible(manifest, others):
        raise MlmsError(f"{manifest.source or manifest.key} is for framework {manifest.framework.name}, but "
                        f"{spell('framework')} asks for {','.join(frameworks)}: give a manifest of that framework "
                        "(one file per framework), or its model name; only a PyTorch manifest that builds its module "
                        f"(model.entrypoint or model.architecture) is converted to {' and '.join(CONVERTIBLE)}")
    check_trust(manifest, trust)  # converting opens the module: its code runs only when trusted
    if manifest.task == "text-generation":
        return [manifest if fw == manifest.framework.name else _generating_in(manifest, fw) for fw in frameworks]
    copies = converted_copies(manifest, others, trust, failed)
    return [manifest if fw == manifest.framework.name else copies[fw] for fw in frameworks
            if fw == manifest.framework.name or fw in copies]
