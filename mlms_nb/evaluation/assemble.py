"""The `Evaluation`, assembled from one framework's records as they arrive (:mod:`mlms_nb.evaluation.records`),
and each framework's outcome: complete, or partial / failed / not run with the reason (error, interrupt, signal,
timeout, crash), what was measured, what is missing and which loops were cut short."""
from __future__ import annotations

import os
import socket

import numpy as np
import pandas as pd

from mlms_nb.evaluation.records import (
    MEASUREMENTS, AccuracyPass, ColdStart, FullPass, Note, Opened, OutputsPass, TargetsPass, TimedLoop,
    TracedPass,
)
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.stats import latency_stats, load_warning, stability_warning
from mlms_nb.generation.agreement import sequence_agreement
from mlms_nb.generation.records import GenerateLoop, GreedyTokens
from mlms_nb.generation.work import loop_label
from mlms_nb.launchers import Outcome
from mlms_nb.profilers.load import LOAD_COLUMNS
from mlms_nb.schema.evaluation import FULL_PASS, GENERATION, GENERATION_AGREEMENT, GENERATION_REQUESTS, LATENCY, SampleKey

STATUSES = ("complete", "partial", "failed", "not run", "running")
"""A framework's status in ``Evaluation.outcomes``: all measured; some measured, then stopped; stopped before
measuring anything; never started (an earlier stop); still measuring (as the history store sees it meanwhile)."""


