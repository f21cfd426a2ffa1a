"""The one place where the evaluation frames' columns, dtypes and units are written down.

An :class:`~mlms_nb.evaluation.result.Evaluation` holds these pandas frames (empty when not measured); the
analyses, the display and the history store take their column names from here, so a renamed column fails at
import (``LATENCY.pick("median_ms")`` raises for a name the schema does not have), not in a user's notebook.

**latency** -- one row per framework x batch size x scenario, from the untraced timed loop
(:func:`mlms_nb.evaluation.stats.latency_stats` gives the statistics, in :data:`LATENCY_STATISTICS` order).
Percentiles use numpy's linear interpolation; the median's CI is a seeded percentile bootstrap.

**cold_start** -- one row per framework: loading the model and its first inference, timed once.

**full_pass** -- one row per framework: every dataset input streamed through the model once (decoded and
preprocessed by background workers while the model runs), with its wall time and where the time went.

**accuracy** -- one row per framework with labeled data: top-1/top-5 as fractions 0..1 of ``n`` inputs.

**predictions** -- one row per framework x input: label, top-1, top-5 and whether they were right.

**summary** -- :attr:`Evaluation.summary`: one row per framework x batch size (``scenario`` only when the
evaluation ran several).

**outputs** -- one row per framework x input (x chunk) x output: shape, dtype, a summary and, as
``capture_outputs`` asks, the values (:mod:`mlms_nb.evaluation.outputs`).

**output_agreement** -- one row per framework x output x metric against the reference framework's captured
values (:mod:`mlms_nb.evaluation.agreement`).

**target_metrics** -- one row per framework x output x metric against the ground truth a dataset carries
(:mod:`mlms_nb.evaluation.targets`): the mean over the inputs, its spread and count.

**trace_overhead** -- traced runs only: per framework and batch size, the traced median against the untraced.

**generation** -- one row per framework x batch size x generate scenario x KV-cache setting: MLPerf's TTFT, TPOT,
inter-token latency, request latency and tokens/s, each with its median, mean, std, nearest-rank and interpolated
percentiles and the median's 95% CI; total and prefill tokens/s, KV-cache bytes, goodput (:mod:`mlms_nb.generation`).

**generation_requests** -- one row per request of those loops (``--json`` carries them).

**generation_agreement** -- greedy tokens and logits of each framework (and KV-cache setting) against the first.

**history** -- :meth:`mlms_nb.store.history.HistoryStore.query`: one row per stored evaluation x framework.

``samples`` (raw latencies) are keyed by :class:`SampleKey` ``(framework, batch_size, scenario)`` and hold int64
nanoseconds, one per timed call.
"""
from __future__ import annotations

from typing import NamedTuple

from mlms_nb.schema.frames import Column, FrameSchema


class SampleKey(NamedTuple):
    """The key of ``Evaluation.samples``: one timed loop. Equal to the plain tuple it replaces."""
    framework: str
    batch_size: int
    scenario: str


_FRAMEWORK = Column("framework", "str", "", "canonical framework name: torch, onnxruntime or tensorflow")
_BATCH = Column("batch_size", "int64", "inputs", "inputs per call")
_SCENARIO = Column("scenario", "str", "", "LoadGen scenario: single-stream, offline or server")

_STATISTICS = (
    Column("samples", "int64", "calls", "timed calls"),
    Column("mean_ms", "float64", "ms", "mean latency per call"),
    Column("median_ms", "float64", "ms", "median latency per call"),
    Column("p90_ms", "float64", "ms", "90th percentile"),
    Column("p99_ms", "float64", "ms", "99th percentile"),
    Column("min_ms", "float64", "ms", "fastest call"),
    Column("max_ms", "float64", "ms", "slowest call"),
    Column("std_ms", "float64", "ms", "sample standard deviation (ddof=1); 0 for one call"),
    Column("iqr_ms", "float64", "ms", "interquartile range, p75 - p25"),
    Column("median_ci_low_ms", "float64", "ms", "95% bootstrap CI of the median, low end"),
    Column("median_ci_high_ms", "float64", "ms", "95% bootstrap CI of the median, high end"),
    Column("throughput_per_s", "float64", "inputs/s", "batch size / mean latency (single-stream), or inputs / "
           "loop wall time (offline, server)"),
    Column("iqr_over_median", "float64", "fraction", "iqr_ms / median_ms"),
    Column("unstable", "bool", "", "iqr_over_median > 0.1: the numbers move between runs"),
)
LATENCY_STATISTICS: tuple[str, ...] = tuple(c.name for c in _STATISTICS)
"""The statistic columns of one timed loop, in the order :func:`~mlms_nb.evaluation.stats.latency_stats` gives."""

