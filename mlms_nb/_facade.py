"""Methods that data objects declare and the facade implements: ``ev.layers()`` is ``mlms_nb.layers(ev)``.

`Evaluation` and `Trace` sit below the facade (:mod:`mlms_nb.api`) and may not import it. A `FacadeMethod` in
their class body says, where a reader looks for it, which facade function the method calls; the facade is imported
only when the method is first used (by then the caller has it loaded: it made the object through it)."""
from __future__ import annotations

import importlib
import types


class FacadeMethod:
    """``obj.NAME(*args, **kwargs)`` calls ``mlms_nb.api.NAME(obj, *args, **kwargs)``."""

    def __init__(self, summary: str):
        self.summary = summary
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"``{owner.__name__.lower()}.{name}(...)`` is ``mlms_nb.{name}(run, ...)``: {self.summary}"

    def __get__(self, obj, owner=None):  # noqa: ANN001, ANN204 - any data object
        if obj is None:
            return self
        function = getattr(importlib.import_module("mlms_nb.api"), self.name)
        return types.MethodType(function, obj)
