"""The level-of-detail index of a stored trace, and the queries the timeline panel makes of it.

The index is built once per trace (:mod:`mlms_nb.server.lod_files`) from the level-of-detail pyramid of
``analyses.timeline.compute`` (every span once, shown from the zoom level where it is at least a pixel wide; narrower
spans merged per track into blocks with their count and busy time) and written beside the trace
(``timeline_lod.json`` + two Arrow IPC files), keyed by the spans file's size and mtime. Later opens memory-map it: a
tile touches only the rows it returns.

Times in and out are **ns from the index origin** (the trace's first span start), as integers.

- :meth:`LodIndex.tiles` -- the rows to draw for a window at a pixel width: the spans at least a pixel wide at
  the chosen level plus the blocks of that level, found by binary search per group (bounded by about
  tracks x width x 2, whatever the trace size);
- :meth:`LodIndex.summary` -- count, total and self time per span name of the spans starting in a window;
- :meth:`LodIndex.search` -- span names containing a text, and where the first of them are;
- :meth:`LodIndex.links` -- a span's ancestors (layer <- op <- kernel launch), children, and the spans sharing
  its correlation id (a kernel and the runtime call that launched it);
- :meth:`LodIndex.counters` -- counter series in a window, min/max per pixel.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from mlms_nb.server import runs
from mlms_nb.server.lod_files import (  # noqa: F401  (the file names are part of this module's API)
    META_FILE, ROWS_FILE, SPANS_FILE, build, read_arrays, read_index, write_index)

MAX_LINKS = 200
MAX_COUNTER_SERIES = 16


# ------------------------------------------------------------------------------------------ the index

MERGE_PX = 2
"""Rows narrower than this many pixels of the view are merged (a 1-2 px sliver shows no more than its block)."""
RUN_PX = 64
"""Touching merged marks of one colour join into runs of at most this many pixels (as the pyramid's blocks do)."""


def _reduce_blocks(rows: dict[str, np.ndarray], new: np.ndarray) -> dict[str, np.ndarray]:
    """Rows (sorted) merged into the row before wherever ``new`` is False: extent, count and busy time summed,
    signature and ref of the longest row."""
    first = np.flatnonzero(new)
    block = np.cumsum(new) - 1
    dur = rows["end"] - rows["start"]
    top = np.maximum.reduceat(dur, first)
    is_top = np.flatnonzero(dur == top[block])
    pick = is_top[np.r_[True, block[is_top][1:] != block[is_top][:-1]]]  # first longest row of each block
    return {"start": rows["start"][first], "end": np.maximum.reduceat(rows["end"], first),
            "track": rows["track"][first], "sig": rows["sig"][pick], "n": np.add.reduceat(rows["n"], first),
            "busy": np.add.reduceat(rows["busy"], first), "ref": rows["ref"][pick]}


def _merge_subpixel(rows: dict[str, np.ndarray], origin_ns: int, ns_per_px: float,
                    colour: np.ndarray) -> dict[str, np.ndarray]:
    """Rows narrower than :data:`MERGE_PX` pixels of this view merged per track and pixel column, then touching marks of
    one colour (``colour[sig]``) joined into runs of up to :data:`RUN_PX` pixels; wider rows kept as they are.
    Bounds the marks of a tile by about tracks x width even at the raw level, where the pyramid draws every
    span, and keeps dense stretches to a few marks."""
    narrow = (rows["end"] - rows["start"]) < MERGE_PX * ns_per_px
    if narrow.sum() < 2:
        return rows
    wide = {c: v[~narrow] for c, v in rows.items()}
    nr = {c: v[narrow] for c, v in rows.items()}
    col = np.floor((nr["start"] - origin_ns) / ns_per_px).astype(np.int64)
    order = np.lexsort((nr["start"], col, nr["track"]))
    nr = {c: v[order] for c, v in nr.items()}
    col = col[order]
    merged = _reduce_blocks(nr, np.r_[True, (nr["track"][1:] != nr["track"][:-1]) | (col[1:] != col[:-1])])
    if len(merged["start"]) > 1:
        key = colour[merged["sig"]]
        run = np.floor((merged["start"] - origin_ns) / (ns_per_px * RUN_PX)).astype(np.int64)
        merged = _reduce_blocks(merged, np.r_[True, (merged["track"][1:] != merged["track"][:-1])
                                              | (key[1:] != key[:-1]) | (run[1:] != run[:-1])
                                              | (merged["start"][1:] - merged["end"][:-1] >= ns_per_px)])
    return {c: np.concatenate([wide[c], merged[c]]) for c in rows}


class LodIndex:
    """An opened index (see the module docstring); thread-safe to query."""

    def __init__(self, folder: Path, meta: dict, pyramid: dict, spans: dict | None):
        self.folder, self.meta, self.rows, self._spans = folder, meta, pyramid, spans
        self._lock = threading.Lock()
        self.colour_key = np.unique(meta["sigs"]["colour"], return_inverse=True)[1].reshape(-1)
        self.resolution = np.asarray(meta["resolution_ns"], float)
        self._name_stats = None
        self._counters = None
        self._sorted_ids: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def spans(self) -> dict[str, np.ndarray]:
        """The spans in start order (``start, end, track, name, self, parent, corr, ext, sig``), read from beside
        the trace on first use."""
        if self._spans is None:
            with self._lock:
                if self._spans is None:
                    self._spans = read_arrays(self.folder / SPANS_FILE)
        return self._spans

    # --------------------------------------------------------------- what the panel draws
    def level_for(self, ns_per_px: float) -> int:
        """The coarsest level whose pixel is at most ``level_slack`` times ``ns_per_px`` (the raw level when
        none): the rule of ``analyses.timeline.level_for``."""
        finer = np.flatnonzero(self.resolution <= ns_per_px * self.meta.get("level_slack", 1.0) * (1 + 1e-9))
        return int(finer[0]) if len(finer) else int(self.meta["raw_level"])

    def tiles(self, start_ns: int, end_ns: int, width_px: int) -> dict:
        """The rows to draw for ``[start_ns, end_ns]`` on ``width_px`` pixels (columns of equal length)."""
        raw = int(self.meta["raw_level"])
        level = self.level_for((end_ns - start_ns) / width_px)
        off, look = self.meta["group_offsets"], self.meta["group_lookback_ns"]
        groups = list(range(min(level, raw) + 1)) + ([raw + 1 + level] if level < raw else [])
        s = self.rows["start"]
        parts = []
        for grp in groups:
            lo, hi = off[grp], off[grp + 1]
            if hi <= lo:
                continue
            a = lo + int(np.searchsorted(s[lo:hi], start_ns - look[grp], "left"))
            b = lo + int(np.searchsorted(s[lo:hi], end_ns, "right"))
            if b > a:
                idx = np.arange(a, b)
                parts.append(idx[self.rows["end"][a:b] >= start_ns])
        idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        out = _merge_subpixel({c: self.rows[c][idx] for c in ("start", "end", "track", "sig", "n", "busy", "ref")},
                              start_ns, (end_ns - start_ns) / width_px, self.colour_key)
        out.update(level=level, raw_level=raw, ns_per_px=(end_ns - start_ns) / width_px,
                   level_ns_per_px=float(self.resolution[level]) if level < raw else None,
                   count=int(len(out["start"])), rows_read=int(len(idx)))
        return out

    # --------------------------------------------------------------- brushed range
    def summary(self, start_ns: int, end_ns: int, top: int = 50) -> dict:
        """Per span name, for the spans starting in ``[start_ns, end_ns]``: count, total and self time (ns)."""
        s = self.spans["start"]
        a, b = int(np.searchsorted(s, start_ns, "left")), int(np.searchsorted(s, end_ns, "right"))
        names = self.meta["names"]
        code = self.spans["name"][a:b]
        count = np.bincount(code, minlength=len(names))
        total = np.bincount(code, weights=(self.spans["end"][a:b] - s[a:b]).astype(np.float64), minlength=len(names))
        self_ns = np.bincount(code, weights=self.spans["self"][a:b].astype(np.float64), minlength=len(names))
        present = np.flatnonzero(count)
        ranked = present[np.argsort(-self_ns[present], kind="stable")][:top]
        return {"start_ns": start_ns, "end_ns": end_ns, "spans": int(b - a), "names": int(len(present)),
                "rows": [{"name": names[i], "count": int(count[i]), "total_ns": int(total[i]),
                          "self_ns": int(self_ns[i])} for i in ranked],
                "note": "spans that start in the range; total: their durations; self: duration minus the time of "
                        "their child spans; ns from the trace's recorded start/end times"}

    # --------------------------------------------------------------- search
    def search(self, text: str, limit: int = 200) -> dict:
        """Span names containing ``text`` (case-insensitive), their counts, and the first ``limit`` such spans."""
        needle = text.strip().lower()
        names = self.meta["names"]
        ids = np.array([i for i, nm in enumerate(names) if needle and needle in nm.lower()], np.int64)
        if self._name_stats is None:
            code = self.spans["name"]
            self._name_stats = (np.bincount(code, minlength=len(names)),
                                np.bincount(code, weights=(self.spans["end"] - self.spans["start"]).astype(float),
                                            minlength=len(names)))
        count, total = self._name_stats
        hits = np.flatnonzero(np.isin(self.spans["name"], ids))[:limit] if len(ids) else np.zeros(0, np.int64)
        return {"query": text, "name_ids": ids.tolist(),
                "names": [{"name": names[i], "count": int(count[i]), "total_ns": int(total[i])} for i in ids[:100]],
                "matches": int(count[ids].sum()) if len(ids) else 0,
                "first": [self._span(int(i)) for i in hits]}

    # --------------------------------------------------------------- links
    def _span(self, i: int, relation: str | None = None) -> dict:
        sp = self.spans
        out = {"ref": i, "start_ns": int(sp["start"][i]), "end_ns": int(sp["end"][i]), "track": int(sp["track"][i]),
               "name": self.meta["names"][int(sp["name"][i])], "sig": int(sp["sig"][i])}
        if relation:
            out["relation"] = relation
        return out

    def _same_id(self, column: str, value: int) -> np.ndarray:
        """Rows whose ``column`` (``corr`` or ``ext``) equals ``value``, by binary search in a sorted copy made
        on first use."""
        if column not in self._sorted_ids:
            ids = self.spans[column]
            order = np.argsort(ids, kind="stable")
            self._sorted_ids[column] = (ids[order], order)
        values, order = self._sorted_ids[column]
        return order[np.searchsorted(values, value, "left"):np.searchsorted(values, value, "right")]

    def links(self, ref: int) -> dict:
        """The span ``ref`` and its related spans: ancestors, direct children, and spans sharing its correlation
        id (a kernel and the runtime call that launched it) or its external id (an op and the device work it
        launched), with their ancestors: a kernel leads to its launch call, op and layer, and back."""
        n = len(self.spans["start"])
        if not 0 <= ref < n:
            raise runs.BadRequest(f"ref {ref} is not a span of this trace (0..{n - 1})")
        parent = self.spans["parent"]
        related: dict[int, str] = {}

        def ancestors(i: int, label: str) -> None:
            p, hops = int(parent[i]), 0
            while p >= 0 and hops < 64 and len(related) < MAX_LINKS:
                related.setdefault(p, label if hops == 0 else "ancestor")
                p, hops = int(parent[p]), hops + 1

        ancestors(ref, "parent")
        children = np.flatnonzero(parent == ref)[:MAX_LINKS // 2]
        for c in children:
            related.setdefault(int(c), "child")
        for column, label in (("corr", "correlated (kernel / launch)"), ("ext", "same external id (op / device work)")):
            ids = self.spans[column]
            for i in [ref, *children.tolist()]:
                if ids[i] < 0:
                    continue
                for j in self._same_id(column, int(ids[i]))[:16]:
                    if int(j) != ref and int(j) not in related:
                        related[int(j)] = label
                        ancestors(int(j), "parent of linked")
        return {"span": self._span(ref), "related": [self._span(i, rel) for i, rel in related.items()]}

    # --------------------------------------------------------------- counters
    def counters(self, start_ns: int, end_ns: int, width_px: int) -> dict:
        """Each counter series (source, metric, device; its unit) in the window: per pixel, min and max."""
        if self._counters is None:
            frame = runs.load_counters(self.folder)
            series = []
            if frame is not None and len(frame):
                frame = frame.sort_values("ts_ns", kind="stable")
                for (src, metric, unit, dev), part in frame.groupby(["source", "metric", "unit", "device"],
                                                                    observed=True, sort=True):
                    series.append({"label": f"{metric} ({dev})" if dev else str(metric), "source": str(src),
                                   "unit": str(unit), "t": part["ts_ns"].to_numpy(np.int64) - self.meta["origin_ns"],
                                   "v": part["value"].to_numpy(np.float64)})
            self._counters = series[:MAX_COUNTER_SERIES]
        out = []
        span = max(end_ns - start_ns, 1)
        for s in self._counters:
            t, v = s["t"], s["v"]
            a = max(int(np.searchsorted(t, start_ns, "left")) - 1, 0)
            b = min(int(np.searchsorted(t, end_ns, "right")) + 1, len(t))
            tt, vv = t[a:b], v[a:b]
            if len(tt) > 2 * width_px:  # min and max per pixel column
                col = np.clip(((tt - start_ns) * width_px // span), -1, width_px)
                first = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
                tmin, vmin, vmax = tt[first], np.minimum.reduceat(vv, first), np.maximum.reduceat(vv, first)
            else:
                tmin, vmin, vmax = tt, vv, vv
            finite = np.isfinite(s["v"])
            out.append({"label": s["label"], "source": s["source"], "unit": s["unit"], "t_ns": tmin.tolist(),
                        "min": np.where(np.isfinite(vmin), vmin, None).tolist(),
                        "max": np.where(np.isfinite(vmax), vmax, None).tolist(),
                        "lo": float(s["v"][finite].min()) if finite.any() else None,
                        "hi": float(s["v"][finite].max()) if finite.any() else None})
        return {"series": out, "note": "counter samples as recorded (min and max per pixel when denser); "
                                       "times: ns from the trace start"}


# ------------------------------------------------------------------------------------------ cache

_cache: "OrderedDict[tuple[str, str], LodIndex]" = OrderedDict()
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()
CACHE_SIZE = 8


def open_index(folder: Path) -> LodIndex:
    """The index of the trace in ``folder``: from memory, from beside the trace, or built (and written beside
    it when the folder is writable). One build per trace at a time."""
    key = runs.spans_key(folder)
    with _guard:
        lock = _locks.setdefault(str(folder), threading.Lock())
    with lock:
        cached = _cache.get((str(folder), key))
        if cached is not None:
            with _guard:
                _cache.move_to_end((str(folder), key))
            return cached
        found = read_index(folder, key)
        if found is None:
            found = build(folder)
            try:
                write_index(folder, *found)
            except OSError:  # a read-only store still gets its timeline, from memory
                pass
        index = LodIndex(folder, *found)
        with _guard:
            _cache[(str(folder), key)] = index
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        return index
