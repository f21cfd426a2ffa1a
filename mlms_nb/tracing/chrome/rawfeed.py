"""The importer's fast path: a run of events typed by msgspec, its ``args`` kept raw, columns built without a Python
dict per event.

:class:`~mlms_nb.tracing._jsonscan.EventStream` (``parse=decode``) hands each run of whole events to :func:`decode`:
msgspec reads every event into a small :class:`Event` struct whose ``args`` stays a :class:`msgspec.Raw` (a view of
the run's bytes, nothing parsed). :func:`feed_raw` then fills :class:`~mlms_nb.tracing.chrome.columns.EventColumns`
exactly as its per-event loop would, in a few whole-run operations:

- times, names, categories, pids and tids come from the structs (one C-level pass per column);
- the per-span ids (``ID_COLUMNS``: "External id", "Ev Idx", ...) are found in the run's ``args`` bytes with numpy
  (the key, optional whitespace, a colon, a run of at most 18 digits), parsed into int64 and blanked in a copy
  (``4610`` -> ``0   ``: same length, still JSON). The keys searched are those the first run held, and any found
  later; a key not searched keeps its digits in the text, so its id is that text's own;
- what is left of each event's ``args`` -- the same for every event of the same kind -- is interned (pyarrow's
  dictionary encoding), and only each new distinct text is parsed and read by the per-event rules (shape from
  "Input Dims", ``flops``, the attrs text), then checked: it is *safe* only if every id key it holds was blanked once,
  at the top level, and read as an id by those rules (no backslash anywhere, so no other spelling of a key). Events
  sharing a safe text differ only in their id digits, so they share its shape, flops and attrs.
- Kineto's ``[memory]`` instant events: their ``args`` are decoded by msgspec in one call.

Events of other phases (metadata, counters, begin/end pairs) add no rows: they go through the per-event loop. Anything
else -- a category whose args carry device, stream or correlation (GPU activity, runtime calls, ONNX Runtime nodes,
unknown ones), a text that is not safe, a field of another type than the struct says, an id of more than 18 digits --
makes :func:`feed_raw` return False before it appends anything (only interning tables grow), and the caller feeds
the same run through the per-event loop (``orjson``), which is the reference: both paths give the same frames
(tests/test_trace_ingest_fast.py compares them on every such case).

``benchmarks/trace_ingest.py`` measures it (issue 25: >= 350k events/s on a 1M-event Kineto trace, peak RAM <= 1x the
file).
"""
from __future__ import annotations

import re
from operator import attrgetter
from typing import Union

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from mlms_nb.schema.spans import ID_COLUMNS
from mlms_nb.tracing.chrome import kineto
from mlms_nb.tracing.chrome._common import ARGS_AS_ATTRS, ARGS_OF_HOST_OP, INT64_MAX, int_ids

NAN = float("nan")


class Event(msgspec.Struct):
    """One trace event as msgspec reads it; the defaults are the per-event loop's for a missing key."""

    ph: str
    ts: Union[float, None] = None  # required of X and instant events: a None there hands the run back
    name: str = ""
    cat: Union[str, None] = None
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")


class MemoryArgs(msgspec.Struct):
    """The fields of a Kineto ``[memory]`` event's args that are kept, with the per-event loop's defaults."""

    nbytes: float = msgspec.field(name="Bytes", default=0.0)
    alloc: float = msgspec.field(name="Total Allocated", default=NAN)
    reserved: float = msgspec.field(name="Total Reserved", default=NAN)
    devtype: int = msgspec.field(name="Device Type", default=0)
    devid: int = msgspec.field(name="Device Id", default=-1)


_EVENTS = msgspec.json.Decoder(list[Event])
_MEMORY = msgspec.json.Decoder(list[MemoryArgs])
_FAST_RULES = (ARGS_OF_HOST_OP, ARGS_AS_ATTRS)
_ID_KEYS = [(col, key.encode() + b'"') for col, key in ID_COLUMNS.items()]
_ID_PATTERNS = {col: re.compile(re.escape(lit) + rb"[ \t\r\n]*:[ \t\r\n]*[0-9]") for col, lit in _ID_KEYS}
_WS = np.zeros(256, bool)
_WS[[9, 10, 13, 32]] = True
_PAD = 40  # blank bytes after the last args: every lookahead below stays inside the array
_MAX_DIGITS = 18  # < 2**63: any such run is an int64 id

