"""Timeline of a trace: one track per (level, device, thread / stream, nesting depth), zoomable from the whole
run down to single kernels, for traces of a million spans in a notebook with no Bokeh server.

- :func:`compute` -- the tracks and the level-of-detail rows (:mod:`analyses._lod`): every span once, shown
  from the zoom level where it is at least a pixel wide; narrower spans merged per track into blocks
  (count, busy time) at each coarser level. Times: ns from the trace start (``start_ns``, ``end_ns``).
- :func:`view` -- the rows drawn for one x window (ms) at one plot width (px).
- :func:`plot` -- Bokeh (interactive; the pyramid travels once as a compressed binary payload and a CustomJS
  callback on the x range swaps in the right level and the visible window, see :mod:`analyses._timeline_bokeh`)
  or matplotlib (static, for a PDF).
- :func:`to_html` -- a standalone page with INLINE resources (works offline).

Hover: name, duration (ns/µs/ms), input shapes, FLOPs, layer type, level; on merged blocks: how many spans,
their busy time and the longest one's name.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from mlms_nb.display import people_table
from mlms_nb.schema.trace import LEVEL_NAMES, attrs_dict, validate_spans

from . import _lod
from ._lod import signatures  # noqa: F401  (hover signatures of the pyramid rows; the server index uses them)
from ._plot import AnalysisError, MissingDependency, check_backend
from ._titles import fit_titles, matplotlib_titles
from ._timeline_axes import X_LABEL, Y_LABEL, duration_text, tick_label, time_axis, time_text  # noqa: F401
# (the axes' words, public here too)
from .phases import PHASE_COLOURS

# tab20, dark shades first: the same colours in Bokeh and matplotlib
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5",
           "#7f7f7f")
OTHER_COLOR = "#c7c7c7"
NAMED_KINDS = ("op", "kernel", "memcpy", "memset", "runtime")
"""Kinds coloured by their own name when they carry no layer type (``aten::conv2d``, a CUDA kernel)."""
LEVEL_SLACK = _lod.LEVEL_SLACK
"""A zoom level is drawn while its pixel is at most this many view pixels wide."""
_EXTRA = "pip install 'mlms-nb[analysis]'"
_REQUIRED = ("trace_id", "span_id", "parent_id", "name", "level", "kind", "start_ns", "end_ns", "duration_ns",
             "thread", "device", "stream", "layer_type", "shape", "flops")


# ------------------------------------------------------------------------------------------ compute

def _spans_of(spans) -> pd.DataFrame:
    if hasattr(spans, "spans") and isinstance(getattr(spans, "spans"), pd.DataFrame):
        spans = spans.spans  # a Trace
    if not isinstance(spans, pd.DataFrame):
        raise AnalysisError(f"timeline: expected a spans DataFrame or a Trace, got {type(spans).__name__}")
    missing = [c for c in _REQUIRED if c not in spans.columns]
    if missing:
        raise AnalysisError(f"timeline: the spans frame lacks column(s) {', '.join(missing)} "
                            "(see mlms_nb.schema.trace)")
    try:
        return validate_spans(spans)
    except ValueError as exc:
        raise AnalysisError(f"timeline: {exc}") from None


def _codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64), [str(c) for c in col.cat.categories]
    codes, uniq = pd.factorize(col.astype(str))
    return codes.astype(np.int64), [str(u) for u in uniq]


def parent_rows(spans: pd.DataFrame) -> np.ndarray:
    """Per span: the row (position) of its parent in ``spans`` (same ``trace_id``, ``span_id == parent_id``), or
    -1 for a root or a parent that is not in the frame."""
    n = len(spans)
    tcode, _ = _codes(spans["trace_id"])
    key = (tcode << 40) | spans["span_id"].to_numpy(np.int64)
    pid = spans["parent_id"].to_numpy(np.int64)
    order = np.argsort(key, kind="stable")
    skey = key[order]
    pkey = (tcode << 40) | pid
    pos = np.minimum(np.searchsorted(skey, pkey), max(n - 1, 0))
    found = (pid != 0) & (skey[pos] == pkey) if n else np.zeros(0, bool)
    return np.where(found, order[pos], -1)


def _nesting_depth(spans: pd.DataFrame, base: np.ndarray) -> np.ndarray:
    """Per span: how many of its ancestors (by ``parent_id``) lie on the same base track."""
    parent = parent_rows(spans)
    depth = np.zeros(len(spans), np.int64)
    anc = parent.copy()
    for _ in range(256):  # a tree deeper than 256 (or a cycle) stops here
        idx = np.flatnonzero(anc >= 0)
        if not len(idx):
            break
        a = anc[idx]
        depth[idx] += base[a] == base[idx]
        anc[idx] = parent[a]
    return depth


def _tracks(spans: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Track (lane) index of every span and the table of tracks, ordered by level, device, thread, depth."""
    level = spans["level"].cat.codes.to_numpy(np.int64)
    dcode, devices = _codes(spans["device"])
    thread = spans["thread"].to_numpy(np.int64)
    stream = spans["stream"].to_numpy(np.int64)
    keys = pd.DataFrame({"level": level, "device": dcode, "thread": thread, "stream": stream})
    base = keys.groupby(list(keys.columns), sort=False).ngroup().to_numpy(np.int64)
    depth = _nesting_depth(spans, base)
    combo, first, lane_of = np.unique(base * 1024 + np.minimum(depth, 1023), return_index=True,
                                      return_inverse=True)
    table = keys.iloc[first].reset_index(drop=True)
    table["device"] = [devices[c] for c in table["device"]]
    table["depth"] = depth[first]
    cols = ["level", "device", "thread", "stream", "depth"]
    order = table.sort_values(cols).index.to_numpy()
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    table = table.iloc[order].reset_index(drop=True)
    table["track"] = np.arange(len(table))
    labels = []
    for lv, dev, th, st, d in table[cols].itertuples(index=False):
        where = f"stream {st}" if st >= 0 else f"thread {th}"
        labels.append(f"{LEVEL_NAMES[lv]} · {dev} · {where}" + (f" [{d}]" if d else ""))
    table["level"] = [LEVEL_NAMES[v] for v in table["level"]]
    table["track_label"] = labels
    return rank[lane_of.reshape(-1)], table


