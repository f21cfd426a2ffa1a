"""A PyTorch model -> ONNX, by whichever exporter works for it, each attempt and its error recorded.

Routes, in order: ``legacy`` (``torch.onnx.export(dynamo=False)``, the TorchScript exporter: node names keep the
module scopes, ``/layer1/layer1.0/conv1/Conv``, which is what lines the layers up across frameworks) and
``dynamo`` (``torch.onnx.export(dynamo=True)``, through ``torch.export``; needs ``onnxscript``; its nodes carry
their module path in ``metadata_props["pkg.torch.onnx.name_scopes"]``, from which :func:`scope_dynamo_names`
renames them the legacy way, so both routes line up the same). A route that raises, or whose graph's outputs differ from PyTorch's on the example inputs by more
than ``tolerance`` (relative to max |output|), is recorded as failed and the next is tried. Constants are folded
(:func:`mlms_nb.frameworks.convert.fold_constants`), so every node left is a real layer op.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError

ROUTES = ("legacy", "dynamo")
OPSET = 17
INPUT_NAME, OUTPUT_NAME = "input", "logits"


class ConversionError(MlmsError):
    """No route converted a model (the message names the model and each route's error)."""


@dataclass
class Attempt:
    """One try of one route: whether it worked, how long it took (s), its error, its max |output difference|."""
    route: str
    ok: bool
    seconds: float
    error: str = ""
    max_abs_diff: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class OnnxExport:
    """The ONNX file written, the route that wrote it, every attempt, and the PyTorch module names."""
    path: Path
    route: str
    attempts: list[Attempt] = field(default_factory=list)
    module_names: list[str] = field(default_factory=list)
    max_abs_diff: float = float("nan")


def _as_tuple(example_inputs) -> tuple:
    torch = require("torch")
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    return tuple(torch.as_tensor(np.asarray(t)) if not isinstance(t, torch.Tensor) else t for t in items)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at 2 for the block: the TorchScript exporter prints the whole graph to stdout
    when it fails (torch 2.13 checks ``_jit_is_onnx_log_enabled`` without calling it, so its log is always on),
    which would corrupt ``mlms eval --json``'s output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _export(route: str, module, args: tuple, out: Path, dynamic: Sequence[Sequence[int]] = ()) -> None:
    """Export by ``route``; the batch axis (0) of every input is dynamic, and so is each axis in ``dynamic[i]``
    of input ``i`` (a sequence length, an image size)."""
    torch = require("torch")
    axes = [sorted({0, *(dynamic[i] if i < len(dynamic) else ())}) for i in range(len(args))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        names = [INPUT_NAME] if len(args) == 1 else [f"input_{i}" for i in range(len(args))]
        if route == "legacy":
            spec = {n: {a: ("batch" if a == 0 else f"{n}_{a}") for a in ax} for n, ax in zip(names, axes)}
            rank = np.ndim(_torch_out(module, args))
            # an input axis that varies may make any output axis vary: each is named, so none is fixed
            spec[OUTPUT_NAME] = {a: ("batch" if a == 0 else f"{OUTPUT_NAME}_{a}")
                                 for a in (range(rank) if any(len(ax) > 1 for ax in axes) else (0,))}
            with stdout_to_stderr():
                torch.onnx.export(module, args, str(out), dynamo=False, opset_version=OPSET, input_names=names,
                                  output_names=[OUTPUT_NAME], do_constant_folding=True, dynamic_axes=spec)
        else:
            require("onnxscript", "the dynamo ONNX exporter")
            # Dim.DYNAMIC: torch.export infers each axis's range (a model may bound a sequence by its position
            # table) and fails instead of specialising it to the example's size
            shapes = tuple({a: torch.export.Dim.DYNAMIC for a in ax} for ax in axes)
            with stdout_to_stderr():  # its progress lines are printed
                program = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=[OUTPUT_NAME],
                                            dynamic_shapes=shapes, optimize=True, verbose=False)
            program.save(str(out))
            scope_dynamo_names(out)


def scope_dynamo_names(path: Path) -> int:
    """Rename the nodes of a dynamo export ``/<module path>/<Op>_<n>`` from their ``name_scopes`` metadata, as the
    legacy exporter names them (``/layer1/0/relu_2/Relu_7``: the third call of ``layer1.0.relu``); returns how many
    were renamed. A module's next call starts when its first op's kind comes again (exact for one-op modules such
    as activations; a multi-op module called twice is split where its first op repeats)."""
    import ast

    onnx = require("onnx")
    model = onnx.load(str(path))
    calls: dict[str, int] = {}
    first_op: dict[str, str] = {}
    seen_in_call: dict[str, set] = {}
    renamed = 0
    for n, node in enumerate(model.graph.node):
        meta = {m.key: m.value for m in node.metadata_props}
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
        except (ValueError, SyntaxError):
            continue
        module = next((q for q in reversed(scopes[:-1]) if q), "") if len(scopes) > 1 else ""
        leaf = re.sub(r"_\d+$", "", str(scopes[-1])) if scopes else node.op_type
        if module:
            if module not in first_op:
                first_op[module], calls[module], seen_in_call[module] = leaf, 0, set()
            elif leaf == first_op[module] and leaf in seen_in_call[module]:
                calls[module] += 1
                seen_in_call[module] = set()
            seen_in_call[module].add(leaf)
        parts = module.split(".") if module else []
        if parts and calls.get(module):
            parts[-1] = f"{parts[-1]}_{calls[module]}"
        node.name = "/" + "".join(f"{p}/" for p in parts) + f"{node.op_type}_{n}"
        renamed += 1
    onnx.save(model, str(path))
    return renamed


def _outputs_differ(module, args: tuple, path: Path, dynamic: Sequence[Sequence[int]] = ()) -> float:
    """Max |ONNX Runtime output - PyTorch output| on ``args`` with the batch doubled and every ``dynamic`` axis one
    shorter (so each dynamic axis is exercised at another size than the export's)."""
    torch = require("torch")
    ort = require("onnxruntime")
    doubled = []
    for i, a in enumerate(args):
        a = torch.cat([a, a.flip(0) * 0.5 + 0.1]) if a.is_floating_point() else torch.cat([a, a.flip(0)])
        for axis in (dynamic[i] if i < len(dynamic) else ()):
            if a.shape[axis] >= 2:
                a = a.narrow(axis, 0, a.shape[axis] - 1)
        doubled.append(a)
    with torch.no_grad():
        expected = module(*doubled)
    expected = expected[0] if isinstance(expected, (tuple, list)) else expected
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), doubled)}
    actual = session.run(None, feed)[0]
    return float(np.max(np.abs(actual - expected.detach().numpy())))


