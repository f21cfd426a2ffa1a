"""Errors of the tracing package (subclasses of :class:`mlms_nb.errors.MlmsError`; ``str(err)`` is shown as is)."""
from __future__ import annotations

from ..errors import MlmsError


class TraceFormatError(MlmsError, ValueError):
    """A trace file is malformed, truncated or of an unknown structure; the message names the file and the fault.

    Raised before anything is returned: an import either gives a whole :class:`~mlms_nb.tracing.Trace` or this.
    """


class TraceSchemaError(MlmsError, ValueError):
    """A spans or counters frame does not follow :mod:`mlms_nb.tracing.schema` (missing column, wrong dtype)."""