def _colour_keys(spans: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """What each span is coloured by, as codes into a list of keys: its layer type; else its name for ops and
    kernels; else its kind. Worked out once per distinct (layer type, kind, name)."""
    lt, lt_cats = _codes(spans["layer_type"])
    kind, kind_cats = _codes(spans["kind"])
    name, name_cats = _codes(spans["name"])
    combo = (lt * (len(kind_cats) + 1) + kind) * (len(name_cats) + 1) + name
    uniq, first, inverse = np.unique(combo, return_index=True, return_inverse=True)
    keys = []
    for i in first:
        layer_type, k = lt_cats[lt[i]] if lt[i] >= 0 else "", kind_cats[kind[i]] if kind[i] >= 0 else ""
        keys.append(layer_type or (name_cats[name[i]] if k in NAMED_KINDS else k))
    codes, cats = pd.factorize(np.asarray(keys, dtype=object))
    return codes[inverse.reshape(-1)].astype(np.int64), [str(c) for c in cats]


def compute(spans, *, width_px: int = 1200, factor: float = 2.0, merge_ratio: float = 0.3) -> pd.DataFrame:
    """The tracks and level-of-detail rows of a timeline of ``spans`` (a spans frame or a ``Trace``).

    One row per span (``row_kind == "span"``, drawn at zoom levels ``lod_from..lod_to``) and one per merged
    block (``"block"``, drawn at level ``lod_from == lod_to`` only). Columns: ``track, track_label, row_kind,
    lod_from, lod_to, start_ns, end_ns`` (ns from the trace start; a block spans its first start to its last
    end), ``duration_ns`` (``end_ns - start_ns``), ``span_count``, ``busy_ns`` (sum of the spans'
    durations), and the attributes of the span (for a block: of its longest span) ``name, level, kind,
    layer_type, shape, flops, colour_key, span_row`` (row of that span in ``spans``).

    ``width_px``: plot width at zoom level 0 (px); ``factor``: zoom between levels; ``merge_ratio``: a level is
    kept while its blocks are at most this fraction of the spans they replace. ``df.attrs``: ``origin_ns``
    (trace start on the trace's clock), ``extent_ns``, ``resolution_ns`` (ns per pixel per level),
    ``raw_level``, ``width_px``, ``tracks`` (a frame: track, level, device, thread, stream, depth, label),
    ``n_spans``, ``focus_ns`` (start, end of the spans below APPLICATION level -- an evaluation's traced pass --
    or of the whole trace), ``phases`` (a generate run's trace: :func:`phase_bands`, else an empty frame).
    """
    spans = _spans_of(spans)
    if int(width_px) < 10:
        raise AnalysisError(f"timeline: width_px must be at least 10 pixels, got {width_px!r}")
    if not float(factor) > 1:
        raise AnalysisError(f"timeline: factor (zoom between levels) must be > 1, got {factor!r}")
    n = len(spans)
    if n == 0:
        raise AnalysisError("timeline: the trace has no spans (was it recorded at trace level NONE?)")
    start = spans["start_ns"].to_numpy(np.int64)
    origin = int(start.min())
    rel = start - origin
    dur = spans["duration_ns"].to_numpy(np.int64)
    lane, tracks = _tracks(spans)
    colour, colour_cats = _colour_keys(spans)
    pyr = _lod.build(lane, rel, dur, key=colour, width_px=int(width_px), factor=float(factor),
                     merge_ratio=float(merge_ratio))
    raw = pyr.raw_level
    nb = len(pyr.block_level)
    span_row = np.concatenate([np.arange(n), pyr.block_longest]).astype(np.int64)
    is_block = np.r_[np.zeros(n, bool), np.ones(nb, bool)]
    s = np.r_[rel, pyr.block_start_ns].astype(np.int64)
    e = np.r_[rel + dur, pyr.block_end_ns].astype(np.int64)
    out = pd.DataFrame({
        "track": np.r_[lane, pyr.block_lane].astype(np.int64),
        "row_kind": pd.Categorical.from_codes(is_block.astype(np.int8), ["span", "block"]),
        "lod_from": np.r_[pyr.lod_from, pyr.block_level].astype(np.int64),
        "lod_to": np.r_[np.full(n, raw), pyr.block_level].astype(np.int64),
        "start_ns": s, "end_ns": e, "duration_ns": e - s,
        "span_count": np.r_[np.ones(n, np.int64), pyr.block_count].astype(np.int64),
        "busy_ns": np.r_[dur, pyr.block_busy_ns].astype(np.int64),
    })
    out.insert(1, "track_label", pd.Categorical.from_codes(out["track"].to_numpy(),
                                                          list(tracks["track_label"])) if len(tracks)
               else pd.Categorical([]))
    for col in ("name", "level", "kind", "layer_type", "shape"):
        cat = spans[col].array
        out[col] = pd.Categorical.from_codes(cat.codes[span_row], dtype=cat.dtype)
    out["flops"] = spans["flops"].to_numpy(np.float64)[span_row]
    out["colour_key"] = pd.Categorical.from_codes(colour[span_row], colour_cats)
    out["span_row"] = span_row
    traced = (spans["level"] != "APPLICATION").to_numpy()
    focus = ((int(rel[traced].min()), int((rel + dur)[traced].max())) if traced.any() and not traced.all()
             else (0, int(pyr.extent_ns)))
    out.attrs.update(analysis="timeline", origin_ns=origin, extent_ns=int(pyr.extent_ns), focus_ns=focus,
                     resolution_ns=[float(r) for r in pyr.resolution_ns], raw_level=raw, width_px=int(width_px),
                     factor=float(factor), tracks=tracks, n_spans=n, phases=phase_bands(spans, origin))
    return out


@people_table
def levels(tl: pd.DataFrame) -> pd.DataFrame:
    """One row per zoom level of :func:`compute`'s frame ``tl``: the time one pixel stands for (``pixel_ns``; none
    at the raw level, where every span is drawn on its own), the bars drawn for the whole trace, how many of them
    are merged blocks, the spans they stand for and their busy time (the same at every level: nothing is lost)."""
    res = tl.attrs["resolution_ns"]
    lf, lt = tl["lod_from"].to_numpy(), tl["lod_to"].to_numpy()
    block = (tl["row_kind"] == "block").to_numpy()
    count, busy = tl["span_count"].to_numpy(), tl["busy_ns"].to_numpy()
    rows = []
    for level in range(int(tl.attrs["raw_level"]) + 1):
        drawn = (lf <= level) & (lt >= level)
        rows.append({"zoom_level": str(level) if level < len(res) else f"{level} (raw)",
                     "pixel_ns": float(res[level]) if level < len(res) else np.nan, "bars": int(drawn.sum()),
                     "merged_blocks": int((drawn & block).sum()), "spans_represented": int(count[drawn].sum()),
                     "busy_ms": float(busy[drawn].sum()) / 1e6})
    out = pd.DataFrame(rows)
    out.attrs["note"] = (f"zoom level 0: the whole trace ({tl.attrs['extent_ns'] / 1e6:,.1f} ms) on "
                         f"{tl.attrs['width_px']} px; each level {tl.attrs['factor']:g}x finer")
    return out


def phase_bands(spans: pd.DataFrame, origin_ns: int = 0) -> pd.DataFrame:
    """The phases of a generate run's trace: one row per phase-tagged ``predict`` span (:mod:`mlms_nb.generation.
    traced`): ``label`` (``prefill`` or ``decode step k``), ``phase``, ``step``, ``batch_size``, ``start_ns``,
    ``end_ns`` (from ``origin_ns``) and ``duration_ns``; empty (same columns) for any other trace."""
    cols = ["label", "phase", "step", "batch_size", "start_ns", "end_ns", "duration_ns"]
    predict = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    attrs = predict["attrs"].astype(str)
    tagged = attrs.str.contains('"phase"', regex=False).to_numpy()
    rows = []
    for text, start, dur in zip(attrs[tagged], predict["start_ns"][tagged], predict["duration_ns"][tagged]):
        a = attrs_dict(text)
        phase, step = str(a.get("phase")), int(a.get("step") or 0)
        rows.append((phase if phase != "decode" else f"decode step {step}", phase, step, int(a.get("batch", -1)),
                     int(start) - origin_ns, int(start) - origin_ns + int(dur), int(dur)))
    return pd.DataFrame(rows, columns=cols).sort_values("start_ns", ignore_index=True)


def _timeline(data, **kw) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame) and data.attrs.get("analysis") == "timeline":
        return data
    return compute(data, **kw)


