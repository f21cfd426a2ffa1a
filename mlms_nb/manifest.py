"""Model manifests: the MLModelScope fields, validated with pydantic, errors that name the field path.

A manifest says what a model is (name, semantic version, where its graph and weights live, with their
sha256), which framework runs it (name and an npm-style version range such as ``^2.0`` or ``>=1.17``),
what its inputs look like and which declarative pre/post-processing steps turn an image into its input
tensor and its output into labels. One YAML file describes one model in one framework.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal, Union

import semantic_version
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlms_nb.errors import ManifestError, UnknownModelError
from mlms_nb.paths import builtin_manifest_dir

FRAMEWORKS = ("torch", "onnxruntime", "tensorflow")
FRAMEWORK_ALIASES = {"pytorch": "torch", "ort": "onnxruntime", "onnx": "onnxruntime", "tf": "tensorflow", "keras": "tensorflow"}


def canonical_framework(name: str) -> str:
    """``pytorch`` -> ``torch``, ``ort`` -> ``onnxruntime``, ``tf`` -> ``tensorflow``; unknown names pass through."""
    key = name.strip().lower()
    return FRAMEWORK_ALIASES.get(key, key)


def parse_version(text: str) -> semantic_version.Version:
    """A semantic version from a framework's own string (``2.13.0+cpu``, ``2.21.0``, ``1.31``)."""
    try:
        return semantic_version.Version(text)
    except ValueError:
        return semantic_version.Version.coerce(text.split("+")[0])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


# ---------------------------------------------------------------- pre/post-processing steps

class DecodeArgs(_Strict):
    color_mode: Literal["RGB", "BGR", "GRAY"] = "RGB"


class ResizeArgs(_Strict):
    """``size``: an int resizes the shorter side to it (keeping aspect); ``[h, w]`` resizes exactly."""
    size: Union[int, tuple[int, int]]
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"


class CenterCropArgs(_Strict):
    size: Union[int, tuple[int, int]]


class NormalizeArgs(_Strict):
    """``(x - mean) / scale`` per channel, on pixel values in 0..255."""
    mean: list[float]
    scale: list[float]


class ToLayoutArgs(_Strict):
    """Move channels to the given layout; by default, the manifest input's layout."""
    layout: Literal["NCHW", "NHWC"] | None = None


class SoftmaxArgs(_Strict):
    axis: int = -1


class TopKArgs(_Strict):
    k: int = Field(5, ge=1)


class CodeArgs(_Strict):
    """Python source defining ``process(x)``; run only when the caller passes ``trust=True``."""
    source: str


STEP_ARGS: dict[str, type[_Strict]] = {
    "decode": DecodeArgs,
    "resize": ResizeArgs,
    "center_crop": CenterCropArgs,
    "normalize": NormalizeArgs,
    "to_layout": ToLayoutArgs,
    "softmax": SoftmaxArgs,
    "top_k": TopKArgs,
    "code": CodeArgs,
}
PREPROCESS_OPS = ("decode", "resize", "center_crop", "normalize", "to_layout", "code")
POSTPROCESS_OPS = ("softmax", "top_k", "code")


class Step(BaseModel):
    """One declarative step. In YAML: ``- resize: {size: 256}`` or just ``- softmax``."""
    model_config = ConfigDict(extra="forbid")
    op: str
    args: Any

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {value: {}}
        if isinstance(value, dict) and set(value) - {"op", "args"}:
            if len(value) != 1:
                raise ValueError(f"a step is a mapping with one key (the op), got keys {sorted(value)}")
            op, args = next(iter(value.items()))
            value = {"op": op, "args": args or {}}
        if not isinstance(value, dict):
            raise ValueError(f"a step is an op name or a one-key mapping, got {type(value).__name__}")
        op = value.get("op")
        if op not in STEP_ARGS:
            raise ValueError(f"unknown step {op!r}; known steps: {', '.join(STEP_ARGS)}")
        args = value.get("args") or {}
        if isinstance(args, BaseModel):
            return value
        try:
            return {"op": op, "args": STEP_ARGS[op].model_validate(args)}
        except ValidationError as err:
            first = err.errors()[0]
            where = str(first["loc"][0]) if first["loc"] else ""
            raise ValueError(f"{op}.{where}: {first['msg']}" if where else f"{op}: {first['msg']}") from None

    def __repr__(self) -> str:
        return f"Step({self.op}, {self.args!r})"


# ---------------------------------------------------------------- the manifest

