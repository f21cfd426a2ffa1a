"""How a timeline's time axis reads: its labels, its ticks in s, ms, µs or ns, and a duration in words; shared by
the matplotlib figure (timeline.py) and the Bokeh one (_timeline_bokeh.py)."""
from __future__ import annotations

import numpy as np

X_LABEL = "time since trace start (unit on each tick: s, ms, µs or ns)"
Y_LABEL = "track (level · device · thread [depth])"


def tick_label(ms: float, step_ms: float) -> str:
    """An x tick for ``ms`` on an axis whose ticks are ``step_ms`` apart, in s, ms, µs or ns as the step reads
    best (the same rule as the Bokeh figure's tick formatter)."""
    scale, unit = ((1e3, "s") if step_ms >= 1e3 else (1.0, "ms") if step_ms >= 1 else
                   (1e-3, "µs") if step_ms >= 1e-3 else (1e-6, "ns"))
    decimals = int(min(6, max(0, -np.floor(np.log10(step_ms / scale) + 1e-9)))) if step_ms > 0 else 0
    return f"{ms / scale:,.{decimals}f} {unit}"


def time_text(ms: float) -> str:
    """A duration of ``ms`` milliseconds in ms, µs or ns (``unknown`` when not finite), as the titles say it."""
    if not np.isfinite(ms):
        return "unknown"
    if ms >= 1:
        return f"{ms:,.3f} ms"
    if ms >= 1e-3:
        return f"{ms * 1e3:,.3f} µs"
    return f"{ms * 1e6:,.0f} ns"
