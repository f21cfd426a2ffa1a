"""The timeline analysis: tracks and level-of-detail rows on a real trace of EfficientNet-Lite0, the Bokeh page
(hover fields, INLINE resources) and its rendering in headless Chromium, the static matplotlib version."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from mlms_nb.analyses import timeline
from mlms_nb.analyses._plot import AnalysisError
from mlms_nb.analyses._titles import subtitle_of
from mlms_nb.errors import MlmsError
from mlms_nb.tracing import TraceLevel, Tracer
from mlms_nb.schema.trace import SPAN_COLUMNS, spans_frame

from .conftest import SESSION_HOME

torch = pytest.importorskip("torch")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# ------------------------------------------------------------------------------------------ real traces

def _shapes(args) -> str:
    return json.dumps([list(a.shape) for a in args if isinstance(a, torch.Tensor)], separators=(",", ":"))


def trace_model(model, x, repeats: int = 2):
    """Trace ``model(x)`` with the real Tracer: a MODEL ``predict`` span per call, a FRAMEWORK span per module
    call (layer type, input shapes, FLOPs from torch's FlopCounterMode), an ML_LIBRARY span per aten op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model(x)
    flops = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    tracer = Tracer(TraceLevel.ML_LIBRARY)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            with tracer.span(f"aten::{func.overloadpacket.__name__}", TraceLevel.ML_LIBRARY, "op",
                             shape=_shapes(args)):
                return func(*args, **(kwargs or {}))

    hooks = []
    for name, module in model.named_modules():
        if not name:
            continue
        fl = flops.get(f"{type(model).__name__}.{name}", float("nan"))

        def pre(mod, inputs, name=name, fl=fl):
            mod._timeline_token = tracer.start(name, TraceLevel.FRAMEWORK, "layer", layer_type=type(mod).__name__,
                                               shape=_shapes(inputs), flops=fl)

        def post(mod, inputs, output) -> None:  # returns None: the output is left as it is
            tracer.end(mod._timeline_token)

        hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.inference_mode(), Ops():
            for _ in range(repeats):
                with tracer.span("predict", TraceLevel.MODEL, "model", batch=int(x.shape[0])):
                    model(x)
    finally:
        for h in hooks:
            h.remove()
    return tracer.trace()


@pytest.fixture(scope="module")
def lite0_trace():
    from mlms_nb.manifest import find_manifest
    from mlms_nb.frameworks import open_predictor

    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(SESSION_HOME))
        torch.manual_seed(0)
        with open_predictor(find_manifest("efficientnet_lite0", framework="torch")) as predictor:
            return trace_model(predictor.model, torch.randn(1, 3, 224, 224), repeats=2)


@pytest.fixture(scope="module")
def spans(lite0_trace) -> pd.DataFrame:
    return lite0_trace.spans


def tiled(spans: pd.DataFrame, copies: int, gap_ns: int) -> pd.DataFrame:
    """``copies`` repeats of real recorded spans, each shifted by the trace's length + ``gap_ns``, under one
    APPLICATION span covering them all (so times and durations pass 2**32 ns)."""
    extent = int(spans["end_ns"].max() - spans["start_ns"].min())
    t0 = int(spans["start_ns"].min())
    step = extent + gap_ns
    cols = {c: np.concatenate([spans[c].to_numpy(object if c not in ("start_ns", "end_ns", "duration_ns",
                                                                       "span_id", "parent_id", "thread",
                                                                       "stream", "layer_index", "flops",
                                                                       "bytes", "memory") else None)
                               for _ in range(copies)]) for c in SPAN_COLUMNS}
    shift = np.repeat(np.arange(copies, dtype=np.int64) * step, len(spans))
    id_shift = np.repeat(np.arange(copies, dtype=np.int64) * (int(spans["span_id"].max()) + 1), len(spans))
    cols["start_ns"] = cols["start_ns"].astype(np.int64) + shift
    cols["end_ns"] = cols["end_ns"].astype(np.int64) + shift
    root = int(spans["span_id"].max() + 1) * copies + 1
    parent = cols["parent_id"].astype(np.int64)
    cols["span_id"] = cols["span_id"].astype(np.int64) + id_shift
    cols["parent_id"] = np.where(parent == 0, root, parent + id_shift)
    row = {"trace_id": cols["trace_id"][0], "span_id": root, "parent_id": 0, "name": "session", "level": "APPLICATION",
           "kind": "application", "start_ns": t0, "end_ns": t0 + copies * step, "duration_ns": copies * step,
           "thread": cols["thread"][0], "device": "cpu", "stream": -1, "layer_index": -1, "layer_type": "",
           "shape": "", "flops": np.nan, "bytes": np.nan, "memory": np.nan, "attrs": "{}"}
    for c in SPAN_COLUMNS:
        cols[c] = np.append(cols[c], np.array([row[c]], dtype=cols[c].dtype))
    cols["duration_ns"] = cols["end_ns"] - cols["start_ns"]
    cols["level"] = [str(v) for v in cols["level"]]
    return spans_frame(cols)