_ts, _dur, _cat, _name, _pid, _tid, _args, _ph = (attrgetter(k) for k in (
    "ts", "dur", "cat", "name", "pid", "tid", "args", "ph"))


class Run:
    """A run of whole events: its bytes (a JSON array) and the :class:`Event` structs msgspec read from them."""

    __slots__ = ("data", "events")

    def __init__(self, data: bytes, events: list):
        self.data = data
        self.events = events

    def __len__(self) -> int:
        return len(self.events)

    def dicts(self) -> list:
        """The run parsed into dicts, for the per-event loop."""
        return orjson.loads(self.data)


def decode(data) -> "Run | list":
    """A run of events (bytes-like JSON array) -> :class:`Run`, or the list orjson parses when its values do not fit
    :class:`Event`. Raises ``orjson.JSONDecodeError`` (a ``ValueError``) when it is not JSON."""
    data = bytes(data)  # the structs' Raw args are views of it: a copy the stream's buffer does not hold
    try:
        return Run(data, _EVENTS.decode(data))
    except (msgspec.DecodeError, ValueError):  # a ValidationError (other types), bad UTF-8: orjson reads it, or says where it is broken
        return orjson.loads(data)


# ------------------------------------------------------------------------------------------- the id digits


def _find_ids(blob: bytearray, a: np.ndarray, ends: np.ndarray, search) -> dict | None:
    """Per id column present in the args bytes (``blob``, padded; ``a``: its writable uint8 view): (event index,
    value) of each ``"<key>": <digits>``, the digits blanked in place. None when a run of digits is too long to be
    an id."""
    out = {}
    by_first: dict[int, np.ndarray] = {}
    for col, lit in _ID_KEYS:
        if col not in search or blob.find(lit) < 0:
            continue
        first = lit[0]
        c = by_first.get(first)
        if c is None:
            c = by_first[first] = np.flatnonzero(a[: len(a) - _PAD] == first)
        for j in range(1, len(lit)):
            c = c[a[c + j] == lit[j]]
            if not len(c):
                break
        if not len(c):
            continue
        q = c + len(lit)
        q = _skip_ws(a, q)
        colon = a[q] == 0x3A
        c, q = c[colon], _skip_ws(a, q[colon] + 1)
        digit = (a[q] - 48) < 10
        c, q = c[digit], q[digit]
        if not len(c):
            continue
        value = np.zeros(len(q), np.int64)
        length = np.zeros(len(q), np.int64)
        p = q.copy()
        for _ in range(_MAX_DIGITS + 1):
            d = a[p].astype(np.int64) - 48
            m = (d >= 0) & (d < 10)
            if not m.any():
                break
            value[m] = value[m] * 10 + d[m]
            length[m] += 1
            p[m] += 1
        if (length > _MAX_DIGITS).any():
            return None
        a[q] = 0x30
        rest = length - 1
        if rest.any():
            k = int(rest.sum())
            base = np.repeat(q + 1 - np.concatenate([[0], np.cumsum(rest)[:-1]]), rest)
            a[base + np.arange(k)] = 0x20
        out[col] = (np.searchsorted(ends, c, side="right"), value)
    for col in search:
        out.setdefault(col, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    return out


def _codes(values: list, table: dict, add) -> np.ndarray:
    """Each value's interned code (int32) from ``table``; values not in it yet are first given one by ``add``."""
    try:
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values))
    except KeyError:  # a value not seen before
        for value in dict.fromkeys(values):
            if value not in table:
                add(value)
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values))


def _skip_ws(a: np.ndarray, q: np.ndarray) -> np.ndarray:
    q = q.copy()
    while True:
        m = _WS[a[q]]
        if not m.any():
            return q
        q[m] += 1


# ------------------------------------------------------------------------------------------- per distinct args