_SERVER_ONLY = "server scenario only"
_SINCE_LOAD = "evaluations made since issue 37, where psutil reads the CPU times"
_LOAD = (  # mlms_nb.profilers.load reads them; its LOAD_COLUMNS names them in this order
    Column("load_avg_1m_before", "float64", "", "the machine's 1-minute load average before the warm-up",
           _SINCE_LOAD),
    Column("load_avg_1m", "float64", "", "the 1-minute load average at the end of the timed loop (lags a minute; "
           "counts this process's own threads)", _SINCE_LOAD),
    Column("cores", "int64", "cores", "the CPUs this process may run on", _SINCE_LOAD),
    Column("threads", "float64", "threads", "the framework's intra-op threads (NaN: its default, one per core)",
           _SINCE_LOAD),
    Column("other_cpu_cores_before", "float64", "cores", "other processes' CPU use during the warm-up (1.7: 170% of "
           "one core)", _SINCE_LOAD),
    Column("other_cpu_cores", "float64", "cores", "other processes' CPU use during the timed loop (with its warm-up "
           "when the loop lasted under 0.2 s): busy CPU time of this process's cores minus its own and its "
           "children's", _SINCE_LOAD),
    Column("own_cpu_cores", "float64", "cores", "this process's (and its children's) CPU use during the timed loop",
           _SINCE_LOAD),
    Column("steal_fraction", "float64", "fraction", "CPU time a hypervisor gave to other guests during the loop",
           _SINCE_LOAD),
    Column("busy", "bool", "", "the machine was busy: other processes used at least half a core and more than the "
           "cores the framework's threads left, or steal was at least 10% (mlms_nb.profilers.load); latencies are "
           "inflated", _SINCE_LOAD),
    Column("quiet_wait_s", "float64", "s", "seconds waited for a quiet machine before the warm-up",
           "runs with wait_for_quiet_s (--wait-for-quiet)"),
)
LATENCY = FrameSchema("latency", (
    _FRAMEWORK, _BATCH, _SCENARIO, *_STATISTICS,
    Column("warmup_calls", "int64", "calls", "untimed calls before the timed loop"),
    Column("target_qps", "float64", "queries/s", "Poisson arrival rate asked for", _SERVER_ONLY),
    Column("achieved_qps", "float64", "queries/s", "queries served / loop wall time", _SERVER_ONLY),
    Column("latency_bound_ms", "float64", "ms", "p99 bound asked for", "server scenario with a bound"),
    Column("meets_bound", "bool", "", "p99_ms <= latency_bound_ms", "server scenario with a bound"),
    Column("complete", "bool", "", "False when the loop was cut short before its stopping rule held (indicative only)"),
    Column("carries_state", "bool", "", "True: the model keeps hidden state between calls (model.reset called before "
           "the loop, not between its calls): each timed call ran from the state the one before left",
           "models that carry hidden state"),
    Column("energy_j", "float64", "J", "energy spent during the timed loop (RAPL for CPUs, NVML for GPUs); NaN "
           "where it cannot be read, with why in energy_method", "evaluations made since issue 26"),
    Column("energy_j_per_input", "float64", "J/input", "energy_j / inputs processed in the timed loop",
           "evaluations made since issue 26"),
    Column("energy_method", "str", "", "how the energy was measured, or 'unavailable: <why>'",
           "evaluations made since issue 26"),
    *_LOAD,
), key=("framework", "batch_size", "scenario"))

COLD_START = FrameSchema("cold_start", (
    _FRAMEWORK, _BATCH,
    Column("load_ms", "float64", "ms", "opening the predictor (assets already fetched and converted)"),
    Column("first_inference_ms", "float64", "ms", "the first predict call, at the first batch size"),
    Column("state_check", "str", "", "hidden state: whether a second call on the first input repeated the first "
           "call's outputs (the model keeps no state between calls), and the extra calls the check cost",
           "evaluations made since the check (issue 20)"),
    Column("conversion_ms", "float64", "ms", "one-time conversions built for this run (an ONNX export, a Keras "
           "port), timed apart: not part of load_ms; 0 when the converted copy was cached",
           "evaluations made since issue 37"),
), key=("framework",))