class Assembler:
    """Fills ``evaluation``'s frames from records and keeps ``evaluation.outcomes`` per framework."""

    def __init__(self, evaluation: Evaluation, batch_sizes: list[int], scenario: str, metrics=None):
        self.ev = evaluation
        self.metrics = metrics  # output metrics beside the manifest's: names or {name: fn(output, reference)}
        self._outputs: list[pd.DataFrame] = []
        self._targets: list[pd.DataFrame] = []
        self.batch_sizes = list(batch_sizes)
        self.scenario = scenario
        self._rows: list[dict] = []
        self._cold: list[dict] = []
        self._full: list[dict] = []
        self._accuracy: list[dict] = []
        self._predictions: list[pd.DataFrame] = []
        self._overhead: list[dict] = []
        self.measured: set[str] = set()
        self._generation: list[dict] = []
        self._requests: list[pd.DataFrame] = []
        self._greedy_reference: GreedyTokens | None = None  # the first greedy run; its logits are not stored
        self._agreement: list[pd.DataFrame] = []

    # ------------------------------------------------------------------ per framework
    def started(self, framework: str) -> None:
        self.ev.outcomes[framework] = {"status": "running", "reason": None, "message": "",
                                       "owner": f"{socket.gethostname()} {os.getpid()}"}

    def not_run(self, framework: str, reason: str, message: str) -> None:
        self.ev.outcomes[framework] = {"status": "not run", "reason": reason, "message": message,
                                       "measured_batch_sizes": [], "missing_batch_sizes": list(self.batch_sizes),
                                       "cut_short_batch_sizes": []}
        self.ev.complete = False

    def finish(self, framework: str, outcome: Outcome) -> dict:
        lat = self.ev.latency
        mine = lat[lat["framework"] == framework] if not lat.empty else lat
        # a batch size appears once, though several loops (generate: with and without the KV cache) measured it
        measured = list(dict.fromkeys(int(b) for b in mine["batch_size"])) if not mine.empty else []
        cut = list(dict.fromkeys(int(b) for b in mine.loc[~mine["complete"].astype(bool), "batch_size"])) \
            if not mine.empty else []
        missing = [b for b in self.batch_sizes if b not in measured or b in cut]
        if outcome.ok and not missing:
            status = "complete"
        else:
            status = "partial" if framework in self.measured else "failed"
        result = {"status": status, "reason": None if outcome.ok else outcome.status,
                  "message": outcome.message, "measured_batch_sizes": measured, "missing_batch_sizes": missing,
                  "cut_short_batch_sizes": cut}
        self.ev.outcomes[framework] = result
        self.ev.complete = all(o.get("status") == "complete" for o in self.ev.outcomes.values())
        return result

    # ------------------------------------------------------------------ records
    def add(self, record) -> bool:
        """Apply one record; True when it holds a measurement (the history should keep it now)."""
        ev, fw = self.ev, record.framework
        if isinstance(record, Opened):
            ev.options.setdefault("predictors", {})[fw] = record.info
        elif isinstance(record, Note):
            ev.warnings.append(record.text)
        elif isinstance(record, ColdStart):
            self._cold.append({"framework": fw, "batch_size": int(record.batch_size), "load_ms": record.load_ns / 1e6,
                               "first_inference_ms": record.first_inference_ns / 1e6,
                               "state_check": record.state_check, "conversion_ms": record.conversion_ns / 1e6})
            ev.cold_start = pd.DataFrame(self._cold)
        elif isinstance(record, FullPass):
            self._full.append({name: record.row.get(name) for name in FULL_PASS.names})
            ev.full_pass = pd.DataFrame(self._full, columns=list(FULL_PASS.names)).astype(
                {c.name: c.dtype for c in FULL_PASS.columns if c.dtype in ("int64", "float64")})
        elif isinstance(record, AccuracyPass):
            self._accuracy.append(dict(record.row))
            self._predictions.append(record.predictions)
            ev.accuracy = pd.DataFrame(self._accuracy)
            ev.predictions = pd.concat(self._predictions, ignore_index=True)
            if record.probabilities is not None:
                ev.probabilities[fw] = record.probabilities
        elif isinstance(record, OutputsPass):
            self._outputs.append(record.outputs)
            ev.outputs = pd.concat(self._outputs, ignore_index=True)
            if ev.outputs["framework"].nunique() > 1:  # every framework's outputs against the first's, as they come
                ev.output_agreement = ev.agreement(metrics=self.metrics)
        elif isinstance(record, TargetsPass):
            self._targets.append(record.metrics)
            ev.target_metrics = pd.concat(self._targets, ignore_index=True)
        elif isinstance(record, TimedLoop):
            self._rows.append(self._latency_row(record))
            ev.latency = pd.DataFrame(self._rows)
            running = ev.outcomes.get(fw)
            if running is not None and running.get("status") == "running" and record.complete:
                running.setdefault("measured_batch_sizes", []).append(int(record.batch_size))
        elif isinstance(record, GenerateLoop):
            self._add_generation(record)
        elif isinstance(record, GreedyTokens):
            if self._greedy_reference is None:
                self._greedy_reference = record
            else:
                self._agreement.append(_schema_frame(GENERATION_AGREEMENT, sequence_agreement(
                    self._greedy_reference, record).to_dict("records")))
                ev.generation_agreement = pd.concat(self._agreement, ignore_index=True)
                self._warn_divergence(self._agreement[-1])
        elif isinstance(record, TracedPass):
            ev.traces[fw] = record.trace
            ev.trace_ids.append(record.trace_id)
            self._overhead.extend(self._overhead_load(record.overhead))
            ev.trace_overhead = pd.DataFrame(self._overhead)
            for name, reason in record.trace.metadata.get("unavailable", {}).items():
                ev.warnings.append(f"{fw}: {name} not traced: {reason}")
        is_measurement = isinstance(record, MEASUREMENTS)
        if is_measurement:
            self.measured.add(fw)
        return is_measurement

    def _latency_row(self, loop: TimedLoop, inputs_per_sample: int | None = None) -> dict:
        scenario, fw, batch_size = loop.scenario, loop.framework, int(loop.batch_size)
        # single-stream: throughput = batch / mean latency; offline and server: inputs served / loop wall time
        stats = latency_stats(loop.samples_ns, inputs_per_sample or batch_size,
                              wall_ns=None if scenario == "single-stream" else loop.wall_ns)
        row = {"framework": fw, "batch_size": batch_size, "scenario": scenario, **stats,
               "warmup_calls": int(loop.warmup_calls), **loop.extra, "complete": bool(loop.complete)}
        row = {**{k: row[k] for k in LATENCY.names if k in row}, **row}  # the schema's column order
        self.ev.samples[SampleKey(fw, batch_size, scenario)] = np.asarray(loop.samples_ns, dtype=np.int64)
        stateful = (f"{fw}: the timed loops timed a model carrying hidden state (model.reset was called before each "
                    "loop, not between its calls): each call ran from the state the one before left")
        if loop.extra.get("carries_state") and stateful not in self.ev.warnings:
            self.ev.warnings.append(stateful)
        busy = load_warning(row)  # a busy machine is named first: its loop's spread says little about the model
        if busy:
            self.ev.warnings.append(busy)
        elif loop.complete:
            # a generate-server request's latency includes its queueing: its spread is the scenario's, not noise
            warning = None if scenario.startswith("generate-server") else stability_warning(row)
            if warning:
                self.ev.warnings.append(warning)
        if not loop.complete:
            self.ev.warnings.append(
                f"{fw}, batch size {batch_size}: this loop was cut short ({loop.reason}) after {len(loop.samples_ns)} "
                f"timed call(s) in {loop.wall_ns / 1e9:.3g} s, before its stopping rule held: its numbers are "
                "indicative only")
        return row

    def _overhead_load(self, rows: list[dict]) -> list[dict]:
        """Overhead rows marked ``busy`` when the machine was busy during their traced calls or the untraced loop
        they are compared with, each such row with a warning: that overhead is the other programs' as much as the
        tracer's (a busy untraced loop makes tracing look free, a busy traced pass makes it look costly)."""
        out = []
        for row in rows:
            loops = [r for r in self._rows if r["framework"] == row["framework"]
                     and int(r["batch_size"]) == int(row["batch_size"]) and "busy" in r]
            if not loops and "busy" not in row:
                out.append(row)  # the machine could not be read here
                continue
            untraced = any(bool(r["busy"]) for r in loops)
            traced = bool(row.get("busy", False))
            row = dict(row)
            others = float(row.pop("other_cpu_cores", np.nan))  # named in the warning; the table keeps busy only
            row["busy"] = untraced or traced
            out.append(row)
            if row["busy"]:
                during = " and ".join(what for what, on in (("the untraced loop", untraced), (
                    f"the traced calls (other processes used {100 * others:.0f}% CPU)", traced)) if on)
                size = f"{row['overhead_pct']:+.0f}%, " if np.isfinite(row.get("overhead_pct", np.nan)) else ""
                self.ev.warnings.append(
                    f"{row['framework']}, batch size {int(row['batch_size'])}: the tracing overhead ({size}traced "
                    f"{row['traced_median_ms']:.3g} ms against {row['untraced_median_ms']:.3g} ms untraced) was "
                    f"measured while the machine was busy during {during}: it is the other programs' as much as the "
                    "tracer's; measure it again on a quiet machine")
        return out

    def _add_generation(self, loop: GenerateLoop) -> None:
        """A generate loop: its statistics row, its requests, and a ``latency`` row of its request latencies (so
        outcomes, the history and the summary see it like any timed loop)."""
        fw, keys = loop.framework, {"framework": loop.framework, "batch_size": int(loop.batch_size),
                                    "scenario": loop.scenario, "kv_cache": bool(loop.kv_cache)}
        self._generation.append({**keys, **loop.row, **loop.extra, "complete": bool(loop.complete)})
        self.ev.generation = _schema_frame(GENERATION, self._generation)
        if loop.complete:  # the row's "unstable" tag (TPOT's spread) has its sentence
            tpot = stability_warning({"framework": fw, "batch_size": loop.batch_size,
                                      "scenario": loop_label(loop.scenario, loop.kv_cache),
                                      "unstable": loop.row.get("unstable"),
                                      "iqr_over_median": loop.row.get("tpot_iqr_over_median"),
                                      "median_ms": loop.row.get("tpot_median_ms"), "samples": len(loop.requests)},
                                     what="TPOT", over="requests")
            if tpot:
                self.ev.warnings.append(tpot)
        self._requests.append(_schema_frame(GENERATION_REQUESTS, [{**keys, **r} for r in loop.requests]))
        self.ev.generation_requests = pd.concat(self._requests, ignore_index=True)
        if len(loop.latency_ns):
            load = {k: v for k, v in loop.extra.items() if k in LOAD_COLUMNS or k == "quiet_wait_s"}
            timed = TimedLoop(fw, loop.batch_size, loop_label(loop.scenario, loop.kv_cache), loop.latency_ns,
                              loop.wall_ns, loop.warmup_calls, load, loop.complete, loop.reason)
            self._rows.append(self._latency_row(timed, inputs_per_sample=1))  # a sample is one request
            self.ev.latency = pd.DataFrame(self._rows)
        running = self.ev.outcomes.get(fw)
        if running is not None and running.get("status") == "running" and loop.complete:
            measured = running.setdefault("measured_batch_sizes", [])
            if int(loop.batch_size) not in measured:
                measured.append(int(loop.batch_size))

    def _warn_divergence(self, rows: pd.DataFrame) -> None:
        same = rows[rows["kind"] == "identical_sequences"]
        if same.empty:
            return
        first = same.iloc[0]
        total = int(first["detail"]["sequences"])
        if int(first["value"]) < total:
            what = f"{first['framework']} ({'KV cache' if first['kv_cache'] else 'no KV cache'})"
            self.ev.warnings.append(
                f"{first['framework']}: greedy decoding gave {total - int(first['value'])} of {total} sequences that "
                f"differ from {first['reference']}'s: {what}, see Evaluation.generation_agreement for the first "
                "divergent position and both top-2 logits there")


def _schema_frame(schema, rows: list[dict]) -> pd.DataFrame:
    """``rows`` as ``schema`` says (columns in order, dtypes), without its conditional columns nobody filled."""
    frame = schema.frame(rows)
    unused = [c.name for c in schema.columns if c.when and frame[c.name].isna().all()]
    return frame.drop(columns=unused)
