"""What counts as a *layer* of a PyTorch model: the one definition the layer spans (:mod:`.tracing`) and the
per-layer costs (:mod:`.costs`) share, so that a traced layer and its costed row are the same module call.

A layer is a module that does work of its own: one with no children, or one holding parameters of its own (a
``Conv2dStaticSamePadding`` owns its weight and a padding child; the child's span nests inside its own) -- but
not ``nn.Identity``, whose forward returns its input: it runs no op, so a span of it would time only the call
(32 of EfficientNet-Lite0's 183 layer calls are ``Identity`` paddings of its 1x1 and stride-1 convolutions).
"""
from __future__ import annotations

import torch


def is_layer(module: torch.nn.Module) -> bool:
    """Whether ``module`` counts as a layer (see the module docstring)."""
    if type(module) is torch.nn.Identity:
        return False
    return next(module.children(), None) is None or next(module.parameters(recurse=False), None) is not None


def layer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(qualified name, module)`` of ``model``'s layers, in registration order."""
    return [(name, m) for name, m in model.named_modules() if is_layer(m)]
