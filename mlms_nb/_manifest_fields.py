"""The parts of the manifest schema below the manifest itself: pre/post-processing steps, the framework,
input, output and model specs, and how pydantic's errors become field paths (``preprocess[2].resize.size``).

`mlms_nb.manifest` re-exports every public name here; import them from there.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Union

import semantic_version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mlms_nb import _manifest_checks as checks
from mlms_nb.paths import builtin_manifest_dir
from mlms_nb._manifest_checks import _errors, _join  # noqa: F401 - the field-path helpers, re-exported

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
MAX_NAME = 128
MAX_URI = 4096

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


def _problems(problems: list[tuple[str, str]]) -> PydanticCustomError:
    """Several ``(sub-path, message)`` errors raised as one; `_describe` reports each at its own path."""
    summary = "; ".join(f"{p}: {m}" if p else m for p, m in problems)
    return PydanticCustomError("mlms_problems", "{summary}", {"summary": summary, "problems": problems})


def _text(value: Any, limit: int, what: str) -> Any:
    """Strings stay strings (other types fail pydantic's own check); too long or holding NUL: refused."""
    if isinstance(value, str):
        if len(value) > limit:
            raise ValueError(f"expected {what} of at most {limit:,} characters, got {len(value):,}")
        if "\x00" in value:
            raise ValueError(f"{what} must not contain a NUL character")
    return value


# ---------------------------------------------------------------- pre/post-processing steps

class DecodeArgs(_Strict):
    """Read the image file and convert it to ``color_mode`` (the first preprocess step; added when missing)."""
    color_mode: Literal["RGB", "BGR", "GRAY"] = "RGB"


class ResizeArgs(_Strict):
    """``size`` (pixels, 1 to 4096): an int resizes the shorter side to it (keeping aspect); ``[h, w]`` exactly."""
    size: Union[int, tuple[int, int]]
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return checks.image_size(value)


class CenterCropArgs(_Strict):
    """``size`` (pixels, 1 to 4096): an int for a square, or ``[h, w]``."""
    size: Union[int, tuple[int, int]]

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return checks.image_size(value)


class NormalizeArgs(_Strict):
    """``(x - mean) / scale`` per channel, on pixel values in 0..255; one value, or one per channel."""
    mean: list[float]
    scale: list[float]

    @field_validator("mean", "scale", mode="before")
    @classmethod
    def _finite(cls, value: Any, info) -> list[float]:
        return checks.numbers(value, info.field_name)


class ToLayoutArgs(_Strict):
    """Move channels to the given layout; by default, the manifest input's layout."""
    layout: Literal["NCHW", "NHWC"] | None = None


class SoftmaxArgs(_Strict):
    """``axis``: -1 or 1, the class axis of the (N, classes) outputs postprocessing works on."""
    axis: int = -1

    @field_validator("axis", mode="before")
    @classmethod
    def _class_axis(cls, value: Any) -> int:
        if isinstance(value, bool) or value not in (-1, 1):
            raise ValueError(f"postprocessing sees outputs shaped (N, classes), so the axis must be -1 or 1 "
                             f"(the class axis), got {value!r}"[:200])
        return int(value)


class TopKArgs(_Strict):
    """``k``: how many classes to keep per input (1 to 10^7; at most the number of classes is used)."""
    k: int = 5

    @field_validator("k", mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> int:
        return checks.whole_number(value, 1, checks.MAX_CLASSES, "classes")


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
                keys = ", ".join(sorted(repr(k)[:40] for k in value)[:10])
                raise ValueError(f"a step is a mapping with one key (the op), got keys {keys}")
            op, args = next(iter(value.items()))
            value = {"op": op, "args": args or {}}
        if not isinstance(value, dict):
            raise ValueError(f"a step is an op name or a one-key mapping, got {type(value).__name__}")
        op = value.get("op")
        if not isinstance(op, str) or op not in STEP_ARGS:
            raise ValueError(f"unknown step {repr(op)[:60]}; known steps: {', '.join(STEP_ARGS)}")
        args = value.get("args") or {}
        if isinstance(args, BaseModel):
            return value
        try:
            return {"op": op, "args": STEP_ARGS[op].model_validate(args)}
        except ValidationError as err:  # every bad argument, each at its own path (preprocess[2].resize.size)
            raise _problems([(_join(op, path), msg) for path, msg in _errors(err)]) from None

    def __repr__(self) -> str:
        return f"Step({self.op}, {self.args!r})"


# ---------------------------------------------------------------- framework, inputs, outputs, model

class FrameworkOptions(_Strict):
    """Settings of the framework that runs the model. ``graph_optimization_level`` (ONNX Runtime only): how much
    ONNX Runtime rewrites the graph before running it -- ``disabled``, ``basic`` (constant folding, redundant
    nodes removed), ``extended`` (fusions) or ``all`` (its default: also layout transformations)."""
    graph_optimization_level: Literal["disabled", "basic", "extended", "all"] | None = Field(
        None, examples=["basic"], description="ONNX Runtime only: disabled, basic (constant folding), extended "
                                              "(fusions) or all (also layout changes); default: all")

    @field_validator("graph_optimization_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class FrameworkSpec(_Strict):
    """The framework that runs the model."""
    name: str = Field(examples=["torch"], description="torch, onnxruntime or tensorflow (aliases: pytorch, ort, "
                                                      "onnx, tf, keras)")
    version: str = Field("*", examples=[">=2.0"], description="npm-style range the installed version must satisfy")
    options: FrameworkOptions = Field(default_factory=FrameworkOptions,
                                      description="settings of the framework that runs the model")

    @model_validator(mode="after")
    def _options_fit(self) -> "FrameworkSpec":
        if self.options.graph_optimization_level is not None and self.name != "onnxruntime":
            raise ValueError(f"options.graph_optimization_level is an ONNX Runtime setting; framework {self.name!r} "
                             "has no graph optimisation level (remove it, or use framework.name: onnxruntime)")
        return self

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        name = canonical_framework(value[:100])
        if name not in FRAMEWORKS:
            raise ValueError(f"unknown framework {value!r}; expected one of {', '.join(FRAMEWORKS)}")
        return name

    @field_validator("version", mode="before")
    @classmethod
    def _range(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"{value!r} is a YAML number; write the range as a quoted string, such as \">={value}\"")
        if not isinstance(value, str):
            return value
        _text(value, 200, "a version range")
        try:
            semantic_version.NpmSpec(value)
        except Exception as err:  # noqa: BLE001 - the range parser raises more than ValueError on odd input
            raise ValueError(f"not an npm-style version range such as >=2.0 ({str(err)[:100]})") from None
        return value

    def accepts(self, version: str) -> bool:
        """Whether a framework version (``2.13.0+cpu``) satisfies this manifest's range."""
        return parse_version(version) in semantic_version.NpmSpec(self.version)


class InputSpec(_Strict):
    """One model input. ``dimensions`` exclude the batch and follow ``layout`` (NCHW: [C, H, W]); an image's
    height and width are 1 to 4096 pixels, each dimension 1 to 2^20, 2^26 elements in all."""
    name: str | None = Field(None, description="the input's name in the graph (informative)")
    type: Literal["image", "tensor"] = Field("image", description="image: datasets of photos are decoded and "
                                                                  "preprocessed; tensor: synthetic or .npz inputs")
    element_type: Literal["float32", "float16", "uint8", "int32", "int64"] = Field("float32",
                                                                                   description="element type fed")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="axis order (NCHW: PyTorch and ONNX; NHWC: Keras)")
    dimensions: list[int] = Field(examples=[[3, 224, 224]], description="the shape without the batch, in `layout`")
    color_mode: Literal["RGB", "BGR", "GRAY"] = Field("RGB", description="channel order images are decoded to")
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0], examples=[[123.675, 116.28, 103.53]],
                              description="subtracted per channel from pixel values 0..255 (default normalize)")
    scale: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0], examples=[[58.395, 57.12, 57.375]],
                               description="divides per channel after the mean (default normalize); not 0")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return _text(value, MAX_NAME, "a name")

    @field_validator("dimensions", mode="before")
    @classmethod
    def _dims(cls, value: Any) -> list[int]:
        return checks.dimensions(value)

    @field_validator("mean", "scale", mode="before")
    @classmethod
    def _finite(cls, value: Any, info) -> list[float]:
        return checks.numbers(value, info.field_name)

    @model_validator(mode="after")
    def _shape(self) -> "InputSpec":
        if self.type == "image":
            problems = []
            if len(self.dimensions) != 3:
                raise _problems([("dimensions", f"expected 3 integers ({self.layout} without the batch), "
                                                f"got {len(self.dimensions)}")])
            height, width = self.height_width
            for name, side in (("height", height), ("width", width)):
                if side > checks.MAX_IMAGE_SIDE:
                    index = (1 if self.layout == "NCHW" else 0) + (name == "width")
                    problems.append((f"dimensions[{index}]", f"an image {name} of at most {checks.MAX_IMAGE_SIDE} "
                                                             f"pixels is supported, got {side}"))
            channels = self.channels
            for field_name in ("mean", "scale"):
                values = getattr(self, field_name)
                if len(values) not in (1, channels):
                    problems.append((field_name, f"expected 1 or {channels} values (one per channel), got {len(values)}"))
            if problems:
                raise _problems(problems)
        return self

    @property
    def channels(self) -> int:
        return self.dimensions[0] if self.layout == "NCHW" else self.dimensions[-1]

    @property
    def height_width(self) -> tuple[int, int]:
        if self.layout == "NCHW":
            return self.dimensions[1], self.dimensions[2]
        return self.dimensions[0], self.dimensions[1]


