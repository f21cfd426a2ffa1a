"""The numeric bounds of the manifest schema, and the check that a manifest's preprocessing can work.

Every bound is stated in the message that refuses a value:

- image sides (``resize.size``, ``center_crop.size``, an image input's H and W): 1 to `MAX_IMAGE_SIDE`
  (4096) pixels;
- each input dimension: 1 to `MAX_DIMENSION` (2^20); all of one input: at most `MAX_INPUT_ELEMENTS`
  (2^26, 256 MiB in float32);
- ``normalize`` / input ``mean``: finite, |mean| <= 1e6; ``scale``: finite, 1e-6 <= scale <= 1e6;
- ``top_k.k`` and ``outputs[].classes``: 1 to `MAX_CLASSES` (10^7); ``softmax.axis``: -1 or 1 (the
  class axis of the (N, classes) outputs that postprocessing works on).

`pipeline_problems` walks the preprocess steps as `Preprocessor` will run them and says what cannot
work: decode not first, resize after a channels-first ``to_layout``, a normalize with the wrong
number of values, a channel count or final image size that differs from ``inputs[0].dimensions``, or
steps that leave the size to each image. Steps after a ``code`` step are the code's business.
"""
from __future__ import annotations

import math
import re
from typing import Any

MAX_IMAGE_SIDE = 4096
MAX_DIMENSION = 1 << 20
MAX_INPUT_ELEMENTS = 1 << 26
MAX_CLASSES = 10_000_000
MAX_MEAN = 1e6
SCALE_RANGE = (1e-6, 1e6)
DECODED_CHANNELS = {"RGB": 3, "BGR": 3, "GRAY": 1}
SYMBOL = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")


def whole_number(value: Any, low: int, high: int, what: str) -> int:
    """``value`` as an int in ``[low, high]``; bools, fractions and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ValueError(f"expected a whole number of {what} from {low:,} to {high:,}, got {_show(value)}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"expected a whole number of {what} from {low:,} to {high:,}, got {_show(value)}")
    return number


def image_size(value: Any) -> int | tuple[int, int]:
    """A resize/crop size: one int (pixels) or ``[height, width]``, each side 1 to `MAX_IMAGE_SIDE`."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"expected one number of pixels or [height, width], got {len(value)} values")
        sides = []
        for i, side in enumerate(value):
            try:
                sides.append(whole_number(side, 1, MAX_IMAGE_SIDE, "pixels"))
            except ValueError as err:
                raise ValueError(f"[{i}]: {err}") from None
        return sides[0], sides[1]
    return whole_number(value, 1, MAX_IMAGE_SIDE, "pixels")


def numbers(value: Any, kind: str) -> list[float]:
    """Per-channel ``mean`` or ``scale`` values: a number or a list of 1 to 4 numbers, within bounds."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not 1 <= len(values) <= 4:
        raise ValueError(f"expected 1 value or one per channel, got {len(values)}")
    out = []
    for i, v in enumerate(values):
        where = f"[{i}]: " if isinstance(value, (list, tuple)) else ""
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}expected a finite number, got {_show(v)}")
        if kind == "mean" and abs(v) > MAX_MEAN:
            raise ValueError(f"{where}expected a mean within ±{MAX_MEAN:g} (pixel values are 0..255), got {v!r}")
        if kind == "scale" and not SCALE_RANGE[0] <= v <= SCALE_RANGE[1]:
            raise ValueError(f"{where}expected a positive divisor from {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g} "
                             f"(such as 58.395, the std of pixel values), got {v!r}")
        out.append(float(v))
    return out


def dimensions(value: Any) -> list[int | str | None]:
    """An input's dimensions (no batch): each 1 to `MAX_DIMENSION`, or dynamic: ``null`` (any size) or a symbol such
    as ``H`` (one size wherever the symbol appears in one call); at most `MAX_INPUT_ELEMENTS` in all (static ones)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of sizes such as [3, 224, 224], got {_show(value)}")
    dims: list[int | str | None] = []
    for i, d in enumerate(value):
        if d is None:
            dims.append(None)
            continue
        if isinstance(d, str):
            if not SYMBOL.match(d):
                raise ValueError(f"[{i}]: expected a size, null (dynamic) or a symbol such as H (letters, digits and "
                                 f"_, starting with a letter), got {_show(d)}")
            dims.append(d)
            continue
        if isinstance(d, (int, float)) and not isinstance(d, bool) and d == -1:
            raise ValueError(f"[{i}]: write a dynamic dimension as null or a symbol such as H, not -1")
        try:
            dims.append(whole_number(d, 1, MAX_DIMENSION, "elements"))
        except ValueError as err:
            raise ValueError(f"[{i}]: {err}") from None
    static = [d for d in dims if isinstance(d, int)]
    if math.prod(static) > MAX_INPUT_ELEMENTS:
        raise ValueError(f"{dims} holds {math.prod(static):,} elements per input, over the limit of "
                         f"{MAX_INPUT_ELEMENTS:,}")
    return dims


