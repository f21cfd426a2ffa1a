"""The JupyterLab timeline panel at scale: first paint and zoom/pan redraw on a >= 1M-span trace, in headless
Chromium (Debian ``chromium``), interleaved with the standalone level-of-detail page of
``benchmarks/timeline_scale.py`` (the same spans, the same browser process).

1. The trace: ``timeline_scale.load_spans`` (torch.profiler on a small CNN, imported by ``mlms_nb.load_trace``,
   cut to ``--spans`` spans; cached under ``--out``). It is stored as a run in a fresh MLMS_HOME (a history row
   and the Parquet trace under ``traces/<evaluation_id>/torch``), its level-of-detail index built the way the
   server builds it (timed; the server writes it beside the trace when a run is first listed or opened).
2. JupyterLab on loopback (``tests/lab_support.start_lab``: random port, a token, base URL ``/hub/user/x/``).
3. ``--repeat`` rounds, the two pages in alternating order, each in a fresh browser context:
   - *panel*: JupyterLab loaded, the runs sidebar shown; *first paint* = from the click on the trace in the
     sidebar to the end of the first frame drawn from a tile covering the view (``probe.first_paint_ms``);
     the first round reads the index from disk in a server that has not opened it, later rounds from the
     server's memory. *Redraw*: a real wheel event (zoom around the centre) or a drag (pan) dispatched on the
     canvas, until the frame after the one drawn from a tile covering the new view at its resolution:
     zoom to 1 %, to 0.01 %, pan by half a view (from the tile in hand), pan by two views, zoom out to all,
     one wheel notch in (from the tile in hand).
   - *standalone*: ``timeline_scale.measure`` (first paint: navigation start to the Bokeh document idle;
     redraw: the x range set from JS until the frame after the next paint; zooms to 1 %, 0.01 %, all, 1 %).
   Printed: median and IQR (p25..p75) per page and measure, in ms.

Targets (panel): first paint <= 1,000 ms, redraw <= 100 ms (median).

Run: ``.venv/bin/python benchmarks/lab_timeline.py [--spans 1000000] [--repeat 5] [--out /tmp/mlms_timeline_scale]``.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import timeline_scale  # noqa: E402

from tests.lab_support import launch_chromium, start_lab  # noqa: E402

WHEEL_PER_E = 500.0
"""The panel zooms by exp(deltaY * 0.002): deltaY = -500 * ln(k) zooms in k times."""

INTERACT_JS = """async ([kind, amount]) => {
  const w = window.mlmsTimelines[window.mlmsTimelines.length - 1];
  const c = w.node.querySelector('canvas'), r = c.getBoundingClientRect();
  const cx = r.left + 230 + (r.width - 238) / 2, cy = r.top + 60;
  w.probe.last_fresh_paint_ms = null;
  const t0 = performance.now();
  if (kind === 'zoom') {
    c.dispatchEvent(new WheelEvent('wheel', {deltaY: amount, clientX: cx, clientY: cy, bubbles: true, cancelable: true}));
  } else {                                   // drag by amount views
    const dx = -amount * (r.width - 238);
    c.dispatchEvent(new MouseEvent('mousedown', {button: 0, clientX: cx, clientY: cy, bubbles: true}));
    window.dispatchEvent(new MouseEvent('mousemove', {clientX: cx + dx / 2, clientY: cy, bubbles: true}));
    window.dispatchEvent(new MouseEvent('mousemove', {clientX: cx + dx, clientY: cy, bubbles: true}));
    window.dispatchEvent(new MouseEvent('mouseup', {button: 0, clientX: cx + dx, clientY: cy, bubbles: true}));
  }
  for (let i = 0; w.probe.last_fresh_paint_ms === null && i < 3000; i++) await new Promise(r => requestAnimationFrame(r));
  await new Promise(r => requestAnimationFrame(r));
  return {redraw_ms: performance.now() - t0, marks: w.probe.marks, level: w.node.dataset.level};
}"""

PANEL_STEPS = [("zoom to 1 %", "zoom", -WHEEL_PER_E * math.log(100)),
               ("zoom to 0.01 %", "zoom", -WHEEL_PER_E * math.log(100)),
               ("pan half a view (tile in hand)", "pan", 0.5),
               ("pan two views", "pan", 2.0),
               ("zoom out to all", "zoom", WHEEL_PER_E * math.log(10000)),
               ("one wheel notch in (tile in hand)", "zoom", -100.0)]


def store_run(home: Path, trace_dir: Path) -> str:
    """A history row for the trace (an Evaluation with no latency: the trace is what is measured here) and the
    trace copied to where ``mlms_nb.api`` saves traces; returns the evaluation id."""
    import os

    os.environ["MLMS_HOME"] = str(home)
    from mlms_nb.evaluation.result import Evaluation
    from mlms_nb.store.history import HistoryStore

    ev = Evaluation(model="kineto-small-cnn", model_version="1.0.0", frameworks=["torch"],
                    options={"trace_level": "ML_LIBRARY", "dataset": "random 1x3x32x32"})
    store = HistoryStore()
    store.save(ev)
    dest = home / "traces" / ev.id / "torch"
    shutil.copytree(trace_dir, dest)
    store.add_trace(ev.id, f"{ev.id}-torch", "parquet", path=str(dest))
    return ev.id


def panel_round(browser, lab, evaluation_id: str) -> dict:
    context = browser.new_context(viewport={"width": 1700, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=120_000)
        page.locator(".jp-mod-left li[data-id='mlms-runs']").click(timeout=120_000)
        chip = f".mlms-run[data-evaluation-id='{evaluation_id}'] .mlms-chip[data-framework='torch']"
        page.wait_for_selector(chip, timeout=60_000)
        t0 = page.evaluate(f"() => {{ const t = performance.now(); document.querySelector(\"{chip}\").click(); "
                           f"return t; }}")
        page.wait_for_function("(window.mlmsTimelines || []).length > 0 && "
                               "window.mlmsTimelines[window.mlmsTimelines.length - 1].probe.first_paint_ms !== null",
                               timeout=120_000)
        out = {"first_paint_ms": page.evaluate(
            "window.mlmsTimelines[window.mlmsTimelines.length - 1].probe.first_paint_ms") - t0}
        out["marks_first"] = page.evaluate("window.mlmsTimelines[window.mlmsTimelines.length - 1].probe.marks")
        page.wait_for_timeout(300)
        for i, (_label, kind, amount) in enumerate(PANEL_STEPS):
            r = page.evaluate(INTERACT_JS, [kind, amount])
            out[f"redraw_{i}_ms"] = r["redraw_ms"]
            out[f"marks_{i}"] = r["marks"]
            page.wait_for_timeout(150)
        if errors:
            raise RuntimeError(f"panel: page errors: {errors[:3]}")
        return out
    finally:
        context.close()


summary = timeline_scale.summary  # median (quartiles) of a run list, one format for both benchmarks


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--width", type=int, default=1200, help="standalone page: plot width (px)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/mlms_timeline_scale"))
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from mlms_nb.analyses import timeline
    from mlms_nb.server import lod

    spans = timeline_scale.load_spans(args.out, args.spans)
    cut = args.out / f"spans_{args.spans}"
    tmp = Path(tempfile.mkdtemp(prefix="mlms-lab-bench-"))
    home = tmp / "mlms_home"
    evaluation_id = store_run(home, cut)
    folder = home / "traces" / evaluation_id / "torch"
    t0 = time.perf_counter()
    index = lod.open_index(folder)  # built and written beside the trace, as the server does on first listing
    t_index = time.perf_counter() - t0
    index_bytes = sum((folder / f).stat().st_size for f in (lod.META_FILE, lod.ROWS_FILE, lod.SPANS_FILE))
    lod._cache.clear()
    t0 = time.perf_counter()
    lod.open_index(folder)
    t_reopen = time.perf_counter() - t0
    lod._cache.clear()

    t0 = time.perf_counter()
    tl = timeline.compute(spans, width_px=args.width)
    page_path = timeline.to_html(timeline.plot(tl, start_ms=0.0, end_ms=tl.attrs["extent_ns"] / 1e6),
                                 args.out / "timeline_lod.html")
    t_page = time.perf_counter() - t0
    extent = tl.attrs["extent_ns"] / 1e6
    mid = extent / 2
    zooms = [(mid - extent / 200, mid + extent / 200), (mid - extent / 20000, mid + extent / 20000), (0.0, extent),
             (mid / 2 - extent / 200, mid / 2 + extent / 200)]

    lab = start_lab(tmp / "lab", home)
    runs: dict[str, list[dict]] = {"panel": [], "standalone": []}
    try:
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            try:
                for r in range(args.repeat):
                    order = ["panel", "standalone"] if r % 2 == 0 else ["standalone", "panel"]
                    for name in order:
                        if name == "panel":
                            runs[name].append(panel_round(browser, lab, evaluation_id))
                        else:
                            runs[name].append(timeline_scale.measure(browser, page_path, zooms, lod=True))
                        print(f"round {r + 1}/{args.repeat} {name}: {runs[name][-1]}", file=sys.stderr)
            finally:
                browser.close()
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    n = index.meta["n_spans"]
    print(f"\n{n:,} spans, {len(index.meta['tracks'])} tracks, {index.meta['extent_ns'] / 1e6:,.1f} ms of trace")
    print(f"server index: built in {t_index:.2f} s (once per trace), {index_bytes / 1e6:.1f} MB beside the trace, "
          f"reopened in {t_reopen * 1e3:.0f} ms; standalone page built in {t_page:.2f} s "
          f"({page_path.stat().st_size / 1e6:.1f} MB)")
    print(f"{args.repeat} interleaved rounds in one headless Chromium, median (p25..p75), ms; first panel round "
          f"reads the index from disk, later rounds from the server's memory\n")
    panel = runs["panel"]
    print(f"{'panel (JupyterLab, tiles from the server)':<48}{'ms':>24}{'marks':>10}")
    print(f"{'first paint (click -> first full frame)':<48}{summary([r['first_paint_ms'] for r in panel]):>24}"
          f"{int(statistics.median(r['marks_first'] for r in panel)):>10,}")
    redraws = []
    for i, (label, _k, _a) in enumerate(PANEL_STEPS):
        vals = [r[f"redraw_{i}_ms"] for r in panel]
        redraws += vals
        print(f"{'redraw, ' + label:<48}{summary(vals):>24}{int(statistics.median(r[f'marks_{i}'] for r in panel)):>10,}")
    print(f"{'redraw, all steps':<48}{summary(redraws):>24}")
    st = runs["standalone"]
    print(f"\n{'standalone LOD page (timeline_scale)':<48}{'ms':>24}")
    print(f"{'first paint (navigation -> Bokeh idle)':<48}{summary([r['first_paint_ms'] for r in st]):>24}")
    print(f"{'pyramid inflated':<48}{summary([r['payload_ready_ms'] for r in st]):>24}")
    labels = ["zoom to 1 %", "zoom to 0.01 %", "zoom out to all", "1 % elsewhere"]
    all_st = []
    for i, label in enumerate(labels):
        vals = [r[f"redraw_{i}_ms"] for r in st]
        all_st += vals
        print(f"{'redraw, ' + label:<48}{summary(vals):>24}")
    print(f"{'redraw, all steps':<48}{summary(all_st):>24}")
    print("\ntargets (panel): first paint <= 1,000 ms, redraw <= 100 ms (median)")


if __name__ == "__main__":
    main()
