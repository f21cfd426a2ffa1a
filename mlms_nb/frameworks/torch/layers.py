"""What counts as a *layer* of a PyTorch model: the one definition the layer spans (:mod:`.tracing`) and the
per-layer costs (:mod:`.costs`) share, so that a traced layer and its costed row are the same module call.

A layer is a module that does work of its own: one with no children, or one holding parameters of its own (a
``Conv2dStaticSamePadding`` owns its weight and a padding child; the child's span nests inside its own) -- but not
a *pass-through*, a module whose ``forward`` is ``return input`` (``nn.Identity``, and the ``Identity`` paddings
of EfficientNet-Lite's 1x1 and stride-1 convolutions: 32 of the 183 layer calls of a Lite0 forward before they
were left out). It runs no op, so its span would time only the call, and its cost row would be zero.
"""
from __future__ import annotations

import inspect

import torch


def _pass_through(self, input):
    return input


_PASS_THROUGH = _pass_through.__code__
_KIND_FLAGS = (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE
               | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def passes_input_through(module: torch.nn.Module) -> bool:
    """Whether ``module``'s class defines ``forward`` as ``return input``: its bytecode, argument count and kind
    (no ``*args`` or ``**kwargs``, not a generator or coroutine) are those of such a function compiled by this
    interpreter. A forward an instance sets for itself is not judged."""
    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    return (code is not None and "forward" not in module.__dict__ and code.co_code == _PASS_THROUGH.co_code
            and code.co_argcount == 2 and code.co_kwonlyargcount == 0
            and (code.co_flags ^ _PASS_THROUGH.co_flags) & _KIND_FLAGS == 0)


def is_layer(module: torch.nn.Module) -> bool:
    """Whether ``module`` counts as a layer (see the module docstring)."""
    if next(module.children(), None) is None:
        return not passes_input_through(module)
    return next(module.parameters(recurse=False), None) is not None and not passes_input_through(module)


def layer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(qualified name, module)`` of ``model``'s layers, in registration order."""
    return [(name, m) for name, m in model.named_modules() if is_layer(m)]