# ------------------------------------------------------------------------------------------ compute

def _conserved(tl: pd.DataFrame, spans: pd.DataFrame) -> None:
    """At every zoom level each track holds each of its spans once: counts add up, busy time is conserved."""
    per_track = tl[tl["row_kind"] == "span"].groupby("track")
    want_n, want_busy = per_track.size(), per_track["busy_ns"].sum()
    assert want_n.sum() == len(spans)
    assert want_busy.sum() == int(spans["duration_ns"].sum())
    for level in range(tl.attrs["raw_level"] + 1):
        rows = tl[(tl["lod_from"] <= level) & (tl["lod_to"] >= level)]
        got = rows.groupby("track").agg(n=("span_count", "sum"), busy=("busy_ns", "sum"))
        pd.testing.assert_series_equal(got["n"], want_n, check_names=False)
        pd.testing.assert_series_equal(got["busy"], want_busy, check_names=False)


def test_tracks_and_level_of_detail_counts(spans):
    tl = timeline.compute(spans, width_px=800)
    tracks = tl.attrs["tracks"]
    # one track per (level, device, thread, nesting depth); every level of the trace has its tracks
    assert set(tracks["level"]) == set(spans["level"].astype(str))
    assert tracks["track_label"].is_unique
    assert all(lab.startswith(lv) and "cpu" in lab for lab, lv in zip(tracks["track_label"], tracks["level"]))
    span_rows = tl[tl["row_kind"] == "span"].sort_values("span_row")
    assert (span_rows["span_row"].to_numpy() == np.arange(len(spans))).all()
    assert (span_rows["level"].astype(str).to_numpy() == spans["level"].astype(str).to_numpy()).all()
    assert (tracks.loc[span_rows["track"], "level"].to_numpy() == spans["level"].astype(str).to_numpy()).all()
    # nested modules go one lane down: within a lane, spans never overlap
    for _, lane in span_rows.groupby("track"):
        s, e = lane["start_ns"].to_numpy(), lane["end_ns"].to_numpy()
        order = np.argsort(s, kind="stable")
        assert (s[order][1:] >= e[order][:-1]).all()
    _conserved(tl, spans)
    level0 = tl[(tl["lod_from"] == 0) & (tl["row_kind"] == "block")]
    assert len(level0) and level0["span_count"].max() > 1  # narrow spans were merged at the full view
    assert (tl["end_ns"] >= tl["start_ns"]).all()


def test_the_zoom_levels_table_counts_every_span_at_every_level_and_reads_without_e_notation(spans):
    """``timeline.levels(tl)`` (notebook 06's table): one row per zoom level, the raw level last; every level
    stands for every span and the same busy time; shown formatted (``2.515270e+07`` was pandas' own display)."""
    tl = timeline.compute(spans, width_px=800)
    table = timeline.levels(tl)
    assert len(table) == tl.attrs["raw_level"] + 1 and table["zoom_level"].iloc[-1].endswith("(raw)")
    assert (table["spans_represented"] == len(spans)).all()
    assert table["busy_ms"].nunique() == 1 and table["bars"].iloc[0] < table["bars"].iloc[-1]
    shown = repr(table)
    assert "pixel (ns)" in shown and "busy (ms)" in shown and not re.search(r"\de[+-]?\d", shown), shown


def test_level_of_detail_at_scale_keeps_views_bounded(spans):
    big = tiled(spans, copies=40, gap_ns=200_000_000)  # ~29k real spans over ~10 s
    tl = timeline.compute(big, width_px=1000)
    # several merged levels before the raw one (how many depends on how long this host took per span)
    assert tl.attrs["raw_level"] >= 2
    _conserved(tl, big)
    n_tracks = len(tl.attrs["tracks"])
    extent_ms = tl.attrs["extent_ns"] / 1e6
    for width in (extent_ms, extent_ms / 10, extent_ms / 100, extent_ms / 1000, extent_ms / 1e5):
        for centre in (0.3, 0.7):
            v = timeline.view(tl, extent_ms * centre - width / 2, extent_ms * centre + width / 2, 1000)
            assert len(v) <= 4 * n_tracks * 1000, (width, len(v))
            # every span at least one level pixel wide (LEVEL_SLACK view pixels) that overlaps the window is
            # drawn on its own
            px_ns = width / 1000 * 1e6 * timeline.LEVEL_SLACK
            s = (big["start_ns"] - big["start_ns"].min()).to_numpy()
            d = big["duration_ns"].to_numpy()
            x0, x1 = v.attrs["window_ms"]
            wide = (d >= px_ns) & (s + d >= x0 * 1e6) & (s <= x1 * 1e6)
            drawn = set(v.loc[v["row_kind"] == "span", "span_row"])
            assert set(np.flatnonzero(wide)) <= drawn


