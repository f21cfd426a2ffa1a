"""Level-of-detail pyramid of a timeline: for each zoom level, spans narrower than a pixel merged per track.

Zoom level ``k`` draws the whole trace (``extent_ns``) over ``width_px * factor**k`` pixels, so one pixel is
``resolution_ns[k] = extent_ns / width_px / factor**k``. At level ``k``:

* a span at least one pixel wide (``duration_ns >= resolution_ns[k]``) is drawn on its own: it is shown from
  level ``lod_from`` (the first level where it is that wide) to the raw level;
* the narrower spans of a track are merged into *blocks*, one per pixel column they start in (consecutive in
  the track, start in ``[i, i+1) * resolution_ns[k]``); a block says how many spans it holds and their total
  busy time, and is drawn with the colour of its longest span. With a ``key`` (the colour), touching blocks
  whose longest spans share it merge further into one run (at most ``run_px`` columns, so a row's extent, and
  the browser's look-back, stay bounded).

Levels are added while merging still pays (the blocks of a level are at most ``merge_ratio`` times the spans
they replace); the first level where it does not is the **raw** level, where every span is drawn on its own.
So each level holds every span of every track exactly once (as itself or inside one block): block counts add
up to the track's span count and busy time is conserved.

Everything is vectorised over spans sorted by ``(lane, start)``: one pass of ``O(n)`` numpy per level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Pyramid:
    """The pyramid of one timeline. Span arrays are in the input order; block arrays sorted by (level, lane,
    start). Times are ns relative to the trace start."""
    extent_ns: int
    width_px: int
    factor: float
    resolution_ns: np.ndarray   # (levels,) ns per pixel at each merged level; the raw level is len(...)
    lod_from: np.ndarray        # (n_spans,) first level a span is drawn on its own
    block_level: np.ndarray     # (n_blocks,) level of each block
    block_lane: np.ndarray
    block_start_ns: np.ndarray
    block_end_ns: np.ndarray
    block_count: np.ndarray     # spans in the block
    block_busy_ns: np.ndarray   # sum of their durations
    block_longest: np.ndarray   # input row of the block's longest span

    @property
    def raw_level(self) -> int:
        return len(self.resolution_ns)


def _first_of_each(block_of: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Index of the first row with ``mask`` in each block (``block_of`` sorted, every block has one)."""
    pos = np.flatnonzero(mask)
    keep = np.ones(len(pos), bool)
    keep[1:] = block_of[pos[1:]] != block_of[pos[:-1]]
    return pos[keep]


def _reduce(new: np.ndarray, start, end, count, busy, longest_dur, longest_row):
    """Merge consecutive rows where ``new`` is False into the row before."""
    first = np.flatnonzero(new)
    block_of = np.cumsum(new) - 1
    top = np.maximum.reduceat(longest_dur, first)
    pick = _first_of_each(block_of, longest_dur == top[block_of])
    return (first, start[first], np.maximum.reduceat(end, first), np.add.reduceat(count, first),
            np.add.reduceat(busy, first), top, longest_row[pick])