def level_for(tl: pd.DataFrame, ms_per_px: float) -> int:
    """The zoom level drawn when one pixel is ``ms_per_px`` ms: the coarsest whose pixel is at most
    :data:`LEVEL_SLACK` view pixels wide."""
    res = np.asarray(tl.attrs["resolution_ns"], float)
    finer = np.flatnonzero(res <= ms_per_px * 1e6 * LEVEL_SLACK * (1 + 1e-9))
    return int(finer[0]) if len(finer) else int(tl.attrs["raw_level"])


def view(tl: pd.DataFrame, start_ms: float | None = None, end_ms: float | None = None,
         width_px: int | None = None) -> pd.DataFrame:
    """The rows of :func:`compute`'s frame drawn for the x window ``[start_ms, end_ms]`` (ms from the trace
    start; default: the whole trace) on a plot ``width_px`` pixels wide; ``attrs["level"]`` says which level."""
    extent_ms = tl.attrs["extent_ns"] / 1e6
    x0 = 0.0 if start_ms is None else float(start_ms)
    x1 = extent_ms if end_ms is None else float(end_ms)
    if not x1 > x0:
        raise AnalysisError(f"timeline view: end_ms ({x1}) must be after start_ms ({x0})")
    width = int(width_px or tl.attrs["width_px"])
    level = level_for(tl, (x1 - x0) / width)
    lf, lt = tl["lod_from"].to_numpy(), tl["lod_to"].to_numpy()
    s, e = tl["start_ns"].to_numpy() / 1e6, tl["end_ns"].to_numpy() / 1e6
    keep = (lf <= level) & (lt >= level) & (e >= x0) & (s <= x1)
    out = tl[keep]
    out.attrs = {**tl.attrs, "level": level, "window_ms": (x0, x1), "view_width_px": width}
    return out