def test_bad_input_says_what_is_wrong(spans):
    with pytest.raises(MlmsError, match="lacks column"):
        timeline.compute(spans.drop(columns=["thread"]))
    with pytest.raises(AnalysisError, match="backend"):
        timeline.plot(spans, backend="svg")
    with pytest.raises(AnalysisError, match="no spans"):
        timeline.compute(spans.iloc[:0])
    with pytest.raises(AnalysisError, match="after start_ms"):
        timeline.view(timeline.compute(spans), 5.0, 1.0)


# ------------------------------------------------------------------------------------------ plots

def test_bokeh_page_has_hover_fields_units_and_inline_resources(spans, tmp_path):
    from bokeh.models import Axis, HoverTool, Title

    layout = timeline.plot(spans, width_px=800, measured_by="mlms_nb Tracer (hooks + dispatch mode), CPU")
    fig = layout.select_one({"name": "timeline"})
    hover = fig.select_one(HoverTool)
    labels = [label for label, _ in hover.tooltips]
    for want in ("name", "duration", "shape", "FLOPs", "layer type", "spans merged", "busy time"):
        assert want in labels
    axis_labels = [a.axis_label for a in fig.select({"type": Axis})]
    assert timeline.X_LABEL in axis_labels and any("track" in a for a in axis_labels)
    assert "(ms)" not in timeline.X_LABEL  # the ticks carry their own unit (s, ms, µs or ns), so the label names none
    assert f"{len(spans):,} spans" in fig.title.text and "\n" not in fig.title.text  # one line; the how under it
    assert "measured by mlms_nb Tracer" in subtitle_of(fig)
    assert len(fig.select({"type": Title})) >= 2 and fig.toolbar_location == "right"  # never over a title line
    page = timeline.to_html(layout, tmp_path / "timeline.html")
    html = page.read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", html)
    assert "Bokeh" in html and "mlms_load" in html
    assert page.stat().st_size < 5_000_000


def test_matplotlib_version_for_pdf(spans, tmp_path):
    tl = timeline.compute(spans, width_px=800)
    fig = timeline.plot(tl, backend="matplotlib", measured_by="mlms_nb Tracer, CPU")
    ax = fig.axes[0]
    assert ax.get_xlabel() == timeline.X_LABEL
    words = ax.get_title() + " " + subtitle_of(ax)
    assert "hover" not in words  # a static figure offers no interaction
    assert "track" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == list(tl.attrs["tracks"]["track_label"])
    assert f"{len(spans):,} spans" in ax.get_title() and "per pixel" in words
    assert len(ax.collections[0].get_paths()) == len(timeline.view(tl))
    pdf = tmp_path / "timeline.pdf"
    fig.savefig(pdf)
    assert pdf.read_bytes()[:4] == b"%PDF"
    zoomed = timeline.plot(tl, backend="matplotlib", start_ms=1.0, end_ms=2.0)
    assert zoomed.axes[0].get_xlim() == (1.0, 2.0)


# ------------------------------------------------------------------------------------------ the browser

FIRST_PAINT = """window.__fp = null;
(function poll() { const B = window.Bokeh;
  if (B && B.documents && B.documents.length && B.documents[0].is_idle) { window.__fp = performance.now(); return; }
  requestAnimationFrame(poll); })();"""
ZOOM = """async ([x0, x1]) => {
  const doc = Bokeh.documents[0], plot = doc.get_model_by_name("timeline"), view = Bokeh.index.find_one(plot);
  let painted = false; const paint = view.paint;
  view.paint = function () { paint.call(this); painted = true; };
  plot.x_range.setv({start: x0, end: x1});
  view.request_paint();
  for (let i = 0; !painted && i < 600; i++) await new Promise((r) => requestAnimationFrame(r));
  view.paint = paint;
  const d = doc.get_model_by_name("timeline_visible").data;
  return {x0: Array.from(d.x0), d: Array.from(d.d), n: Array.from(d.n), y: Array.from(d.y),
          lod: doc.get_model_by_name("timeline_lod").text, width: plot.inner_width};
}"""

