"""Theory: what a model must compute and move, and what the machine can do -- the two sides of a roofline.

- :func:`torch_layer_costs` (a PyTorch module + example input), :func:`onnx_node_costs` (an ONNX graph) and
  :func:`model_costs` (a manifest's model in torch / onnxruntime / tensorflow): per-layer FLOPs
  (1 multiply-add = 2 FLOPs), parameters, weight/input/output bytes and arithmetic intensity (FLOP/byte).
  ``frame.attrs["convention"]`` states exactly what is counted; ``layer_name`` / ``torch_name`` is the
  PyTorch module name, the key shared across frameworks.
- :func:`machine_ceilings`: measured peak fp32 FLOP/s (GEMM) and memory bandwidth (STREAM triad) of the
  CPU or a CUDA GPU, with spread, cached per machine in the history store; ridge = peak / bandwidth.

PyTorch and onnx are imported on first use.
"""
from __future__ import annotations

from ._costs import FLOP_CONVENTION
from .ceilings import Ceilings, DeviceUnavailableError, machine_ceilings, measure_ceilings
from .flops_onnx import onnx_node_costs
from .flops_torch import torch_layer_costs
from .manifest_costs import model_costs

__all__ = ["Ceilings", "DeviceUnavailableError", "FLOP_CONVENTION", "machine_ceilings", "measure_ceilings",
           "model_costs", "onnx_node_costs", "torch_layer_costs"]
