"""Theory: per-layer FLOPs/bytes/intensity against hand formulas and FlopCounterMode; ONNX against PyTorch;
measured machine ceilings, their cache in the history store, and the errors for bad input."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from mlms_nb.errors import MlmsError, UnknownModelError  # noqa: E402
from mlms_nb.store.history import HistoryStore  # noqa: E402
from mlms_nb.naming import torch_to_keras_name  # noqa: E402
from mlms_nb.api import machine_ceilings  # noqa: E402
from mlms_nb.frameworks.costs import model_costs  # noqa: E402
from mlms_nb.frameworks.onnxruntime.costs import onnx_node_costs  # noqa: E402
from mlms_nb.frameworks.torch.costs import torch_layer_costs  # noqa: E402
from mlms_nb.theory import Ceilings, DeviceUnavailableError  # noqa: E402
from mlms_nb.theory import ceilings as ceilings_module  # noqa: E402

F32 = 4


def flop_counter_total(model, x) -> tuple[int, dict]:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops(), counter.get_flop_counts()


# ---------------------------------------------------------------- hand formulas, PyTorch

@pytest.mark.parametrize("groups", [1, 4, 8], ids=["standard", "grouped", "depthwise"])
def test_conv2d_costs_equal_the_hand_formula(groups):
    n, cin, h, w, cout, k, stride = 2, 8, 20, 20, 16 if groups != 8 else 8, 3, 2
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=1, groups=groups, bias=True).eval()
    x = torch.randn(n, cin, h, w)
    row = torch_layer_costs(conv, x).iloc[0]

    ho = wo = (h + 2 - k) // stride + 1
    macs = n * cout * ho * wo * (cin // groups) * k * k
    weights = cout * (cin // groups) * k * k + cout
    assert row.layer_type == "Conv2d" and row.layer_name == ""
    assert json.loads(row.input_shape) == [n, cin, h, w] and json.loads(row.output_shape) == [n, cout, ho, wo]
    assert row.flops_matmul_conv == 2 * macs
    assert row.flops == 2 * macs + n * cout * ho * wo  # + one add per output element for the bias
    assert row.params == weights and row.weight_bytes == weights * F32
    assert row.input_bytes == n * cin * h * w * F32 and row.output_bytes == n * cout * ho * wo * F32
    assert row.bytes == (weights + n * cin * h * w + n * cout * ho * wo) * F32
    assert row.intensity_flop_per_byte == pytest.approx(row.flops / row.bytes, rel=1e-12)
    assert row.flops_matmul_conv == flop_counter_total(conv, x)[0]


def test_linear_costs_equal_the_hand_formula():
    fc = nn.Linear(64, 10).eval()
    x = torch.randn(3, 64)
    row = torch_layer_costs(fc, x).iloc[0]
    assert row.flops_matmul_conv == 2 * 3 * 64 * 10 == flop_counter_total(fc, x)[0]
    assert row.flops == 2 * 3 * 64 * 10 + 3 * 10
    assert row.params == 64 * 10 + 10
    assert row.bytes == (64 * 10 + 10 + 3 * 64 + 3 * 10) * F32


class Block(nn.Module):
    """A residual block: the add runs in the block's own forward, outside any leaf module."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU6()

    def forward(self, x):
        return self.act(self.bn(self.conv(x))) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 3)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.gap(self.pool(self.block(x)))
        return self.softmax(self.head(torch.flatten(x, 1)))


def test_element_wise_norm_pool_and_ops_outside_layers_are_counted():
    model = Net().eval()
    x = torch.randn(2, 4, 8, 8)
    frame = torch_layer_costs(model, x)
    rows = {(r.layer_name, r.layer_type): r for r in frame.itertuples()}
    elems = 2 * 4 * 8 * 8
    assert list(frame.layer_index) == list(range(len(frame)))
    assert [r.layer_name for r in frame.itertuples()] == ["block.conv", "block.bn", "block.act", "block", "pool",
                                                          "gap", "head", "softmax"]
    assert rows[("block.bn", "BatchNorm2d")].flops == 2 * elems  # inference BatchNorm: one multiply-add
    assert rows[("block.bn", "BatchNorm2d")].weight_bytes == 4 * 4 * F32  # weight, bias, running mean and var
    assert rows[("block.act", "ReLU6")].flops == elems
    add = rows[("block", "add (in forward of Block)")]
    assert add.flops == elems and add.input_bytes == 2 * elems * F32 and add.output_bytes == elems * F32
    assert rows[("pool", "MaxPool2d")].flops == 2 * 4 * 4 * 4 * (2 * 2)  # output elements x window
    assert rows[("gap", "AdaptiveAvgPool2d")].flops == 2 * 4 * 4 * 4  # one per input element
    assert rows[("softmax", "Softmax")].flops == 5 * 2 * 3
    assert frame.flops_matmul_conv.sum() == flop_counter_total(model, x)[0]
    assert "2 FLOPs" in frame.attrs["convention"] and "write-allocate" in frame.attrs["convention"]
    assert frame.attrs["uncounted_ops"] == []


