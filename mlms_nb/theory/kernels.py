"""Each framework's own best kernels on the CPU, timed: the ceilings a layer of that framework can reach.

A roofline's ceilings must hold for the framework whose layers are plotted under them: ONNX Runtime's blocked
(NCHWc) convolutions outrun a torch GEMM on the same machine, so one framework's GEMM is no ceiling for another's
layers. Per framework, with the evaluation's intra-op thread count, fp32:

- ``gemm``: an n x n MatMul (2 n^3 FLOPs), n >= 1024 (smaller GEMMs run far below peak) calibrated so one call
  takes ~``TARGET_S``;
- ``conv``: a 3x3 convolution, stride 1, same padding, ``CONV_CHANNELS`` channels in and out, batch 1, H = W
  calibrated likewise (2 x 9 x C_in x C_out x H x W FLOPs);
- ``copy``: STREAM's add, ``c = a + b`` on float32 arrays of ``array_bytes`` each (12 bytes per element: reads a
  and b, writes c; write-allocate not counted); TensorFlow adds in place (``a += b``, the same 12 bytes), since a
  fresh output per call would time its allocation.

torch: ``torch.matmul`` / ``torch.nn.functional.conv2d`` / ``torch.add(out=)``; ONNX Runtime: a one-node graph
per kernel in a session at ORT_ENABLE_ALL (so Conv runs as the NCHWc kernel the model's convolutions use), the
copy's output bound once through IOBinding; TensorFlow: ``tf.function`` of ``tf.linalg.matmul`` /
``tf.nn.conv2d`` (NHWC) / ``Variable.assign_add``. Each kernel: a warm-up, then repetitions until ``repetitions`` or
``budget_s`` (at least ``MIN_REPETITIONS``). The frameworks are imported on first use.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError

FRAMEWORKS = ("torch", "onnxruntime", "tensorflow")
TARGET_S = 0.08
CONV_CHANNELS = 128
REPETITIONS = 5
MIN_REPETITIONS = 3
BUDGET_S = 0.6
COPY_BYTES_PER_ELEMENT = 12  # float32 c = a + b: read a, read b, write c


@dataclass(frozen=True)
class KernelTiming:
    """Per-repetition rates of one kernel: ``unit`` FLOP/s (gemm, conv) or bytes/s (copy); ``how`` says what ran."""
    kernel: str
    unit: str
    rates: tuple[float, ...]
    how: str


Runner = Callable[[], object]


def _seconds(run: Runner) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _rates(run: Runner, amount: float, repetitions: int, budget_s: float) -> tuple[float, ...]:
    run()  # warm-up (ORT and TF plan and allocate on the first call)
    started, out = time.perf_counter(), []
    for _ in range(repetitions):
        out.append(amount / max(_seconds(run), 1e-9))
        if len(out) >= MIN_REPETITIONS and time.perf_counter() - started > budget_s:
            break
    return tuple(out)


def _fastest(probe: Runner) -> float:
    """Seconds of the fastest of a few calls after a warm-up: a busy moment must not make the kernel tiny."""
    probe()
    return max(min(_seconds(probe) for _ in range(3)), 1e-9)


def _gemm_size(make: Callable[[int], Runner]) -> int:
    rate = 2 * 512**3 / _fastest(make(512))
    return int(min(max(round((TARGET_S * rate / 2) ** (1 / 3) / 256) * 256, 1024), 4096))


def _conv_side(make: Callable[[int], Runner]) -> int:
    per_pixel = 2 * 9 * CONV_CHANNELS**2
    rate = per_pixel * 56 * 56 / _fastest(make(56))
    return int(min(max(round((TARGET_S * rate / per_pixel) ** 0.5 / 8) * 8, 56), 112))


# ------------------------------------------------------------------------------------------ each framework

def _torch_kernels(threads: int | None):
    torch = require("torch", "measuring torch's ceilings")

    def gemm(n):
        a, b, c = torch.rand(n, n), torch.rand(n, n), torch.empty(n, n)
        return lambda: torch.matmul(a, b, out=c)

    def conv(h):
        x, w = torch.rand(1, CONV_CHANNELS, h, h), torch.rand(CONV_CHANNELS, CONV_CHANNELS, 3, 3)
        return lambda: torch.nn.functional.conv2d(x, w, padding=1)

    def copy(n):
        a, b, c = torch.full((n,), 1.0), torch.full((n,), 2.0), torch.zeros(n)
        return lambda: torch.add(a, b, out=c)

    where = f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
    names = ("torch.matmul(out=)", "torch.nn.functional.conv2d (NCHW)", "torch.add(a, b, out=c)")
    return (gemm, conv, copy), names, where, torch.inference_mode


def _ort_kernels(threads: int | None):
    ort = require("onnxruntime", "measuring ONNX Runtime's ceilings")
    onnx = require("onnx", "measuring ONNX Runtime's ceilings")
    from onnx import TensorProto, helper

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = int(threads)

    def session(node, inputs, output):
        graph = helper.make_graph([node], "ceiling", inputs, [output])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = min(model.ir_version, 9)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def tensor(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    def gemm(n):
        s = session(helper.make_node("MatMul", ["a", "b"], ["c"]), [tensor("a", [n, n]), tensor("b", [n, n])],
                    tensor("c", [n, n]))
        feed = {"a": np.random.rand(n, n).astype(np.float32), "b": np.random.rand(n, n).astype(np.float32)}
        return lambda: s.run(None, feed)

    def conv(h):
        c = CONV_CHANNELS
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        s = session(node, [tensor("x", [1, c, h, h]), tensor("w", [c, c, 3, 3])], tensor("y", [1, c, h, h]))
        feed = {"x": np.random.rand(1, c, h, h).astype(np.float32), "w": np.random.rand(c, c, 3, 3).astype(np.float32)}
        return lambda: s.run(None, feed)

    def copy(n):
        s = session(helper.make_node("Add", ["a", "b"], ["c"]), [tensor("a", [n]), tensor("b", [n])], tensor("c", [n]))
        a, b, c = np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32), np.zeros(n, np.float32)
        binding = s.io_binding()
        binding.bind_cpu_input("a", a)
        binding.bind_cpu_input("b", b)
        binding.bind_output("c", "cpu", 0, np.float32, [n], c.ctypes.data)
        return lambda keep=(a, b, c): s.run_with_iobinding(binding)  # the binding holds pointers into a, b and c

    where = (f"onnxruntime {ort.__version__} (onnx {onnx.__version__}), CPUExecutionProvider, ORT_ENABLE_ALL, "
             f"{threads or 'default'} intra-op threads")
    names = ("a one-node MatMul session", "a one-node Conv session (NCHWc after ORT_ENABLE_ALL)",
             "a one-node Add session, output bound once (IOBinding)")
    return (gemm, conv, copy), names, where, None


def _tf_kernels(threads: int | None):
    tf = require("tensorflow", "measuring TensorFlow's ceilings")
    pool = tf.config.threading.get_intra_op_parallelism_threads() or None
    if threads and pool is None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            pool = int(threads)
        except RuntimeError:  # TensorFlow's runtime already started with its default pool
            pool = None
    if threads and int(threads) != pool:
        raise MlmsError(f"TensorFlow's intra-op pool already runs with {pool or 'its default number of'} threads, not "
                        f"the {threads} asked for: its ceilings can only be measured with the threads it runs with")

    def gemm(n):
        a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
        f = tf.function(tf.linalg.matmul)  # operands passed in, so nothing is folded into a constant
        return lambda: f(a, b).numpy()

    def conv(h):
        x, w = tf.random.uniform((1, h, h, CONV_CHANNELS)), tf.random.uniform((3, 3, CONV_CHANNELS, CONV_CHANNELS))
        f = tf.function(lambda x, w: tf.nn.conv2d(x, w, strides=1, padding="SAME"))
        return lambda: f(x, w).numpy()

    def copy(n):
        a, b = tf.Variable(tf.fill((n,), 1.0)), tf.fill((n,), 2.0)
        @tf.function
        def f(b):
            a.assign_add(b, read_value=False)  # in place: no 4n-byte output allocated per call

        return lambda: f(b)

    where = f"tensorflow {tf.__version__}, {pool or 'default'} intra-op threads"
    names = ("tf.function(tf.linalg.matmul)", "tf.function(tf.nn.conv2d) (NHWC)",
             "tf.function(a.assign_add(b)) on a tf.Variable a, in place")
    return (gemm, conv, copy), names, where, None


def kernel_timings(framework: str, threads: int | None, array_bytes: int, *, repetitions: int = REPETITIONS,
                   budget_s: float = BUDGET_S) -> tuple[list[KernelTiming], str]:
    """The GEMM, convolution and copy of ``framework`` timed on the CPU now; and where they ran (version, threads)."""
    build = {"torch": _torch_kernels, "onnxruntime": _ort_kernels, "tensorflow": _tf_kernels}.get(framework)
    if build is None:
        raise MlmsError(f"framework {framework!r}: ceilings are measured for {', '.join(FRAMEWORKS)}")
    (gemm, conv, copy), names, where, context = build(threads)
    with (context() if context else _nothing()):
        n = _gemm_size(gemm)
        gemm_rates = _rates(gemm(n), 2.0 * n**3, repetitions, budget_s)
        h = _conv_side(conv)
        conv_rates = _rates(conv(h), 2.0 * 9 * CONV_CHANNELS**2 * h * h, repetitions, budget_s)
        elements = array_bytes // 4
        copy_rates = _rates(copy(elements), float(COPY_BYTES_PER_ELEMENT * elements), repetitions, budget_s)
    c = CONV_CHANNELS
    return [
        KernelTiming("gemm", "FLOP/s", gemm_rates, f"fp32 GEMM {n} x {n} ({names[0]}; 2*{n}^3 FLOPs)"),
        KernelTiming("conv", "FLOP/s", conv_rates, f"fp32 3x3 convolution {c}->{c} channels on 1x{c}x{h}x{h} "
                                                   f"({names[1]}; 2*9*{c}*{c}*{h}*{h} FLOPs)"),
        KernelTiming("copy", "bytes/s", copy_rates, f"STREAM add c = a + b on float32 arrays of "
                                                    f"{array_bytes / 2**20:.0f} MiB each ({names[2]}; 12 bytes "
                                                    "per element, write-allocate not counted)"),
    ], where


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