def is_dynamic(dim: Any) -> bool:
    """Whether one dimension is left to each input (``null`` or a symbol)."""
    return not isinstance(dim, int)


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"  # huge ints: no decimal repr (Python limits its digits)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


IMAGE_OPS = ("decode", "resize", "resize_fit", "center_crop", "normalize", "to_layout", "code")
AUDIO_OPS = ("decode_audio", "chunk", "code")
TEXT_OPS = ("tokenize", "code")
OPS_BY_TYPE = {"image": IMAGE_OPS, "tensor": IMAGE_OPS, "audio": AUDIO_OPS, "text": TEXT_OPS}


def pipeline_problems(spec: Any, steps: list[Any], where: str = "inputs[0]") -> list[tuple[str, str]]:
    """``(field path, message)`` for each way ``steps`` cannot turn a dataset item into ``spec``'s input (``where``
    is the input's field path: the first input the dataset feeds)."""
    allowed = OPS_BY_TYPE.get(spec.type, ())
    for i, step in enumerate(steps):
        if step.op not in allowed:
            return [(f"preprocess[{i}]", f"step {step.op} does not apply to a {spec.type} input ({where}.type); "
                                         f"its steps are {', '.join(allowed)}")]
    if spec.type == "audio":
        return [] if not steps or steps[0].op in ("decode_audio", "code") else [
            ("preprocess[0]", "the steps of an audio input start with decode_audio (the file's samples)")]
    if spec.type == "text":
        if steps and steps[0].op in ("tokenize", "code"):
            return []
        return [("preprocess", f"a text input needs a tokenize step (a tokenizer file) to turn text into {where}")]
    if spec.type != "image" and not steps:
        return []  # a tensor input fed by already preprocessed data
    problems: list[tuple[str, str]] = []
    if not steps:
        decoded = DECODED_CHANNELS[spec.color_mode]
        if decoded != spec.channels:
            problems.append((f"{where}.color_mode", _channels_message(decoded, spec.channels, where)))
        return problems
    if spec.type != "image" and steps[0].op not in ("decode", "code"):
        return [("preprocess[0]", "the steps of a tensor input run on decoded images: start them with decode, "
                                  "or list none when the dataset holds preprocessed tensors")]
    size: tuple[int, int] | None = None  # None: each image's own size
    size_path = "preprocess"
    layout = "HWC"
    channels, channels_from = DECODED_CHANNELS[spec.color_mode], f"{where}.color_mode"
    for i, step in enumerate(steps):
        path, args = f"preprocess[{i}]", step.args
        if step.op == "code":
            return problems
        if step.op == "decode":
            if i:
                problems.append((path, "decode must be the first step; move it to preprocess[0]"))
            channels, channels_from = DECODED_CHANNELS[args.color_mode], f"{path}.decode.color_mode"
        elif step.op in ("resize", "resize_fit"):
            if layout == "CHW":
                problems.append((path, f"{step.op} works on height x width x channels images; move it before "
                                       "the to_layout step that puts channels first"))
            if step.op == "resize_fit":
                size = None  # each image's own aspect ratio
            elif isinstance(args.size, int):
                size = None if size is None else _shorter_side_to(size, args.size)
            else:
                size = (int(args.size[0]), int(args.size[1]))
            size_path = f"{path}.{step.op}"
        elif step.op == "center_crop":
            size = (args.size, args.size) if isinstance(args.size, int) else (int(args.size[0]), int(args.size[1]))
            size_path = f"{path}.center_crop.size"
        elif step.op == "normalize":
            for name in ("mean", "scale"):
                count = len(getattr(args, name))
                if count not in (1, spec.channels):
                    problems.append((f"{path}.normalize.{name}", f"expected 1 or {spec.channels} values (one per "
                                                                 f"channel of {where}), got {count}"))
        elif step.op == "to_layout":
            layout = "CHW" if (args.layout or spec.layout) == "NCHW" else "HWC"
    if spec.type != "image":
        return problems
    height, width = spec.height_width
    dynamic = is_dynamic(height) or is_dynamic(width)
    if size is None and not dynamic:
        problems.append(("preprocess", f"the steps leave the image size to each image; end them with a resize or "
                                       f"center_crop to [{height}, {width}] ({where}.dimensions), or make the "
                                       "height and width dynamic (null or a symbol such as H)"))
    elif size is not None and any(not is_dynamic(want) and got != want for got, want in zip(size, (height, width))):
        problems.append((size_path, f"the steps make {size[0]}x{size[1]} images but {where}.dimensions says "
                                    f"{height}x{width} (height x width); make the two agree"))
    if channels != spec.channels:
        problems.append((channels_from, _channels_message(channels, spec.channels, where)))
    return problems