FULL_PASS = FrameSchema("full_pass", (
    _FRAMEWORK,
    Column("dataset", "str", "", "the dataset's name"),
    _BATCH,
    Column("inputs", "int64", "inputs", "inputs that went through the model"),
    Column("batches", "int64", "calls", "predict calls"),
    Column("skipped", "int64", "inputs", "unreadable inputs left out"),
    Column("wall_s", "float64", "s", "wall time of the pass, from opening the stream to the last batch's results "
           "(time.perf_counter_ns)"),
    Column("inputs_per_s", "float64", "inputs/s", "inputs / wall_s: end-to-end throughput, preprocessing included"),
    Column("preprocess_s", "float64", "s", "time the pipeline's workers spent reading, decoding and preprocessing, "
           "summed over the workers (overlaps the inference; can exceed wall_s)"),
    Column("inference_s", "float64", "s", "time inside the framework's predict calls"),
    Column("postprocess_s", "float64", "s", "time scoring the outputs (softmax, top-k, per-input rows)"),
    Column("wait_s", "float64", "s", "time the model waited for the next batch (preprocessing not hidden)"),
    Column("workers", "int64", "readers", "pipeline workers (threads or processes, as reader says); 0 where the "
           "batches are views of a memory-mapped .npz, taken by the model's thread itself"),
    Column("reader", "str", "", "what read the dataset: threads, or processes (the reader option)",
           when="in runs recorded since the reader option"),
    Column("prefetch", "int64", "batches", "batches read ahead at most"),
    Column("nonfinite_inputs", "int64", "inputs", "inputs whose data held NaN or Inf (left out of every metric); -1: "
           "not checked (inputs cut into ordered chunks)", when="in runs recorded since issue 20"),
    Column("nonfinite_outputs", "int64", "inputs", "inputs whose outputs held NaN or Inf (left out of every metric); "
           "-1: not checked", when="in runs recorded since issue 20"),
), key=("framework",))

ACCURACY = FrameSchema("accuracy", (
    Column("n", "int64", "inputs", "labeled inputs scored"),
    Column("top1", "float64", "fraction", "share of inputs whose top-1 class is the label (0..1)"),
    Column("top5", "float64", "fraction", "share of inputs whose label is in the top 5 (0..1)"),
    _FRAMEWORK,
    Column("dataset", "str", "", "the dataset's name"),
    Column("skipped", "int64", "inputs", "unreadable inputs left out"),
    Column("reason", "str", "", "why top1/top5 are n/a (NaN): the dataset's label space differs from the model's "
           "classes, or every labeled input held NaN/Inf; empty when they were measured",
           when="in runs recorded since issue 20"),
), key=("framework",))

PREDICTIONS = FrameSchema("predictions", (
    _FRAMEWORK,
    Column("input_id", "str", "", "the input's id (file name, or index)"),
    Column("label", "int64", "class", "the true class index; -1 when unknown"),
    Column("label_name", "str", "", "the true class name; missing when the manifest has no labels"),
    Column("top1", "int64", "class", "predicted class index"),
    Column("top1_name", "str", "", "predicted class name; missing when the manifest has no labels"),
    Column("top1_prob", "float64", "probability", "the top-1 class's probability"),
    Column("top5", "object", "class", "list of the 5 most probable class indices"),
    Column("top5_probs", "object", "probability", "list of their probabilities"),
    Column("correct_top1", "bool", "", "top1 == label"),
    Column("correct_top5", "bool", "", "label in top5"),
), key=("framework", "input_id"))

SUMMARY = FrameSchema("summary", (
    _FRAMEWORK, _BATCH,
    Column("scenario", "str", "", _SCENARIO.doc, "when the latency frame holds several scenarios"),
    Column("top1", "float64", "fraction", "top-1 accuracy (0..1); NaN without labeled data"),
    Column("top5", "float64", "fraction", "top-5 accuracy (0..1); NaN without labeled data"),
    LATENCY["median_ms"], LATENCY["median_ci_low_ms"], LATENCY["median_ci_high_ms"], LATENCY["p90_ms"],
    LATENCY["p99_ms"], LATENCY["throughput_per_s"], LATENCY["samples"],
), key=("framework", "batch_size"))

