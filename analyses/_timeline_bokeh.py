"""The Bokeh side of :mod:`analyses.timeline`: a figure that zooms through a million spans with no server.

What travels to the browser:

* the bars of the first view (computed in Python, so the first paint needs no script of ours);
* the whole level-of-detail pyramid as **one gzip-compressed binary payload** (base64 text inside the page):
  spans sorted by (first level, start) and blocks by (level, start), starts delta-coded, durations and busy
  times as uint32 ns (larger values escaped), lanes and signature ids uint8/16, each array stored as byte
  planes (all first bytes, then all second bytes...), which gzip packs about 20 % tighter. The browser inflates
  it with its own ``DecompressionStream`` right after the first paint (the plot's first layout triggers it; a
  zoom before then waits for it);
* a small table of distinct (name, shape, layer type, kind, level, FLOPs) *signatures* the rows point at.

A CustomJS callback on the x range picks the level (the coarsest whose pixel is not wider than the current
one), binary-searches each group for the visible window (looking back by the group's longest row) and swaps
the rows into the one rendered ColumnDataSource. The rows drawn stay bounded by about (tracks x width in
pixels x a small factor) at every zoom.
"""
from __future__ import annotations

import base64
import gzip

import numpy as np
import pandas as pd

from ._lod import signatures
from ._plot import MissingDependency

OTHER_COLOR = "#c7c7c7"
ESCAPE = 0xFFFFFFFF
_EXTRA = "pip install 'mlms-nb[analysis]'"

# The loader: payload (base64 gzip) -> typed arrays; one promise per page and figure, kept on window.
_LOAD_JS = """
function mlms_load(key, payload, layout) {
  const memo = (window.__mlms_timeline = window.__mlms_timeline || {});
  const st = memo[key] || (memo[key] = {});
  if (st.loading) return st.loading;
  const bytes = typeof Uint8Array.fromBase64 === "function" ? Uint8Array.fromBase64(payload)
    : Uint8Array.from(atob(payload), (c) => c.charCodeAt(0));
  const inflated = new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).arrayBuffer();
  st.loading = inflated.then((buf) => {
    const T = {u8: Uint8Array, u16: Uint16Array, u32: Uint32Array, f32: Float32Array};
    const out = {};
    for (const [table, col, dtype, offset, n] of layout.arrays) {   // byte planes -> typed array
      const w = T[dtype].BYTES_PER_ELEMENT, planes = new Uint8Array(buf, offset, n * w), bytes = new Uint8Array(n * w);
      for (let b = 0; b < w; b++) { const p = b * n; for (let i = 0; i < n; i++) bytes[i * w + b] = planes[p + i]; }
      (out[table] = out[table] || {})[col] = new T[dtype](bytes.buffer);
    }
    for (const [table, col] of layout.ns_columns) {  // uint32 ns (+ escapes) -> float64 ms
      const v = out[table][col], esc = layout.escapes[table + "." + col], n = v.length, ms = new Float64Array(n);
      let j = 0;
      if (col === "dstart") {                         // delta-coded starts, restarting at each group
        const firsts = new Set(layout[table + "_off"]);
        let s = 0;
        for (let i = 0; i < n; i++) { if (firsts.has(i)) s = 0; s += v[i] === 4294967295 ? esc[j++] : v[i]; ms[i] = s / 1e6; }
        out[table].start = ms;
      } else {
        for (let i = 0; i < n; i++) ms[i] = (v[i] === 4294967295 ? esc[j++] : v[i]) / 1e6;
        out[table][col] = ms;
      }
    }
    st.data = out;
    st.ready_ms = performance.now();
    return out;
  });
  return st.loading;
}
"""

