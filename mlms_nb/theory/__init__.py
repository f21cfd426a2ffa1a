"""Theory: the counting conventions of a roofline and what the machine can do.

- :data:`FLOP_CONVENTION` and the cost helpers in :mod:`.flops`: per-layer FLOPs (1 multiply-add = 2 FLOPs),
  parameters, weight/input/output bytes and arithmetic intensity (FLOP/byte). Each framework's cost model
  lives in its folder (:mod:`mlms_nb.frameworks.torch.costs`, :mod:`mlms_nb.frameworks.onnxruntime.costs`);
  :func:`mlms_nb.frameworks.costs.model_costs` picks one for a manifest.
- :func:`machine_ceilings`: measured peak fp32 FLOP/s and memory bandwidth per framework, thread count and dtype
  (on the CPU that framework's own GEMM, convolution and STREAM add, :mod:`.kernels`; on a CUDA GPU torch's GEMM
  and triad), with spread; the caller passes where to cache them (the facade passes the history store);
  ridge = peak / bandwidth.

The frameworks are imported on first use.
"""
from __future__ import annotations

from mlms_nb.theory.flops import FLOP_CONVENTION
from mlms_nb.theory.ceilings import Ceilings, DeviceUnavailableError, machine_ceilings, measure_ceilings

__all__ = ["Ceilings", "DeviceUnavailableError", "FLOP_CONVENTION", "machine_ceilings", "measure_ceilings"]
