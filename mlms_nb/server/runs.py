"""The one adapter between the server extension and mlms_nb's internals: the history store, its ``traces``
table, where traces live on disk (``$MLMS_HOME/traces/<evaluation_id>/<framework>``, a Parquet folder written by
``Trace.save``) and how a trace is opened. Nothing else in :mod:`mlms_nb.server` imports mlms_nb modules, so
moving the store (``mlms_nb.store.history`` -> ``mlms_nb.store``) only changes the imports here.

Every id that reaches this module has been checked by :func:`check_evaluation_id` / :func:`check_framework`;
every path it returns lies inside :func:`traces_root` (symlinks resolved), and every file read inside a trace
folder is resolved and confined to that folder too (:func:`confined_file`), so no request can read a file outside the
store. One damaged or unreadable trace breaks only itself: the listing marks it ``unreadable`` (with why) and its
endpoints answer :class:`Unreadable` (HTTP 422) with that sentence.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

EVALUATION_ID = re.compile(r"[0-9a-f]{32}")
FRAMEWORK = re.compile(r"[a-z][a-z0-9_]{0,31}")
TRACE_LEVELS = ("NONE", "APPLICATION", "MODEL", "FRAMEWORK", "ML_LIBRARY", "SYSTEM_LIBRARY", "HARDWARE", "FULL")
SPANS_FILE = "spans.parquet"
COUNTERS_FILE = "counters.parquet"


class BadRequest(ValueError):
    """A malformed id or parameter; its text is one sentence for the HTTP 400 reply."""


class NotFound(LookupError):
    """No such run or trace in the store; its text is one sentence for the HTTP 404 reply."""


class Unreadable(RuntimeError):
    """A stored trace whose files cannot be read (damaged, or a link out of its folder); one sentence for the HTTP
    422 reply."""


def check_evaluation_id(value: str) -> str:
    """``value`` if it is an evaluation id (32 lowercase hex digits), else :class:`BadRequest`."""
    if not isinstance(value, str) or not EVALUATION_ID.fullmatch(value):
        raise BadRequest(f"{value[:80]!r} is not an evaluation id (32 hex digits, as `mlms history` lists them)")
    return value


def check_framework(value: str) -> str:
    if not isinstance(value, str) or not FRAMEWORK.fullmatch(value):
        raise BadRequest(f"{value[:80]!r} is not a framework name (lowercase letters, digits and _)")
    return value


# ------------------------------------------------------------------------------------------ where things are

def store_root() -> Path:
    """``$MLMS_HOME`` (resolved)."""
    from mlms_nb.paths import mlms_home

    return mlms_home().resolve()


def traces_root() -> Path:
    return store_root() / "traces"


def store_description() -> str:
    from mlms_nb.store.history import HistoryStore

    return HistoryStore().display_url


def _inside_store(path: str | None) -> Path | None:
    """The trace folder at ``path`` if it resolves to a folder under :func:`traces_root` holding spans."""
    if not path:
        return None
    root = traces_root()
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    spans = resolved / SPANS_FILE
    if not resolved.is_relative_to(root) or resolved == root or not (spans.exists() or spans.is_symlink()):
        return None
    return resolved


def confined_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it is a regular file that resolves inside ``folder`` (a link out of it is refused);
    None otherwise."""
    try:
        resolved = (folder / name).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if resolved.parent != folder.resolve() or not resolved.is_file():
        return None
    return resolved


def _spans_file(folder: Path) -> Path:
    """The confined spans file of a trace folder, or :class:`Unreadable` saying why not."""
    spans = confined_file(folder, SPANS_FILE)
    if spans is None:
        link = folder / SPANS_FILE
        why = ("is a link that leaves the trace folder; it was not read" if link.is_symlink()
               else "is not a regular file")
        raise Unreadable(f"the trace in {folder} is unreadable: its {SPANS_FILE} {why}")
    return spans


# ------------------------------------------------------------------------------------------ runs

_footers: dict[tuple[str, int, int], dict] = {}


