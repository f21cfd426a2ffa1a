"""Figures as a reader sees them, read from their objects (no browser; seconds): every Bokeh panel stretches to the
output's width with a one-line title, its subtitle under it, the toolbar clear of both and its legend outside the
data; in matplotlib, x tick labels and the labels of points never overlap (their extents measured by the renderer),
and a timeline's time axis holds as many ticks as its labels leave room for at any width (issue 37)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mlms_nb.analyses import batch_scaling, layers, roofline, timeline
from mlms_nb.analyses._plot import OUTPUT_COLUMN_PX
from mlms_nb.analyses._roof_check import RoofContext
from mlms_nb.analyses._timeline_axes import time_axis
from mlms_nb.analyses._titles import SUBTITLE_PX_PER_CHAR, TITLE_PX_PER_CHAR, subtitle_of
from mlms_nb.schema.trace import spans_frame

from tests.helpers import titles
from tests.test_analyses import BW, PEAK, roofline_inputs, scaling_frame

pytest.importorskip("bokeh")
pytest.importorskip("matplotlib")
MS = 1_000_000
LONG_NAMES = ["_blocks.12._depthwise_conv.static_padding", "_blocks.12._project_conv", "_conv_stem", "_fc", "_bn0"]


def layer_spans(repetitions: int = 3) -> pd.DataFrame:
    """Predict calls (MODEL spans, batch 1) each holding the same five layer spans with long module names."""
    rows, span = [], 1
    for rep in range(repetitions):
        t0 = rep * 20 * MS
        rows.append(dict(span_id=span, parent_id=0, name="predict", level="MODEL", kind="model", start_ns=t0,
                         end_ns=t0 + 15 * MS, layer_index=-1, layer_type="", attrs='{"batch": 1}'))
        predict, span = span, span + 1
        for i, name in enumerate(LONG_NAMES):
            start = t0 + i * 3 * MS
            rows.append(dict(span_id=span, parent_id=predict, name=name, level="FRAMEWORK", kind="layer",
                             start_ns=start, end_ns=start + (i + 1 + rep) * MS // 2, layer_index=i,
                             layer_type="Conv2dStaticSamePadding", attrs="{}"))
            span += 1
    frame = pd.DataFrame(rows)
    return spans_frame({**{c: frame[c].to_numpy() for c in frame}, "thread": np.full(len(frame), 7),
                        "trace_id": ["t"] * len(frame)})


def long_trace_spans(seconds: float = 31.0) -> pd.DataFrame:
    """A 31-second trace: layer spans every 50 ms under one predict call (ticks in the tens of thousands of ms)."""
    n = int(seconds * 20)
    start = np.arange(n, dtype="int64") * 50 * MS + MS
    return spans_frame({
        "trace_id": ["t"] * (n + 1), "span_id": np.arange(1, n + 2), "parent_id": np.r_[0, np.ones(n, "int64")],
        "name": ["predict"] + [f"_blocks.{i % 16}._project_conv" for i in range(n)],
        "level": ["MODEL"] + ["FRAMEWORK"] * n, "kind": ["model"] + ["layer"] * n,
        "start_ns": np.r_[0, start], "end_ns": np.r_[int(seconds * 1000 * MS), start + 30 * MS],
        "thread": np.full(n + 1, 7), "layer_index": np.r_[-1, np.arange(n) % 53],
        "layer_type": [""] + ["Conv"] * n, "attrs": ['{"batch": 1}'] + ["{}"] * n})


def figures(backend: str) -> dict:
    costs, latency = roofline_inputs()
    fast = latency.assign(**{c: latency[c] / 40 for c in ("self_median_ms", "self_p25_ms", "self_p75_ms")})
    above = roofline.compute(costs, fast, PEAK, BW, roof=RoofContext(peak_iqr=1e9))  # points above their roof
    model = roofline.compute_model({1: costs, 8: costs.assign(flops=costs["flops"] * 8)},
                                   pd.DataFrame({"framework": ["torch", "torch"], "batch_size": [1, 8],
                                                 "median_ms": [30.0, 100.0]}), PEAK, BW)
    frame = scaling_frame()
    both = pd.concat([frame, frame.assign(framework="onnxruntime", throughput_per_s=frame["throughput_per_s"] * 1.5)],
                     ignore_index=True)
    spans = layer_spans()
    return {"roofline per layer": roofline.plot(above, backend), "roofline per model": roofline.plot(model, backend),
            "batch scaling": batch_scaling.plot(batch_scaling.compute(both), backend),
            "layer latency": layers.plot(layers.compute(spans, "latency"), backend),
            "layer memory": layers.plot(layers.compute(spans, "occurrence"), backend)}


def drawn(fig):
    """``fig`` drawn on an Agg canvas; its renderer (what measures each text's extent)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def bokeh_panels(fig) -> list:
    from bokeh.plotting import figure

    return [fig] if isinstance(fig, figure) else list(fig.select({"type": figure}))


def check_bokeh_panel(panel) -> None:
    """Stretches to the output's width; a one-line title and subtitle lines that fit the narrowest the panel is
    drawn at; the toolbar at the right (never in the title's row); every legend in a side panel, not on the data."""
    from bokeh.models import Legend

    assert panel.sizing_mode == "stretch_width", panel.title.text  # as wide as the output column, at least
    assert panel.max_width is None or panel.max_width >= OUTPUT_COLUMN_PX, panel.title.text
    text = panel.title.text
    assert text and "\n" not in text and len(text) * TITLE_PX_PER_CHAR < panel.min_width, text
    for line in [t.text for t in panel.above if getattr(t, "text_font_style", None) == "italic"]:
        assert "\n" not in line and len(line) * SUBTITLE_PX_PER_CHAR < panel.min_width, line
    assert panel.toolbar_location == "right"
    for legend in panel.select({"type": Legend}):
        assert legend not in panel.center and (legend in panel.right or legend in panel.below), text


@pytest.mark.parametrize("name", ["roofline per layer", "roofline per model", "batch scaling", "layer latency",
                                  "layer memory"])
def test_bokeh_panels_stretch_with_one_line_titles_and_legends_outside(name):
    fig = figures("bokeh")[name]
    panels = bokeh_panels(fig)
    assert panels
    for panel in panels:
        check_bokeh_panel(panel)
    assert all(len(t) > 20 for t in titles(fig))  # the subtitle says how it was measured


def test_a_roofline_legend_is_beside_the_plot_and_a_row_of_panels_has_it_below():
    roof, scaling = (figures("bokeh")[k] for k in ("roofline per layer", "batch scaling"))
    from bokeh.models import Legend

    def legends(side):
        return [x for x in side if isinstance(x, Legend)]

    assert legends(roof.right) and not legends(roof.below)  # next to the roof, not over the memory-bound points
    assert all(legends(p.below) and not legends(p.right) for p in bokeh_panels(scaling))
    assert "measurement problem" in " ".join(item.label["value"] for item in roof.legend[0].items)
    assert "roof_check_why" in subtitle_of(roof)


def test_the_timeline_title_is_one_short_line_and_its_subtitle_is_not_cut():
    layout = timeline.plot(long_trace_spans(), measured_by="mlms_nb Tracer (hooks + dispatch mode), CPU")
    fig = layout.select_one({"name": "timeline"})
    check_bokeh_panel(fig)
    assert fig.title.text == f"Timeline of {len(long_trace_spans()):,} spans over 31.0 s"  # 3 digits, not 31,000.000
    assert "measured by mlms_nb Tracer (hooks + dispatch mode), CPU" in subtitle_of(fig)
    assert fig.xaxis[0].major_label_policy.__class__.__name__ == "NoOverlap"


def overlaps(boxes) -> list[tuple]:
    """Pairs of horizontally overlapping boxes (x0, x1), in order."""
    boxes = sorted(boxes)
    return [(a, b) for a, b in zip(boxes, boxes[1:]) if b[0] < a[1]]


def x_tick_boxes(fig, ax) -> list[tuple[float, float]]:
    renderer = fig.canvas.get_renderer()
    lo, hi = sorted(ax.get_xlim())
    return [(box.x0, box.x1) for tick, label in zip(ax.get_xticks(), ax.get_xticklabels())
            if lo <= tick <= hi and label.get_text()
            for box in [label.get_window_extent(renderer)]]


@pytest.mark.parametrize("width_in", [3.0, 5.0, 7.0, 10.0, 15.2])
def test_time_ticks_never_overlap_at_any_width(width_in):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    for lo, hi in ((27_000.0, 30_600.0), (0.0, 0.004), (12.5, 13.75), (0.0, 31_000.0)):
        fig = Figure(figsize=(width_in, 2), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_xlim(lo, hi)
        time_axis(ax)
        fig.canvas.draw()
        boxes = x_tick_boxes(fig, ax)
        assert len(boxes) >= 2 and not overlaps(boxes), (width_in, lo, hi, [t.get_text() for t in ax.get_xticklabels()])


def test_a_static_timeline_re_laid_out_narrower_keeps_its_ticks_apart():
    """As the report shows it: drawn for the notebook, then 10 inches wide for the page (more ticks, then fewer)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = timeline.plot(long_trace_spans(), "matplotlib", start_ms=27_000, end_ms=30_600)
    FigureCanvasAgg(fig)
    ax = fig.axes[0]
    counts = []
    for width in (fig.get_figwidth(), 10.0, 6.0):
        fig.set_size_inches(width, fig.get_figheight())
        fig.canvas.draw()
        boxes = x_tick_boxes(fig, ax)
        assert len(boxes) >= 2 and not overlaps(boxes), (width, [t.get_text() for t in ax.get_xticklabels()])
        counts.append(len(boxes))
    assert counts[0] > counts[-1]  # the tick count follows the width
    assert "\n" not in ax.get_title() and "per pixel" in subtitle_of(ax)


def test_matplotlib_point_labels_sit_clear_of_their_markers_and_legends_outside_the_plot():
    fig = figures("matplotlib")["roofline per model"]
    renderer = drawn(fig)
    ax = fig.axes[0]
    radius_px = max(np.sqrt(c.get_sizes().max()) / 2 * fig.dpi / 72 for c in ax.collections if len(c.get_sizes()))
    markers = np.vstack([ax.transData.transform(c.get_offsets()) for c in ax.collections if len(c.get_offsets())])
    labels = [t for t in ax.texts if t.get_text().startswith("torch b")]
    assert len(labels) == 2
    for label in labels:
        box = label.get_window_extent(renderer)
        for x, y in markers:  # the label's box does not reach into any marker's disc
            nearest_x, nearest_y = min(max(x, box.x0), box.x1), min(max(y, box.y0), box.y1)
            assert np.hypot(x - nearest_x, y - nearest_y) > radius_px, (label.get_text(), box, (x, y))
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= ax.get_window_extent(renderer).x1  # beside the plot, over none of its points


@pytest.mark.parametrize("name", ["roofline per layer", "batch scaling", "layer latency"])
def test_matplotlib_titles_are_one_line_with_the_subtitle_under_them(name):
    fig = figures("matplotlib")[name]
    renderer = drawn(fig)
    figure_box = fig.get_window_extent(renderer)
    for ax in fig.axes:
        assert ax.get_title() and "\n" not in ax.get_title()
        title = ax.title.get_window_extent(renderer)
        for text in [ax.title] + [t for t in ax.texts if t.get_style() == "italic"]:
            box = text.get_window_extent(renderer)
            assert figure_box.x0 - 1 <= box.x0 and box.x1 <= figure_box.x1 + 1, text.get_text()  # not cut
        subtitle = [t.get_window_extent(renderer) for t in ax.texts if t.get_style() == "italic"]
        assert all(s.y1 <= title.y0 + 1 for s in subtitle)  # under the title, not over it
        if ax.get_legend() is not None:
            assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
