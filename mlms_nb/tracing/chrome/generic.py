"""Any other Chrome trace (Perfetto / chrome://tracing JSON): what the importer reads besides the known categories.

Known categories are read as their dialect says (:mod:`.kineto`, :mod:`.ort`); other ``X`` events become FRAMEWORK
/ ``other`` spans with the category in ``attrs["cat"]``; ``B``/``E`` pairs are matched per (pid, tid) into
spans; ``C`` events become counters (one metric per numeric arg: ``name`` or ``name.arg``); ``M`` events name
processes and threads (``metadata["process_names"]`` / ``["thread_names"]``).
"""
from __future__ import annotations

from mlms_nb.schema.levels import TraceLevel as _L
from mlms_nb.tracing.chrome._common import ARGS_OF_UNKNOWN_CATEGORY, json_safe

UNKNOWN_CATEGORY = (_L.FRAMEWORK, "other", ARGS_OF_UNKNOWN_CATEGORY)
"""What an ``X`` event of an unknown category is read as: (level, kind, how its args are read)."""


def metadata(skeleton) -> dict:
    """The trace metadata a generic Chrome trace gives: no known clock, and its top-level fields."""
    meta: dict = {"clock": {"name": "chrome trace", "wall_offset_ns": None}}
    if isinstance(skeleton, dict):
        meta["chrome"] = json_safe({k: v for k, v in skeleton.items() if k != "traceEvents"})
    return meta


def other_event(cols, ph, ev: dict) -> None:
    """An event that is neither complete (``X``) nor instant: metadata, counter, begin/end; others are ignored."""
    if ph == "M":
        _metadata_event(cols, ev)
    elif ph == "C":
        _counter_event(cols, ev)
    elif ph == "B" or ph == "E":
        _begin_end_event(cols, ph, ev)


def _metadata_event(cols, ev: dict) -> None:
    name = ev.get("name")
    a = ev.get("args") or {}
    if name == "process_name":
        cols.process_names[str(ev.get("pid"))] = a.get("name")
    elif name == "thread_name":
        cols.thread_names[f"{ev.get('pid')}/{ev.get('tid')}"] = a.get("name")


def _counter_event(cols, ev: dict) -> None:
    name = str(ev.get("name", ""))
    args = ev.get("args") or {}
    src = str(ev.get("cat") or "chrome")
    for key, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metric = name if len(args) == 1 else f"{name}.{key}"
            cols.counter_rows.append((ev["ts"], src, metric, float(value), "", ""))


def _begin_end_event(cols, ph: str, ev: dict) -> None:
    """``B`` opens a span on its (pid, tid); ``E`` closes the innermost open one into an ``X`` event that the
    importer reads with the rest when it builds (an unmatched ``E`` is dropped)."""
    key = (ev.get("pid", 0), ev.get("tid", 0))
    if ph == "B":
        cols.open_be.setdefault(key, []).append(ev)
        return
    stack = cols.open_be.get(key)
    if not stack:
        return
    b = stack.pop()
    args = dict(b.get("args") or {})
    args.update(ev.get("args") or {})
    cols.be_spans.append({"ph": "X", "name": b.get("name", ""), "cat": b.get("cat"), "ts": b["ts"],
                          "dur": ev["ts"] - b["ts"], "pid": key[0], "tid": key[1], "args": args})