_RANGE_JS = _LOAD_JS + """
const memo = (window.__mlms_timeline = window.__mlms_timeline || {});
const st = memo[src.id] || (memo[src.id] = {});
st.want = [xr.start, xr.end];
if (!st.data) { mlms_load(src.id, payload, layout).then(draw); return; }
draw();
function lower(a, lo, hi, v) { while (lo < hi) { const m = (lo + hi) >>> 1; if (a[m] < v) lo = m + 1; else hi = m; } return lo; }
function fmt(ms) { return ms >= 1 ? ms.toFixed(3) + " ms" : ms >= 1e-3 ? (ms * 1e3).toFixed(3) + " µs" : (ms * 1e6).toFixed(0) + " ns"; }
function draw() {
  const [x0, x1] = st.want;
  const W = Math.max(plot.inner_width || layout.width_px, 20);
  const p = (x1 - x0) / W;                       // ms per pixel
  const res = layout.resolution_ms, raw = layout.raw_level;
  let k = raw;
  for (let j = 0; j < res.length; j++) { if (res[j] <= p * layout.level_slack * (1 + 1e-9)) { k = j; break; } }
  const key = k + ":" + x0 + ":" + x1 + ":" + W;
  if (st.drawn === key) return;
  st.drawn = key;
  const S = st.data.spans, B = st.data.blocks, C = sig.data.c;
  const picked = [];                              // [table, lo, hi] runs of candidate rows
  let total = 0;
  function runs(T, off, look, g) {
    const lo = lower(T.start, off[g], off[g + 1], x0 - look[g]);
    const hi = lower(T.start, lo, off[g + 1], x1 + 1e-12);
    picked.push([T, lo, hi, T === B]);
    total += hi - lo;
  }
  for (let g = 0; g <= k; g++) runs(S, layout.spans_off, layout.spans_look, g);
  if (k < raw) runs(B, layout.blocks_off, layout.blocks_look, k);
  const o = {x0: new Float64Array(total), x1: new Float64Array(total), y: new Float64Array(total),
             c: new Float64Array(total), a: new Float64Array(total), ref: new Float64Array(total),
             n: new Float64Array(total), d: new Float64Array(total), busy: new Float64Array(total)};
  let m = 0;
  for (const [T, lo, hi, block] of picked) {
    const st_ = T.start, du = T.dur, ln = T.lane, sg = T.sig;
    for (let i = lo; i < hi; i++) {
      const s = st_[i], d = du[i], e = s + d;
      if (e < x0) continue;
      o.x0[m] = s; o.x1[m] = Math.max(e, s + p); o.y[m] = ln[i]; o.c[m] = C[sg[i]]; o.ref[m] = sg[i]; o.d[m] = d;
      if (block) { const b = T.busy[i]; o.n[m] = T.n[i]; o.busy[m] = b; o.a[m] = 0.25 + 0.55 * Math.min(1, b / Math.max(d, 1e-12)); }
      else { o.n[m] = 1; o.busy[m] = d; o.a[m] = 0.9; }
      m++;
    }
  }
  for (const c in o) o[c] = o[c].subarray(0, m);
  src.data = o;
  lod.text = "zoom level " + (k < raw ? k : k + " (raw: every span)") + ": " + fmt(p) + " per pixel, " + m.toLocaleString() + " bars drawn";
}
"""

_READY_JS = _LOAD_JS + """
const get = (k) => (cb.args instanceof Map ? cb.args.get(k) : cb.args[k]);
// after the first paint: inflate the pyramid, then run the range callback once (compiles it; same view, same bars)
requestAnimationFrame(() => setTimeout(() => {
  mlms_load(get("src").id, get("payload"), get("layout")).then(() => cb.execute(xr));
}, 0));
"""

_HOVER_JS = """
const i = special_vars.index, d = src.data, S = sig.data;
const s = d.ref[i], n = d.n[i];
function t(ms) { return !isFinite(ms) ? "unknown" : ms >= 1 ? ms.toFixed(3) + " ms" : ms >= 1e-3 ? (ms * 1e3).toFixed(3) + " µs" : (ms * 1e6).toFixed(0) + " ns"; }
function fl(f) { if (!isFinite(f)) return "unknown"; const u = [[1e12, " TFLOPs"], [1e9, " GFLOPs"], [1e6, " MFLOPs"], [1e3, " kFLOPs"]];
  for (const [v, name] of u) if (f >= v) return (f / v).toFixed(3) + name; return f.toFixed(0) + " FLOPs"; }
switch (format) {
  case "name": return n > 1 ? n.toLocaleString() + " spans merged (longest: " + S.name[s] + ")" : S.name[s];
  case "duration": return n > 1 ? t(d.d[i]) + " (block extent)" : t(d.d[i]);
  case "shape": return n > 1 ? "(merged)" : (S.shape[s] || "unknown");
  case "flops": return n > 1 ? "(merged)" : fl(S.flops[s]);
  case "layer_type": return (S.layer_type[s] || "none") + " (" + S.kind[s] + ", " + S.level[s] + ")";
  case "count": return n.toLocaleString();
  case "busy": return n > 1 ? t(d.busy[i]) + " (" + (100 * d.busy[i] / Math.max(d.d[i], 1e-12)).toFixed(1) + " % of the block)" : t(d.busy[i]);
  case "start": return d.x0[i].toFixed(6) + " ms";
}
return "";
"""