def _read_args(cols, text: bytes, rule: int):
    """The per-event rules on one distinct args text: (readable, shape code, flops or None, attrs code, facts), facts
    per id column: (how many ``"<key>": <digit>`` the text holds, the id the rules read or None, whether the attrs
    text still names the key)."""
    if not text:
        return True, 0, None, 0, {}
    if b"\\" in text:  # no escapes: every key is spelled as it reads
        return False, 0, None, 0, {}
    try:
        args = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, 0, None, 0, {}
    if args is not None and not isinstance(args, dict):
        return False, 0, None, 0, {}
    sc, fl = 0, None
    if rule == ARGS_OF_HOST_OP and args:
        dims = args.pop("Input Dims", None)
        if dims is not None:
            key = orjson.dumps(dims)
            sc = cols.shapes.get(key)
            if sc is None:
                sc = cols.shapes[key] = len(cols.shapes)
        fl = args.pop("flops", None)
    code = 0
    extracted = {}
    attrs = b""
    if args:
        for col, key in ID_COLUMNS.items():
            v = args.get(key)
            if v is not None and type(v) is int and 0 <= v <= INT64_MAX:
                del args[key]
                extracted[col] = v
        attrs = orjson.dumps(args) if args else b"{}"
        code = cols.attrs_table.get(attrs)
        if code is None:
            code = cols.attrs_table[attrs] = len(cols.attrs_table)
    facts = {col: (len(_ID_PATTERNS[col].findall(text)), extracted.get(col), lit in attrs) for col, lit in _ID_KEYS}
    return True, sc, fl, code, facts


def _safe(got, searched) -> bool:
    """Whether every event sharing this text reads as it does: each id key whose digits were blanked is there once,
    at the top level, read as an id (a key not blanked keeps its digits in the text, so its id is the text's)."""
    if not got[0]:
        return False
    facts = got[4]
    for col in searched if facts else ():  # no facts: an empty text (no args)
        n, v, named = facts[col]
        if n > 1 or (n == 1) != (v is not None) or (n == 1 and named):
            return False
    return True


# ------------------------------------------------------------------------------------------- the run