def _channels_message(decoded: int, expected: int, where: str = "inputs[0]") -> str:
    return (f"decoding gives {decoded} channel{'s' if decoded > 1 else ''} but {where}.dimensions has {expected}; "
            "use color_mode GRAY for 1 channel or RGB/BGR for 3")


def _shorter_side_to(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """torchvision's rule, as `Preprocessor` applies it: the shorter side to ``short_side``."""
    h, w = size
    if w <= h:
        return int(short_side * h / w), short_side
    return short_side, int(short_side * w / h)


# ---------------------------------------------------------------- pydantic errors as field paths

def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    in_steps = bool(loc) and loc[0] in ("preprocess", "postprocess")
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif (in_steps and i == 2 and part in ("op", "args")) or str(part).startswith("function-"):
            continue
        else:
            text = str(part)
            if not text or not text.isprintable() or len(text) > 60:  # an empty or odd key: shown quoted
                text = repr(text[:60])
            path += f".{text}" if path else text
    return path


def join_path(path: str, sub: str) -> str:
    if not sub:
        return path
    if not path or sub.startswith("["):
        return path + sub
    return f"{path}.{sub}"


def _clean(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def field_errors(err: Any) -> list[tuple[str, str]]:
    """``(field path, message)`` for every error pydantic found, with one wording for unknown/missing fields."""
    out = []
    for e in err.errors():
        path = _field_path(tuple(e["loc"]))
        if e["type"] == "mlms_problems":
            out += [(join_path(path, sub), msg) for sub, msg in e["ctx"]["problems"]]
            continue
        msg = _clean(e["msg"])
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        # A validator's own message may start with the sub-field it is about (``[1]: ...``, ``size: ...``).
        head, sep, rest = msg.partition(": ")
        if sep and head and " " not in head and (head.startswith("[") or head.isidentifier()):
            path, msg = join_path(path, head), rest
        out.append((path, msg))
    return out
