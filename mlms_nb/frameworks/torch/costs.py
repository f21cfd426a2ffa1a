"""Per-layer theoretical costs of a PyTorch model, from one forward pass on an example input.

Every ATen op of the pass is seen by a ``TorchDispatchMode`` and charged to the module whose forward is running
(forward pre/post hooks keep the call stack). A *layer* is what :mod:`mlms_nb.frameworks.torch.layers` says (a
module with no children or with parameters of its own, not a pass-through such as ``nn.Identity``), as for the layer
spans; each layer call is one row, in call order. An op that runs directly in the forward of a container (a residual
add in a block, a flatten in the root) is a row of its own, named after that container, with ``layer_type`` such as
``"add (in forward of MBConvBlock)"``; views (reshape, flatten, transpose) cost nothing and get no row.

``flops_matmul_conv`` is what ``torch.utils.flop_counter.FlopCounterMode`` counts -- its own formula
registry (convolution, mm/addmm/bmm/baddbmm, the SDPA kernels) called on the same ops, with the same
fallback to ``func.decompose`` -- so its sum over the frame equals ``FlopCounterMode.get_total_flops()``.
``flops`` adds what FlopCounterMode leaves out: bias adds, BatchNorm, activations, pooling, element-wise
ops, softmax, and attention kernels missing from its registry (CPU flash attention); see ``mlms_nb.theory.flops``.
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError
from mlms_nb.frameworks.torch.layers import is_layer
from mlms_nb.theory.flops import (
    AFFINE_FLOPS_PER_ELEMENT, COMMON_COLUMNS, INFERENCE_BATCHNORM_FLOPS_PER_ELEMENT, NORM_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_ELEMENT, attention_flops, finish_frame, numel, shape_json,
)

COLUMNS = ("layer_index", "layer_name", "layer_type") + COMMON_COLUMNS

# ATen ops (names without leading/trailing "_") that move data but compute nothing.
DATA_MOVEMENT_OPS = frozenset({
    "clone", "copy", "to_copy", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "pad", "cat", "stack", "fill", "zero",
    "zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_empty", "new_full",
    "index_select", "gather", "index", "slice_scatter", "select_scatter", "repeat", "roll", "flip",
    "embedding", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "masked_select",
    "contiguous", "empty", "zeros", "ones", "full", "arange", "scalar_tensor", "local_scalar_dense",
})
VIEW_LIKE_OPS = frozenset({"unsafe_view", "alias", "detach", "lift_fresh", "set"})
REDUCTION_OPS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "norm",
                           "linalg_vector_norm", "logsumexp", "var_mean", "std_mean", "argmax", "argmin"})
POOLING_OPS = frozenset({"max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
                         "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
                         "avg_pool3d"})


# ---------------------------------------------------------------- one op's FLOPs

def _shape(value: Any) -> list[int] | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else [int(d) for d in shape]


def _first_tensor(value: Any):
    torch = require("torch")
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _tensors(values: Any) -> list:
    """Tensors in ``values`` (nested tuples, lists and dicts), each once, in order."""
    torch = require("torch")
    out, seen = [], set()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(values)
    return out


def _nbytes(t) -> int:
    return int(t.numel()) * int(t.element_size())


def op_kind_and_flops(func, args: tuple, kwargs: dict, out: Any) -> tuple[str, float, float]:
    """``(kind, flops, flops_matmul_conv)`` of one ATen op call; kind: compute | data | view | unknown.

    ``flops_matmul_conv`` is FlopCounterMode's registry formula (0 for ops outside its registry).
    """
    torch = require("torch")
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    base = packet.__name__.strip("_")
    out_tensor = _first_tensor(out)
    out_elems = numel(_shape(out_tensor))
    if packet in flop_registry:
        counted = float(flop_registry[packet](*args, **kwargs, out_val=out))
        extra = 0.0
        if base in ("convolution", "convolution_overrideable", "cudnn_convolution", "slow_conv2d_forward"):
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            extra = float(out_elems) if bias is not None else 0.0
        elif base in ("addmm", "baddbmm"):
            extra = float(out_elems)
        elif "attention" in base and "backward" not in base:
            q, k = _shape(args[0]), _shape(args[1])
            if q and k and len(q) >= 3:
                extra = float(SOFTMAX_FLOPS_PER_ELEMENT * numel(q[:-2]) * q[-2] * k[-2])
        return "compute", counted + extra, counted
    if func.is_view or base in VIEW_LIKE_OPS:
        return "view", 0.0, 0.0
    if base in DATA_MOVEMENT_OPS:
        return "data", 0.0, 0.0
    first = _first_tensor(args)
    in_elems = numel(_shape(first))
    if "scaled_dot_product" in base and "backward" not in base:  # e.g. CPU flash attention: not in the registry
        q, k, v = (_shape(a) for a in args[:3])
        if q and k and v and len(q) >= 3:
            flops, _ = attention_flops(numel(q[:-2]), q[-2], k[-2], q[-1], v[-1])
            return "compute", flops, 0.0
    if "batch_norm" in base:
        training = next((a for a in args if isinstance(a, bool)), False)
        if "no_training" in base or not training:
            return "compute", float(INFERENCE_BATCHNORM_FLOPS_PER_ELEMENT * in_elems), 0.0
        affine = AFFINE_FLOPS_PER_ELEMENT if args[1] is not None else 0
        return "compute", float((NORM_FLOPS_PER_ELEMENT + affine) * in_elems), 0.0
    if base in ("native_layer_norm", "native_group_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm"):
        weight = args[2] if base.endswith("layer_norm") else (args[1] if len(args) > 1 else None)
        affine = AFFINE_FLOPS_PER_ELEMENT if isinstance(weight, torch.Tensor) else 0
        return "compute", float((NORM_FLOPS_PER_ELEMENT + affine) * in_elems), 0.0
    if base in ("softmax", "log_softmax", "safe_softmax"):
        return "compute", float(SOFTMAX_FLOPS_PER_ELEMENT * out_elems), 0.0
    if base in POOLING_OPS:
        spatial = len(_shape(out_tensor)) - 2
        kernel = args[1] if len(args) > 1 else kwargs.get("kernel_size")
        kernel = [int(k) for k in (kernel if isinstance(kernel, (list, tuple)) else [kernel])]
        if len(kernel) == 1:
            kernel = kernel * max(spatial, 1)
        return "compute", float(out_elems * numel(kernel)), 0.0
    if "adaptive" in base and "pool" in base:
        return "compute", float(in_elems), 0.0
    if base in ("mv", "dot", "vdot", "addmv"):  # outside FlopCounterMode's registry
        mat = _shape(args[1] if base == "addmv" else args[0])
        return "compute", float(2 * numel(mat) + (out_elems if base == "addmv" else 0)), 0.0
    if torch.Tag.pointwise in func.tags:
        return "compute", float(out_elems), 0.0
    if base in REDUCTION_OPS:
        return "compute", float(in_elems), 0.0
    return "unknown", 0.0, 0.0


# ---------------------------------------------------------------- attribution to modules

@dataclass
class _Tensors:
    """Shapes and total bytes of some tensors (kept instead of the tensors, so activations can be freed)."""
    shapes: list
    nbytes: int

    @classmethod
    def of(cls, tensors: list) -> "_Tensors":
        return cls([_shape(t) for t in tensors], sum(_nbytes(t) for t in tensors))


@dataclass
class _Call:
    """One module call; for a layer, the sums of the ops it ran itself."""
    seq: int
    name: str
    module: Any
    is_layer: bool
    inputs: _Tensors
    outputs: _Tensors = field(default_factory=lambda: _Tensors([], 0))
    flops: float = 0.0
    flops_matmul_conv: float = 0.0
    moves_data: bool = False


class _Recorder:
    """Forward hooks keep the stack of running module calls; the dispatch mode charges each op to the top one."""

    def __init__(self, model):
        self.names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        self.weight_ptrs = {t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()) if t.numel()}
        self.counter = itertools.count()
        self.stack: list[_Call] = []
        self.calls: list[_Call] = []
        self.container_rows: list[dict] = []
        self.unknown_ops: set[str] = set()

    def pre_hook(self, module, args, kwargs):
        call = _Call(next(self.counter), self.names.get(id(module), ""), module, is_layer(module),
                     _Tensors.of(_tensors((args, kwargs))))
        self.stack.append(call)
        if call.is_layer:
            self.calls.append(call)

    def post_hook(self, module, args, kwargs, output):
        if self.stack and self.stack[-1].module is module:
            self.stack.pop().outputs = _Tensors.of(_tensors(output))

    def on_op(self, func, args, kwargs, out) -> None:
        try:
            kind, flops, counted = op_kind_and_flops(func, args, kwargs, out)
        except Exception as err:  # noqa: BLE001 - an odd argument layout: count nothing, say so in attrs
            kind, flops, counted = "unknown", 0.0, 0.0
            self.unknown_ops.add(f"{func} (formula failed: {type(err).__name__})")
        if kind == "view" or not self.stack:
            return
        if kind == "unknown":
            self.unknown_ops.add(str(func))
        call = self.stack[-1]
        if call.is_layer:
            call.flops += flops
            call.flops_matmul_conv += counted
            call.moves_data = True
            return
        operands = _tensors((args, kwargs))
        weights = [t for t in operands if t.numel() and t.data_ptr() in self.weight_ptrs]
        inputs = _Tensors.of([t for t in operands if not any(t is w for w in weights)])
        outputs = _Tensors.of(_tensors(out))
        self.container_rows.append({
            "seq": next(self.counter), "layer_name": call.name,
            "layer_type": f"{func._overloadpacket.__name__.strip('_')} (in forward of {type(call.module).__name__})",
            "input_shape": shape_json(inputs.shapes), "output_shape": shape_json(outputs.shapes),
            "flops": flops, "flops_matmul_conv": counted,
            "params": sum(int(t.numel()) for t in weights), "weight_bytes": sum(_nbytes(t) for t in weights),
            "input_bytes": inputs.nbytes, "output_bytes": outputs.nbytes,
        })


def _dispatch_mode(recorder: _Recorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    torch = require("torch")

    class _Mode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch keeps torch.compile out of a mode's __torch_dispatch__ by a wrapper that imports torch._dynamo
            # at the first op (about 1 s of CPU, paid by every process that works out costs); when no compiler is
            # loaded there is nothing to keep out, so the wrapper is asked for only once torch._dynamo is
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            # As FlopCounterMode does: an op outside the registry is decomposed when it can be.
            if func is not torch.ops.prim.device.default:
                with self:
                    result = func.decompose(*args, **kwargs)
                if result is not NotImplemented:
                    return result
            out = func(*args, **kwargs)
            recorder.on_op(func, args, kwargs, out)
            return out

    return _Mode()


# ---------------------------------------------------------------- rows

def _layer_row(call: _Call) -> dict:
    module = call.module
    params = list(module.parameters(recurse=False))
    buffers = [b for b in module.buffers(recurse=False) if b.is_floating_point()]
    return {
        "seq": call.seq, "layer_name": call.name, "layer_type": type(module).__name__,
        "input_shape": shape_json(call.inputs.shapes), "output_shape": shape_json(call.outputs.shapes),
        "flops": call.flops, "flops_matmul_conv": call.flops_matmul_conv,
        "params": sum(int(p.numel()) for p in params),
        "weight_bytes": sum(_nbytes(t) for t in params + buffers),
        "input_bytes": call.inputs.nbytes if call.moves_data else 0,
        "output_bytes": call.outputs.nbytes if call.moves_data else 0,
    }


def torch_layer_costs(model, example_input) -> pd.DataFrame:
    """One row per layer call (and per op run directly in a container's forward), in execution order.

    ``model``: an ``nn.Module`` (run as is, under ``torch.no_grad()``: put it in eval mode first);
    ``example_input``: a tensor, or a tuple of tensors passed as positional arguments. FLOPs and bytes
    follow ``frame.attrs["convention"]``; ``flops_matmul_conv`` sums to FlopCounterMode's total.
    """
    torch = require("torch")
    if not isinstance(model, torch.nn.Module):
        raise MlmsError(f"torch_layer_costs needs a torch.nn.Module, got {type(model).__name__}")
    inputs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise MlmsError("example_input: expected a tensor or a tuple of tensors, got "
                        f"{type(example_input).__name__}")
    recorder = _Recorder(model)
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
        handles.append(module.register_forward_hook(recorder.post_hook, with_kwargs=True, always_call=True))
    try:
        with torch.no_grad(), _dispatch_mode(recorder):
            model(*inputs)
    except MlmsError:
        raise
    except Exception as err:  # a shape mismatch, a missing argument ...
        shapes = ", ".join(str(list(t.shape)) for t in inputs)
        raise MlmsError(f"{type(model).__name__} could not run on an input of shape {shapes}: "
                        f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    finally:
        for handle in handles:
            handle.remove()
    rows = [_layer_row(c) for c in recorder.calls] + recorder.container_rows
    rows.sort(key=lambda r: r.pop("seq"))
    for index, row in enumerate(rows):
        row["layer_index"] = index
    frame = finish_frame(rows, COLUMNS, convention_extra=(
        "Rows: one per call of a layer (a module with no children or with parameters of its own), in call "
        "order; ops run directly in a container's forward (a residual add) are rows named after the container, "
        "layer_type '<op> (in forward of <Class>)'. flops_matmul_conv = what torch.utils.flop_counter."
        "FlopCounterMode counts (same registry, same ops): its sum equals FlopCounterMode's total. A layer called "
        "twice has two rows (params repeated: sum unique names for the model's parameter count). A call that "
        "runs no op (Identity, Dropout in eval) moves 0 bytes."))
    frame.attrs["framework"] = "torch"
    frame.attrs["uncounted_ops"] = sorted(recorder.unknown_ops)
    frame.attrs["input_shapes"] = [list(t.shape) for t in inputs]
    return frame