def palette(tl: pd.DataFrame, top: int = len(PALETTE)) -> dict[str, str]:
    """Colour of each colour key: the ``top`` keys with the most busy time get the palette, others grey."""
    spans = tl[tl["row_kind"] == "span"]
    busy = spans.groupby("colour_key", observed=True)["busy_ns"].sum().sort_values(ascending=False)
    return {str(k): PALETTE[i] for i, k in enumerate(busy.index[:top])}


def _title(tl: pd.DataFrame, title: str | None, measured_by: str | None, interactive: bool = True) -> tuple[str, str]:
    """The title (what: how many spans over how long, three significant digits) and the subtitle (how)."""
    n, extent_ms = tl.attrs["n_spans"], tl.attrs["extent_ns"] / 1e6
    main = title or f"Timeline of {n:,} spans over {duration_text(extent_ms)}"
    how = (f"measured by {measured_by}" if measured_by else "span start and end times as recorded in the trace")
    sub = (f"one track per level · device · thread; {how}; bars: spans at their recorded start and end; pale "
           "blocks: spans narrower than a pixel, merged per track" + (" (hover: count, busy time)" if interactive
                                                                       else ""))
    return main, sub


# ------------------------------------------------------------------------------------------ plot

def plot(spans, backend: str = "bokeh", *, start_ms: float | None = None, end_ms: float | None = None,
         width_px: int = 1200, title: str | None = None, measured_by: str | None = None, **compute_kw):
    """The timeline of ``spans`` (a spans frame, a ``Trace``, or :func:`compute`'s frame).

    ``backend="bokeh"``: an interactive figure (zoom with the wheel or a box: the level and the window swap in
    the browser); ``"matplotlib"``: a static ``Figure`` of the window ``[start_ms, end_ms]``. ``measured_by``
    says how the trace was recorded (shown under the title), e.g. ``"torch.profiler (Kineto), CPU"``.
    """
    backend = check_backend(backend)
    tl = _timeline(spans, width_px=width_px, **compute_kw)
    if start_ms is None and end_ms is None:
        start_ms, end_ms = focus_window(tl)
    if backend == "matplotlib":
        return _matplotlib(tl, start_ms, end_ms, title, measured_by)
    from ._timeline_bokeh import figure_of

    main, sub = _title(tl, title, measured_by)
    return figure_of(tl, view(tl, start_ms, end_ms), colours=palette(tl), title=main, subtitle=sub)