TRACE_OVERHEAD = FrameSchema("trace_overhead", (
    _FRAMEWORK, _BATCH,
    Column("trace_level", "str", "", "the deepest level traced"),
    Column("untraced_median_ms", "float64", "ms", "median of the untraced timed loop"),
    Column("traced_median_ms", "float64", "ms", "median of the traced calls"),
    Column("traced_calls", "int64", "calls", "traced calls per batch size"),
    Column("overhead_pct", "float64", "%", "100 * (traced / untraced - 1)"),
    Column("noise_pct", "float64", "%", "the overhead's noise: the 95% CI half-widths of the untraced and traced "
           "medians over each median, summed; an overhead within it is shown as 'within noise (±x%)'",
           when="in runs recorded since issue 20"),
    Column("busy", "bool", "", "the machine was busy during the traced calls or the untraced loop it is compared "
           "with (mlms_nb.profilers.load): the overhead is the other programs' as much as the tracer's", _SINCE_LOAD),
), key=("framework", "batch_size"))

OUTPUTS = FrameSchema("outputs", (
    _FRAMEWORK,
    Column("input_id", "str", "", "the input's id (file name, or index)"),
    Column("chunk", "int64", "", "the chunk's place in its input's ordered chunks (0-based); -1 when not chunked"),
    Column("output", "str", "", "the output's name (outputs[].name; output, output_1 ... when unnamed)"),
    Column("shape", "object", "elements", "the output's shape for this input, without the batch"),
    Column("dtype", "str", "", "the output's element type"),
    Column("min", "float64", "output's own", "smallest finite element"),
    Column("max", "float64", "output's own", "largest finite element"),
    Column("mean", "float64", "output's own", "mean of the finite elements"),
    Column("std", "float64", "output's own", "standard deviation of the finite elements"),
    Column("values", "object", "output's own", "every element, flattened (float64), where capture_outputs kept "
                                               "them; missing otherwise"),
), key=("framework", "input_id", "chunk", "output"))

OUTPUT_AGREEMENT = FrameSchema("output_agreement", (
    _FRAMEWORK,
    Column("reference", "str", "", "the framework compared against"),
    Column("output", "str", "", "the output's name"),
    Column("metric", "str", "", "max_abs_error, mean_abs_error, max_rel_error, mean_rel_error, cosine (outputs of "
                                "2 or more elements), flipped_decisions (argmax or a 0.5 threshold), not_compared, "
                                "or a built-in (mse, mae, iou, exact_match) or user metric"),
    Column("value", "float64", "", "the metric: errors in the output's unit (rel: fraction), cosine -1..1, "
                                   "flipped_decisions a count of inputs; built-in and user metrics averaged over the "
                                   "inputs compared; NaN for not_compared"),
    Column("inputs", "int64", "inputs", "inputs (x chunks) the metric covers: those whose values both frameworks "
                                        "captured (cosine: of 2 or more elements; flipped_decisions: a rule applied)"),
    Column("detail", "str", "", "flipped_decisions: the rule that made the decisions; not_compared: why; cosine: "
                                "which inputs, when not all; else empty", "evaluations made since issue 20"),
), key=("framework", "reference", "output", "metric"))

TARGET_METRICS = FrameSchema("target_metrics", (
    _FRAMEWORK,
    Column("output", "str", "", "the output's name"),
    Column("metric", "str", "", "a built-in (mse, mae, iou, exact_match) or user metric of the output against its "
                                "target"),
    Column("value", "float64", "", "the metric's mean over the inputs with a target; its unit is in ``unit``"),
    Column("std", "float64", "", "the sample standard deviation over the inputs (ddof=1; NaN for one input)"),
    Column("ci95_low", "float64", "", "the 95% confidence interval of the mean (Student's t), low end"),
    Column("ci95_high", "float64", "", "its high end"),
    Column("inputs", "int64", "inputs", "inputs (x chunks) with a target for this output"),
    Column("unit", "str", "", "the unit of value, std and the interval: the output's unit (mae), its square (mse), "
                              "a fraction (iou, exact_match), or a user metric's own"),
), key=("framework", "output", "metric"))

