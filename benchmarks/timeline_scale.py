"""Timeline at scale: a 1M-span trace drawn by ``analyses.timeline`` against a plain Bokeh plot of the same
spans, both rendered in headless Chromium (Debian ``chromium``), no Bokeh server.

1. The trace (generated once; cached as Kineto JSON under ``--out``): a small real CNN profiled by
   ``torch.profiler`` (``record_shapes=True``; every layer wrapped in ``record_function("<i>: <LayerType>")`` and
   every inference in ``record_function("predict")``) for enough iterations, then imported with
   ``mlms_nb.load_trace`` and cut to the first ``--spans`` spans (by start time).
2. Two standalone pages (INLINE resources, works offline), their size on disk:
   - *LOD*: ``timeline.plot`` -- the level-of-detail pyramid shipped as compact arrays; a CustomJS callback on
     the x range swaps in the level and window to draw;
   - *plain*: one Bokeh ``hbar`` per span, every span in one ColumnDataSource (same tracks, colours, a hover
     with name and duration).
3. ``--repeat`` runs, the two pages interleaved (LOD, plain, LOD, ...), each in a fresh browser context:
   - *first paint*: from navigation start (``performance.now()`` origin) to the first animation frame in which
     the Bokeh document reports idle (every view rendered once);
   - *redraw*: the x range set from JS (``x_range.setv({start, end})``), then until the frame after the
     plot view's next ``paint()`` returned (so the new frame was produced); three zooms in a row: to 1 % of the
     trace (middle; the page's first zoom), to 0.01 %, back to the whole trace, to another 1 % window.
   Printed: median and IQR (p25..p75) per page and measure, in ms.

Targets (LOD page): first paint <= 2 s, redraw <= 200 ms.

Chromium flags: ``--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking
--disable-component-update --disable-sync``; Playwright never downloads a browser here (``executable_path``).

Run: ``.venv/bin/python benchmarks/timeline_scale.py [--spans 1000000] [--repeat 5] [--out /tmp/mlms_timeline_scale]
[--chromium /usr/bin/chromium]``.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

FIRST_PAINT_JS = """
window.__mlms_first_paint_ms = null;
(function poll() {
  const B = window.Bokeh;
  if (B && B.documents && B.documents.length && B.documents[0].is_idle) {
    window.__mlms_first_paint_ms = performance.now();
    return;
  }
  requestAnimationFrame(poll);
})();
"""
"""Init script: records when the Bokeh document is first idle (all views rendered), ms from navigation start."""

REDRAW_JS = """async ([name, x0, x1]) => {
  const doc = Bokeh.documents[0];
  const plot = doc.get_model_by_name(name);
  const view = Bokeh.index.find_one(plot);
  let painted = null;
  const paint = view.paint;
  view.paint = function () { paint.call(this); painted = performance.now(); };
  const t0 = performance.now();
  plot.x_range.setv({start: x0, end: x1});
  while (painted === null) await new Promise(r => requestAnimationFrame(r));
  await new Promise(r => requestAnimationFrame(r));
  const t1 = performance.now();
  view.paint = paint;
  const visible = doc.get_model_by_name("timeline_visible");
  return {redraw_ms: t1 - t0, paint_ms: painted - t0, bars: visible ? visible.get_length() : null};
}"""
"""Zoom ``name``'s x range to ``[x0, x1]`` ms and time it until the frame after the next paint."""

# --------------------------------------------------------------------------------------------- the trace


