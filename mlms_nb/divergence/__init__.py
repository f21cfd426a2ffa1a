"""Cross-framework divergence: the same model in two or three frameworks (and an INT8 copy) on the same
inputs, compared layer by layer, with each layer's latency beside its error.

``diverge("efficientnet_lite0", frameworks=("torch", "onnxruntime", "tensorflow"))`` -> :class:`Divergence`.
Frameworks are imported only when a divergence runs. ``diverge_outputs(model, frameworks=...)`` ->
:class:`OutputDivergence` compares every output instead, for any model (:mod:`mlms_nb.divergence.outputs`).
"""
from mlms_nb.divergence.run import ALIGNMENT_RULE, diverge
from mlms_nb.divergence.outputs import OutputDivergence, diverge_outputs
from mlms_nb.divergence.result import Divergence

__all__ = ["diverge", "diverge_outputs", "Divergence", "OutputDivergence", "ALIGNMENT_RULE"]