GENERATION_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("ms", "time to first token: the first token's arrival - the request's arrival"),
    "tpot": ("ms", "time per output token (MLPerf): (request latency - TTFT) / (output tokens - 1); requests of one "
                   "token left out"),
    "itl": ("ms", "inter-token latency: each token's arrival - the previous token's, over every request's tokens"),
    "latency": ("ms", "request latency: the last token's arrival - the request's arrival"),
    "tokens_per_s": ("tokens/s", "output tokens per second of one request: output tokens / request latency"),
}
"""The per-request generation metrics the ``generation`` frame summarises, with their unit and meaning."""
GENERATION_STATISTICS: dict[str, str] = {
    "median": "median", "mean": "mean", "std": "sample standard deviation (ddof=1)",
    "p90": "90th percentile by nearest rank (MLPerf's rule: the smallest value with 90% at or below it)",
    "p99": "99th percentile by nearest rank (MLPerf's rule)",
    "p90_linear": "90th percentile by linear interpolation (numpy's default; vLLM's benchmark's)",
    "p99_linear": "99th percentile by linear interpolation",
    "ci_low": "95% bootstrap CI of the median, low end (2000 resamples, seeded)", "ci_high": "its high end",
}


def generation_column(metric: str, stat: str) -> str:
    """The ``generation`` frame's column of ``stat`` of ``metric``: ``ttft_p99_ms``, ``tokens_per_s_median``."""
    unit = GENERATION_METRICS[metric][0]
    return f"{metric}_{stat}_ms" if unit == "ms" else f"{metric}_{stat}"


GENERATION = FrameSchema("generation", (
    _FRAMEWORK, _BATCH,
    Column("scenario", "str", "", "generate (offline: static batches back to back) or generate-server (Poisson "
                                  "arrivals at target_qps, batched as they arrive, up to batch_size)"),
    Column("kv_cache", "bool", "", "True: the model's KV cache; False: the whole sequence again per token"),
    Column("requests", "int64", "requests", "requests timed"),
    Column("batches", "int64", "calls", "batches (generate calls) timed"),
    Column("warmup_calls", "int64", "calls", "untimed batches before timing"),
    Column("wall_s", "float64", "s", "the timed loop's wall time"),
    *(Column(generation_column(m, st), "float64", unit, f"{doc} -- {GENERATION_STATISTICS[st]}")
      for m, (unit, doc) in GENERATION_METRICS.items() for st in GENERATION_STATISTICS),
    Column("itl_count", "int64", "intervals", "inter-token intervals summarised"),
    Column("tpot_iqr_over_median", "float64", "fraction", "interquartile range of TPOT over its median"),
    Column("unstable", "bool", "", "tpot_iqr_over_median > 0.1: TPOT moves between runs (generate only; in "
           "generate-server it moves with the batches arrivals form); Evaluation.warnings has its sentence"),
    Column("output_tokens_mean", "float64", "tokens", "output tokens per request, mean"),
    Column("prompt_tokens_mean", "float64", "tokens", "prompt tokens per request (padding excluded), mean"),
    Column("output_tokens_per_s", "float64", "tokens/s", "total output tokens / the loop's wall time"),
    Column("prefill_tokens_per_s_median", "float64", "tokens/s", "prompt tokens of a batch / its prefill time, "
                                                                 "median over batches"),
    Column("kv_cache_peak_bytes", "int64", "bytes", "the KV cache's bytes at the end of the largest batch, from its "
                                                    "tensors' shapes (0 without a cache)"),
    Column("kv_cache_bytes_per_token_per_layer", "float64", "bytes", "peak / (rows x positions x layers); NaN "
                                                                     "without a cache or a layer count"),
    Column("ttft_limit_ms", "float64", "ms", "the TTFT limit goodput counts against (missing: none)"),
    Column("tpot_limit_ms", "float64", "ms", "the TPOT limit goodput counts against (missing: none)"),
    Column("goodput_fraction", "float64", "fraction", "requests meeting every limit set / requests; NaN without "
                                                      "limits"),
    Column("goodput_per_s", "float64", "requests/s", "requests meeting every limit set / the loop's wall time"),
    Column("target_qps", "float64", "requests/s", "generate-server: the Poisson arrival rate", "generate-server"),
    Column("achieved_qps", "float64", "requests/s", "generate-server: requests served / wall time", "generate-server"),
    Column("complete", "bool", "", "False when the loop was cut short"),
), key=("framework", "batch_size", "scenario", "kv_cache"))