class FrameworkSpec(_Strict):
    name: str
    version: str = "*"

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        name = canonical_framework(value)
        if name not in FRAMEWORKS:
            raise ValueError(f"unknown framework {value!r}; expected one of {', '.join(FRAMEWORKS)}")
        return name

    @field_validator("version")
    @classmethod
    def _range(cls, value: str) -> str:
        try:
            semantic_version.NpmSpec(str(value))
        except ValueError as err:
            raise ValueError(f"not an npm-style version range ({err})") from None
        return str(value)

    def accepts(self, version: str) -> bool:
        """Whether a framework version (``2.13.0+cpu``) satisfies this manifest's range."""
        return parse_version(version) in semantic_version.NpmSpec(self.version)


class InputSpec(_Strict):
    """One model input. ``dimensions`` exclude the batch and follow ``layout`` (NCHW: [C, H, W])."""
    type: Literal["image", "tensor"] = "image"
    element_type: Literal["float32", "float16", "uint8", "int32", "int64"] = "float32"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dimensions: list[int]
    color_mode: Literal["RGB", "BGR", "GRAY"] = "RGB"
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    scale: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0])

    @model_validator(mode="after")
    def _shape(self) -> "InputSpec":
        if self.type == "image":
            if len(self.dimensions) != 3:
                raise ValueError(f"dimensions: expected 3 integers, got {len(self.dimensions)}")
            if any(d <= 0 for d in self.dimensions):
                raise ValueError(f"dimensions: expected positive integers, got {self.dimensions}")
            channels = self.channels
            for field in ("mean", "scale"):
                values = getattr(self, field)
                if len(values) not in (1, channels):
                    raise ValueError(f"{field}: expected 1 or {channels} values (one per channel), got {len(values)}")
            if any(s == 0 for s in self.scale):
                raise ValueError("scale: must not contain 0")
        return self

    @property
    def channels(self) -> int:
        return self.dimensions[0] if self.layout == "NCHW" else self.dimensions[-1]

    @property
    def height_width(self) -> tuple[int, int]:
        if self.layout == "NCHW":
            return self.dimensions[1], self.dimensions[2]
        return self.dimensions[0], self.dimensions[1]


class OutputSpec(_Strict):
    type: Literal["classification", "tensor"] = "classification"
    labels: str | None = None  # asset URI of a text file, one label per line


ASSET_FIELDS = ("graph_path", "weights_path")


class ModelSpec(_Strict):
    """Where the model comes from. ``architecture`` names a built-in builder (eager PyTorch / Keras);
    ``graph_path`` and ``weights_path`` are asset URIs; ``sha256`` maps an asset field to its digest."""
    architecture: str | None = None
    graph_path: str | None = None
    weights_path: str | None = None
    sha256: dict[str, str] = Field(default_factory=dict)
    weights: Literal["pretrained", "random"] = "pretrained"

    @field_validator("sha256")
    @classmethod
    def _digests(cls, value: dict[str, str]) -> dict[str, str]:
        for key, digest in value.items():
            if key not in ASSET_FIELDS:
                raise ValueError(f"key {key!r} is not an asset field; expected one of {', '.join(ASSET_FIELDS)}")
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
                raise ValueError(f"{key}: expected 64 hex digits, got {digest!r}")
        return {k: v.lower() for k, v in value.items()}

    @model_validator(mode="after")
    def _something(self) -> "ModelSpec":
        if not (self.architecture or self.graph_path):
            raise ValueError("expected an architecture or a graph_path")
        return self


class Manifest(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$")
    version: str = "1.0.0"
    description: str = ""
    license: str | None = None
    references: list[str] = Field(default_factory=list)
    framework: FrameworkSpec
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    preprocess: list[Step] = Field(default_factory=list)
    postprocess: list[Step] = Field(default_factory=list)
    model: ModelSpec
    attributes: dict[str, Any] = Field(default_factory=dict)
    source: str | None = Field(default=None, exclude=True)  # the file it was read from

    @field_validator("version")
    @classmethod
    def _semver(cls, value: Any) -> str:
        try:
            return str(semantic_version.Version(str(value)))
        except ValueError:
            raise ValueError(f"expected a semantic version like 1.0.0, got {value!r}") from None

    @field_validator("preprocess")
    @classmethod
    def _pre_ops(cls, steps: list[Step]) -> list[Step]:
        return _only(steps, PREPROCESS_OPS, "preprocess")

    @field_validator("postprocess")
    @classmethod
    def _post_ops(cls, steps: list[Step]) -> list[Step]:
        return _only(steps, POSTPROCESS_OPS, "postprocess")

    # ------------------------------------------------------------------ conveniences
    @property
    def key(self) -> str:
        """``name@version/framework``: how history and the registry identify this manifest."""
        return f"{self.name}@{self.version}/{self.framework.name}"

    @property
    def has_code(self) -> bool:
        return any(s.op == "code" for s in [*self.preprocess, *self.postprocess])

    @property
    def pretrained(self) -> bool:
        return self.model.weights == "pretrained"

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=True)
        data["preprocess"] = [{s.op: s.args.model_dump(mode="json")} for s in self.preprocess]
        data["postprocess"] = [{s.op: s.args.model_dump(mode="json")} for s in self.postprocess]
        return data