#: a bare name (no dot, slash or scheme) in ``outputs[].labels`` names a label file shipped with mlms-nb
LABELS_SHORTHAND = re.compile(r"^[A-Za-z0-9_\-]+$")


def shipped_labels() -> list[str]:
    """The names of the label files shipped with mlms-nb (``labels: imagenet1k``)."""
    return sorted(p.stem for p in (builtin_manifest_dir() / "labels").glob("*.txt"))


def labels_file(value: str) -> Path | None:
    """The shipped file a ``labels`` shorthand names; None when ``value`` is a path or URI, not a shorthand."""
    return builtin_manifest_dir() / "labels" / f"{value}.txt" if LABELS_SHORTHAND.match(value) else None


class OutputSpec(_Strict):
    """``labels``: a label file shipped with mlms-nb by name (``imagenet1k``), or the asset URI of a text file, one
    label per line; ``classes``: how many the output has (1 to 10^7), checked against the labels when both are known."""
    name: str | None = Field(None, description="the output's name in the graph (informative)")
    type: Literal["classification", "tensor"] = Field("classification", description="classification: top-1/top-5 "
                                                                                    "accuracy on labeled datasets")
    labels: str | None = Field(None, examples=["imagenet1k", "labels.txt"],
                               description="a shipped label file by name, a bare word (" + ", ".join(
                                   f"``{n}``" for n in shipped_labels()) + "), or the asset URI of a text file, "
                                   "one label per line (``./labels`` for a file without a dot in its name)")
    classes: int | None = Field(None, examples=[1000], description="how many classes the output has")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return _text(value, MAX_NAME, "a name")

    @field_validator("labels", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        value = _text(value, MAX_URI, "an asset URI")
        if isinstance(value, str) and LABELS_SHORTHAND.match(value) and value not in shipped_labels():
            raise ValueError(f"{value!r} is not a shipped label file; shipped ones: {', '.join(shipped_labels())} "
                             "(or give the path of a text file, one label per line)")
        return value

    @field_validator("classes", mode="before")
    @classmethod
    def _classes(cls, value: Any) -> Any:
        return None if value is None else checks.whole_number(value, 1, checks.MAX_CLASSES, "classes")


ASSET_FIELDS = ("graph_path", "weights_path")


ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ModelSpec(_Strict):
    """Where the model comes from: ``architecture`` (a built-in builder), ``graph_path`` (a model file or SavedModel
    folder, used first when given) or ``entrypoint`` (your own code building the model); ``weights_path`` holds
    weights for an architecture or an entrypoint. Paths are asset URIs; ``sha256`` maps an asset field to its digest."""
    architecture: str | None = Field(None, description="a built-in architecture: efficientnet_lite0, "
                                                       "efficientnet_lite1, efficientnet_lite2, resnet50, vit_tiny "
                                                       "or bert_tiny")
    graph_path: str | None = Field(None, description="a model file (asset URI): TorchScript .pt/.ts/.jit, torch.export "
                                                     ".pt2, .onnx, .keras/.h5, or a SavedModel folder")
    weights_path: str | None = Field(None, description="weights for an architecture or an entrypoint (asset URI): "
                                                       ".safetensors, or a state dict torch.load reads with "
                                                       "weights_only=True (.pth/.pt/.bin); .weights.h5 for Keras")
    entrypoint: str | None = Field(None, description="\"package.module:callable\" returning an nn.Module (torch) or a "
                                                     "keras.Model (tensorflow); runs only with trust")
    entrypoint_args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the entrypoint "
                                                                              "callable")
    sha256: dict[str, str] = Field(default_factory=dict, description="asset field -> expected sha256 (64 hex "
                                                                     "digits), checked before the asset is used")
    weights: Literal["pretrained", "random"] = Field("pretrained", description="random: performance runs only "
                                                                               "(no accuracy)")
    instance: Any = Field(None, exclude=True, repr=False)  # a live model object (mlms_nb.evaluate(obj)); never saved

    @field_validator("graph_path", "weights_path", "architecture", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        return _text(value, MAX_URI, "an asset URI")

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _entrypoint(cls, value: Any) -> Any:
        _text(value, MAX_URI, "an entrypoint")
        if isinstance(value, str) and not ENTRYPOINT_PATTERN.match(value):
            raise ValueError(f"expected \"package.module:callable\" (a Python import path, a colon, a callable), "
                             f"got {value[:100]!r}")
        return value

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
        given = [name for name in ("architecture", "graph_path", "entrypoint") if getattr(self, name)]
        if self.instance is not None:
            return self
        if not given:
            raise ValueError("expected one of architecture (built in), graph_path (a model file) or entrypoint "
                             "(\"package.module:callable\")")
        if self.entrypoint and self.architecture:
            raise ValueError("give an entrypoint or an architecture, not both")
        if self.entrypoint_args and not self.entrypoint:
            raise _problems([("entrypoint_args", "needs an entrypoint")])
        if self.architecture and not self.graph_path and self.weights == "pretrained" and not self.weights_path:
            raise _problems([("weights_path", f"architecture {self.architecture!r} with pretrained weights needs a "
                                              "weights_path (or weights: random for performance runs)")])
        return self