SCREEN_XY = """([x, y]) => {
  const plot = Bokeh.documents[0].get_model_by_name("timeline"), view = Bokeh.index.find_one(plot);
  const r = view.canvas_view.el.getBoundingClientRect();
  return [r.left + view.frame.x_scale.compute(x), r.top + view.frame.y_scale.compute(y)];
}"""
BLOCK_AT = """() => {
  const d = Bokeh.documents[0].get_model_by_name("timeline_visible").data;
  let best = -1;
  for (let i = 0; i < d.n.length; i++) if (d.n[i] > 1 && (best < 0 || d.x1[i] - d.x0[i] > d.x1[best] - d.x0[best])) best = i;
  return [(d.x0[best] + d.x1[best]) / 2, d.y[best]];
}"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)")
def test_renders_and_zooms_in_headless_chromium(spans, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    big = tiled(spans, copies=12, gap_ns=300_000_000)  # > 4.29 s: starts and durations need the escapes
    tl = timeline.compute(big, width_px=900)
    page_path = timeline.to_html(timeline.plot(tl), tmp_path / "timeline.html")
    extent_ms = tl.attrs["extent_ns"] / 1e6
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.add_init_script(FIRST_PAINT)
            page.goto(page_path.as_uri())
            page.wait_for_function("window.__fp !== null", timeout=60_000)
            page.wait_for_function("Object.values(window.__mlms_timeline || {}).some((s) => s.data)",
                                   timeout=60_000)
            shot = page.screenshot()
            for x0, x1 in ((extent_ms * 0.61, extent_ms * 0.62), (extent_ms * 0.3, extent_ms * 0.3 + 0.05),
                           (0.0, extent_ms)):
                got = page.evaluate(ZOOM, [x0, x1])
                want = timeline.view(tl, x0, x1, got["width"])  # the figure stretches: its drawn width
                assert len(got["x0"]) == len(want), got["lod"]
                order = np.lexsort((want["start_ns"].to_numpy(), want["track"].to_numpy()))
                got_order = np.lexsort((np.array(got["x0"]), np.array(got["y"])))
                np.testing.assert_allclose(np.array(got["x0"])[got_order],
                                           want["start_ns"].to_numpy()[order] / 1e6, rtol=0, atol=1e-9)
                np.testing.assert_allclose(np.array(got["d"])[got_order],
                                           want["duration_ns"].to_numpy()[order] / 1e6, rtol=0, atol=1e-9)
                assert np.array(got["n"]).sum() == want["span_count"].sum()
                assert f"zoom level {want.attrs['level']}" in got["lod"]
            # hover: a span shows its name, duration, shape, FLOPs, layer type; a merged block its count and busy time
            page.evaluate(ZOOM, [0.0, extent_ms])
            block = page.evaluate(BLOCK_AT)
            page.mouse.move(*page.evaluate(SCREEN_XY, block))
            tip = page.locator(".bk-tooltip-content").first
            tip.wait_for(state="visible", timeout=10_000)
            text = tip.inner_text()
            assert re.search(r"name:\s+[\d,]+ spans merged \(longest: ", text), text
            assert re.search(r"busy time:\s+[\d.,]+ (ms|µs|ns) \([\d.]+ % of the block\)", text), text
            first_layer = big[big["kind"] == "layer"].iloc[0]
            x = (first_layer["start_ns"] - big["start_ns"].min() + first_layer["duration_ns"] / 2) / 1e6
            page.evaluate(ZOOM, [x - first_layer["duration_ns"] / 2e6, x + first_layer["duration_ns"] / 2e6])
            lane = int(tl.loc[(tl["row_kind"] == "span") & (tl["span_row"] == first_layer.name), "track"].iloc[0])
            page.mouse.move(0, 0)
            page.mouse.move(*page.evaluate(SCREEN_XY, [x, lane]))
            page.wait_for_timeout(200)
            text = page.locator(".bk-tooltip-content").first.inner_text()
            assert f"name:\t{first_layer['name']}" in text, text
            assert re.search(r"duration:\s+[\d.,]+ (ms|µs)", text), text
            assert f"shape:\t{first_layer['shape']}" in text, text
            assert re.search(r"FLOPs:\s+[\d.]+ [kMGT]?FLOPs", text), text
            assert f"layer type:\t{first_layer['layer_type']} (layer, FRAMEWORK)" in text, text
            assert not errors, errors
        finally:
            browser.close()
    from io import BytesIO

    from PIL import Image

    img = np.asarray(Image.open(BytesIO(shot)).convert("RGB"))
    colours = {tuple(c) for c in img[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 10  # the bars, the axes, the legend: not a blank page