GENERATION_REQUESTS = FrameSchema("generation_requests", (
    _FRAMEWORK, _BATCH, GENERATION["scenario"], GENERATION["kv_cache"],
    Column("request", "int64", "", "the request's index in its loop"),
    Column("batch", "int64", "", "the index of the batch that served it"),
    Column("batch_rows", "int64", "requests", "requests in that batch"),
    Column("prompt_tokens", "int64", "tokens", "its prompt's tokens (padding excluded)"),
    Column("output_tokens", "int64", "tokens", "tokens generated (a stop token included)"),
    Column("arrival_ms", "float64", "ms", "its arrival, from the loop's first arrival"),
    Column("queue_ms", "float64", "ms", "its batch's start - its arrival (0 offline)"),
    Column("ttft_ms", "float64", "ms", GENERATION_METRICS["ttft"][1]),
    Column("latency_ms", "float64", "ms", GENERATION_METRICS["latency"][1]),
    Column("tpot_ms", "float64", "ms", GENERATION_METRICS["tpot"][1] + "; NaN for one token"),
    Column("tokens_per_s", "float64", "tokens/s", GENERATION_METRICS["tokens_per_s"][1]),
    Column("itl_ms", "object", "ms", "list of its inter-token latencies"),
    Column("output_ids", "object", "token ids", "list of its output tokens"),
), key=("framework", "batch_size", "scenario", "kv_cache", "request"))

GENERATION_AGREEMENT = FrameSchema("generation_agreement", (
    _FRAMEWORK,
    Column("reference", "str", "", "the framework compared against (the first greedy run: its KV cache if measured)"),
    Column("kv_cache", "bool", "", "the compared run's KV-cache setting"),
    Column("kind", "str", "", "identical_sequences (value: how many), divergence (one per differing sequence; "
                              "value: its first divergent position) or logits_max_abs_diff (per step)"),
    Column("sequence", "int64", "", "the prompt's index; -1 for a row over every sequence"),
    Column("step", "int64", "tokens", "the new token's position (0: the prefill's); -1 for identical_sequences"),
    Column("value", "float64", "", "see kind: a count, a position, or a logit difference (logits' unit)"),
    Column("detail", "object", "", "divergence: both frameworks' top-2 [token, logit]; logits: phase, sequences "
                                   "compared, max_rel_diff; identical_sequences: sequences, tokens_each"),
), key=("framework", "kv_cache", "kind", "sequence", "step"))

HISTORY = FrameSchema("history", (
    Column("id", "int64", "", "row id in the store (one row per evaluation and framework)"),
    Column("evaluation_id", "str", "", "the evaluation's 32-hex id"),
    Column("model", "str", "", "model name"),
    Column("model_version", "str", "", "manifest version"),
    _FRAMEWORK,
    Column("framework_version", "str", "", "the framework's version on that stack"),
    Column("stack_hash", "str", "", "hash of hardware + software with only this framework's version"),
    Column("created_at", "str", "", "when it ran: ISO-8601, UTC"),
    Column("complete", "bool", "", "False when not every batch size of this framework was measured"),
    Column("status", "str", "", "complete, partial (some measured, then stopped), failed (nothing measured), running"),
    Column("reason", "str", "", "why not complete: error, interrupt, signal, timeout or crash; missing when complete"),
    Column("dataset", "str", "", "the dataset's name"),
    Column("batch_sizes", "object", "inputs", "the batch sizes measured (a list that reads as 1, 8)"),
    Column("n", "Int64", "inputs", "labelled inputs top1/top5 were measured on; missing when there was no accuracy"),
    Column("top1", "float64", "fraction", "top-1 accuracy (0..1) of the n inputs"),
    Column("top5", "float64", "fraction", "top-5 accuracy (0..1) of the n inputs"),
    Column("median_ms", "float64", "ms", "median latency at the smallest batch size"),
    Column("agent", "str", "", "the mlms agent that measured it (name at address); missing when measured by the caller"),
), key=("id",))

FRAMES: dict[str, FrameSchema] = {s.name: s for s in (LATENCY, COLD_START, FULL_PASS, ACCURACY, PREDICTIONS,
                                                      TRACE_OVERHEAD, OUTPUTS, OUTPUT_AGREEMENT, TARGET_METRICS,
                                                      GENERATION, GENERATION_REQUESTS, GENERATION_AGREEMENT)}
"""The frames an `Evaluation` stores, by attribute name."""