class TiedHead(nn.Module):
    """A container whose forward multiplies by a child's weight (weight tying): that op is a row of its own."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)

    def forward(self, tokens):
        return self.embed(tokens) @ self.embed.weight.T


def test_ops_in_a_container_forward_count_the_weights_they_read():
    model = TiedHead().eval()
    tokens = torch.tensor([[1, 2, 3]])
    frame = torch_layer_costs(model, tokens)
    head = frame[frame.layer_type.str.endswith("(in forward of TiedHead)")]
    assert len(head) == 1 and head.layer_name.iloc[0] == ""
    row = head.iloc[0]
    assert row.flops == row.flops_matmul_conv == 2 * 3 * 6 * 11 == flop_counter_total(model, tokens)[0]
    assert row.params == 11 * 6 and row.weight_bytes == 11 * 6 * F32
    assert row.input_bytes == 3 * 6 * F32 and row.output_bytes == 3 * 11 * F32


def test_torch_costs_reject_bad_input():
    with pytest.raises(MlmsError, match="torch.nn.Module"):
        torch_layer_costs("resnet", torch.zeros(1))
    with pytest.raises(MlmsError, match="example_input"):
        torch_layer_costs(nn.Linear(2, 2), [1, 2])
    with pytest.raises(MlmsError, match="could not run on an input of shape"):
        torch_layer_costs(nn.Linear(2, 2), torch.zeros(1, 3))


# ---------------------------------------------------------------- real models

@pytest.fixture(scope="module")
def lite0_torch():
    from mlms_nb.zoo.registry import build_torch_model

    model = build_torch_model("efficientnet_lite0")
    x = torch.zeros(1, 3, 224, 224)
    return model, x, torch_layer_costs(model, x)


def test_efficientnet_lite0_matmul_conv_flops_equal_flop_counter_mode(lite0_torch):
    model, x, frame = lite0_torch
    total, per_module = flop_counter_total(model, x)
    assert frame.flops_matmul_conv.sum() == total
    # layer by layer too: FlopCounterMode keys modules as "EfficientNet.<qualified name>"
    by_layer = frame.groupby("layer_name").flops_matmul_conv.sum()
    convs = frame[frame.flops_matmul_conv > 0]
    assert len(convs) == sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())  # each called once
    for name in convs.layer_name:
        assert by_layer[name] == sum(per_module[f"EfficientNet.{name}"].values()), name
    # every convolution against the hand formula, from the module's own attributes
    modules = dict(model.named_modules())
    for row in frame[frame.layer_type == "Conv2dStaticSamePadding"].itertuples():
        conv = modules[row.layer_name]
        n, cout, ho, wo = json.loads(row.output_shape)
        macs = n * cout * ho * wo * (conv.in_channels // conv.groups) * math.prod(conv.kernel_size)
        assert row.flops_matmul_conv == 2 * macs == row.flops, row.layer_name
    # the residual adds of the MBConv blocks are rows of their own, 1 FLOP per element
    adds = frame[frame.layer_type == "add (in forward of MBConvBlock)"]
    assert len(adds) == 9 and (adds.flops == [math.prod(json.loads(s)) for s in adds.output_shape]).all()
    assert frame.flops.sum() > total  # BatchNorm, ReLU6, pooling and the adds on top
    assert frame.params.sum() == sum(p.numel() for p in model.parameters())  # every layer called once


def test_onnx_conv_costs_agree_with_torch_per_layer(lite0_torch, models_home):
    model, _, torch_frame = lite0_torch
    onnx_frame = model_costs("efficientnet_lite0", "onnxruntime")
    assert onnx_frame.attrs["uncounted_ops"] == [] and onnx_frame.attrs["nodes_without_shapes"] == []
    assert onnx_frame.flops_matmul_conv.sum() == torch_frame.flops_matmul_conv.sum()
    torch_convs = torch_frame[torch_frame.layer_type == "Conv2dStaticSamePadding"]
    convs = onnx_frame[onnx_frame.op_type == "Conv"].merge(
        torch_convs, left_on="torch_name", right_on="layer_name", suffixes=("_onnx", "_torch"), validate="1:1")
    assert len(convs) == sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert (convs.flops_matmul_conv_onnx == convs.flops_matmul_conv_torch).all()
    assert (convs.output_shape_onnx == convs.output_shape_torch).all()
    assert (convs.output_bytes_onnx == convs.output_bytes_torch).all()
    # the exporter folded each BatchNorm into its Conv: one bias per output channel more, 1 FLOP per output
    channels = [json.loads(s)[1] for s in convs.output_shape_torch]
    assert (convs.params_onnx == convs.params_torch + channels).all()
    out_elems = [math.prod(json.loads(s)) for s in convs.output_shape_torch]
    assert (convs.flops_onnx == convs.flops_torch + out_elems).all()
    # the node names map back to real modules, Gemm included
    gemm = onnx_frame[onnx_frame.op_type == "Gemm"].iloc[0]
    assert gemm.torch_name == "_fc" and gemm.flops_matmul_conv == 2 * 1280 * 1000


def test_model_costs_for_tensorflow_reuse_torch_with_keras_names(lite0_torch):
    _, _, torch_frame = lite0_torch
    tf_frame = model_costs("efficientnet_lite0", "tf", batch_size=2)
    assert tf_frame.attrs["framework"] == "tensorflow" and "Keras" in tf_frame.attrs["note"]
    assert (tf_frame.keras_name == [torch_to_keras_name(n) for n in tf_frame.layer_name]).all()
    assert "_blocks__0___depthwise_conv" in set(tf_frame.keras_name)
    assert tf_frame.flops_matmul_conv.sum() == 2 * torch_frame.flops_matmul_conv.sum()  # batch 2


def test_model_costs_reject_bad_input():
    with pytest.raises(UnknownModelError, match="unknown model"):
        model_costs("no_such_model")
    with pytest.raises(MlmsError, match="framework 'caffe'"):
        model_costs("efficientnet_lite0", framework="caffe")
    with pytest.raises(MlmsError, match="batch_size"):
        model_costs("efficientnet_lite0", batch_size=0)
    with pytest.raises(UnknownModelError, match="tensorflow"):
        model_costs("resnet50", framework="tensorflow")  # resnet50 has no Keras copy


# ---------------------------------------------------------------- hand formulas, ONNX

def _graph_with_every_formula():
    init = [
        numpy_helper.from_array(torch.randn(16, 2, 3, 3).numpy(), "W"),
        numpy_helper.from_array(torch.randn(16).numpy(), "B"),
        *[numpy_helper.from_array(torch.ones(16).numpy(), name) for name in ("scale", "bias", "mean", "var")],
        numpy_helper.from_array(torch.randn(10, 16).numpy(), "G"),
        numpy_helper.from_array(torch.randn(10).numpy(), "Gb"),
        numpy_helper.from_array(torch.randn(8, 6).numpy(), "M"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="/conv/Conv", group=4, pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="/bn/BN"),
        helper.make_node("Relu", ["bn"], ["r"], name="/act/Relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="/pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="/gap/GlobalAveragePool"),
        helper.make_node("Flatten", ["g"], ["f"], name="/Flatten"),
        helper.make_node("Gemm", ["f", "G", "Gb"], ["y"], name="/fc/Gemm", transB=1),
        helper.make_node("Softmax", ["y"], ["probs"], name="/Softmax", axis=1),
        helper.make_node("MatMul", ["a", "M"], ["mm"], name="/proj/MatMul"),
        helper.make_node("Attention", ["q", "k", "v"], ["att"], name="/attn/Attention"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 10, 10]),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 3, 4, 8]),
              helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", 4, 5, 8]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch", 4, 7, 8]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch", 4, 7, 16])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("probs", "mm", "att")]
    graph = helper.make_graph(nodes, "formulas", inputs, outputs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_onnx_node_costs_equal_the_hand_formulas(tmp_path):
    path = tmp_path / "formulas.onnx"
    onnx.save(_graph_with_every_formula(), str(path))
    frame = onnx_node_costs(path, batch_size=2)
    rows = {r.op_type: r for r in frame.itertuples()}
    conv_macs = 2 * 16 * 10 * 10 * (8 // 4) * 3 * 3
    assert rows["Conv"].flops_matmul_conv == 2 * conv_macs
    assert rows["Conv"].flops == 2 * conv_macs + 2 * 16 * 10 * 10
    assert rows["Conv"].params == 16 * 2 * 3 * 3 + 16
    assert rows["Conv"].bytes == (16 * 2 * 9 + 16 + 2 * 8 * 10 * 10 + 2 * 16 * 10 * 10) * F32
    assert rows["Conv"].torch_name == "conv" and rows["Flatten"].torch_name == ""
    assert rows["BatchNormalization"].flops == 2 * 2 * 16 * 10 * 10
    assert rows["Relu"].flops == 2 * 16 * 10 * 10
    assert rows["MaxPool"].flops == 2 * 16 * 5 * 5 * 4
    assert rows["GlobalAveragePool"].flops == 2 * 16 * 5 * 5
    assert rows["Flatten"].flops == 0 and rows["Flatten"].bytes == 0  # a view moves nothing
    assert rows["Gemm"].flops_matmul_conv == 2 * 2 * 16 * 10 and rows["Gemm"].flops == 2 * 2 * 16 * 10 + 2 * 10
    assert rows["Softmax"].flops == 5 * 2 * 10
    assert rows["MatMul"].flops == 2 * (2 * 3 * 4 * 6) * 8
    assert rows["Attention"].flops_matmul_conv == 2 * (2 * 4) * 5 * 7 * (8 + 16)
    assert rows["Attention"].flops == 2 * (2 * 4) * 5 * 7 * (8 + 16) + 5 * (2 * 4) * 5 * 7
    assert json.loads(rows["Attention"].output_shape) == [2, 4, 5, 16]
    assert frame.attrs["input_shapes"]["x"] == [2, 8, 10, 10]
    for op, row in rows.items():
        if row.bytes:
            assert row.intensity_flop_per_byte == pytest.approx(row.flops / row.bytes), op


def test_onnx_node_costs_reject_bad_input(tmp_path):
    model = _graph_with_every_formula()
    with pytest.raises(MlmsError, match="'nope', not an input"):
        onnx_node_costs(model, {"nope": [1, 2]})
    with pytest.raises(MlmsError, match=r"input_shapes\['x'\]: expected 4 positive sizes"):
        onnx_node_costs(model, {"x": [1, 8, 10]})
    with pytest.raises(MlmsError, match="does not exist"):
        onnx_node_costs(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(MlmsError, match="not a readable ONNX model"):
        onnx_node_costs(tmp_path / "junk.onnx")
    with pytest.raises(MlmsError, match="batch_size"):
        onnx_node_costs(model, batch_size=0)


# ---------------------------------------------------------------- machine ceilings

@pytest.fixture(scope="module")
def ceilings_store(tmp_path_factory):
    """A history store of its own, and a count of real measurements made through machine_ceilings."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ceilings') / 'history.sqlite'}"
    calls = []
    real = ceilings_module.measure_ceilings
    mp = pytest.MonkeyPatch()
    mp.setattr(ceilings_module, "measure_ceilings",
               lambda device, **kw: calls.append(device) or real(device, **kw))
    ceilings_module._memo.clear()
    yield url, calls
    mp.undo()
    ceilings_module._memo.clear()