_TICK_JS = """
const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : Math.max(Math.abs(tick), 1e-6);
const [scale, unit] = step >= 1e3 ? [1e3, "s"] : step >= 1 ? [1, "ms"] : step >= 1e-3 ? [1e-3, "µs"] : [1e-6, "ns"];
const d = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / scale) + 1e-9)));
return (tick / scale).toLocaleString("en-US", {minimumFractionDigits: d, maximumFractionDigits: d}) + " " + unit;
"""
"""x ticks in s, ms, µs or ns as their spacing reads best (``analyses.timeline.tick_label`` in Python)."""
LEGEND_COLUMNS = 4
MIN_WIDTH_PX = 720
"""The narrowest a timeline is drawn at (it stretches wider): its subtitle is wrapped for this width."""

HOVER_FIELDS = ("name", "duration", "shape", "FLOPs", "layer type", "spans merged", "busy time", "start")
"""Labels of the hover tooltip, in order."""
_HOVER_FORMATS = ("name", "duration", "shape", "flops", "layer_type", "count", "busy", "start")


def payload(tl: pd.DataFrame, sig: np.ndarray) -> tuple[str, dict]:
    """The pyramid as base64 gzip bytes and its layout (arrays, group offsets, look-backs, escapes)."""
    raw = int(tl.attrs["raw_level"])
    n_sig = int(sig.max()) + 1 if len(sig) else 0
    lane_t = ("u8", np.uint8) if len(tl.attrs["tracks"]) < 256 else ("u16", np.uint16)
    sig_t = ("u16", np.uint16) if n_sig < 65536 else ("u32", np.uint32)
    start_all, dur_all = tl["start_ns"].to_numpy(), tl["duration_ns"].to_numpy()
    lod = tl["lod_from"].to_numpy()
    is_block = (tl["row_kind"] == "block").to_numpy()
    layout: dict = {"arrays": [], "escapes": {}, "ns_columns": [], "raw_level": raw}
    chunks: list[bytes] = []
    size = 0

    def add(table: str, col: str, dtype: tuple[str, type], values: np.ndarray) -> None:
        nonlocal size
        arr = np.ascontiguousarray(values, dtype=dtype[1])
        data = arr.view(np.uint8).reshape(len(arr), arr.itemsize).T.tobytes()  # byte planes: gzip packs them better
        layout["arrays"].append([table, col, dtype[0], size, len(values)])
        pad = (-len(data)) % 8
        chunks.append(data + b"\0" * pad)
        size += len(data) + pad

    def add_ns(table: str, col: str, ns: np.ndarray) -> None:
        """int64 ns as uint32, values >= 2**32 - 1 replaced by the escape and listed in order."""
        big = ns >= ESCAPE
        layout["escapes"][f"{table}.{col}"] = [int(v) for v in ns[big]]
        layout["ns_columns"].append([table, col])
        add(table, col, ("u32", np.uint32), np.where(big, ESCAPE, ns))

    for table, mask, n_groups in (("spans", ~is_block, raw + 1), ("blocks", is_block, max(raw, 1))):
        idx = np.flatnonzero(mask)
        order = np.lexsort((start_all[idx], lod[idx]))
        idx = idx[order]
        group = lod[idx]
        start = start_all[idx]
        off = np.searchsorted(group, np.arange(n_groups + 1))
        delta = np.diff(start, prepend=0)
        firsts = off[:-1][off[:-1] < len(idx)]
        delta[firsts] = start[firsts]  # each group restarts from 0
        dur = dur_all[idx]
        layout[f"{table}_off"] = [int(v) for v in off]
        layout[f"{table}_look"] = [float(dur[off[g]:off[g + 1]].max()) / 1e6 if off[g + 1] > off[g] else 0.0
                                   for g in range(n_groups)]
        add_ns(table, "dstart", delta)
        add_ns(table, "dur", dur)
        add(table, "lane", lane_t, tl["track"].to_numpy()[idx])
        add(table, "sig", sig_t, sig[idx])
        if table == "blocks":
            add(table, "n", ("u32", np.uint32), tl["span_count"].to_numpy()[idx])
            add_ns(table, "busy", tl["busy_ns"].to_numpy()[idx])
    blob = gzip.compress(b"".join(chunks), compresslevel=6, mtime=0)
    layout["bytes"] = size
    layout["compressed_bytes"] = len(blob)
    return base64.b64encode(blob).decode("ascii"), layout