def first_cause(text: str) -> str:
    """The line of an exporter's error that says what went wrong: the dynamo exporter's first line is a generic
    "Failed to convert ... step 3/3", its cause the first line under "## Exception summary"; colour codes removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    line = next((x for x in text.splitlines() if x.strip()), "")
    return re.sub(r"^<class '(?:[\w.]+\.)?(\w+)'>: ", r"\1: ", line.strip())


def torch_to_onnx(module, example_inputs, out: Path, routes: Sequence[str] = ROUTES, tolerance: float = 1e-4,
                  label: str | None = None, dynamic_axes: Sequence[Sequence[int]] = ()) -> OnnxExport:
    """Export ``module`` (an ``nn.Module`` in eval mode, or a loaded TorchScript module) to ``out``.

    ``example_inputs``: a tensor (or array), or a tuple of them, with a batch axis first; a batch of 2 or more, and
    at least 2 positions along each of ``dynamic_axes[i]`` (input ``i``'s axes besides the batch whose size varies),
    or the dynamo route specialises that axis to the example's size. Returns the export, with every attempt; raises
    :class:`ConversionError` naming the model and each route's error when none works."""
    from mlms_nb.frameworks.convert import fold_constants

    onnx = require("onnx")
    torch = require("torch")
    label = label or type(module).__name__
    if isinstance(module, torch.nn.Module):
        module.eval()
    args = _as_tuple(example_inputs)
    attempts: list[Attempt] = []
    for route in routes:
        if route not in ROUTES:
            raise MlmsError(f"unknown ONNX export route {route!r}; expected some of {', '.join(ROUTES)}")
        started = time.perf_counter()
        try:
            _export(route, module, args, out, dynamic_axes)
            fold_constants(out)
            onnx.checker.check_model(str(out), full_check=True)
            diff = _outputs_differ(module, args, out, dynamic_axes)
        except Exception as err:  # noqa: BLE001 - every exporter failure is recorded, then the next route is tried
            line = first_cause(str(err))
            where = traceback.extract_tb(err.__traceback__)[-1]
            attempts.append(Attempt(route, False, time.perf_counter() - started,
                                    f"{type(err).__name__}: {line[:300]} (at {Path(where.filename).name}:{where.lineno})"))
            continue
        scale = max(1.0, float(np.max(np.abs(_torch_out(module, args)))))
        ok = diff <= tolerance * scale
        attempts.append(Attempt(route, ok, time.perf_counter() - started,
                                "" if ok else f"outputs differ from PyTorch by {diff:.3g} (tolerance {tolerance:g} x "
                                              f"{scale:.3g})", diff))
        if ok:
            names = [n for n, _ in module.named_modules() if n] if hasattr(module, "named_modules") else []
            return OnnxExport(out, route, attempts, names, diff)
    tried = "; ".join(f"{a.route}: {a.error}" for a in attempts)
    raise ConversionError(f"{label}: no route exported it to ONNX ({tried})")


def _torch_out(module, args) -> np.ndarray:
    torch = require("torch")
    with torch.no_grad():
        y = module(*args)
    return (y[0] if isinstance(y, (tuple, list)) else y).detach().numpy()


def load_torch_file(path: Path) -> Any:
    """A TorchScript file (``torch.jit.load``) or a ``torch.export`` program (``.pt2``, its module). Both run code
    the file brings: the caller decides whether the file is trusted."""
    torch = require("torch")
    if path.suffix == ".pt2":
        return torch.export.load(str(path)).module()
    return torch.jit.load(str(path), map_location="cpu").eval()