def test_cpu_ceilings_are_measured_plausible_and_cached(ceilings_store):
    url, calls = ceilings_store
    first = machine_ceilings("cpu", url=url)
    assert calls == ["cpu"]
    assert first.ridge_flop_per_byte == pytest.approx(first.peak_flops_per_s / first.bandwidth_bytes_per_s, rel=1e-12)
    assert 1e8 < first.peak_flops_per_s < 1e14  # 0.1 GFLOP/s .. 100 TFLOP/s
    assert 1e8 < first.bandwidth_bytes_per_s < 1e13  # 0.1 GB/s .. 10 TB/s
    assert first.peak_flops_iqr >= 0 and first.bandwidth_iqr >= 0
    assert first.threads == torch.get_num_threads() and len(first.stack_hash) == 16
    assert first.framework == "torch" and first.dtype == "float32"
    assert "torch.matmul" in first.method and "conv2d" in first.method and "12 bytes" in first.method

    assert machine_ceilings("cpu", url=url) is first  # this process's memo: no new measurement
    ceilings_module._memo.clear()
    loaded = machine_ceilings("cpu", url=url)  # from the history store: no new measurement
    if first.busy:  # measured while other programs took the CPU (the suite's other workers): measured again
        assert loaded.measured_at > first.measured_at and calls == ["cpu", "cpu"]
    else:
        assert loaded == first and calls == ["cpu"]
    stored = HistoryStore(url).ceilings()
    key = f"cpu/torch/{torch.get_num_threads()}/float32"
    assert set(stored.metric) == {f"{key}/peak_flops_per_s", f"{key}/bandwidth_bytes_per_s",
                                  f"{key}/ridge_flop_per_byte"}

    measured = len(calls)
    again = machine_ceilings("cpu", url=url, refresh=True)
    assert len(calls) == measured + 1 and again.measured_at > loaded.measured_at
    assert HistoryStore(url).load_ceilings(first.stack_hash, key)["measured_at"] == again.measured_at
    assert machine_ceilings("cpu", url=url) is again


