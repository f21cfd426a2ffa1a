"""Pre- and post-processing from a manifest's declarative steps.

`Preprocessor` turns one image (a path, a ``PIL.Image`` or an HWC ``uint8`` array) into the model's
input tensor, without the batch dimension, shaped exactly as ``manifest.inputs[0].dimensions``.
`Postprocessor` (:mod:`mlms_nb.data.postprocess`, re-exported here) turns a batch of model outputs (logits) into
probabilities and the top-k classes; code steps run through :mod:`mlms_nb.data.code_steps` (trusted only).

Preprocess steps, in the order the manifest lists them:

- ``decode {color_mode}``: read the file with PIL and convert it to RGB, BGR (RGB with the channels
  reversed) or GRAY (one channel). The image is fully loaded here, so a truncated or corrupt file fails
  in this step with `ImageDecodeError` (datasets skip such files). EXIF orientation is not applied, as
  in the reference pipelines (torchvision, Keras). When no decode step is listed one is added first,
  with the input's ``color_mode``.
- ``resize {size, interpolation}``: PIL resize (antialiased). An int resizes the shorter side to
  ``size`` and the longer one to ``int(size * long / short)`` (torchvision's rule); ``[h, w]`` resizes
  exactly. Interpolation: nearest, bilinear (the default), bicubic or lanczos.
- ``resize_fit {short_side, long_side, multiple_of, interpolation}``: keep the aspect ratio -- the shorter side to
  ``short_side`` without the longer passing ``long_side`` -- then round each side to the nearest multiple of
  ``multiple_of`` (detection and OCR models with dynamic height and width).
- ``center_crop {size}``: torchvision's rule (offsets ``round((H - h) / 2)``); a crop larger than the
  image is padded with zeros.
- ``normalize {mean, scale}``: ``(x - mean) / scale`` per channel, in float32, on pixels in 0..255.
- ``to_layout {layout}``: channels first (NCHW) or last (NHWC); by default the input's layout.
- ``code {source}``: Python source defining ``process(x)``; runs only with ``trust=True``. ``x`` is a
  numpy array (HWC uint8 when no numeric step ran before it); ``process`` returns the new array.

With no preprocess steps the standard ImageNet ones are derived from the input: decode(color_mode),
resize the shorter side to ``round(H / 0.875)``, center_crop(H, W), normalize(mean, scale),
to_layout(layout). After the last step the array is put in the input's layout (unless a code step
ran, whose layout is the code's business), cast to ``element_type`` and its shape checked.

Audio and text inputs (``decode_audio``, ``chunk``, ``tokenize``): :mod:`mlms_nb.data.signals`. The preprocessor
works for the manifest's *fed* input (``Manifest.fed_input``); dynamic dimensions (``null``, ``H``) take each
input's own size.

Postprocess steps: ``softmax {axis}`` (numerically stable), ``top_k {k}`` (default 5, at most the
number of classes) and ``code``. With no postprocess steps: softmax, then top_k(5) for a classification output,
nothing for a ``tensor`` output (``Postprocessor.active`` is False). Without a softmax step the outputs are taken
to be probabilities already.
"""
from __future__ import annotations

import math
import os
from typing import Any, Union

import numpy as np
from PIL import Image

from mlms_nb.manifest.checks import MAX_IMAGE_SIDE
from mlms_nb.errors import DatasetError, ManifestError
from mlms_nb.data.code_steps import UntrustedCodeError, check_code, compile_code  # noqa: F401  (re-exported)
from mlms_nb.data.postprocess import DEFAULT_TOP_K, Postprocessor, Prediction, softmax, top_k  # noqa: F401  (re-exported)
from mlms_nb.manifest import (CenterCropArgs, DecodeArgs, Manifest, NormalizeArgs, ResizeArgs, ResizeFitArgs,
                              Step, ToLayoutArgs)

ImageLike = Union[str, "os.PathLike[str]", Image.Image, np.ndarray]

#: The fraction of the resized image that the center crop keeps when no steps are listed (ImageNet's 224/256).
CROP_FRACTION = 0.875
#: The most pixels one resize may produce (2 x 4096^2): a ``size`` of one int keeps the aspect ratio, so a
#: very wide image would otherwise grow without bound. Manifests bound every size to 4096 pixels.
MAX_RESIZE_PIXELS = 2 * MAX_IMAGE_SIDE ** 2

_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
_PIL_MODE = {"RGB": "RGB", "BGR": "RGB", "GRAY": "L"}


class ImageDecodeError(DatasetError):
    """One image could not be read or decoded (datasets skip it and record why)."""


