"""Building the level-of-detail index of a stored trace (see :mod:`mlms_nb.server.lod` for the queries) and its files.

:func:`build` turns the trace's spans into the pyramid of ``analyses.timeline.compute`` (rows grouped by the zoom
level they appear at, each with a hover signature) and the spans in start order (brush, search, links);
:func:`write_index` stores them beside the trace (``timeline_lod.json`` + two Arrow IPC files, meta last, atomically)
and :func:`read_index` reopens them, memory-mapped, when their key still matches the spans file. Times are ns from the
index origin (the trace's first span start), as integers.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from mlms_nb._fs import atomic_write_text, temp_path_beside
from mlms_nb.server import runs

FORMAT = "mlms-nb/timeline-lod"
VERSION = 5
BASE_WIDTH_PX = 1200
META_FILE, ROWS_FILE, SPANS_FILE = "timeline_lod.json", "timeline_lod.rows.arrow", "timeline_lod.spans.arrow"


def _codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64), [str(c) for c in col.cat.categories]
    codes, uniq = pd.factorize(col.astype(str))
    return codes.astype(np.int64), [str(u) for u in uniq]


def build(folder: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The index of the trace in ``folder``: (meta, pyramid rows, spans in start order)."""
    timeline = runs.timeline_module()
    spans = runs.load_spans(folder)
    if not len(spans):
        raise runs.NotFound("this trace holds no spans")
    tl = timeline.compute(spans, width_px=BASE_WIDTH_PX)
    n, raw = len(spans), int(tl.attrs["raw_level"])
    origin = int(tl.attrs["origin_ns"])

    # spans in start order: brush, search and links work on these
    start = spans["start_ns"].to_numpy(np.int64) - origin
    order = np.argsort(start, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    dur = spans["duration_ns"].to_numpy(np.int64)
    parent = timeline.parent_rows(spans)
    has = parent >= 0
    child_ns = np.bincount(parent[has], weights=dur[has], minlength=n)
    self_ns = np.maximum(dur - child_ns, 0).astype(np.int64)
    name_code, names = _codes(spans["name"])
    corr, ext = (spans[c].to_numpy(np.int64) if c in spans.columns else np.full(n, -1, np.int64)
                 for c in ("correlation", "external_id"))

    # signatures: what hover shows of a row (its span, or a block's longest span), with its colour
    colours = timeline.palette(tl)
    sig, table = timeline.signatures(tl, colours)
    palette = [*colours.values(), timeline.OTHER_COLOR]
    name_index = {nm: i for i, nm in enumerate(names)}
    sigs = {c: table[c] for c in ("shape", "layer_type", "kind", "level")}
    sigs["name"] = [name_index[v] for v in table["name"]]
    sigs["flops"] = [None if not np.isfinite(f) else float(f) for f in table["flops"]]
    sigs["colour"] = [palette[c] for c in table["c"]]
    span_sig = np.empty(n, np.int64)
    is_span = (tl["row_kind"] == "span").to_numpy()
    span_sig[tl["span_row"].to_numpy()[is_span]] = sig[is_span]

    # pyramid rows grouped: spans by the level they appear at (0..raw), then the blocks of each merged level
    lod = tl["lod_from"].to_numpy(np.int64)
    group = np.where(is_span, lod, raw + 1 + lod)
    rstart = tl["start_ns"].to_numpy(np.int64)
    rorder = np.lexsort((rstart, group))
    g = group[rorder]
    n_groups = 2 * raw + 1
    off = np.searchsorted(g, np.arange(n_groups + 1))
    rdur = tl["duration_ns"].to_numpy(np.int64)[rorder]
    look = [int(rdur[off[i]:off[i + 1]].max()) if off[i + 1] > off[i] else 0 for i in range(n_groups)]
    ref_type = np.int32 if n < 2 ** 31 else np.int64
    pyramid = {"start": rstart[rorder], "end": tl["end_ns"].to_numpy(np.int64)[rorder],
               "track": tl["track"].to_numpy(np.int32)[rorder], "sig": sig[rorder].astype(np.int32),
               "n": tl["span_count"].to_numpy(ref_type)[rorder], "busy": tl["busy_ns"].to_numpy(np.int64)[rorder],
               "ref": rank[tl["span_row"].to_numpy(np.int64)][rorder].astype(ref_type)}
    track_of_span = np.empty(n, np.int32)
    track_of_span[tl["span_row"].to_numpy()[is_span]] = tl["track"].to_numpy(np.int32)[is_span]
    sorted_spans = {"start": start[order], "end": start[order] + dur[order], "track": track_of_span[order],
                    "name": name_code[order].astype(np.int32), "self": self_ns[order],
                    "parent": np.where(parent[order] >= 0, rank[np.maximum(parent[order], 0)], -1),
                    "corr": corr[order], "ext": ext[order], "sig": span_sig[order].astype(np.int32)}

    levels = spans["level"].astype(str).to_numpy()
    traced = levels != "APPLICATION"
    s_all, e_all = start, start + dur
    focus = ([int(s_all[traced].min()), int(e_all[traced].max())] if traced.any() and not traced.all()
             else [0, int(tl.attrs["extent_ns"])])
    tracks = tl.attrs["tracks"]
    meta = {
        "format": FORMAT, "version": VERSION, "key": runs.spans_key(folder), "origin_ns": origin,
        "extent_ns": int(tl.attrs["extent_ns"]), "focus_ns": focus, "n_spans": n, "raw_level": raw,
        "resolution_ns": [float(r) for r in tl.attrs["resolution_ns"]], "width_px": BASE_WIDTH_PX,
        "tracks": [{"track": int(t), "label": str(lab), "level": str(lv), "device": str(dev), "thread": int(th),
                    "stream": int(st), "depth": int(d)}
                   for t, lab, lv, dev, th, st, d in zip(tracks["track"], tracks["track_label"], tracks["level"],
                                                         tracks["device"], tracks["thread"], tracks["stream"],
                                                         tracks["depth"])],
        "names": names, "sigs": sigs, "group_offsets": [int(v) for v in off], "group_lookback_ns": look,
        "level_slack": float(timeline.LEVEL_SLACK),
        "has_correlation": bool((corr >= 0).any() or (ext >= 0).any()),
        # a generate run's steps (prefill, decode step k), ns from the trace start, for the panel's phase bands
        "phases": [{"label": str(lab), "phase": str(ph), "step": int(k), "batch_size": int(b), "start_ns": int(s0),
                    "end_ns": int(s1)} for lab, ph, k, b, s0, s1 in tl.attrs["phases"][
                        ["label", "phase", "step", "batch_size", "start_ns", "end_ns"]].itertuples(index=False)],
    }
    return meta, pyramid, sorted_spans


def write_index(folder: Path, meta: dict, pyramid: dict, spans: dict) -> None:
    """Write the index beside the trace: Arrow files first, the meta (which names the key) last, atomically. The
    pyramid rows are stored plain, so a reopen memory-maps them and a tile reads only the pages it touches; the
    spans table (brush, search, links) is LZ4-compressed and read on first use."""
    import pyarrow as pa

    for name, table, compression in ((ROWS_FILE, pyramid, None), (SPANS_FILE, spans, "lz4")):
        batch = pa.record_batch({k: pa.array(v) for k, v in table.items()})
        options = pa.ipc.IpcWriteOptions(compression=compression)
        with temp_path_beside(folder / name) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema, options=options) as writer:
                writer.write_batch(batch)
            os.replace(tmp, folder / name)
    atomic_write_text(folder / META_FILE, json.dumps(meta))


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The columns of an Arrow IPC file as numpy arrays (memory-mapped when the file is not compressed)."""
    import pyarrow as pa

    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()  # the map lives as long as the arrays
    return {c: table.column(c).chunk(0).to_numpy(zero_copy_only=True) for c in table.column_names}


def read_index(folder: Path, key: str):
    """The meta and pyramid rows written beside the trace, if they are there and match ``key``; else None."""
    import pyarrow as pa

    files = [runs.confined_file(folder, name) for name in (META_FILE, ROWS_FILE, SPANS_FILE)]
    if None in files:  # missing, or a link out of the trace folder: build the index afresh
        return None
    try:
        meta = json.loads(files[0].read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("version") != VERSION or meta.get("key") != key:
            return None
        return meta, read_arrays(files[1]), None
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None
