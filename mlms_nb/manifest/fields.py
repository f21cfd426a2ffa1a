"""The parts of the manifest schema below the manifest itself: the framework, input, output and model specs, and how
pydantic's errors become field paths (``inputs[0].dimensions[1]``); the pre/post-processing steps are in
:mod:`mlms_nb.manifest.steps`.

`mlms_nb.manifest` re-exports every public name here; import them from there.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import semantic_version
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mlms_nb.manifest import checks
from mlms_nb.paths import builtin_manifest_dir

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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def problems_error(problems: list[tuple[str, str]]) -> PydanticCustomError:
    """Several ``(sub-path, message)`` errors raised as one; `_describe` reports each at its own path."""
    summary = "; ".join(f"{p}: {m}" if p else m for p, m in problems)
    return PydanticCustomError("mlms_problems", "{summary}", {"summary": summary, "problems": problems})


def bounded_text(value: Any, limit: int, what: str) -> Any:
    """Strings stay strings (other types fail pydantic's own check); too long or holding NUL: refused."""
    if isinstance(value, str):
        if len(value) > limit:
            raise ValueError(f"expected {what} of at most {limit:,} characters, got {len(value):,}")
        if "\x00" in value:
            raise ValueError(f"{what} must not contain a NUL character")
    return value


# ---------------------------------------------------------------- framework, inputs, outputs, model

class FrameworkOptions(Strict):
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


class FrameworkSpec(Strict):
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
        bounded_text(value, 200, "a version range")
        try:
            semantic_version.NpmSpec(value)
        except Exception as err:  # noqa: BLE001 - the range parser raises more than ValueError on odd input
            raise ValueError(f"not an npm-style version range such as >=2.0 ({str(err)[:100]})") from None
        return value

    def accepts(self, version: str) -> bool:
        """Whether a framework version (``2.13.0+cpu``) satisfies this manifest's range."""
        return parse_version(version) in semantic_version.NpmSpec(self.version)


ELEMENT_TYPES = ("float32", "float16", "float64", "uint8", "int8", "int32", "int64", "bool")
INPUT_TYPES = ("image", "tensor", "audio", "text", "constant")


class InputSpec(Strict):
    """One model input. ``dimensions`` exclude the batch and follow ``layout`` (NCHW: [C, H, W]); an image's
    height and width are 1 to 4096 pixels, each dimension 1 to 2^20, 2^26 elements in all. A dimension may be
    dynamic: ``null`` (any size) or a symbol such as ``H`` (the same size wherever the symbol appears in one call);
    sizes are checked against it at run time. ``batch_axis``: where the batch goes (0: first; null: the input has
    none, e.g. a scalar). ``type: constant`` feeds ``value`` (a number or nested list) in every call."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = Field(None, description="the input's name: the ONNX graph input, the torch forward argument "
                                               "or the Keras input it feeds; needed when there are several inputs")
    type: Literal["image", "tensor", "audio", "text", "constant"] = Field(
        "image", description="image: photos decoded and preprocessed; tensor: synthetic or .npz inputs; audio: sound "
                             "files (decode_audio, chunk); text: strings (tokenize); constant: `value` in every call")
    element_type: Literal["float32", "float16", "float64", "uint8", "int8", "int32", "int64", "bool"] = Field(
        "float32", validation_alias=AliasChoices("element_type", "dtype"),
        description="element type fed (`dtype` is accepted as another spelling)")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="axis order (NCHW: PyTorch and ONNX; NHWC: Keras)")
    dimensions: list[int | str | None] | None = Field(
        None, examples=[[3, 224, 224], [3, None, None], [1, "T"]],
        description="the shape without the batch, in `layout`; null or a symbol (H) for a dynamic dimension; "
                    "required except for constants (whose value gives it)")
    batch_axis: int | None = Field(0, description="the axis the batch is stacked on (0: first); null: no batch axis")
    value: Any = Field(None, examples=[16000], description="type constant: the value fed in every call")
    color_mode: Literal["RGB", "BGR", "GRAY"] = Field("RGB", description="channel order images are decoded to")
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0], examples=[[123.675, 116.28, 103.53]],
                              description="subtracted per channel from pixel values 0..255 (default normalize)")
    scale: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0], examples=[[58.395, 57.12, 57.375]],
                               description="divides per channel after the mean (default normalize); not 0")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return bounded_text(value, MAX_NAME, "a name")

    @field_validator("dimensions", mode="before")
    @classmethod
    def _dims(cls, value: Any) -> Any:
        return None if value is None else checks.dimensions(value)

    @field_validator("batch_axis", mode="before")
    @classmethod
    def _axis(cls, value: Any) -> Any:
        return None if value is None else checks.whole_number(value, 0, 32, "axes")

    @field_validator("mean", "scale", mode="before")
    @classmethod
    def _finite(cls, value: Any, info) -> list[float]:
        return checks.numbers(value, info.field_name)

    @model_validator(mode="after")
    def _shape(self) -> "InputSpec":
        if self.type == "constant":
            return self._constant()
        if self.value is not None:
            raise problems_error([("value", "only a constant input has a value; set type: constant or remove it")])
        if self.dimensions is None:
            raise problems_error([("dimensions", "required field is missing")])
        if self.batch_axis is not None and self.batch_axis > len(self.dimensions):
            raise problems_error([("batch_axis", f"an input of {len(self.dimensions)} dimensions (without the batch) can "
                                            f"take the batch at axis 0 to {len(self.dimensions)}, not {self.batch_axis}")])
        if self.type == "image":
            problems = []
            if len(self.dimensions) != 3:
                raise problems_error([("dimensions", f"expected 3 integers ({self.layout} without the batch), "
                                                f"got {len(self.dimensions)}")])
            channels = self.channels
            if checks.is_dynamic(channels):
                index = 0 if self.layout == "NCHW" else 2
                raise problems_error([(f"dimensions[{index}]", "an image's channel count must be a number (1 or 3), "
                                                          f"not {channels!r}")])
            height, width = self.height_width
            for name, side in (("height", height), ("width", width)):
                if isinstance(side, int) and side > checks.MAX_IMAGE_SIDE:
                    index = (1 if self.layout == "NCHW" else 0) + (name == "width")
                    problems.append((f"dimensions[{index}]", f"an image {name} of at most {checks.MAX_IMAGE_SIDE} "
                                                             f"pixels is supported, got {side}"))
            for field_name in ("mean", "scale"):
                values = getattr(self, field_name)
                if len(values) not in (1, channels):
                    problems.append((field_name, f"expected 1 or {channels} values (one per channel), got {len(values)}"))
            if problems:
                raise problems_error(problems)
        return self

    def _constant(self) -> "InputSpec":
        import numpy as np

        if self.value is None:
            raise problems_error([("value", "a constant input needs the value to feed, such as 16000")])
        try:
            array = np.asarray(self.value, dtype=self.element_type)
        except (TypeError, ValueError, OverflowError) as err:
            raise problems_error([("value", f"not a {self.element_type} number or nested list of them ({err})")]) from None
        if array.size > 1 << 16:
            raise problems_error([("value", f"a constant of at most 65,536 elements is supported, got {array.size:,}")])
        if self.dimensions is not None and list(array.shape) != self.dimensions:
            raise problems_error([("dimensions", f"the value is shaped {list(array.shape)}, not {self.dimensions}")])
        if self.batch_axis == 0 and "batch_axis" not in self.model_fields_set:
            self.batch_axis = None  # a constant is fed as it is unless told to repeat it per input
        self.dimensions = list(array.shape)
        return self

    @property
    def dynamic(self) -> bool:
        """Whether any dimension is left to each input."""
        return any(checks.is_dynamic(d) for d in self.dimensions or ())

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


OUTPUT_METRICS = ("mse", "mae", "iou", "exact_match")


class OutputSpec(Strict):
    """``labels``: a label file shipped with mlms-nb by name (``imagenet1k``), or the asset URI of a text file, one
    label per line; ``classes``: how many the output has (1 to 10^7), checked against the labels when both are known.
    ``metrics``: built-in metrics of this output against the reference framework's (mse, mae, iou of masks
    thresholded at 0.5, exact_match)."""
    name: str | None = Field(None, description="the output's name: the ONNX graph output, the position or key of "
                                               "torch forward's result, or the Keras output; needed when there are "
                                               "several outputs")
    type: Literal["classification", "tensor"] = Field("classification", description="classification: top-1/top-5 "
                                                                                    "accuracy on labeled datasets; "
                                                                                    "tensor: captured and compared")
    labels: str | None = Field(None, examples=["imagenet1k", "labels.txt"],
                               description="a shipped label file by name, a bare word (" + ", ".join(
                                   f"``{n}``" for n in shipped_labels()) + "), or the asset URI of a text file, "
                                   "one label per line (``./labels`` for a file without a dot in its name)")
    classes: int | None = Field(None, examples=[1000], description="how many classes the output has")
    metrics: list[Literal["mse", "mae", "iou", "exact_match"]] = Field(
        default_factory=list, examples=[["mse"]], description="built-in metrics against the reference framework's "
                                                              "output: mse, mae, iou (masks), exact_match")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return bounded_text(value, MAX_NAME, "a name")

    @field_validator("labels", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        value = bounded_text(value, MAX_URI, "an asset URI")
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


class ModelSpec(Strict):
    """Where the model comes from: ``architecture`` (a built-in builder), ``graph_path`` (a model file or SavedModel
    folder, used first when given) or ``entrypoint`` (your own code building the model); ``weights_path`` holds
    weights for an architecture or an entrypoint. Paths are asset URIs; ``sha256`` maps an asset field to its digest."""
    architecture: str | None = Field(None, description="a built-in architecture: efficientnet_lite0, "
                                                       "efficientnet_lite1, efficientnet_lite2, resnet50, vit_tiny, "
                                                       "bert_tiny or tiny_gpt2 (a causal LM)")
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
    reset: str | None = Field(None, examples=["reset_states"],
                              description="torch only: the name of the model's method that clears the state it keeps "
                                          "between calls (a TorchScript method exported with @torch.jit.export, or a "
                                          "Python module's method), called before every item of the full pass and "
                                          "before every timed loop; a model whose two calls on one input differ is "
                                          "refused without it (or without explicit state: inputs and outputs)")
    instance: Any = Field(None, exclude=True, repr=False)  # a live model object (mlms_nb.evaluate(obj)); never saved

    @field_validator("graph_path", "weights_path", "architecture", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        return bounded_text(value, MAX_URI, "an asset URI")

    @field_validator("reset", mode="before")
    @classmethod
    def _reset(cls, value: Any) -> Any:
        bounded_text(value, MAX_URI, "a method name")
        if isinstance(value, str) and not value.isidentifier():
            raise ValueError(f"expected the name of a method of the model (a Python identifier), got {value[:100]!r}")
        return value

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _entrypoint(cls, value: Any) -> Any:
        bounded_text(value, MAX_URI, "an entrypoint")
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
            raise problems_error([("entrypoint_args", "needs an entrypoint")])
        if self.architecture and not self.graph_path and self.weights == "pretrained" and not self.weights_path:
            raise problems_error([("weights_path", f"architecture {self.architecture!r} with pretrained weights needs a "
                                              "weights_path (or weights: random for performance runs)")])
        return self