class ImageTooLargeError(ImageDecodeError):
    """Resizing one image would exceed `MAX_RESIZE_PIXELS` (datasets skip it and record why)."""


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


# ---------------------------------------------------------------- preprocessing

class Preprocessor:
    """One image -> the model's input tensor (no batch dimension), as ``manifest.inputs[0]`` describes it.

    Thread-safe: datasets call it from a small thread pool (PIL releases the GIL while decoding).
    """

    def __init__(self, manifest: Manifest, trust: bool = False):
        self.manifest = manifest
        self.trust = trust
        self.input = manifest.fed_input
        self.dims = list(self.input.dimensions)
        self.shape = tuple(self.dims) if not self.input.dynamic else None  # None: some sizes are each input's own
        self.dtype = np.dtype(self.input.element_type)
        steps = list(manifest.preprocess) or self.default_steps(manifest)
        if any(s.op == "code" for s in steps):
            check_code(manifest, "preprocess", trust)
        #: True when each dataset item becomes ordered chunks (a chunk step): one model call per chunk
        self.chunked = any(s.op == "chunk" for s in steps)
        self._tokenize = None
        if self.input.type in ("audio", "text"):
            self.steps = steps
            self._code = {i: compile_code(s.args.source, manifest, f"preprocess[{i}]")
                          for i, s in enumerate(steps) if s.op == "code"}
            tokenize = next((s for s in steps if s.op == "tokenize"), None)
            if tokenize is not None:
                from mlms_nb.data.signals import Tokenize

                self._tokenize = Tokenize(tokenize.args, manifest, self.input.name or "input")
            return
        is_image = self.input.type == "image"
        if is_image and not any(s.op == "decode" for s in steps):
            steps.insert(0, Step(op="decode", args=DecodeArgs(color_mode=self.input.color_mode)))
        for i, step in enumerate(steps):
            if step.op == "decode" and i != 0:
                raise ManifestError(f"preprocess[{i}]: decode must be the first step")
        self.steps: list[Step] = steps
        self._code = {i: compile_code(s.args.source, manifest, f"preprocess[{i}]")
                      for i, s in enumerate(steps) if s.op == "code"}
        self._channels_first_early = self._normalize_steps_going_channels_first(steps)

    def _normalize_steps_going_channels_first(self, steps: list[Step]) -> set[int]:
        """The normalize steps that may put the pixels channels-first before they become float32: those followed
        only by center_crop and to_layout steps on the way to a channels-first result. Moving the 1-byte pixels
        first and writing the floats once in place is 5-7x cheaper than transposing floats afterwards, and gives
        the same values (the arithmetic is per element)."""
        early = set()
        for i, step in enumerate(steps):
            if step.op != "normalize":
                continue
            after = steps[i + 1:]
            if any(s.op not in ("center_crop", "to_layout") for s in after):
                continue
            layouts = [s.args.layout or self.input.layout for s in after if s.op == "to_layout"]
            if (layouts[-1] if layouts else self.input.layout) == "NCHW":
                early.add(i)
        return early

    @staticmethod
    def default_steps(manifest: Manifest) -> list[Step]:
        """The standard steps derived from the input spec, for manifests that list none."""
        spec = manifest.fed_input
        if spec.type != "image":
            return []
        h, w = spec.height_width
        if spec.dynamic:  # each image keeps its own size
            return [Step(op="decode", args=DecodeArgs(color_mode=spec.color_mode)),
                    Step(op="normalize", args=NormalizeArgs(mean=list(spec.mean), scale=list(spec.scale))),
                    Step(op="to_layout", args=ToLayoutArgs(layout=spec.layout))]
        return [
            Step(op="decode", args=DecodeArgs(color_mode=spec.color_mode)),
            # constructed without the 4096-pixel bound of manifests: a 4096-pixel input resizes to 4681 first
            Step(op="resize", args=ResizeArgs.model_construct(size=int(round(h / CROP_FRACTION)),
                                                              interpolation="bilinear")),
            Step(op="center_crop", args=CenterCropArgs(size=(h, w))),
            Step(op="normalize", args=NormalizeArgs(mean=list(spec.mean), scale=list(spec.scale))),
            Step(op="to_layout", args=ToLayoutArgs(layout=spec.layout)),
        ]

    def __repr__(self) -> str:
        return f"Preprocessor({self.manifest.key}, steps=[{', '.join(s.op for s in self.steps)}])"

    # ------------------------------------------------------------------ the work
    def __call__(self, image: ImageLike) -> np.ndarray | dict[str, np.ndarray]:
        if self.input.type in ("audio", "text"):
            return self._signal(image)
        x: Any = image
        layout = "HWC"  # where the channels are while we know it; None after a code step
        bgr = False
        for i, step in enumerate(self.steps):
            op, args = step.op, step.args
            if op == "decode":
                x = decode_image(image, args.color_mode)
                bgr = args.color_mode == "BGR"
            elif op == "resize":
                x = self._resize(x, args)
            elif op == "resize_fit":
                x = self._resize(x, ResizeArgs.model_construct(size=fit_size(_size_of(x), args),
                                                               interpolation=args.interpolation))
            elif op == "center_crop":
                x = self._center_crop(x, layout, args)
            elif op == "normalize":
                x, bgr = self._to_array(x, bgr), False
                if i in self._channels_first_early and layout == "HWC":
                    x, layout = self._to_layout(x, layout, "NCHW", i)
                x = self._normalize(x, layout, args, i)
            elif op == "to_layout":
                x, bgr = self._to_array(x, bgr), False
                x, layout = self._to_layout(x, layout, args.layout or self.input.layout, i)
            elif op == "code":
                x, bgr = self._to_array(x, bgr), False
                x, layout = np.asarray(self._code[i](x)), None
        x = self._to_array(x, bgr)
        if layout is not None and x.ndim == 3:
            x, layout = self._to_layout(x, layout, self.input.layout, None)
        return self._finish(x, x.shape, "resize/center_crop/to_layout")

    def _finish(self, x: np.ndarray, shape: tuple[int, ...], steps: str) -> np.ndarray:
        """``x`` cast to the input's element type, once its shape (one chunk's, when chunked) fits the dimensions."""
        if len(shape) != len(self.dims) or any(isinstance(d, int) and d != got for d, got in zip(self.dims, shape)):
            dims = "[" + ", ".join("null" if d is None else str(d) for d in self.dims) + "]"
            raise DatasetError(
                f"{self.manifest.key}: preprocessing gives shape {list(shape)} but the model input "
                f"(inputs[{self.manifest.fed_index}].dimensions, {self.input.layout} without the batch) expects "
                f"{dims}; check the manifest's {steps} steps")
        if self.dtype == np.uint8 and x.dtype != np.uint8:
            x = np.clip(np.rint(x), 0, 255)
        return np.ascontiguousarray(x, dtype=self.dtype)

    def _signal(self, item: Any) -> np.ndarray | dict[str, np.ndarray]:
        """An audio file or a text through its steps (:mod:`mlms_nb.data.signals`)."""
        from mlms_nb.data import signals

        x: Any = item
        for i, step in enumerate(self.steps):
            if step.op == "decode_audio":
                x = signals.decode_audio(item, step.args)
            elif step.op == "chunk":
                x = signals.chunk(np.asarray(x), step.args)
            elif step.op == "tokenize":
                x = self._tokenize(x)
            elif step.op == "code":
                x = self._code[i](x)
        if isinstance(x, dict):
            return x
        x = np.asarray(x)
        return self._finish(x, x.shape[1:] if self.chunked else x.shape, self.input.type)

    @staticmethod
    def _to_array(x: Any, bgr: bool, dtype: Any = None) -> np.ndarray:
        if isinstance(x, Image.Image):
            x = np.asarray(x, dtype=dtype)
            if x.ndim == 2:
                x = x[:, :, None]
            if bgr:
                x = x[:, :, ::-1]
            return x
        x = np.asarray(x)
        return x if dtype is None else x.astype(dtype, copy=False)

    @staticmethod
    def _resize(x: Any, args: ResizeArgs) -> Any:
        resample = _INTERPOLATION[args.interpolation]
        if isinstance(x, Image.Image):
            w, h = x.size
        else:
            h, w = x.shape[:2]
        if isinstance(args.size, int):
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = args.size, int(args.size * long / short)
            nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
        else:
            nh, nw = _pair(args.size)
        if (nw, nh) == (w, h):
            return x
        if nw * nh > MAX_RESIZE_PIXELS:
            raise ImageTooLargeError(
                f"resizing a {w}x{h} image to {nw}x{nh} would make {nw * nh:,} pixels, over the limit of "
                f"{MAX_RESIZE_PIXELS:,}; crop such images first or resize to [height, width]")
        if isinstance(x, Image.Image):
            return x.resize((nw, nh), resample)
        # An array (after a code step): resize each channel as a float image.
        arr = np.asarray(x, dtype=np.float32)
        planes = arr[:, :, None] if arr.ndim == 2 else arr
        out = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(planes[:, :, c]), mode="F")
                                   .resize((nw, nh), resample)) for c in range(planes.shape[2])], axis=2)
        return out if arr.ndim == 3 else out[:, :, 0]

    @staticmethod
    def _center_crop(x: Any, layout: str | None, args: CenterCropArgs) -> Any:
        th, tw = _pair(args.size)
        if isinstance(x, Image.Image):
            w, h = x.size
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            return x.crop((left, top, left + tw, top + th))  # out of bounds -> zeros
        chw = layout == "CHW"
        h, w = (x.shape[1], x.shape[2]) if chw else (x.shape[0], x.shape[1])
        if th > h or tw > w:
            raise DatasetError(f"center_crop: crop {th}x{tw} is larger than the array's {h}x{w}")
        top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        if chw:
            return x[:, top:top + th, left:left + tw]
        return x[top:top + th, left:left + tw]

    def _normalize(self, x: np.ndarray, layout: str | None, args: NormalizeArgs, i: int) -> np.ndarray:
        channels = x.shape[0] if layout == "CHW" else x.shape[-1]
        mean = np.asarray(args.mean, dtype=np.float32)
        scale = np.asarray(args.scale, dtype=np.float32)
        for name, v in (("mean", mean), ("scale", scale)):
            if v.size not in (1, channels):
                raise ManifestError(f"preprocess[{i}].{name}: expected 1 or {channels} values (one per channel), "
                                    f"got {v.size}")
        if layout == "CHW":
            mean, scale = mean.reshape(-1, 1, 1), scale.reshape(-1, 1, 1)
        out = np.subtract(np.ascontiguousarray(x), mean, dtype=np.float32)  # one pass, written in order
        np.divide(out, scale, out=out)
        return out

    def _to_layout(self, x: np.ndarray, layout: str | None, target: str, i: int | None):
        want = "CHW" if target == "NCHW" else "HWC"
        if layout is None:
            where = f"preprocess[{i}]: " if i is not None else ""
            raise ManifestError(f"{where}to_layout after a code step: the code must return the model's layout itself")
        if x.ndim == 2:
            x = x[:, :, None] if layout == "HWC" else x[None]
        if layout != want:
            x = x.transpose(2, 0, 1) if want == "CHW" else x.transpose(1, 2, 0)
        return x, want


