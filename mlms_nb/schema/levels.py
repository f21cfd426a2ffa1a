"""Trace levels, as MLModelScope names them; a span is recorded only when its level is enabled."""
from __future__ import annotations

from enum import IntEnum

from mlms_nb.errors import MlmsError


class TraceLevel(IntEnum):
    NONE = 0
    APPLICATION = 1
    MODEL = 2
    FRAMEWORK = 3
    ML_LIBRARY = 4
    SYSTEM_LIBRARY = 5
    HARDWARE = 6
    FULL = 7

    @classmethod
    def parse(cls, value: "str | int | TraceLevel") -> "TraceLevel":
        """``"framework"`` / ``3`` / ``TraceLevel.FRAMEWORK`` -> ``TraceLevel.FRAMEWORK``."""
        if isinstance(value, TraceLevel):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().upper().replace("-", "_")]
        except KeyError:
            raise MlmsError(f"unknown trace level {value!r}; expected one of {', '.join(m.name for m in cls)}") from None