def generate(path: Path, spans: int) -> dict:
    """Profile a small CNN with torch.profiler until the imported trace holds >= ``spans`` spans."""
    import torch
    import torch.nn as nn
    from torch.profiler import ProfilerActivity, profile, record_function

    from mlms_nb import load_trace

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = [nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
              nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    for layer in layers:
        layer.eval()
    x = torch.randn(1, 3, 32, 32)

    def run(iters: int, out: Path) -> None:
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(iters):
                with record_function("predict"):
                    h = x
                    for i, layer in enumerate(layers):
                        with record_function(f"{i}: {type(layer).__name__}"):
                            h = layer(h)
        prof.export_chrome_trace(str(out))

    probe = path.with_suffix(".probe.json")
    run(50, probe)
    per_iter = len(load_trace(probe).spans) / 50
    probe.unlink()
    iters = math.ceil(spans * 1.02 / per_iter)
    t0 = time.perf_counter()
    run(iters, path)
    return {"iterations": iters, "generate_s": round(time.perf_counter() - t0, 1), "bytes": path.stat().st_size}


def load_spans(out: Path, n: int):
    """The first ``n`` spans (by start) of the generated trace; the cut is cached as Parquet (``Trace.save``)."""
    from mlms_nb import load_trace
    from mlms_nb.tracing import Trace

    cut = out / f"spans_{n}"
    if cut.exists():
        return load_trace(cut).spans
    path = out / "kineto.json"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        info = generate(path, n)
        print(f"generated {path}: {info}", file=sys.stderr)
    trace = load_trace(path)
    if len(trace.spans) < n:
        raise SystemExit(f"{path} holds {len(trace.spans):,} spans, fewer than --spans {n:,}; delete it to regenerate")
    spans = trace.spans.iloc[:n].reset_index(drop=True)  # sorted by start: parents come before their children
    Trace(spans, None, trace.metadata).save(cut)
    return spans


# --------------------------------------------------------------------------------------------- the pages


def plain_figure(tl, width_px: int):
    """One Bokeh hbar per span (every span in one ColumnDataSource), same tracks and colours as the LOD page."""
    import numpy as np
    from bokeh.models import FixedTicker, HoverTool, Range1d
    from bokeh.plotting import figure

    from mlms_nb.analyses.timeline import OTHER_COLOR, X_LABEL, Y_LABEL, palette

    spans = tl[tl["row_kind"] == "span"]
    tracks = tl.attrs["tracks"]
    colours = palette(tl)
    keys = spans["colour_key"].astype(str)
    start = spans["start_ns"].to_numpy() / 1e6
    end = spans["end_ns"].to_numpy() / 1e6
    extent = tl.attrs["extent_ns"] / 1e6
    data = {"y": spans["track"].to_numpy(np.float64), "left": start, "right": end,
            "color": keys.map(lambda k: colours.get(k, OTHER_COLOR)).tolist(),
            "name": spans["name"].astype(str).tolist(), "dur_ms": end - start}
    fig = figure(name="timeline", title=f"Plain Bokeh: {len(spans):,} spans, one hbar each (no level of detail)",
                 frame_width=width_px, height=int(min(max(120 + 22 * len(tracks), 320), 1400)),
                 x_range=Range1d(0, extent), y_range=Range1d(len(tracks) - 0.5, -0.5),
                 tools="xpan,xwheel_zoom,xbox_zoom,reset", x_axis_label=X_LABEL, y_axis_label=Y_LABEL)
    bars = fig.hbar(y="y", left="left", right="right", height=0.8, color="color", source=data)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("name", "@name"), ("duration", "@dur_ms{0.000000} ms")]))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(len(tracks))))
    fig.yaxis.major_label_overrides = {i: lab for i, lab in enumerate(tracks["track_label"])}
    return fig


# --------------------------------------------------------------------------------------------- the browser


def launch(pw, chromium: str):
    return pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)