def feed_raw(cols, run: Run) -> bool:
    """Append ``run`` to ``cols`` (an EventColumns) as its per-event loop would; False (nothing changed) when the run
    needs that loop."""
    evs = run.events
    n = len(evs)
    xs = [e for e in evs if e.ph == "X"]
    mems: list = []
    other_at: list = []
    if len(xs) != n:
        instant = [e for e in evs if e.ph == "i" or e.ph == "I"]
        mems = [e for e in instant if e.name == "[memory]"]
        if len(xs) + len(instant) != n:  # metadata, counters, begin/end...: no rows, read by the per-event loop
            other_at = [i for i, e in enumerate(evs) if e.ph != "X" and e.ph != "i" and e.ph != "I"]
        del instant
    nx = len(xs)
    # categories: known rules only
    cats = cols.cats
    cc = _codes(list(map(_cat, xs)), cats, cols.cat_code)
    rule = np.asarray(cols.cat_rules, np.int64)[cc] if nx else np.zeros(0, np.int64)
    if not np.isin(rule, _FAST_RULES).all():
        return False
    # args: ids out, then the distinct rest
    raws = list(map(_args, xs))
    lens = np.fromiter(map(len, raws), np.int64, nx)
    blob = bytearray().join(raws)
    del raws
    blob += b" " * _PAD
    ends = np.cumsum(lens)
    starts = ends - lens
    a = np.frombuffer(blob, np.uint8)
    search = cols.raw_id_keys if cols.raw_id_keys is not None else ID_COLUMNS  # the first run: every key
    ids = _find_ids(blob, a, ends, search)
    if ids is None:
        return False
    offsets = np.concatenate([[0], ends]).astype(np.int32)
    keys = pa.BinaryArray.from_buffers(pa.binary(), nx, [None, pa.py_buffer(offsets), pa.py_buffer(blob)])
    enc = pc.dictionary_encode(keys)
    local = np.asarray(enc.indices, np.int64) * 2 + (rule == ARGS_OF_HOST_OP)
    del keys, starts
    uniq, inv = np.unique(local, return_inverse=True)
    texts = enc.dictionary
    info = np.zeros((len(uniq), 3), np.int64)
    flops = np.full(len(uniq), NAN)
    has_flops = np.zeros(len(uniq), bool)
    tables = cols.raw_args_tables
    facts = []
    for i, u in enumerate(uniq.tolist()):
        text = texts[u >> 1].as_py()
        r = ARGS_OF_HOST_OP if u & 1 else ARGS_AS_ATTRS
        got = tables.get((r, text))
        if got is None:
            got = tables[(r, text)] = _read_args(cols, text, r)
        if not _safe(got, search):
            return False
        facts.append(got[4])
        info[i] = (1, got[1], got[3])
        if got[2] is not None:
            if type(got[2]) not in (int, float):
                return False
            has_flops[i] = True
            flops[i] = got[2]
    for col, _ in _ID_KEYS:
        if col in ids:  # blanked: every occurrence found belongs to a text that holds it
            counts = np.array([f[col][0] if f else 0 for f in facts], np.int64)
            if int(counts[inv].sum()) != len(ids[col][0]):
                return False
        else:  # not blanked (not seen before): the text's own id
            v = [f[col][1] if f else None for f in facts]
            if any(x is not None for x in v):
                has = np.array([x is not None for x in v])
                rows = np.flatnonzero(has[inv])
                ids[col] = (rows, np.array([x if x is not None else -1 for x in v], np.int64)[inv][rows])
                cols.raw_id_keys = {*search, col}
    del enc, texts, blob, a
    # memory events
    if mems:
        try:
            margs = list(map(_args, mems))
            if not all(map(len, margs)):
                margs = [m if len(m) else b"{}" for m in margs]
            margs = _MEMORY.decode(b"[" + b",".join(margs) + b"]")
        except msgspec.DecodeError:
            return False
    parsed = None
    if other_at:
        try:
            parsed = run.dicts()
        except orjson.JSONDecodeError:
            return False
    # ---- nothing above changed cols except interning tables; from here on, append
    row0 = cols.n
    try:
        ts = np.fromiter(map(_ts, xs), np.float64, nx)
        dur = np.fromiter(map(_dur, xs), np.float64, nx)
        mem_ts = np.fromiter(map(_ts, mems), np.float64, len(mems))
    except (TypeError, ValueError, OverflowError):
        return False
    names = cols.names
    nc = _codes(list(map(_name, xs)), names, lambda s: names.setdefault(s, len(names)))
    for col, (ev, val) in ids.items():
        if len(ev):
            rows, vals = cols.id_rows[col]
            rows.frombytes((ev + row0).astype(np.int64).tobytes())
            vals.frombytes(val.astype(np.int64).tobytes())
    if cols.raw_id_keys is None:
        cols.raw_id_keys = {col for col, (ev, _) in ids.items() if len(ev)}
    fl_rows = np.flatnonzero(has_flops[inv])
    if len(fl_rows):
        cols.flops_rows.extend((fl_rows + row0).tolist())
        cols.flops_vals.extend(flops[inv][fl_rows].tolist())
    if mems:
        mem = {"ts": mem_ts,
               "bytes": np.fromiter(map(attrgetter("nbytes"), margs), np.float64, len(mems)),
               "alloc": np.fromiter(map(attrgetter("alloc"), margs), np.float64, len(mems)),
               "reserved": np.fromiter(map(attrgetter("reserved"), margs), np.float64, len(mems)),
               "devtype": list(map(attrgetter("devtype"), margs)), "devid": list(map(attrgetter("devid"), margs)),
               "pid": list(map(_pid, mems)), "tid": list(map(_tid, mems))}
        kineto.add_memory_chunk(cols.mem_parts, mem, cols.path, cols.str_ids)
    # text pids/tids get their ids in the per-event loop's order: the memory events' first, then the spans'
    pid = int_ids(list(map(_pid, xs)), cols.str_ids)
    tid = int_ids(list(map(_tid, xs)), cols.str_ids)
    if other_at:
        cols.feed([parsed[i] for i in other_at])  # adds len(other_at) to n_events
        del parsed
    cols.n_events += n - len(other_at)
    if nx:
        cols.p_ts.append(ts)
        cols.p_dur.append(dur)
        cols.p_cat.append(cc)
        cols.p_name.append(nc)
        cols.p_shape.append(info[inv, 1].astype(np.int32))
        cols.p_pid.append(pid)
        cols.p_tid.append(tid)
        cols.p_attrs.append(info[inv, 2].astype(np.int32))
        cols.n = row0 + nx
    return True
