"""The manifest's pre/post-processing steps: one small argument model per step (``preprocess[2].resize.size``),
the step table and :class:`Step`, which validates ``{op: args}``.

`mlms_nb.manifest` re-exports every public name here; import them from there.
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlms_nb.manifest import checks
from mlms_nb.manifest.checks import field_errors, join_path
from mlms_nb.manifest.fields import MAX_URI, problems_error, Strict, bounded_text

class DecodeArgs(Strict):
    """Read the image file and convert it to ``color_mode`` (the first preprocess step; added when missing)."""
    color_mode: Literal["RGB", "BGR", "GRAY"] = "RGB"


class ResizeArgs(Strict):
    """``size`` (pixels, 1 to 4096): an int resizes the shorter side to it (keeping aspect); ``[h, w]`` exactly."""
    size: Union[int, tuple[int, int]]
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return checks.image_size(value)


class ResizeFitArgs(Strict):
    """Keep the aspect ratio: scale so that the shorter side becomes ``short_side`` (when given) without the longer
    side passing ``long_side`` (when given), then round each side to the nearest multiple of ``multiple_of`` (at
    least one multiple). Sides in pixels, 1 to 4096."""
    short_side: int | None = Field(None, description="the shorter side's target (pixels)")
    long_side: int | None = Field(None, description="the longer side's limit (pixels)")
    multiple_of: int = Field(1, description="round each side to a multiple of this (pixels), e.g. 32")
    interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos"] = "bilinear"

    @field_validator("short_side", "long_side", "multiple_of", mode="before")
    @classmethod
    def _side(cls, value: Any) -> Any:
        return None if value is None else checks.whole_number(value, 1, checks.MAX_IMAGE_SIDE, "pixels")

    @model_validator(mode="after")
    def _one_side(self) -> "ResizeFitArgs":
        if self.short_side is None and self.long_side is None:
            raise ValueError("give short_side, long_side or both (pixels)")
        return self


class DecodeAudioArgs(Strict):
    """Read a WAV/FLAC/OGG file with soundfile (float32 in -1..1), mix to ``channels`` (mono averages them) and
    resample to ``sample_rate`` (Hz; soxr when installed, else scipy's polyphase filter)."""
    sample_rate: int = Field(16000, description="the model's sample rate (Hz)")
    channels: Literal["mono", "keep"] = Field("mono", description="mono: average the channels; keep: (C, samples)")

    @field_validator("sample_rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> int:
        return checks.whole_number(value, 1, 1_000_000, "Hz")


class ChunkArgs(Strict):
    """Cut the signal's last axis into ordered chunks of ``size`` samples every ``hop`` (default ``size``), each
    prefixed by ``context`` samples of what came before (zeros before the start); the last chunk is padded with
    zeros. Gives ``(chunks, ..., context + size)``: one model call per chunk, in order."""
    size: int = Field(description="samples per chunk")
    hop: int | None = Field(None, description="samples between chunk starts (default: size)")
    context: int = Field(0, description="samples of left context before each chunk")

    @field_validator("size", "hop", "context", mode="before")
    @classmethod
    def _samples(cls, value: Any, info) -> Any:
        if value is None:
            return None
        return checks.whole_number(value, 0 if info.field_name == "context" else 1, checks.MAX_DIMENSION, "samples")


class TokenizeArgs(Strict):
    """Tokenize text with a `tokenizers` file (``tokenizer.json``, an asset URI), truncated and padded to
    ``max_length``; ``ids``, ``attention_mask`` and ``type_ids`` name the model inputs each goes to (null: not fed)."""
    tokenizer: str = Field(description="asset URI of a tokenizers JSON file")
    max_length: int = Field(128, description="tokens per input (truncated, then padded)")
    ids: str = Field("input_ids", description="the input the token ids go to")
    attention_mask: str | None = Field(None, description="the input the attention mask goes to (1 = token)")
    type_ids: str | None = Field(None, description="the input the token type ids go to")

    @field_validator("tokenizer", mode="before")
    @classmethod
    def _uri(cls, value: Any) -> Any:
        return bounded_text(value, MAX_URI, "an asset URI")

    @field_validator("max_length", mode="before")
    @classmethod
    def _length(cls, value: Any) -> int:
        return checks.whole_number(value, 1, checks.MAX_DIMENSION, "tokens")


class CenterCropArgs(Strict):
    """``size`` (pixels, 1 to 4096): an int for a square, or ``[h, w]``."""
    size: Union[int, tuple[int, int]]

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return checks.image_size(value)


class NormalizeArgs(Strict):
    """``(x - mean) / scale`` per channel, on pixel values in 0..255; one value, or one per channel."""
    mean: list[float]
    scale: list[float]

    @field_validator("mean", "scale", mode="before")
    @classmethod
    def _finite(cls, value: Any, info) -> list[float]:
        return checks.numbers(value, info.field_name)


class ToLayoutArgs(Strict):
    """Move channels to the given layout; by default, the manifest input's layout."""
    layout: Literal["NCHW", "NHWC"] | None = None


class SoftmaxArgs(Strict):
    """``axis``: -1 or 1, the class axis of the (N, classes) outputs postprocessing works on."""
    axis: int = -1

    @field_validator("axis", mode="before")
    @classmethod
    def _class_axis(cls, value: Any) -> int:
        if isinstance(value, bool) or value not in (-1, 1):
            raise ValueError(f"postprocessing sees outputs shaped (N, classes), so the axis must be -1 or 1 "
                             f"(the class axis), got {value!r}"[:200])
        return int(value)


class TopKArgs(Strict):
    """``k``: how many classes to keep per input (1 to 10^7; at most the number of classes is used)."""
    k: int = 5

    @field_validator("k", mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> int:
        return checks.whole_number(value, 1, checks.MAX_CLASSES, "classes")


class CodeArgs(Strict):
    """Python source defining ``process(x)``; run only when the caller passes ``trust=True``."""
    source: str


STEP_ARGS: dict[str, type[Strict]] = {
    "decode": DecodeArgs,
    "resize": ResizeArgs,
    "resize_fit": ResizeFitArgs,
    "center_crop": CenterCropArgs,
    "normalize": NormalizeArgs,
    "to_layout": ToLayoutArgs,
    "softmax": SoftmaxArgs,
    "top_k": TopKArgs,
    "decode_audio": DecodeAudioArgs,
    "chunk": ChunkArgs,
    "tokenize": TokenizeArgs,
    "code": CodeArgs,
}
PREPROCESS_OPS = ("decode", "resize", "resize_fit", "center_crop", "normalize", "to_layout", "decode_audio", "chunk",
                  "tokenize", "code")
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
            raise problems_error([(join_path(op, path), msg) for path, msg in field_errors(err)]) from None

    def __repr__(self) -> str:
        return f"Step({self.op}, {self.args!r})"

    @property
    def arguments(self) -> str:
        """The step's arguments as people read them: ``size=256, interpolation=bilinear`` (defaults included, unset
        optional ones left out)."""
        return ", ".join(f"{key}={value}" for key, value in self.args.model_dump(mode="json", exclude_none=True).items())

    def __str__(self) -> str:
        return f"{self.op}({self.arguments})"