def _only(steps: list[Step], allowed: tuple[str, ...], where: str) -> list[Step]:
    for i, step in enumerate(steps):
        if step.op not in allowed:
            raise ValueError(f"[{i}]: step {step.op!r} does not belong in {where}; expected one of {', '.join(allowed)}")
    return steps


# ---------------------------------------------------------------- parsing with field paths

def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("op", "args") or str(part).startswith("function-"):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path


def _clean(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = _field_path(tuple(e["loc"]))
        msg = _clean(e["msg"])
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        # A validator's own message may already start with the sub-field it is about.
        if ":" in msg and msg.split(":", 1)[0] and not msg.split(":", 1)[0].count(" "):
            head, rest = msg.split(":", 1)
            if head.startswith("["):
                path, msg = path + head, rest.strip()
            else:
                path, msg = (f"{path}.{head}" if path else head), rest.strip()
        lines.append(f"{path or '<manifest>'}: {msg}")
    return "; ".join(lines)


def parse_manifest(data: Any, source: str | None = None) -> Manifest:
    """Validate a manifest mapping; a `ManifestError` names every bad field path."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}a manifest is a YAML mapping, got {type(data).__name__}")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        raise ManifestError(f"{where}{_describe(err)}") from None
    manifest.source = source
    return manifest


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate one manifest file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ManifestError(f"{path}: cannot read the manifest ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError(f"{path}: not valid YAML{at}: {getattr(err, 'problem', err)}") from None
    return parse_manifest(data, source=str(path))


# ---------------------------------------------------------------- discovery

def manifest_paths() -> list[Path]:
    """Every manifest file: the built-in folder, then each entry of ``MLMS_MANIFEST_PATH`` (folders or files)."""
    roots = [builtin_manifest_dir()]
    roots += [Path(p).expanduser() for p in os.environ.get("MLMS_MANIFEST_PATH", "").split(os.pathsep) if p]
    found: list[Path] = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found += sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    return found


class ManifestCatalog:
    """All manifests mlms-nb can see; broken files are kept aside with their error, not fatal."""

    def __init__(self, paths: list[Path] | None = None):
        self.manifests: list[Manifest] = []
        self.errors: dict[str, str] = {}
        for path in manifest_paths() if paths is None else paths:
            try:
                self.manifests.append(load_manifest(path))
            except ManifestError as err:
                self.errors[str(path)] = str(err)

    def names(self) -> list[str]:
        return sorted({m.name for m in self.manifests})

    def select(self, framework: str | None = None) -> list[Manifest]:
        fw = canonical_framework(framework) if framework else None
        return [m for m in self.manifests if fw is None or m.framework.name == fw]

    def find(self, name: str, framework: str | None = None, version: str | None = None) -> Manifest:
        """The newest manifest named ``name`` for ``framework`` whose version satisfies ``version`` (a range)."""
        key = name.strip().lower().replace("-", "_")
        candidates = [m for m in self.manifests if m.name.replace("-", "_") == key]
        if not candidates:
            close = difflib.get_close_matches(key, self.names(), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `mlms models` lists them"
            raise UnknownModelError(f"unknown model {name!r}{hint}")
        if framework:
            fw = canonical_framework(framework)
            in_fw = [m for m in candidates if m.framework.name == fw]
            if not in_fw:
                have = ", ".join(sorted({m.framework.name for m in candidates}))
                raise UnknownModelError(f"model {name!r} has no manifest for framework {framework!r}; it has: {have}")
            candidates = in_fw
        if version:
            spec = semantic_version.NpmSpec(version)
            candidates = [m for m in candidates if semantic_version.Version(m.version) in spec]
            if not candidates:
                raise UnknownModelError(f"model {name!r} has no version matching {version!r}")
        # Newest version first; between frameworks, the order of FRAMEWORKS (PyTorch is the reference).
        return max(candidates, key=lambda m: (semantic_version.Version(m.version), -FRAMEWORKS.index(m.framework.name)))


def find_manifest(name_or_path: str | os.PathLike, framework: str | None = None, version: str | None = None) -> Manifest:
    """A manifest by model name (searched in the catalog) or by the path of a YAML file."""
    if isinstance(name_or_path, Manifest):
        return name_or_path
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        return load_manifest(text)
    return ManifestCatalog().find(text, framework=framework, version=version)
