"""The timeline panel's links on a GPU-shaped trace: a kernel leads to the runtime call that launched it
(correlation id), the op that launched it (external id), and that op's layer; and back from the layer."""
from __future__ import annotations

from mlms_nb.server import lod
from mlms_nb.schema.trace import spans_frame
from mlms_nb.tracing.trace import Trace


def test_kernel_links_to_its_launch_op_and_layer(tmp_path):
    # the shape CUPTI + torch.profiler give one conv on a GPU (times in ns on one clock)
    spans = spans_frame({
        "trace_id": ["t"] * 4, "span_id": [1, 2, 3, 4], "parent_id": [0, 1, 2, 0],
        "name": ["features.0", "aten::conv2d", "cudaLaunchKernel", "implicit_gemm_fprop"],
        "level": ["FRAMEWORK", "ML_LIBRARY", "SYSTEM_LIBRARY", "SYSTEM_LIBRARY"],
        "kind": ["layer", "op", "runtime", "kernel"],
        "start_ns": [1_000, 1_100, 1_200, 5_000], "end_ns": [9_000, 8_000, 1_900, 7_000],
        "thread": [11, 11, 11, 0], "device": ["cpu", "cpu", "cpu", "cuda:0"], "stream": [-1, -1, -1, 7],
        "correlation": [-1, -1, 77, 77], "external_id": [-1, 10, 10, 10],
    })
    folder = Trace(spans, None, {"source": "test"}).save(tmp_path / "trace")
    index = lod.open_index(folder)
    assert index.meta["has_correlation"]
    kernel = index.search("implicit_gemm")["first"][0]
    got = {r["name"]: r["relation"] for r in index.links(kernel["ref"])["related"]}
    assert got["cudaLaunchKernel"].startswith("correlated")
    assert got["aten::conv2d"] in ("same external id (op / device work)", "parent of linked")
    assert got["features.0"] in ("ancestor", "parent of linked")
    assert index.meta["tracks"][kernel["track"]]["device"] == "cuda:0"
    layer = index.search("features.0")["first"][0]
    back = {r["name"]: r["relation"] for r in index.links(layer["ref"])["related"]}
    assert back["aten::conv2d"] == "child"
