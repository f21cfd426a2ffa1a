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


def duration_text(ms: float) -> str:
    """A duration in a title: three significant digits in s, ms, µs or ns (``47.1 s``, ``152 ms``, ``8.40 µs``),
    never more digits than a reader takes in at a glance."""
    if not np.isfinite(ms):
        return "unknown"
    for scale, unit in ((1e3, "s"), (1.0, "ms"), (1e-3, "µs"), (1e-6, "ns")):
        if ms >= scale or unit == "ns":
            value = ms / scale
            return f"{value:,.0f} {unit}" if value >= 100 else f"{value:#.3g}".rstrip(".") + f" {unit}"
    return f"{ms} ms"  # pragma: no cover


LABEL_GAP_EM = 1.5
"""Space left between two neighbouring x tick labels, in character widths."""
CHAR_EM = 0.62
"""The width of a tick label's character (digits, comma, unit) in ems of its font: DejaVu Sans, matplotlib's."""


def tick_count(axis_px: float, label_chars: int, font_px: float) -> int:
    """How many x ticks an axis ``axis_px`` wide holds when each label is ``label_chars`` characters of a
    ``font_px`` font, with a gap between neighbours (at least 2)."""
    return max(2, int(axis_px // ((label_chars + LABEL_GAP_EM) * CHAR_EM * font_px)))


def time_ticks(lo_ms: float, hi_ms: float, axis_px: float, font_px: float) -> tuple[np.ndarray, float]:
    """Ticks (ms) in ``[lo_ms, hi_ms]`` at a round step, as many as an axis ``axis_px`` wide holds with their labels
    (:func:`tick_label`) never touching: the step grows until the widest label fits; ``(ticks, step_ms)``."""
    from matplotlib.ticker import MaxNLocator

    bins = tick_count(axis_px, 6, font_px)
    while True:
        ticks = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(lo_ms, hi_ms)
        inside = ticks[(ticks >= lo_ms - 1e-9 * abs(hi_ms - lo_ms)) & (ticks <= hi_ms + 1e-9 * abs(hi_ms - lo_ms))]
        step = float(np.diff(ticks).min()) if len(ticks) > 1 else max(hi_ms - lo_ms, 1e-9)
        widest = max((len(tick_label(t, step)) for t in inside), default=1)
        if bins <= 1 or len(inside) <= tick_count(axis_px, widest, font_px):
            return inside, step
        bins -= 1


def time_axis(ax, fontsize: float = 9) -> None:
    """Give a matplotlib axes' x axis (ms) ticks that never overlap: chosen at draw time from the axis's width and
    its labels' width (a figure re-laid out narrower, as the report does, gets fewer ticks), labelled in s, ms, µs
    or ns as their step reads best."""
    from matplotlib.ticker import Formatter, Locator

    class TimeLocator(Locator):
        def __call__(self):
            lo, hi = self.axis.get_view_interval()
            return self.tick_values(lo, hi)

        def tick_values(self, vmin, vmax):
            axes = self.axis.axes
            ticks, _ = time_ticks(min(vmin, vmax), max(vmin, vmax), axes.get_window_extent().width,
                                  fontsize * axes.figure.dpi / 72)
            return ticks

    class TimeFormatter(Formatter):
        step = 1.0

        def set_locs(self, locs):
            super().set_locs(locs)
            self.step = float(np.diff(locs).min()) if len(locs) > 1 else 1.0

        def __call__(self, x, pos=None):
            return tick_label(x, self.step)

    ax.tick_params(axis="x", labelsize=fontsize)
    ax.xaxis.set_major_locator(TimeLocator())
    ax.xaxis.set_major_formatter(TimeFormatter())
