"""The `Evaluation` value object: what one evaluation measured, and views derived from it; nothing else.

The runner fills it in; :mod:`mlms_nb.display` shows it (``repr``, the notebook's HTML, the CLI's text);
:mod:`mlms_nb.evaluation.codec` writes and reads its JSON (lossless: frames keep their columns, order and dtypes,
latency samples every nanosecond, probabilities their dtype and shape); the history store saves one framework's
part of it at a time (``for_framework``). It imports no framework and no analysis (the facade lends it
``.layers()``, ``.roofline()`` ...). Its frames' columns are written down in :mod:`mlms_nb.schema.evaluation`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from mlms_nb.display import FramesForPeople, ShownByDisplay, for_people
from mlms_nb._facade import FacadeMethod
from mlms_nb._clock import new_id, now_utc
from mlms_nb._fs import atomic_write_text
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation import codec
from mlms_nb.evaluation.codec import EvaluationFormatError, plain
from mlms_nb.evaluation.stats import machine_note
from mlms_nb.generation.metrics import generation_note
from mlms_nb.options import Timing, spell
from mlms_nb.schema.evaluation import FRAMES, SUMMARY, SampleKey
from mlms_nb.schema.trace import counters_frame, spans_frame
from mlms_nb.stack import describe_stack, stack_hash
from mlms_nb.tracing.trace import Trace

__all__ = ["Evaluation", "EvaluationFormatError"]


@dataclass(eq=False, repr=False, kw_only=True)
class Evaluation(ShownByDisplay, FramesForPeople):
    """One evaluation of one model in one or more frameworks, on one stack, with one set of options.

    Frames (empty when not measured): ``latency`` one row per framework x batch size x scenario
    (``framework, batch_size, scenario`` + the `latency_stats` keys, + ``target_qps, latency_bound_ms,
    meets_bound, achieved_qps`` in the server scenario); ``cold_start`` (``framework, load_ms,
    first_inference_ms, batch_size``); ``full_pass`` (every input streamed through the model once: ``inputs,
    wall_s, inputs_per_s, preprocess_s, inference_s, wait_s``...); ``accuracy`` (``framework, dataset, n, top1, top5, skipped``;
    top1/top5 are fractions 0..1); ``predictions`` one row per framework x input.
    ``samples`` maps a `SampleKey` ``(framework, batch_size, scenario)`` to the raw int64 nanosecond latencies.
    Columns, dtypes and units of every frame: :mod:`mlms_nb.schema.evaluation`.
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
    samples: dict[SampleKey, np.ndarray] = field(default_factory=dict)
    cold_start: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: per framework: the streamed pass over every input (inputs, wall_s, inputs_per_s, preprocess_s, ...)
    full_pass: pd.DataFrame = field(default_factory=pd.DataFrame)
    accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    probabilities: dict[str, np.ndarray] = field(default_factory=dict)
    #: one row per framework x input (x chunk) x output: shape, summary, values where captured (capture_outputs)
    outputs: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: per framework x output x metric, against the reference framework (the first that captured outputs)
    output_agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: per framework x output x metric, against the dataset's targets: mean over the inputs, std, 95% CI, count
    target_metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: causal LMs: per framework x batch size x generate scenario x KV cache, TTFT/TPOT/ITL/tokens/s statistics
    generation: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: causal LMs: one row per request of those loops (arrival, TTFT, latency, TPOT, inter-token latencies, tokens)
    generation_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: causal LMs: greedy tokens and logits of each framework / KV-cache setting against the first
    generation_agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    complete: bool = True
    #: per framework: ``status`` (complete | partial | failed | not run), ``reason`` (None or error, interrupt,
    #: signal, timeout, crash), ``message``, ``measured_batch_sizes``, ``missing_batch_sizes``,
    #: ``cut_short_batch_sizes`` (see :mod:`mlms_nb.evaluation.assemble`); empty for results made before them
    outcomes: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    history_ids: list[int] = field(default_factory=list)
    #: traced runs only: per framework and batch size, the traced median against the untraced one
    trace_overhead: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: False when the history store could not take it (a warning names the fallback file it was written to)
    saved: bool = True
    #: traced runs only: framework -> Trace (kept beside the evaluation, not inside its JSON)
    traces: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ analyses (the facade's functions)
    layers = FacadeMethod("per-layer latency of a traced run")
    roofline = FacadeMethod("achieved against attainable FLOP/s per layer")
    batch_scaling = FacadeMethod("latency and throughput across batch sizes")
    compare = FacadeMethod("this run against another, layer by layer")
    timeline = FacadeMethod("the trace's spans on a timeline")
    kernels = FacadeMethod("GPU against CPU time per layer")

    # ------------------------------------------------------------------ derived views
    def missing(self) -> list[str]:
        """One sentence per framework not completely measured: what is missing and why (empty when complete)."""
        out = []
        for fw, o in self.outcomes.items():
            if o.get("status") in ("complete", None):
                continue
            missing = o.get("missing_batch_sizes") or []
            what = (f"batch size(s) {', '.join(map(str, missing))} not measured" if missing
                    else "the sweep was measured, a later step was not")
            cut = o.get("cut_short_batch_sizes") or []
            if cut:
                what += f" ({', '.join(map(str, cut))} cut short)"
            out.append(f"{fw}: {o.get('status')} ({o.get('reason')}): {what}: {o.get('message') or o.get('reason')}")
        if not out and not self.complete:
            out.append("the sweep was interrupted; the table holds what was measured before")
        return out

    def framework_stack_hash(self, framework: str) -> str:
        """The stack hash of one framework's results: hardware + software with only that framework's version."""
        return stack_hash(self.stack, framework=framework)

    @property
    def stack_hash(self) -> str:
        """The hash of the whole stack (every framework's version in it)."""
        return stack_hash(self.stack)

    @property
    def stack_summary(self) -> str:
        """The stack in one line for people (CPU, cores, memory, GPUs, OS, Python, the threads asked for)."""
        return describe_stack(self.stack, threads=(self.options or {}).get("threads"))

    @property
    def summary(self) -> pd.DataFrame:
        """Per framework and batch size: top1, top5 (fractions), median_ms with its 95% CI (median_ci_low_ms,
        median_ci_high_ms), p90_ms, p99_ms, throughput_per_s and samples (timed calls): the CI is what the display
        reads each row's digits from (torch.utils.benchmark's rule).

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
                row.update({k: rec.get(k, np.nan) for k in _SUMMARY_STATISTICS})
                rows.append(row)
        measured = set() if lat.empty else set(lat["framework"])
        for fw in self.frameworks:  # accuracy without latency (interrupted runs) still shows
            if fw in acc_by_fw and fw not in measured:
                a = acc_by_fw[fw]
                rows.append({"framework": fw, "batch_size": np.nan, "top1": a.get("top1", np.nan),
                             "top5": a.get("top5", np.nan), **{k: np.nan for k in _SUMMARY_STATISTICS}})
        columns = [c for c in SUMMARY.names if c != "scenario" or several]
        frame = pd.DataFrame(rows, columns=columns)
        if not frame.empty:
            order = {fw: i for i, fw in enumerate(self.frameworks)}
            frame = frame.sort_values(
                by=["framework", "batch_size"], key=lambda s: s.map(order) if s.name == "framework" else s,
                kind="stable", ignore_index=True)
            for col in ("top1", "top5", *_SUMMARY_STATISTICS[:-1]):  # samples: int64 (float64 beside a NaN row)
                frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        frame.attrs["note"] = self.measurement_note()
        return for_people(frame)

    @property
    def generates(self) -> bool:
        """Whether this is a generate run (a causal language model's generate or generate-server scenario): what its
        latency means, which options apply to it and how its numbers were measured."""
        return str((self.options or {}).get("scenario")).startswith("generate") or not self.generation.empty

    def measurement_note(self) -> str:
        """How the numbers were measured, in one paragraph (repetitions, warm-up, threads, scenario, clock)."""
        opts = self.options or {}
        lat = self.latency
        parts = []
        scenario = opts.get("scenario")
        machine = machine_note(lat)
        if self.generates:
            return "; ".join(filter(None, [generation_note(opts, self.generation), machine]))
        if scenario is None and not lat.empty and "scenario" in lat:
            scenario = ", ".join(map(str, lat["scenario"].unique()))
        if not lat.empty and "samples" in lat:
            lo, hi = int(lat["samples"].min()), int(lat["samples"].max())
            reps = f"{lo}" if lo == hi else f"{lo} to {hi}"
            parts.append(f"latency: median, p90 and p99 of {reps} timed calls per batch size"
                         + (f" ({scenario} scenario)" if scenario else ""))
        elif scenario:
            parts.append(f"latency: {scenario} scenario (no timed calls recorded)")
        rule = Timing.rule(opts)
        if rule:
            parts.append(f"each loop ran {rule}")
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
        if machine:
            parts.append(machine)
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

        stack = json.loads(json.dumps(plain(self.stack)))
        software = stack.get("software")
        if isinstance(software, dict):
            for fw in others:
                software.pop(fw, None)
        options = json.loads(json.dumps(plain(self.options)))
        for key, value in list(options.items()):
            if isinstance(value, dict) and set(value) & set(self.frameworks) and set(value) <= set(self.frameworks):
                options[key] = {k: v for k, v in value.items() if k == framework}
        return Evaluation(
            model=self.model, model_version=self.model_version, frameworks=[framework],
            manifests={k: v for k, v in self.manifests.items() if k == framework},
            stack=stack, options=options,
            latency=rows(self.latency), cold_start=rows(self.cold_start), full_pass=rows(self.full_pass),
            accuracy=rows(self.accuracy),
            predictions=rows(self.predictions), trace_overhead=rows(self.trace_overhead),
            outputs=rows(self.outputs), output_agreement=rows(self.output_agreement),
            target_metrics=rows(self.target_metrics), generation=rows(self.generation),
            generation_requests=rows(self.generation_requests), generation_agreement=rows(self.generation_agreement),
            traces={k: v for k, v in self.traces.items() if k == framework},
            samples={SampleKey(*k): v.copy() for k, v in self.samples.items() if k[0] == framework},
            probabilities={k: v.copy() for k, v in self.probabilities.items() if k == framework},
            complete=self.outcomes.get(framework, {}).get("status", "complete") == "complete" if self.outcomes
            else self.complete,
            outcomes={k: dict(v) for k, v in self.outcomes.items() if k == framework},
            warnings=[w for w in self.warnings if _warning_framework(w, self.frameworks) in (None, framework)],
            trace_ids=list(self.trace_ids), history_ids=[], id=self.id, created_at=self.created_at)

    def agreement(self, reference: str | None = None, metrics=None) -> pd.DataFrame:
        """Each framework's captured outputs against ``reference``'s (default: the first framework), one row per
        framework x output x metric (:func:`mlms_nb.evaluation.agreement.agreement`); ``metrics``: built-in names
        (mse, mae, iou, exact_match) or ``{name: fn(output, reference) -> float}``, beside the manifest's own."""
        from mlms_nb.evaluation.agreement import agreement, manifest_metrics

        return agreement(self.outputs, reference, metrics, manifest_metrics(self.manifests))

    @property
    def trace(self):
        """The traced pass as one `Trace`: a framework's own, or all frameworks' spans side by side (each
        framework keeps its ``trace_id``, so ``span_id``/``parent_id`` are unique within a ``trace_id``)."""
        if not self.traces:
            raise MlmsError(f"this evaluation was not traced: run it with {spell('trace_level', 'FRAMEWORK')} "
                            "(or another level)")
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
        stack = json.loads(json.dumps(plain(first.stack)))
        options = json.loads(json.dumps(plain(first.options)))
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
            latency=concat("latency"), cold_start=concat("cold_start"), full_pass=concat("full_pass"),
            accuracy=concat("accuracy"),
            predictions=concat("predictions"), trace_overhead=concat("trace_overhead"),
            outputs=concat("outputs"), output_agreement=concat("output_agreement"),
            target_metrics=concat("target_metrics"), generation=concat("generation"),
            generation_requests=concat("generation_requests"), generation_agreement=concat("generation_agreement"),
            traces={k: v for p in parts for k, v in p.traces.items()},
            samples={k: v for p in parts for k, v in p.samples.items()},
            probabilities={k: v for p in parts for k, v in p.probabilities.items()},
            complete=all(p.complete for p in parts), warnings=warnings,
            outcomes={k: v for p in parts for k, v in p.outcomes.items()},
            trace_ids=list(dict.fromkeys(t for p in parts for t in p.trace_ids)),
            history_ids=[i for p in parts for i in p.history_ids], id=first.id, created_at=first.created_at)

    # ------------------------------------------------------------------ JSON (see codec.py)
    def to_dict(self) -> dict:
        """A JSON-ready dict (only str, int, float, bool, None, lists and dicts)."""
        return codec.encode(self)

    def to_json(self, indent: int | None = None) -> str:
        """Strict JSON text of the whole evaluation (see `from_json`)."""
        return codec.to_json(self, indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> "Evaluation":
        return cls(**codec.decode(data))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Evaluation":
        """The `Evaluation` that `to_json` wrote (this version's format or an older one)."""
        return cls(**codec.from_json(text))

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
            if f.name in FRAMES:
                if not _frames_equal(a, b):
                    return False
            elif f.name in ("samples", "probabilities"):
                if a.keys() != b.keys() or any(
                        np.asarray(a[k]).dtype != np.asarray(b[k]).dtype or not np.array_equal(a[k], b[k])
                        for k in a):
                    return False
            elif plain(a) != plain(b):
                return False
        return True

    __hash__ = None  # a mutable value



_SUMMARY_STATISTICS = ("median_ms", "median_ci_low_ms", "median_ci_high_ms", "p90_ms", "p99_ms", "throughput_per_s",
                       "samples")


def _warning_framework(warning: str, frameworks: list[str]) -> str | None:
    """The framework a warning starts with (``"torch: ..."``, ``"torch, batch size 8: ..."``), if any."""
    for fw in frameworks:
        if warning.startswith((f"{fw}:", f"{fw},", f"{fw} ")):
            return fw
    return None


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if a.empty and b.empty and list(a.columns) == list(b.columns) == []:
        return True
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
        return True
    except AssertionError:
        return False