def trace_facts(folder: Path) -> dict:
    """Span count and recorded trace level of a trace folder, from the Parquet footer only (cached). A trace that
    cannot be read gives ``spans`` 0 and ``unreadable``: why (the others are unaffected)."""
    try:
        return _footer_facts(_spans_file(folder))
    except Unreadable as err:
        return {"spans": 0, "trace_level": "", "source": "", "unreadable": str(err)}
    except Exception as err:  # noqa: BLE001 - OSError, ArrowInvalid ...: any damage breaks this trace only
        why = " ".join(str(err).split())[:200] or type(err).__name__
        return {"spans": 0, "trace_level": "", "source": "", "unreadable":
                f"the trace in {folder} is unreadable: its {SPANS_FILE} could not be opened ({why})"}


def _footer_facts(spans: Path) -> dict:
    import pyarrow.parquet as pq

    st = spans.stat()
    key = (str(spans), st.st_mtime_ns, st.st_size)
    facts = _footers.get(key)
    if facts is None:
        with pq.ParquetFile(spans, memory_map=True) as f:
            meta = f.schema_arrow.metadata or {}
            try:
                info = json.loads(meta.get(b"mlms_nb", b"{}")).get("metadata") or {}
            except ValueError:
                info = {}
            facts = {"spans": int(f.metadata.num_rows), "trace_level": str(info.get("level") or ""),
                     "source": str(info.get("source") or "")}
        _footers[key] = facts
    return facts


def readable_folder(folder: Path) -> Path:
    """``folder`` if its trace can be opened (spans file confined, footer readable), else :class:`Unreadable`."""
    why = trace_facts(folder).get("unreadable")
    if why:
        raise Unreadable(why)
    return folder


def _traces_by_evaluation(evaluation_id: str | None = None) -> dict[str, dict[str, Path]]:
    """evaluation id -> framework -> trace folder, for the store's traces that exist inside the store."""
    from mlms_nb.store.history import HistoryStore

    frame = HistoryStore().traces(evaluation_id)
    out: dict[str, dict[str, Path]] = {}
    for eid, path in zip(frame["evaluation_id"], frame["path"]):
        folder = _inside_store(path)
        if folder is None or not FRAMEWORK.fullmatch(folder.name):
            continue
        out.setdefault(str(eid), {}).setdefault(folder.name, folder)  # newest first: the first one wins
    return out


def trace_folders() -> list[Path]:
    """The folders of every stored trace that lies inside the store, newest first."""
    return [folder for fws in _traces_by_evaluation().values() for folder in fws.values()]


def list_runs(limit: int = 500) -> list[dict[str, Any]]:
    """The stored evaluations, newest first, one entry per evaluation (its frameworks gathered)."""
    from mlms_nb.store.history import HistoryStore

    frame = HistoryStore().query(limit=limit)
    traced = _traces_by_evaluation()
    runs: dict[str, dict[str, Any]] = {}
    for row in frame.to_dict("records"):
        eid = str(row["evaluation_id"])
        run = runs.get(eid)
        if run is None:
            run = runs[eid] = {"evaluation_id": eid, "model": row["model"], "model_version": row["model_version"],
                               "created_at": row["created_at"], "complete": True, "dataset": row["dataset"],
                               "frameworks": [], "batch_sizes": [], "history_ids": [], "traces": []}
        run["frameworks"].append(row["framework"])
        run["history_ids"].append(int(row["id"]))
        run["complete"] = run["complete"] and bool(row["complete"])
        run["batch_sizes"] = sorted(set(run["batch_sizes"]) | {int(b) for b in row["batch_sizes"]})
    for eid, run in runs.items():
        for fw, folder in sorted(traced.get(eid, {}).items()):
            run["traces"].append({"framework": fw, **trace_facts(folder)})
        run["trace_levels"] = sorted({t["trace_level"] for t in run["traces"] if t["trace_level"]},
                                     key=lambda lv: TRACE_LEVELS.index(lv) if lv in TRACE_LEVELS else 99)
    return list(runs.values())


def store_version() -> str:
    """Changes whenever a run or a trace is added or removed (what the sidebar polls)."""
    from mlms_nb.store.history import HistoryStore

    store = HistoryStore()
    return f"{len(store)}:{len(store.traces())}"


