"""Where manifests are found: the built-in folder and ``MLMS_MANIFEST_PATH``.

`ManifestCatalog` reads every manifest it can see; a file that fails to load is kept aside with its sentence, never
fatal to the others. A built-in wins over a user manifest of the same name and framework unless a version range
(``NAME@RANGE``) asks for the other. `find_manifest` takes a path or a name.
"""
from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import semantic_version

from mlms_nb.errors import ManifestError, UnknownModelError
from mlms_nb.manifest.fields import FRAMEWORKS, canonical_framework
from mlms_nb.manifest.model import Manifest, load_manifest, parse_manifest
from mlms_nb.manifest.yaml_reader import read_manifest_yaml
from mlms_nb.paths import builtin_manifest_dir

log = logging.getLogger(__name__)

def manifest_roots() -> list[Path]:
    """Where manifests are looked for: the built-in folder, then each entry of ``MLMS_MANIFEST_PATH``."""
    roots = [builtin_manifest_dir()]
    roots += [Path(p).expanduser() for p in os.environ.get("MLMS_MANIFEST_PATH", "").split(os.pathsep) if p]
    return roots


def manifest_paths() -> list[Path]:
    """Every manifest file in `manifest_roots` (folders searched recursively, without following links; files
    named directly), each once. Unreadable folders are skipped."""
    found: list[Path] = []
    seen: set[str] = set()
    for root in manifest_roots():
        try:
            if root.is_file():
                files = [root]
            elif root.is_dir():
                files = []
                for folder, dirs, names in os.walk(root, onerror=lambda err: None):
                    dirs.sort()
                    files += [Path(folder) / n for n in sorted(names) if n.endswith((".yaml", ".yml"))]
            else:
                files = []
        except OSError:
            continue
        for path in files:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                found.append(path)
    return found


@dataclass
class FailedManifest:
    """A manifest file that did not load: its path, the error, and which model(s) it may be for."""
    path: str
    error: str
    names: set[str] = field(default_factory=set)  # normalised candidate names (its ``name``, else its file name)
    framework: str | None = None  # its framework when that much could be read


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _failure(path: Path, err: BaseException, data: Any) -> FailedManifest:
    message = str(err) if isinstance(err, ManifestError) else f"{path}: {type(err).__name__}: {str(err)[:300]}"
    # NAME.yaml, or NAME/FRAMEWORK.yaml as the built-in manifests are laid out
    framework = canonical_framework(path.stem) if canonical_framework(path.stem) in FRAMEWORKS else None
    names = {_norm(path.parent.name if framework else path.stem)}
    if isinstance(data, dict):
        if isinstance(data.get("name"), str):
            names = {_norm(data["name"])}
        fw = data.get("framework")
        if isinstance(fw, dict) and isinstance(fw.get("name"), str):
            framework = canonical_framework(fw["name"])
    return FailedManifest(str(path), message, names, framework)