def visible_columns(rows: pd.DataFrame, sig_of_rows: np.ndarray, colour_index: np.ndarray) -> dict:
    """The rendered source's columns for ``rows`` (a :func:`analyses.timeline.view`), as the browser builds them."""
    x0, x1 = rows.attrs["window_ms"]
    px = (x1 - x0) / rows.attrs["view_width_px"]
    s = rows["start_ns"].to_numpy() / 1e6
    e = rows["end_ns"].to_numpy() / 1e6
    d = e - s
    busy = rows["busy_ns"].to_numpy() / 1e6
    block = (rows["row_kind"] == "block").to_numpy()
    return {"x0": s, "x1": np.maximum(e, s + px), "y": rows["track"].to_numpy(np.float64),
            "c": colour_index[sig_of_rows].astype(np.float64),
            "a": np.where(block, 0.25 + 0.55 * np.minimum(1, busy / np.maximum(d, 1e-12)), 0.9),
            "ref": sig_of_rows.astype(np.float64), "n": rows["span_count"].to_numpy(np.float64), "d": d,
            "busy": busy}


def figure_of(tl: pd.DataFrame, rows: pd.DataFrame, *, colours: dict[str, str], title: str, subtitle: str):
    """The Bokeh layout (figure + a line saying the zoom level) of timeline ``tl``, first showing ``rows``."""
    try:
        from bokeh.layouts import column
        from bokeh.models import (BasicTicker, ColumnDataSource, CustomJS, CustomJSHover, CustomJSTickFormatter,
                                  Div, FixedTicker, HoverTool, Legend, LegendItem, LinearColorMapper, NoOverlap,
                                  Range1d)
        from bokeh.plotting import figure
    except ImportError:
        raise MissingDependency(f"plot backend 'bokeh' needs Bokeh, which is not installed: {_EXTRA}") from None
    from ._timeline_axes import X_LABEL, Y_LABEL, tick_count, time_text
    from ._titles import TOOLBAR_PX, fit_titles, subtitles

    tracks = tl.attrs["tracks"]
    n_tracks = max(len(tracks), 1)
    width_px = int(rows.attrs["view_width_px"])
    extent_ms = max(tl.attrs["extent_ns"] / 1e6, 1e-6)
    sig, sig_table = signatures(tl, colours)
    data, layout = payload(tl, sig)
    from ._lod import LEVEL_SLACK

    layout.update(width_px=width_px, resolution_ms=[r / 1e6 for r in tl.attrs["resolution_ns"]],
                  level_slack=LEVEL_SLACK)
    visible = ColumnDataSource(visible_columns(rows, sig[tl.index.get_indexer(rows.index)], sig_table["c"]),
                               name="timeline_visible")
    sig_src = ColumnDataSource(sig_table, name="timeline_signatures")
    x0, x1 = rows.attrs["window_ms"]
    legend_rows = -(-(len(colours) + 1) // LEGEND_COLUMNS)
    # the title on one line and the subtitle wrapped for the narrowest the figure is drawn at (it stretches to the
    # output area; the range callback draws for the plot's actual inner width); the toolbar at the right, clear
    # of both
    labels_px = 6.5 * max((len(t) for t in tracks["track_label"]), default=0) + 50
    narrowest = min(width_px, MIN_WIDTH_PX)
    title, lines = fit_titles(title, subtitle, narrowest - labels_px - TOOLBAR_PX)
    # (at most 300 px wider than the width its levels of detail were computed for: wider, a whole trace would be
    # drawn span by span)
    fig = figure(name="timeline", title=title, width=width_px, sizing_mode="stretch_width", min_width=narrowest,
                 max_width=width_px + 300,
                 height=int(min(max(150 + 22 * n_tracks, 360), 1400)) + 16 * legend_rows,
                 x_range=Range1d(x0, x1, bounds=(-0.02 * extent_ms, extent_ms * 1.02), min_interval=1e-6),
                 y_range=Range1d(n_tracks - 0.5, -0.5), tools="xpan,xwheel_zoom,xbox_zoom,reset,save",
                 active_scroll="xwheel_zoom", x_axis_label=X_LABEL, y_axis_label=Y_LABEL, toolbar_location="right")
    fig.title.text_font_size = "11pt"
    subtitles(fig, lines)
    mapper = LinearColorMapper(palette=list(colours.values()) + [OTHER_COLOR], low=-0.5, high=len(colours) + 0.5)
    bars = fig.hbar(y="y", left="x0", right="x1", height=0.8, source=visible, line_color=None,
                    fill_color={"field": "c", "transform": mapper}, fill_alpha="a")
    fig.yaxis.ticker = FixedTicker(ticks=list(range(len(tracks))))
    fig.yaxis.major_label_overrides = {i: lab for i, lab in enumerate(tracks["track_label"])}
    fig.yaxis.major_label_text_font_size = "8pt"
    fig.xaxis.formatter = CustomJSTickFormatter(code=_TICK_JS)
    # as many ticks as the narrowest plot holds labels such as "27,500 ms" (11 px characters); any that would still
    # touch are left unlabelled
    fig.xaxis.ticker = BasicTicker(desired_num_ticks=tick_count(narrowest - labels_px - TOOLBAR_PX, 10, 11))
    fig.xaxis.major_label_policy = NoOverlap()
    fig.ygrid.grid_line_color = None
    fmt = CustomJSHover(args=dict(src=visible, sig=sig_src), code=_HOVER_JS)
    fig.add_tools(HoverTool(renderers=[bars], formatters={"@ref": fmt},
                            tooltips=[(label, "@ref{%s}" % f) for label, f in zip(HOVER_FIELDS, _HOVER_FORMATS)]))
    names = [k[:40] for k in colours] + ["other"]
    swatches = fig.hbar(y=[-10.0] * len(names), left=[0.0] * len(names), right=[0.0] * len(names), height=0.8,
                        color=list(colours.values()) + [OTHER_COLOR])  # off-range: drawn only in the legend
    fig.add_layout(Legend(items=[LegendItem(label=nm, renderers=[swatches], index=i) for i, nm in enumerate(names)],
                          title="colour: layer type", label_text_font_size="8pt", title_text_font_size="8pt",
                          glyph_height=10, spacing=0, padding=4, orientation="horizontal",
                          ncols=LEGEND_COLUMNS), "below")
    _phase_bands(fig, tl, n_tracks)
    level = rows.attrs["level"]
    lod = Div(text=f"zoom level {level}{' (raw: every span)' if level >= tl.attrs['raw_level'] else ''}: "
                   f"{time_text((x1 - x0) / width_px)} per pixel, {len(rows):,} bars drawn",
              name="timeline_lod", styles={"font-size": "9pt", "color": "#555"})
    args = dict(xr=fig.x_range, plot=fig, src=visible, sig=sig_src, lod=lod, payload=data, layout=layout)
    on_range = CustomJS(args=args, code=_RANGE_JS)
    fig.x_range.js_on_change("start", on_range)
    fig.x_range.js_on_change("end", on_range)
    # the plot's first layout sets inner_width: the moment to inflate the payload, right after the first paint
    fig.js_on_change("inner_width", CustomJS(args=dict(cb=on_range, xr=fig.x_range), code=_READY_JS))
    return column(fig, lod, name="timeline_layout", sizing_mode="stretch_width")


def _phase_bands(fig, tl: pd.DataFrame, n_tracks: int) -> None:
    """A generate run's phases (``tl.attrs["phases"]``) as bands behind the bars, one colour per phase with a
    legend entry each, and a hover that names the step (``prefill`` or ``decode step k``), its batch size and
    duration."""
    bands = tl.attrs.get("phases")
    if bands is None or not len(bands):
        return
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem

    from .phases import PHASE_COLOURS

    items, renderers = [], []
    for phase, colour in PHASE_COLOURS.items():
        part = bands[bands["phase"] == phase]
        if part.empty:
            continue
        source = ColumnDataSource({"left": part["start_ns"] / 1e6, "right": part["end_ns"] / 1e6,
                                   "label": list(part["label"]), "batch": list(part["batch_size"]),
                                   "ms": part["duration_ns"] / 1e6}, name=f"timeline_phase_{phase}")
        quad = fig.quad(left="left", right="right", bottom=n_tracks - 0.5, top=-0.5, source=source, fill_color=colour,
                        fill_alpha=0.12, line_color=None, level="underlay")
        renderers.append(quad)
        items.append(LegendItem(label=f"{phase} ({len(part)} step{'s' if len(part) > 1 else ''})",
                                renderers=[quad]))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("phase", "@label"), ("batch size", "@batch"),
                                                           ("step time", "@ms{0,0.000} ms")]))
    fig.add_layout(Legend(items=items, title="band: phase of generation", label_text_font_size="8pt",
                          title_text_font_size="8pt", orientation="horizontal", padding=4, spacing=4), "below")