def measure(browser, page_path: Path, zooms: list[tuple[float, float]], lod: bool, timeout_s: float = 300) -> dict:
    """First paint (ms from navigation start), for the LOD page when its payload is inflated, and one redraw per
    zoom, in a fresh context."""
    context = browser.new_context(viewport={"width": 1700, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(FIRST_PAINT_JS)
        page.goto(page_path.resolve().as_uri(), timeout=timeout_s * 1000, wait_until="load")
        page.wait_for_function("window.__mlms_first_paint_ms !== null", timeout=timeout_s * 1000)
        out = {"first_paint_ms": page.evaluate("window.__mlms_first_paint_ms")}
        if lod:  # the pyramid is inflated after the first paint: when is the page ready to zoom?
            page.wait_for_function("Object.values(window.__mlms_timeline || {}).some((s) => s.data)",
                                   timeout=timeout_s * 1000)
            out["payload_ready_ms"] = page.evaluate(
                "Math.max(...Object.values(window.__mlms_timeline).map((s) => s.ready_ms || 0))")
        page.wait_for_timeout(300)
        for i, (x0, x1) in enumerate(zooms):
            r = page.evaluate(REDRAW_JS, ["timeline", x0, x1])
            out[f"redraw_{i}_ms"] = r["redraw_ms"]
            out[f"bars_{i}"] = r["bars"]
            page.wait_for_timeout(100)
        if errors:
            raise RuntimeError(f"{page_path.name}: page errors: {errors[:3]}")
        return out
    finally:
        context.close()


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):,.0f} ({q[0]:,.0f}..{q[2]:,.0f})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--width", type=int, default=1200, help="plot frame width (px)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/mlms_timeline_scale"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from mlms_nb.analyses import timeline

    spans = load_spans(args.out, args.spans)
    t0 = time.perf_counter()
    tl = timeline.compute(spans, width_px=args.width)
    t_compute = time.perf_counter() - t0
    t0 = time.perf_counter()
    lod_fig = timeline.plot(tl, measured_by="torch.profiler (Kineto JSON, record_shapes) on CPU, imported by "
                                           "mlms_nb.load_trace")
    lod_page = timeline.to_html(lod_fig, args.out / "timeline_lod.html")
    t_lod_html = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain_page = timeline.to_html(plain_figure(tl, args.width), args.out / "timeline_plain.html")
    t_plain_html = time.perf_counter() - t0
    extent = tl.attrs["extent_ns"] / 1e6
    mid = extent / 2
    zooms = [(mid - extent / 200, mid + extent / 200), (mid - extent / 20000, mid + extent / 20000), (0.0, extent),
             (mid / 2 - extent / 200, mid / 2 + extent / 200)]
    runs: dict[str, list[dict]] = {"LOD": [], "plain": []}
    with sync_playwright() as pw:
        browser = launch(pw, args.chromium)
        try:
            for r in range(args.repeat):
                order = [("LOD", lod_page), ("plain", plain_page)]
                for name, page in (order if r % 2 == 0 else order[::-1]):
                    runs[name].append(measure(browser, page, zooms, lod=name == "LOD"))
                    print(f"run {r + 1}/{args.repeat} {name}: {runs[name][-1]}", file=sys.stderr)
        finally:
            browser.close()

    n = tl.attrs["n_spans"]
    print(f"\n{n:,} spans, {len(tl.attrs['tracks'])} tracks, {extent:,.1f} ms of trace; LOD levels: "
          f"{tl.attrs['raw_level']} merged + raw; {int((tl['row_kind'] == 'block').sum()):,} merged blocks")
    print(f"python: compute {t_compute:.2f} s, LOD page build+write {t_lod_html:.2f} s, plain page "
          f"{t_plain_html:.2f} s; Chromium {args.chromium}, {args.repeat} interleaved runs, median (p25..p75)\n")
    labels = [("HTML size (MB)", None), ("first paint (ms)", "first_paint_ms"),
              ("pyramid inflated (ms)", "payload_ready_ms"),
              ("redraw, zoom to 1 % (ms)", "redraw_0_ms"), ("redraw, zoom to 0.01 % (ms)", "redraw_1_ms"),
              ("redraw, zoom out to all (ms)", "redraw_2_ms"), ("redraw, 1 % elsewhere (ms)", "redraw_3_ms"),
              ("bars drawn at 1 % (count)", "bars_0"), ("bars drawn at 0.01 % (count)", "bars_1"),
              ("bars drawn, all (count)", "bars_2")]
    print(f"{'measure':<32}{'LOD (analyses.timeline)':>28}{'plain Bokeh hbar':>28}")
    sizes = {"LOD": lod_page.stat().st_size / 1e6, "plain": plain_page.stat().st_size / 1e6}
    for label, key in labels:
        cells = []
        for name in ("LOD", "plain"):
            if key is None:
                cells.append(f"{sizes[name]:,.1f}")
            elif key.startswith("bars"):
                vals = [r[key] for r in runs[name] if r.get(key) is not None]
                cells.append(f"{int(statistics.median(vals)):,}" if vals else f"{n:,} (all)")
            else:
                cells.append(summary([r[key] for r in runs[name] if key in r]))
        print(f"{label:<32}{cells[0]:>28}{cells[1]:>28}")
    print("\ntargets (LOD): first paint <= 2,000 ms, redraw <= 200 ms")


if __name__ == "__main__":
    main()