class ManifestCatalog:
    """All manifests mlms-nb can see; a file that fails to load, whatever it holds, is kept aside in ``errors``
    (path -> sentence) and ``failed``, never fatal to the others.

    Precedence: a manifest in ``MLMS_MANIFEST_PATH`` with the name and framework of a built-in one does not
    replace it. `find` picks the built-in (and logs a warning naming the other file) unless a version range
    is given, in which case the newest matching manifest wins (the built-in on a tie). To use the other file
    without a version, pass its path.
    """

    def __init__(self, paths: list[Path] | None = None):
        self.manifests: list[Manifest] = []
        self.errors: dict[str, str] = {}
        self.failed: list[FailedManifest] = []
        self._builtin_root = os.path.realpath(builtin_manifest_dir())
        for path in manifest_paths() if paths is None else paths:
            data = None
            try:
                data = read_manifest_yaml(path)
                self.manifests.append(parse_manifest(data, source=str(path)))
            except Exception as err:  # noqa: BLE001 - a hostile file must not break the catalog
                failure = _failure(Path(path), err, data)
                self.failed.append(failure)
                self.errors[failure.path] = failure.error

    def is_builtin(self, manifest: Manifest) -> bool:
        """Whether ``manifest`` is one mlms-nb ships (read from the built-in folder)."""
        if not manifest.source:
            return False
        real = os.path.realpath(manifest.source)
        return os.path.commonpath([real, self._builtin_root]) == self._builtin_root

    def shadowed(self) -> list[tuple[Manifest, Manifest]]:
        """``(user manifest, built-in manifest)`` pairs of one name and framework: the built-in is the default."""
        builtins = {(m.name, m.framework.name): m for m in self.manifests if self.is_builtin(m)}
        return [(m, builtins[(m.name, m.framework.name)]) for m in self.manifests
                if not self.is_builtin(m) and (m.name, m.framework.name) in builtins]

    def names(self) -> list[str]:
        return sorted({m.name for m in self.manifests})

    def select(self, framework: str | None = None) -> list[Manifest]:
        fw = canonical_framework(framework) if framework else None
        return [m for m in self.manifests if fw is None or m.framework.name == fw]

    def find(self, name: str, framework: str | None = None, version: str | None = None) -> Manifest:
        """The manifest named ``name`` for ``framework`` whose version satisfies ``version`` (a range): the
        built-in one when there is one (see the class docstring), else the newest."""
        key = _norm(name)
        candidates = [m for m in self.manifests if _norm(m.name) == key]
        failed = [f for f in self.failed if key in f.names]
        if not candidates:
            if failed:
                raise self._failed(name, failed)
            close = difflib.get_close_matches(key, self.names(), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `mlms models` lists them"
            raise UnknownModelError(f"unknown model {name!r}{hint}")
        if framework:
            fw = canonical_framework(framework)
            in_fw = [m for m in candidates if m.framework.name == fw]
            if not in_fw:
                failed_fw = [f for f in failed if f.framework in (None, fw)]
                if failed_fw:
                    raise self._failed(name, failed_fw)
                have = ", ".join(sorted({m.framework.name for m in candidates}))
                raise UnknownModelError(f"model {name!r} has no manifest for framework {framework!r}; it has: {have}")
            candidates = in_fw
        if version:
            try:
                spec = semantic_version.NpmSpec(str(version))
            except ValueError:
                raise ManifestError(f"version {version!r} is not an npm-style range such as ^1.0 or 1.2.0") from None
            candidates = [m for m in candidates if semantic_version.Version(m.version) in spec]
            if not candidates:
                raise UnknownModelError(f"model {name!r} has no version matching {version!r}")
        builtin_fws = {m.framework.name for m in candidates if self.is_builtin(m)}
        passed_over = [m for m in candidates if not self.is_builtin(m) and m.framework.name in builtin_fws]
        if not version:
            candidates = [m for m in candidates if m not in passed_over]
        # Newest version first; on a tie the built-in; between frameworks, FRAMEWORKS' order (PyTorch first).
        chosen = max(candidates, key=lambda m: (semantic_version.Version(m.version), self.is_builtin(m),
                                                -FRAMEWORKS.index(m.framework.name)))
        self._say_which(chosen, passed_over, version)
        return chosen

    def _say_which(self, chosen: Manifest, passed_over: list[Manifest], version: str | None) -> None:
        same = [m for m in passed_over if m.framework.name == chosen.framework.name]
        if not same:
            return
        if self.is_builtin(chosen):
            others = ", ".join(f"{m.source} ({m.version})" for m in same if m is not chosen)
            if others:
                log.warning("%s: using the built-in manifest %s; %s from MLMS_MANIFEST_PATH has the same name and "
                            "framework and is not used: pass its path, or NAME@VERSION, to use it",
                            chosen.key, chosen.version, others)
        else:
            log.warning("%s: using %s from MLMS_MANIFEST_PATH, not the built-in manifest of that name, because "
                        "version %s asks for it", chosen.key, chosen.source, version)

    @staticmethod
    def _failed(name: str, failed: list[FailedManifest]) -> ManifestError:
        more = f" ({len(failed) - 1} more failed; `mlms models` lists them)" if len(failed) > 1 else ""
        return ManifestError(f"the manifest of model {name!r} failed to load: {failed[0].error}{more}")


def find_manifest(name_or_path: str | os.PathLike, framework: str | None = None, version: str | None = None) -> Manifest:
    """A manifest by the path of a YAML file, or by model name searched in the catalog (`ManifestCatalog.find`);
    ``NAME@RANGE`` (``efficientnet_lite0@^2``) gives the version range in the name."""
    if isinstance(name_or_path, Manifest):
        return name_or_path
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        return load_manifest(text)
    if "@" in text:
        text, _, in_name = text.partition("@")
        version = version or in_name or None
    return ManifestCatalog().find(text, framework=framework, version=version)
