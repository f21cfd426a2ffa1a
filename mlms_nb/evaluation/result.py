"""The `Evaluation` value object: what one evaluation measured, kept apart from how it is shown.

The runner fills it in; the notebook shows it (``_repr_html_``), the CLI prints it (``to_text``), the
history store saves one framework's part of it at a time (``for_framework`` + ``to_json``). It imports no
framework. ``to_json``/``from_json`` are lossless: frames keep their columns, order and dtypes, latency
samples keep every nanosecond, probabilities keep their dtype and shape. The JSON is strict (no NaN):
missing numbers are ``null``, infinities are the strings ``"inf"``/``"-inf"``.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from mlms_nb._clock import new_id, now_utc
from mlms_nb._fs import atomic_write_text
from mlms_nb.errors import MlmsError
from mlms_nb.schema.trace import counters_frame, spans_frame
from mlms_nb.tracing.trace import Trace
from mlms_nb.stack import describe_stack, stack_hash

FORMAT = "mlms-nb/evaluation"
FORMAT_VERSION = 1

LATENCY_KEY_COLUMNS = ("framework", "batch_size", "scenario")
SUMMARY_COLUMNS = ("framework", "batch_size", "top1", "top5", "median_ms", "p90_ms", "p99_ms", "throughput_per_s")
FRAME_FIELDS = ("latency", "cold_start", "accuracy", "predictions", "trace_overhead")


class EvaluationFormatError(MlmsError, ValueError):
    """Text or a file that is not a saved mlms-nb evaluation."""


@dataclass(eq=False, repr=False, kw_only=True)
class Evaluation:
    """One evaluation of one model in one or more frameworks, on one stack, with one set of options.

    Frames (empty when not measured): ``latency`` one row per framework x batch size x scenario
    (``framework, batch_size, scenario`` + the `latency_stats` keys, + ``target_qps, latency_bound_ms,
    meets_bound, achieved_qps`` in the server scenario); ``cold_start`` (``framework, load_ms,
    first_inference_ms, batch_size``); ``accuracy`` (``framework, dataset, n, top1, top5, skipped``;
    top1/top5 are fractions 0..1); ``predictions`` one row per framework x input.
    ``samples`` maps ``(framework, batch_size, scenario)`` to the raw int64 nanosecond latencies.
    """
    id: str = field(default_factory=new_id)
    created_at: str = field(default_factory=now_utc)
    model: str = ""
    model_version: str = ""
    frameworks: list[str] = field(default_factory=list)
    manifests: dict[str, dict] = field(default_factory=dict)
    stack: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    latency: pd.DataFrame = field(default_factory=pd.DataFrame)
    samples: dict[tuple[str, int, str], np.ndarray] = field(default_factory=dict)
    cold_start: pd.DataFrame = field(default_factory=pd.DataFrame)
    accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    probabilities: dict[str, np.ndarray] = field(default_factory=dict)
    complete: bool = True
    warnings: list[str] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    history_ids: list[int] = field(default_factory=list)
    #: traced runs only: per framework and batch size, the traced median against the untraced one
    trace_overhead: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: traced runs only: framework -> Trace (kept beside the evaluation, not inside its JSON)
    traces: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ derived views
    def framework_stack_hash(self, framework: str) -> str:
        """The stack hash of one framework's results: hardware + software with only that framework's version."""
        return stack_hash(self.stack, framework=framework)

    @property
    def stack_hash(self) -> str:
        """The hash of the whole stack (every framework's version in it)."""
        return stack_hash(self.stack)

    @property
    def summary(self) -> pd.DataFrame:
        """Per framework and batch size: top1, top5 (fractions), median_ms, p90_ms, p99_ms, throughput_per_s.

        ``.attrs["note"]`` says how latency was measured. A ``scenario`` column appears only when the
        latency frame holds more than one scenario.
        """
        lat = self.latency
        acc = self.accuracy
        acc_by_fw: dict[str, dict] = {}
        if not acc.empty and "framework" in acc:
            for rec in acc.to_dict("records"):
                acc_by_fw.setdefault(rec["framework"], rec)
        rows = []
        several = (not lat.empty and "scenario" in lat and lat["scenario"].nunique() > 1)
        if not lat.empty:
            for rec in lat.to_dict("records"):
                fw = rec.get("framework")
                a = acc_by_fw.get(fw, {})
                row = {"framework": fw, "batch_size": rec.get("batch_size")}
                if several:
                    row["scenario"] = rec.get("scenario")
                row.update({"top1": a.get("top1", np.nan), "top5": a.get("top5", np.nan)})
                row.update({k: rec.get(k, np.nan) for k in ("median_ms", "p90_ms", "p99_ms", "throughput_per_s")})
                rows.append(row)
        measured = set() if lat.empty else set(lat["framework"])
        for fw in self.frameworks:  # accuracy without latency (interrupted runs) still shows
            if fw in acc_by_fw and fw not in measured:
                a = acc_by_fw[fw]
                rows.append({"framework": fw, "batch_size": np.nan, "top1": a.get("top1", np.nan),
                             "top5": a.get("top5", np.nan), "median_ms": np.nan, "p90_ms": np.nan,
                             "p99_ms": np.nan, "throughput_per_s": np.nan})
        columns = list(SUMMARY_COLUMNS)
        if several:
            columns.insert(2, "scenario")
        frame = pd.DataFrame(rows, columns=columns)
        if not frame.empty:
            order = {fw: i for i, fw in enumerate(self.frameworks)}
            frame = frame.sort_values(
                by=["framework", "batch_size"], key=lambda s: s.map(order) if s.name == "framework" else s,
                kind="stable", ignore_index=True)
            for col in ("top1", "top5", "median_ms", "p90_ms", "p99_ms", "throughput_per_s"):
                frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        frame.attrs["note"] = self.measurement_note()
        return frame

    def measurement_note(self) -> str:
        """How the numbers were measured, in one paragraph (repetitions, warm-up, threads, scenario, clock)."""
        opts = self.options or {}
        lat = self.latency
        parts = []
        scenario = opts.get("scenario")
        if scenario is None and not lat.empty and "scenario" in lat:
            scenario = ", ".join(map(str, lat["scenario"].unique()))
        if not lat.empty and "samples" in lat:
            lo, hi = int(lat["samples"].min()), int(lat["samples"].max())
            reps = f"{lo}" if lo == hi else f"{lo} to {hi}"
            parts.append(f"latency: median, p90 and p99 of {reps} timed calls per batch size"
                         + (f" ({scenario} scenario)" if scenario else ""))
        elif scenario:
            parts.append(f"latency: {scenario} scenario (no timed calls recorded)")
        rule = []
        if opts.get("min_repeats") is not None:
            rule.append(f"at least {opts['min_repeats']} calls")
        if opts.get("min_time_s") is not None:
            rule.append(f"at least {opts['min_time_s']:g} s")
        if rule:
            parts.append("each loop ran " + " and ".join(rule))
        warmup = opts.get("warmup")
        if not lat.empty and "warmup_calls" in lat:
            lo, hi = int(lat["warmup_calls"].min()), int(lat["warmup_calls"].max())
            calls = f"{lo}" if lo == hi else f"{lo} to {hi}"
            how = " (auto: until the median settled)" if warmup == "auto" else ""
            parts.append(f"after {calls} untimed warm-up calls{how}")
        elif warmup is not None:
            parts.append(f"warm-up: {warmup}")
        threads = opts.get("threads")
        parts.append(f"{threads} threads" if threads else "threads: the framework's default")
        if opts.get("device"):
            parts.append(f"device {opts['device']}")
        if scenario == "offline":
            parts.append("throughput: inputs / wall time of the loop")
        elif scenario:
            parts.append("throughput: batch size / mean latency")
        parts.append(f"clock {opts.get('clock', 'time.perf_counter_ns')}")
        parts.append("95% CI of the median by bootstrap; unstable when IQR > 10% of the median")
        if opts.get("trace_level") and str(opts["trace_level"]).upper() != "NONE":
            parts.append(f"trace level {opts['trace_level']} (adds overhead)")
        return "; ".join(parts)

    # ------------------------------------------------------------------ one framework, and back
    def for_framework(self, framework: str) -> "Evaluation":
        """The part of this evaluation that concerns ``framework`` (same id; its stack keeps only that
        framework's version; warnings that name another framework are left out)."""
        if framework not in self.frameworks:
            raise MlmsError(f"framework {framework!r} is not in this evaluation; it has: {', '.join(self.frameworks)}")
        others = [fw for fw in self.frameworks if fw != framework]

        def rows(frame: pd.DataFrame) -> pd.DataFrame:
            if frame.empty or "framework" not in frame:
                return frame.copy()
            return frame[frame["framework"] == framework].reset_index(drop=True)

        stack = json.loads(json.dumps(_plain(self.stack)))
        software = stack.get("software")
        if isinstance(software, dict):
            for fw in others:
                software.pop(fw, None)
        options = json.loads(json.dumps(_plain(self.options)))
        for key, value in list(options.items()):
            if isinstance(value, dict) and set(value) & set(self.frameworks) and set(value) <= set(self.frameworks):
                options[key] = {k: v for k, v in value.items() if k == framework}
        return Evaluation(
            model=self.model, model_version=self.model_version, frameworks=[framework],
            manifests={k: v for k, v in self.manifests.items() if k == framework},
            stack=stack, options=options,
            latency=rows(self.latency), cold_start=rows(self.cold_start), accuracy=rows(self.accuracy),
            predictions=rows(self.predictions), trace_overhead=rows(self.trace_overhead),
            traces={k: v for k, v in self.traces.items() if k == framework},
            samples={k: v.copy() for k, v in self.samples.items() if k[0] == framework},
            probabilities={k: v.copy() for k, v in self.probabilities.items() if k == framework},
            complete=self.complete,
            warnings=[w for w in self.warnings if _warning_framework(w, self.frameworks) in (None, framework)],
            trace_ids=list(self.trace_ids), history_ids=[], id=self.id, created_at=self.created_at)

    @property
    def trace(self):
        """The traced pass as one `Trace`: a framework's own, or all frameworks' spans side by side (each
        framework keeps its ``trace_id``, so ``span_id``/``parent_id`` are unique within a ``trace_id``)."""
        if not self.traces:
            raise MlmsError("this evaluation was not traced: run it with trace_level='FRAMEWORK' (or another level)")
        if len(self.traces) == 1:
            return next(iter(self.traces.values()))
        parts = list(self.traces.values())
        spans = spans_frame({c: np.concatenate([p.spans[c].to_numpy(dtype=object) for p in parts])
                             for c in parts[0].spans.columns})
        counters = counters_frame(pd.concat([p.counters.astype(object) for p in parts], ignore_index=True))
        meta = {"trace_id": self.id, "source": "mlms_nb.evaluation", "traces": {fw: t.metadata for fw, t in self.traces.items()}}
        return Trace(spans, counters, meta)

    @classmethod
    def combine(cls, parts: Iterable["Evaluation"]) -> "Evaluation":
        """Put per-framework parts of one evaluation (as the history store keeps them) back together."""
        parts = list(parts)
        if not parts:
            raise MlmsError("nothing to combine: no evaluation parts")
        first = parts[0]
        if len(parts) == 1:
            return first
        ids = {p.id for p in parts}
        if len(ids) != 1:
            raise MlmsError(f"cannot combine parts of different evaluations: {sorted(ids)}")
        frameworks: list[str] = []
        for p in parts:
            frameworks += [fw for fw in p.frameworks if fw not in frameworks]
        stack = json.loads(json.dumps(_plain(first.stack)))
        options = json.loads(json.dumps(_plain(first.options)))
        for p in parts[1:]:
            for key, value in (p.stack.get("software") or {}).items():
                stack.setdefault("software", {}).setdefault(key, value)
            for key, value in p.options.items():
                if isinstance(value, dict) and isinstance(options.get(key), dict):
                    options[key] = {**options[key], **value}
                else:
                    options.setdefault(key, value)

        def concat(name: str) -> pd.DataFrame:
            frames = [getattr(p, name) for p in parts if not getattr(p, name).empty]
            if not frames:
                return pd.DataFrame()
            return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].copy()

        warnings: list[str] = []
        for p in parts:
            warnings += [w for w in p.warnings if w not in warnings]
        return cls(
            model=first.model, model_version=first.model_version, frameworks=frameworks,
            manifests={k: v for p in parts for k, v in p.manifests.items()}, stack=stack, options=options,
            latency=concat("latency"), cold_start=concat("cold_start"), accuracy=concat("accuracy"),
            predictions=concat("predictions"), trace_overhead=concat("trace_overhead"),
            traces={k: v for p in parts for k, v in p.traces.items()},
            samples={k: v for p in parts for k, v in p.samples.items()},
            probabilities={k: v for p in parts for k, v in p.probabilities.items()},
            complete=all(p.complete for p in parts), warnings=warnings,
            trace_ids=list(dict.fromkeys(t for p in parts for t in p.trace_ids)),
            history_ids=[i for p in parts for i in p.history_ids], id=first.id, created_at=first.created_at)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """A JSON-ready dict (only str, int, float, bool, None, lists and dicts)."""
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "id": self.id, "created_at": self.created_at, "model": self.model, "model_version": self.model_version,
            "frameworks": list(self.frameworks), "complete": bool(self.complete),
            "manifests": _plain(self.manifests), "stack": _plain(self.stack), "options": _plain(self.options),
            "latency": _frame_to_dict(self.latency), "cold_start": _frame_to_dict(self.cold_start),
            "accuracy": _frame_to_dict(self.accuracy), "predictions": _frame_to_dict(self.predictions),
            "trace_overhead": _frame_to_dict(self.trace_overhead),
            "samples": [{"framework": k[0], "batch_size": int(k[1]), "scenario": k[2],
                         "dtype": str(np.asarray(v).dtype), "ns": np.asarray(v).tolist()}
                        for k, v in self.samples.items()],
            "probabilities": {fw: _array_to_dict(a) for fw, a in self.probabilities.items()},
            "warnings": [str(w) for w in self.warnings], "trace_ids": [str(t) for t in self.trace_ids],
            "history_ids": [int(i) for i in self.history_ids],
        }

    def to_json(self, indent: int | None = None) -> str:
        """Strict JSON text of the whole evaluation (see `from_json`)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "Evaluation":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise EvaluationFormatError("not a saved mlms-nb evaluation (expected \"format\": \"mlms-nb/evaluation\")")
        if int(data.get("format_version", 0)) > FORMAT_VERSION:
            raise EvaluationFormatError(
                f"this evaluation was saved by a newer mlms-nb (format {data['format_version']}); upgrade mlms-nb")
        try:
            samples = {}
            for s in data.get("samples", []):
                samples[(s["framework"], int(s["batch_size"]), s["scenario"])] = np.asarray(
                    s["ns"], dtype=s.get("dtype", "int64"))
            return cls(
                id=data["id"], created_at=data["created_at"], model=data.get("model", ""),
                model_version=data.get("model_version", ""), frameworks=list(data.get("frameworks", [])),
                manifests=data.get("manifests", {}), stack=data.get("stack", {}), options=data.get("options", {}),
                latency=_frame_from_dict(data.get("latency")), samples=samples,
                cold_start=_frame_from_dict(data.get("cold_start")), accuracy=_frame_from_dict(data.get("accuracy")),
                predictions=_frame_from_dict(data.get("predictions")),
                trace_overhead=_frame_from_dict(data.get("trace_overhead")),
                probabilities={fw: _array_from_dict(a) for fw, a in data.get("probabilities", {}).items()},
                complete=bool(data.get("complete", True)), warnings=list(data.get("warnings", [])),
                trace_ids=list(data.get("trace_ids", [])), history_ids=[int(i) for i in data.get("history_ids", [])])
        except (KeyError, TypeError, ValueError) as err:
            raise EvaluationFormatError(f"a saved evaluation is damaged: {type(err).__name__}: {err}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> "Evaluation":
        """The `Evaluation` that `to_json` wrote."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise EvaluationFormatError(f"not JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the JSON to ``path`` (atomically: a reader never sees half a file); returns the path."""
        return atomic_write_text(Path(path).expanduser(), self.to_json(indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Evaluation":
        """Read an evaluation that `save` wrote."""
        path = Path(path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise EvaluationFormatError(f"{path}: cannot read the evaluation ({err.strerror})") from None
        try:
            return cls.from_json(text)
        except EvaluationFormatError as err:
            raise EvaluationFormatError(f"{path}: {err}") from None

    # ------------------------------------------------------------------ equality
    def __eq__(self, other: object) -> bool:
        """Same measurements, stack, options and identity (``history_ids``, where it was stored, is ignored)."""
        if not isinstance(other, Evaluation):
            return NotImplemented
        for f in fields(self):
            if f.name in ("history_ids", "traces"):
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in FRAME_FIELDS:
                if not _frames_equal(a, b):
                    return False
            elif f.name in ("samples", "probabilities"):
                if a.keys() != b.keys() or any(
                        np.asarray(a[k]).dtype != np.asarray(b[k]).dtype or not np.array_equal(a[k], b[k])
                        for k in a):
                    return False
            elif _plain(a) != _plain(b):
                return False
        return True

    __hash__ = None  # a mutable value

    # ------------------------------------------------------------------ display
    def _table(self) -> list[dict[str, str]]:
        """The display rows: one per latency row (or per framework with accuracy only), formatted with units."""
        lat = self.latency
        acc_by_fw = {}
        if not self.accuracy.empty and "framework" in self.accuracy:
            acc_by_fw = {r["framework"]: r for r in self.accuracy.to_dict("records")}
        server = not lat.empty and "target_qps" in lat
        several = not lat.empty and "scenario" in lat and lat["scenario"].nunique() > 1
        out = []
        records = lat.to_dict("records") if not lat.empty else []
        seen = {r.get("framework") for r in records}
        records += [{"framework": fw} for fw in self.frameworks if fw not in seen and fw in acc_by_fw]
        order = {fw: i for i, fw in enumerate(self.frameworks)}
        records.sort(key=lambda r: (order.get(r.get("framework"), len(order)), _num(r.get("batch_size"), 0)))
        for r in records:
            a = acc_by_fw.get(r.get("framework"), {})
            row = {"framework": str(r.get("framework")), "batch size": _fmt_int(r.get("batch_size"))}
            if several:
                row["scenario"] = str(r.get("scenario", ""))
            row["top-1 (%)"] = _fmt_pct(a.get("top1"))
            row["top-5 (%)"] = _fmt_pct(a.get("top5"))
            row["median (ms)"] = _fmt_num(r.get("median_ms"))
            low, high = r.get("median_ci_low_ms"), r.get("median_ci_high_ms")
            row["95% CI of median (ms)"] = (f"{_fmt_num(low)} to {_fmt_num(high)}"
                                            if not (_isna(low) or _isna(high)) else "-")
            row["p90 (ms)"] = _fmt_num(r.get("p90_ms"))
            row["p99 (ms)"] = _fmt_num(r.get("p99_ms"))
            row["throughput (/s)"] = _fmt_num(r.get("throughput_per_s"))
            ratio = r.get("iqr_over_median")
            row["IQR/median (%)"] = ("-" if _isna(ratio) else f"{100 * float(ratio):.1f}"
                                     + (" unstable" if r.get("unstable") is True or r.get("unstable") == 1 else ""))
            row["calls"] = _fmt_int(r.get("samples"))
            if server:
                row["target (/s)"] = _fmt_num(r.get("target_qps"))
                row["achieved (/s)"] = _fmt_num(r.get("achieved_qps"))
                bound = r.get("latency_bound_ms")
                met = r.get("meets_bound")
                row["p99 bound (ms)"] = "-" if _isna(bound) else (
                    f"{_fmt_num(bound)} {'met' if met is True or met == 1 else 'missed'}")
            out.append(row)
        return out

    def _header_lines(self) -> list[tuple[str, str]]:
        """(label, text) lines shown above the table."""
        opts = self.options or {}
        model = f"{self.model} {self.model_version}".strip() or "(no model)"
        if self.frameworks:
            model += f" in {', '.join(self.frameworks)}"
        model += f" (evaluation {self.id[:12]}" + (f", {self.created_at[:19]}Z)" if self.created_at else ")")
        lines = [("Model", model)]
        if self.stack:
            lines.append(("Stack", describe_stack(self.stack, threads=opts.get("threads"))))
        if not self.accuracy.empty and {"dataset", "n"} <= set(self.accuracy.columns):
            ds = "; ".join(f"{r['framework']}: {r['dataset']} ({_fmt_int(r['n'])} inputs"
                           + (f", {_fmt_int(r['skipped'])} skipped" if not _isna(r.get("skipped")) and r.get("skipped")
                              else "") + ")" for r in self.accuracy.to_dict("records"))
            lines.append(("Accuracy", "top-1/top-5 on " + ds))
        elif opts.get("dataset"):
            lines.append(("Dataset", str(opts["dataset"])))
        lines.append(("Measured", self.measurement_note()))
        if not self.cold_start.empty and {"load_ms", "first_inference_ms"} <= set(self.cold_start.columns):
            cold = "; ".join(
                f"{r.get('framework')}: load {_fmt_num(r.get('load_ms'))} ms, first inference "
                f"{_fmt_num(r.get('first_inference_ms'))} ms"
                + (f" (batch {_fmt_int(r.get('batch_size'))})" if not _isna(r.get("batch_size")) else "")
                for r in self.cold_start.to_dict("records"))
            lines.append(("Cold start", cold))
        if not self.complete:
            lines.append(("Incomplete", "the sweep was interrupted; the table holds what was measured before"))
        return lines

    def to_text(self) -> str:
        """A plain-text rendering: header lines, the table with units, the warnings."""
        out = [f"{label}: {text}" for label, text in self._header_lines()]
        rows = self._table()
        if rows:
            columns = list(rows[0].keys())
            for r in rows[1:]:
                columns += [c for c in r if c not in columns]
            widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
            out.append("")
            out.append("  ".join(c.rjust(widths[c]) if i else c.ljust(widths[c]) for i, c in enumerate(columns)))
            for r in rows:
                out.append("  ".join(r.get(c, "").rjust(widths[c]) if i else r.get(c, "").ljust(widths[c])
                                     for i, c in enumerate(columns)))
        else:
            out.append("(nothing measured)")
        if self.warnings:
            out.append("")
            out.append("Warnings:")
            out += [f"  - {w}" for w in self.warnings]
        return "\n".join(out)

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = ['<div class="mlms-evaluation">']
        for label, text in self._header_lines():
            style = ' style="color:#b00"' if label == "Incomplete" else ""
            parts.append(f"<div{style}><b>{esc(label)}:</b> {esc(text)}</div>")
        rows = self._table()
        if rows:
            columns = list(rows[0].keys())
            for r in rows[1:]:
                columns += [c for c in r if c not in columns]
            parts.append('<table class="mlms-table">')
            parts.append("<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in columns) + "</tr></thead><tbody>")
            for r in rows:
                cells = []
                for i, c in enumerate(columns):
                    value = r.get(c, "")
                    align = "left" if i == 0 or c == "scenario" else "right"
                    style = f"text-align:{align}"
                    if c == "IQR/median (%)" and value.endswith("unstable"):
                        style += ";color:#b00"
                    cells.append(f'<td style="{style}">{esc(value)}</td>')
                parts.append("<tr>" + "".join(cells) + "</tr>")
            parts.append("</tbody></table>")
        else:
            parts.append("<div><i>nothing measured</i></div>")
        if self.warnings:
            parts.append('<div style="color:#a60"><b>Warnings:</b><ul>'
                         + "".join(f"<li>{esc(w)}</li>" for w in self.warnings) + "</ul></div>")
        if self.traces and self.history_ids:
            parts.append(panel_link_html(self.id))
        parts.append("</div>")
        return "\n".join(parts)


PANEL_LINK_PREFIX = "#mlms-timeline/"
"""An output link to ``#mlms-timeline/<evaluation_id>[/<framework>]`` opens that stored run in the JupyterLab
timeline panel (the mlms-nb lab extension catches the click; elsewhere the link does nothing)."""


def panel_link_html(evaluation_id: str, framework: str | None = None) -> str:
    """A button-like link that opens a stored, traced run in the JupyterLab timeline panel."""
    target = PANEL_LINK_PREFIX + evaluation_id + (f"/{framework}" if framework else "")
    what = f"the {framework} trace" if framework else "the timeline"
    return (f'<div class="mlms-panel-link" style="margin:4px 0"><a href="{html.escape(target)}" '
            f'title="opens in the mlms-nb JupyterLab extension (JupyterLab only)" style="display:inline-block;'
            f'padding:2px 8px;border:1px solid #1f77b4;border-radius:3px;text-decoration:none">'
            f'Open {html.escape(what)} in the JupyterLab panel</a></div>')


# ---------------------------------------------------------------- helpers: display

def _isna(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    try:
        return bool(isinstance(value, (float, np.floating)) and math.isnan(value))
    except TypeError:
        return False


def _num(value: Any, default: float) -> float:
    try:
        return default if _isna(value) else float(value)
    except (TypeError, ValueError):
        return default


def _fmt_num(value: Any) -> str:
    """3 significant digits for small numbers, thousands separators for large ones; '-' when missing."""
    if _isna(value):
        return "-"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a == 0:
        return "0"
    if a >= 0.001:
        return f"{v:.3f}"
    return f"{v:.2e}"


def _fmt_int(value: Any) -> str:
    if _isna(value):
        return "-"
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return str(value)


def _fmt_pct(value: Any) -> str:
    if _isna(value):
        return "-"
    return f"{100 * float(value):.1f}"


def _warning_framework(warning: str, frameworks: list[str]) -> str | None:
    """The framework a warning starts with (``"torch: ..."``, ``"torch, batch size 8: ..."``), if any."""
    for fw in frameworks:
        if warning.startswith((f"{fw}:", f"{fw},", f"{fw} ")):
            return fw
    return None


# ---------------------------------------------------------------- helpers: JSON

def _plain(value: Any) -> Any:
    """numpy and pandas scalars/arrays -> Python values; tuples -> lists; NaN -> None; inf -> "inf"."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(value, (pd.Timestamp, _dt.datetime, _dt.date)):
        return None if value is pd.NaT else value.isoformat()
    if isinstance(value, pd.Timedelta):
        return int(value.value)
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (str,)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # other numpy scalar kinds
        try:
            return _plain(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _frame_to_dict(frame: pd.DataFrame | None) -> dict:
    """``{"columns", "dtypes", "data"}``: like orient='split' plus the dtypes, so reading it back is exact."""
    if frame is None:
        frame = pd.DataFrame()
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1:
        frame = frame.reset_index(drop=True)
    data = [[_plain(v) for v in row] for row in frame.itertuples(index=False, name=None)]
    return {"columns": [str(c) for c in frame.columns], "dtypes": [str(t) for t in frame.dtypes], "data": data}


def _restore_value(value: Any, kind: str) -> Any:
    if kind == "f" and isinstance(value, str):
        return float(value)  # "inf" / "-inf"
    if kind == "f" and value is None:
        return np.nan
    return value


def _frame_from_dict(data: dict | None) -> pd.DataFrame:
    if not data or not data.get("columns"):
        return pd.DataFrame()
    columns, dtypes, rows = data["columns"], data.get("dtypes") or [], data.get("data") or []
    series = {}
    for j, name in enumerate(columns):
        dtype = dtypes[j] if j < len(dtypes) else "object"
        values = [row[j] for row in rows]
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            kind = ""
        if kind:
            values = [_restore_value(v, kind) for v in values]
            if kind == "M":
                series[name] = pd.Series(pd.to_datetime(values), dtype=dtype)
            elif kind == "m":
                series[name] = pd.Series(pd.to_timedelta(values, unit="ns"), dtype=dtype)
            elif kind == "O":
                s = pd.Series(values, dtype=object)
                series[name] = s
            else:
                series[name] = pd.Series(values, dtype=dtype)
        else:  # extension dtypes: str, string, category, Int64, boolean, datetime64[ns, UTC] ...
            if dtype.startswith("datetime64"):
                series[name] = pd.Series(pd.to_datetime(values), dtype=dtype)
            else:
                try:
                    series[name] = pd.Series(values, dtype=dtype)
                except (TypeError, ValueError):
                    series[name] = pd.Series(values, dtype=object)
    frame = pd.DataFrame(series, columns=columns)
    frame.index = pd.RangeIndex(len(rows))
    return frame


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if a.empty and b.empty and list(a.columns) == list(b.columns) == []:
        return True
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
        return True
    except AssertionError:
        return False


def _array_to_dict(array: np.ndarray) -> dict:
    a = np.asarray(array)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": [_plain(v) for v in a.reshape(-1).tolist()]}


def _array_from_dict(data: dict) -> np.ndarray:
    values = [_restore_value(v, np.dtype(data["dtype"]).kind) for v in data["data"]]
    return np.asarray(values, dtype=data["dtype"]).reshape(data["shape"])