def get_run(evaluation_id: str) -> dict[str, Any]:
    """One run: what :func:`list_runs` says of it, plus its options (scenario, trace level, repeats...)."""
    from mlms_nb.store.history import HistoryStore, NotInHistoryError

    check_evaluation_id(evaluation_id)
    try:
        evaluation = HistoryStore().load(evaluation_id)
    except NotInHistoryError:
        raise NotFound(f"evaluation {evaluation_id} is not in the history store") from None
    if evaluation.id != evaluation_id:  # load() also takes prefixes; ids here are exact
        raise NotFound(f"evaluation {evaluation_id} is not in the history store")
    traces = _traces_by_evaluation(evaluation_id).get(evaluation_id, {})
    summary = evaluation.summary
    return {
        "evaluation_id": evaluation.id, "model": evaluation.model, "model_version": evaluation.model_version,
        "created_at": evaluation.created_at, "complete": bool(evaluation.complete),
        "frameworks": list(evaluation.frameworks), "history_ids": list(evaluation.history_ids),
        "options": json.loads(json.dumps(evaluation.options, default=str)),
        "warnings": list(evaluation.warnings),
        "summary": json.loads(summary.to_json(orient="records")),
        "summary_note": str(summary.attrs.get("note", "")),
        "traces": [{"framework": fw, **trace_facts(folder)} for fw, folder in sorted(traces.items())],
    }


def trace_folder(evaluation_id: str, framework: str) -> Path:
    """The folder of one stored trace (inside the store), or :class:`NotFound`."""
    check_evaluation_id(evaluation_id)
    check_framework(framework)
    folder = _traces_by_evaluation(evaluation_id).get(evaluation_id, {}).get(framework)
    if folder is None:
        raise NotFound(f"no stored trace of framework {framework!r} for evaluation {evaluation_id}")
    return readable_folder(folder)


def load_spans(folder: Path):
    """The spans frame of a stored trace (memory-mapped Parquet; see ``Trace.load``)."""
    from mlms_nb.errors import TraceFormatError
    from mlms_nb.tracing.trace import Trace

    _spans_file(folder)
    if confined_file(folder, COUNTERS_FILE) is None and (folder / COUNTERS_FILE).is_symlink():
        raise Unreadable(f"the trace in {folder} is unreadable: its {COUNTERS_FILE} is a link that leaves the trace "
                         "folder; it was not read")
    try:
        return Trace.load(folder).spans
    except TraceFormatError as err:
        raise Unreadable(f"the trace in {folder} is unreadable: {err}") from None


def load_counters(folder: Path):
    """The counters frame of a stored trace (columns ``ts_ns, source, metric, value, unit, device``)."""
    import pyarrow.parquet as pq

    path = confined_file(folder, COUNTERS_FILE)
    if path is None:
        return None
    with pq.ParquetFile(path, memory_map=True) as f:
        return f.read().to_pandas()


def spans_key(folder: Path) -> str:
    """What a cached level-of-detail index of this trace must match: the spans file's size and mtime."""
    st = _spans_file(folder).stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def evaluation_id_of(run, framework: str | None = None) -> str:
    """The history-store evaluation id of an ``Evaluation`` (for ``%mlms timeline RUN --panel``), or an error
    saying why the panel cannot show it (or its ``framework`` trace)."""
    from mlms_nb.errors import MlmsError

    if not hasattr(run, "history_ids"):
        raise MlmsError("the timeline panel shows runs from the history store; a bare Trace is not stored there: "
                        "evaluate with history=True (the default) and a trace_level, then open that evaluation")
    if not run.traces:
        raise MlmsError("this evaluation was not traced: run it with trace_level='FRAMEWORK' (or another level)")
    if not run.history_ids:
        raise MlmsError("this evaluation is not in the history store (it was run with history=False), so the "
                        "panel cannot read its trace; run it again with history=True")
    if framework is not None and framework not in run.traces:
        raise MlmsError(f"timeline: no trace of framework {framework!r} in this run; it has "
                        f"{', '.join(run.traces)}")
    return str(run.id)


def timeline_module():
    """``analyses.timeline`` (the level-of-detail pyramid; moves to ``mlms_nb.analyses`` with the restructure)."""
    from mlms_nb.analyses import timeline

    return timeline


def panel_link_html(evaluation_id: str, framework: str | None = None) -> str:
    """The output link that opens a run in the timeline panel (the same one the Evaluation's HTML carries)."""
    from mlms_nb.display import panel_link_html as link

    return link(evaluation_id, framework)