def focus_window(tl: pd.DataFrame, pad: float = 0.02) -> tuple[float, float]:
    """The x window (ms) a timeline opens on: its traced pass (``attrs["focus_ns"]``) with ``pad`` of it either
    side, within the trace."""
    s, e = (v / 1e6 for v in tl.attrs.get("focus_ns", (0, tl.attrs["extent_ns"])))
    d = max(e - s, 1e-6) * pad
    return max(s - d, 0.0), min(e + d, tl.attrs["extent_ns"] / 1e6) if e + d > s else s + 1e-6


def _matplotlib(tl, start_ms, end_ms, title, measured_by):
    try:
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise MissingDependency(f"plot backend 'matplotlib' needs matplotlib, which is not installed: {_EXTRA}") \
            from None
    tracks = tl.attrs["tracks"]
    n_tracks = max(len(tracks), 1)
    dpi = 100
    width_px = int(tl.attrs["width_px"])
    height_in = max(2.2 + 0.28 * n_tracks, 0.75 + 0.15 * (len(palette(tl)) + 2))
    fig = Figure(figsize=(width_px / dpi + 3.2, min(height_in, 30)), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    rows = view(tl, start_ms, end_ms, width_px)
    x0, x1 = rows.attrs["window_ms"]
    px = (x1 - x0) / width_px
    colours = palette(tl)
    s = rows["start_ns"].to_numpy() / 1e6
    e = np.maximum(rows["end_ns"].to_numpy() / 1e6, s + px)
    y = rows["track"].to_numpy(float)
    block = (rows["row_kind"] == "block").to_numpy()
    verts = np.stack([np.c_[s, y - .4], np.c_[s, y + .4], np.c_[e, y + .4], np.c_[e, y - .4]], axis=1)
    face = [colours.get(str(k), OTHER_COLOR) for k in rows["colour_key"].astype(str)]
    coll = PolyCollection(verts, facecolors=face, edgecolors="none")
    if len(rows):
        coll.set_alpha(np.where(block, 0.45, 0.9))  # merged blocks pale, as in the browser
    ax.add_collection(coll)
    ax.set_xlim(x0, x1)
    time_axis(ax)  # as many ticks as the drawn width holds, their labels never touching
    ax.set_ylim(n_tracks - 0.5, -0.5)
    ax.set_yticks(range(len(tracks)), list(tracks["track_label"]), fontsize=7)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL, fontsize=8)
    main, sub = _title(tl, title, measured_by, interactive=False)
    # the subtitle wrapped for the narrowest the figure is shown at (a report re-lays it out 10 inches wide)
    room = min(fig.get_figwidth(), 10.0) * dpi - 7 * max((len(t) for t in tracks["track_label"]), default=0) - 60
    main, lines = fit_titles(main, f"{sub}; zoom level {rows.attrs['level']} ({time_text(px)} per pixel)", room)
    matplotlib_titles(ax, main, lines)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=k[:40]) for k, c in colours.items()]
    handles.append(Patch(color=OTHER_COLOR, label="other"))
    bands = tl.attrs.get("phases")
    if bands is not None and len(bands):  # a generate run: each step's phase as a band behind the bars
        shown = bands[(bands["end_ns"] / 1e6 >= x0) & (bands["start_ns"] / 1e6 <= x1)]
        for k, (phase, start, end) in enumerate(zip(shown["phase"], shown["start_ns"], shown["end_ns"])):
            ax.axvspan(start / 1e6, end / 1e6, color=PHASE_COLOURS.get(phase, OTHER_COLOR),
                       alpha=0.10 if k % 2 else 0.16, lw=0, zorder=0)
        if len(shown) <= 24:  # few enough to name each: prefill, decode step k (d<k>)
            for label, start, end in zip(shown["label"], shown["start_ns"], shown["end_ns"]):
                ax.text((start + end) / 2e6, -0.45, label.replace("decode step ", "d"), fontsize=6,
                        ha="center", va="top", clip_on=True)
        handles += [Patch(color=c, alpha=0.3, label=f"band: {p}" + (" step k (d<k>)" if p == "decode" else ""))
                    for p, c in PHASE_COLOURS.items() if p in set(shown["phase"])]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1),
              title="colour: layer type" + ("; band: phase" if bands is not None and len(bands) else ""),
              title_fontsize=7, frameon=False)
    return fig


def to_html(fig, path: str | os.PathLike, title: str = "mlms-nb timeline") -> Path:
    """Write ``fig`` (Bokeh: BokehJS and the data inlined, works offline; matplotlib: an embedded PNG) as a
    standalone HTML page at ``path``; returns the path (its size in bytes is what the page weighs)."""
    from ._output import to_html as page

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(fig, title), encoding="utf-8")
    return path



def show(fig) -> None:
    """Display ``fig`` in a notebook (Bokeh with INLINE resources; matplotlib as PNG)."""
    from ._output import show as display

    display(fig)