def test_ceilings_show_their_units():
    c = Ceilings(device="cpu", peak_flops_per_s=1.2e11, peak_flops_iqr=2e9, bandwidth_bytes_per_s=2e10,
                 bandwidth_iqr=1e9, ridge_flop_per_byte=6.0, method="how", measured_at="2026-01-01T00:00:00+00:00",
                 stack_hash="0123456789abcdef", device_name="test CPU", threads=2)
    text = str(c)
    assert "120.0 GFLOP/s (IQR 2.0)" in text and "20.0 GB/s (IQR 1.0)" in text and "6.00 FLOP/byte" in text
    frame = c.to_frame()
    assert list(frame.unit) == ["FLOP/s", "bytes/s", "FLOP/byte"] and "torch, 2 threads, float32" in text
    assert "FLOP/s" in c._repr_html_() and "IQR" in c._repr_html_()
    assert Ceilings.from_dict(c.to_dict()) == c


def test_gpu_theoretical_numbers_follow_the_data_sheet():
    # H100 SXM: 132 SMs x 128 fp32 lanes x 2 x 1980 MHz; HBM3 2619 MHz (NVML) x 2 x 5120 bits / 8
    flops, bandwidth = ceilings_module.gpu_theoretical(132, (9, 0), 1980, 2619, 5120)
    assert flops == pytest.approx(66.9e12, rel=1e-3) and bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert ceilings_module.gpu_theoretical(10, (99, 0), 1000, None, None) == (None, None)