def _blocks(lane: np.ndarray, start: np.ndarray, end: np.ndarray, dur: np.ndarray, rows: np.ndarray,
            key: np.ndarray | None, resolution: float, run_px: int):
    """Merge spans (sorted by lane, start) into one block per (lane, pixel column of their start); then, when
    ``key`` is given, runs of touching blocks whose longest spans share a key (up to ``run_px`` columns)."""
    col = np.floor(start / resolution).astype(np.int64)
    new = np.empty(len(lane), bool)
    new[:1] = True
    new[1:] = (lane[1:] != lane[:-1]) | (col[1:] != col[:-1])
    first, b_start, b_end, b_count, b_busy, b_top, b_row = _reduce(new, start, end, np.ones(len(lane), np.int64),
                                                                  dur, dur, rows)
    b_lane, b_col = lane[first], col[first]
    if key is not None and len(first) > 1:
        k = key[b_row]
        new = np.empty(len(first), bool)
        new[:1] = True
        new[1:] = ((b_lane[1:] != b_lane[:-1]) | (k[1:] != k[:-1]) | (b_start[1:] - b_end[:-1] >= resolution)
                   | (b_col[1:] // run_px != b_col[:-1] // run_px))
        first, b_start, b_end, b_count, b_busy, b_top, b_row = _reduce(new, b_start, b_end, b_count, b_busy,
                                                                      b_top, b_row)
        b_lane = b_lane[first]
    return b_lane, b_start, b_end, b_count, b_busy, b_row


def build(lane: np.ndarray, start_ns: np.ndarray, duration_ns: np.ndarray, *, key: np.ndarray | None = None,
          width_px: int = 1200, factor: float = 2.0, merge_ratio: float = 0.3, max_levels: int = 40,
          run_px: int = 64) -> Pyramid:
    """The pyramid of spans on ``lane`` (int track index) starting at ``start_ns`` (ns from the trace start)
    lasting ``duration_ns``. ``width_px``: the plot's width at level 0; ``factor``: zoom between levels;
    ``key`` (optional, int per span): touching blocks whose longest spans share a key merge into one, up to
    ``run_px`` pixel columns."""
    lane = np.asarray(lane, np.int64)
    start = np.asarray(start_ns, np.int64)
    dur = np.asarray(duration_ns, np.int64)
    n = len(start)
    extent = int((start + dur).max()) if n else 0
    extent = max(extent, 1)
    r0 = extent / float(width_px)
    order = np.lexsort((start, lane))
    s_lane, s_start, s_dur = lane[order], start[order], dur[order]
    s_end = s_start + s_dur
    with np.errstate(divide="ignore"):
        k = np.ceil(np.log(r0 / np.maximum(s_dur, 1e-9)) / np.log(factor) - 1e-12)
    s_lod = np.clip(np.nan_to_num(k, posinf=max_levels), 0, max_levels).astype(np.int64)
    s_lod[s_dur == 0] = max_levels

    resolutions, parts = [], []
    for level in range(max_levels):
        small = s_lod > level
        n_small = int(small.sum())
        if n_small == 0:
            break
        res = r0 / factor ** level
        b = _blocks(s_lane[small], s_start[small], s_end[small], s_dur[small], order[small],
                    None if key is None else np.asarray(key), res, run_px)
        if level > 0 and len(b[0]) > merge_ratio * n_small:
            break
        resolutions.append(res)
        parts.append((np.full(len(b[0]), level, np.int64),) + b)
    raw = len(resolutions)
    lod_from = np.empty(n, np.int64)
    lod_from[order] = np.minimum(s_lod, raw)
    cols = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(7)]
    return Pyramid(extent, int(width_px), float(factor), np.asarray(resolutions, float), lod_from, *cols)


LEVEL_SLACK = 1.25
"""A level is drawn while its pixel is at most this many view pixels wide: a plot that stretches a little wider
than the width the pyramid was built for keeps its merged level instead of dropping to every span."""


def level_for(pyramid: Pyramid, ns_per_px: float) -> int:
    """The level to draw when one pixel is ``ns_per_px``: the coarsest whose pixel is at most
    :data:`LEVEL_SLACK` of it."""
    res = pyramid.resolution_ns
    if len(res) == 0:
        return 0
    finer = np.flatnonzero(res <= ns_per_px * LEVEL_SLACK * (1 + 1e-9))
    return int(finer[0]) if len(finer) else pyramid.raw_level


def signatures(tl: pd.DataFrame, colours: dict[str, str]) -> tuple[np.ndarray, dict]:
    """Signature id of every row and the signature table (name, shape, layer_type, kind, level, flops, c:
    colour index into ``colours`` + other)."""
    cols = ["name", "shape", "layer_type", "kind", "level", "colour_key"]
    keys = pd.DataFrame({c: tl[c].cat.codes.to_numpy() for c in cols})
    keys["flops"] = tl["flops"].to_numpy()
    sig = keys.groupby(list(keys.columns), sort=False, dropna=False).ngroup().to_numpy(np.int64)
    first = np.unique(sig, return_index=True)[1]
    rows = tl.iloc[first]
    index = {k: i for i, k in enumerate(colours)}
    table = {c: rows[c].astype(str).tolist() for c in ("name", "shape", "layer_type", "kind", "level")}
    table["flops"] = rows["flops"].to_numpy(np.float64)
    table["c"] = np.array([index.get(str(k), len(colours)) for k in rows["colour_key"]], np.int32)
    return sig, table