def _size_of(x: Any) -> tuple[int, int]:
    """``(width, height)`` of a PIL image or an HWC array."""
    if isinstance(x, Image.Image):
        return x.size
    return int(x.shape[1]), int(x.shape[0])


def fit_size(size: tuple[int, int], args: ResizeFitArgs) -> tuple[int, int]:
    """``[height, width]`` for a ``(width, height)`` image under `ResizeFitArgs` (aspect kept, then each side
    rounded to the nearest multiple of ``multiple_of``, at least one multiple)."""
    w, h = size
    scale = math.inf
    if args.short_side is not None:
        scale = args.short_side / min(w, h)
    if args.long_side is not None:
        scale = min(scale, args.long_side / max(w, h))
    m = args.multiple_of
    nh, nw = (max(m, int(round(side * scale / m)) * m) for side in (h, w))
    return nh, nw


def decode_image(image: ImageLike, color_mode: str = "RGB") -> Image.Image:
    """A fully loaded PIL image in ``RGB`` (also for BGR: the channels are swapped later) or ``L`` (GRAY).

    Raises `ImageDecodeError` for a missing, unreadable, truncated or corrupt file.
    """
    mode = _PIL_MODE[color_mode]
    if isinstance(image, np.ndarray):
        arr = image
        if arr.dtype != np.uint8:
            raise ImageDecodeError(f"an image array must be uint8 (H, W[, C]), got {arr.dtype}")
        img = Image.fromarray(arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
        return img if img.mode == mode else img.convert(mode)
    if isinstance(image, Image.Image):
        try:
            image.load()
            return image if image.mode == mode else image.convert(mode)
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad image
            raise ImageDecodeError(f"cannot decode the image: {_reason(err)}") from None
    try:
        with Image.open(image) as img:
            img.load()
            return img.convert(mode) if img.mode != mode else img.copy()
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, EOFError ...
        raise ImageDecodeError(f"cannot decode {os.fspath(image)}: {_reason(err)}") from None


def _reason(err: BaseException) -> str:
    text = str(err).split("\n")[0]
    if type(err).__name__ == "UnidentifiedImageError":
        return "not an image PIL can identify"
    if isinstance(err, FileNotFoundError):
        return "no such file"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