def test_bad_or_unavailable_devices_say_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    with pytest.raises(MlmsError, match="device 'tpu': expected 'cpu', 'cuda' or 'cuda:N'"):
        machine_ceilings("tpu", url=url)
    with pytest.raises(MlmsError, match="expected 'cpu'"):
        machine_ceilings("cuda:x", url=url)
    if torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="CUDA device"):
            machine_ceilings(f"cuda:{torch.cuda.device_count()}", url=url)
    else:
        with pytest.raises(DeviceUnavailableError, match="CPU-only build|no CUDA device is visible"):
            machine_ceilings("cuda", url=url)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the GPU path is covered on one")
def test_gpu_ceilings_are_measured_with_theoretical_numbers():
    c = ceilings_module.measure_ceilings("cuda")
    assert c.device == "cuda:0" and 1e11 < c.peak_flops_per_s < 1e15 and 1e10 < c.bandwidth_bytes_per_s < 1e14
    assert c.ridge_flop_per_byte == pytest.approx(c.peak_flops_per_s / c.bandwidth_bytes_per_s)
    if c.theoretical_peak_flops_per_s:
        assert c.peak_flops_per_s < 1.1 * c.theoretical_peak_flops_per_s
    if c.theoretical_bandwidth_bytes_per_s:
        assert c.bandwidth_bytes_per_s < 1.1 * c.theoretical_bandwidth_bytes_per_s
