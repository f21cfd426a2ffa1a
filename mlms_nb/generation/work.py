"""One framework's part of a generate evaluation (the generation counterpart of
:func:`mlms_nb.evaluation.work.measure_framework`, which hands ``generate`` and ``generate-server`` runs and
``task: text-generation`` manifests here): open the step model (per KV-cache setting asked for), time its load and
first batch (cold), read the prompts, then per KV-cache setting and batch size run the scenario's timed loop
(:func:`mlms_nb.generation.loop.run_generate`) and emit its record the moment it is measured; finally decode the
agreement prompts greedily, so the runner can compare the tokens across frameworks and KV-cache settings.
A loop cut short is emitted as it stands, marked incomplete, before the stop goes on up.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from mlms_nb.evaluation.reporter import Phases, Reporter
from mlms_nb.evaluation.records import ColdStart, Note, Opened, TracedPass
from mlms_nb.evaluation.scenarios import wait_for_quiet_first
from mlms_nb.frameworks.convert import built_ns
from mlms_nb.generation.agreement import AGREEMENT_PROMPTS, greedy_tokens
from mlms_nb.generation.loop import Sampling, generate_batch, loop_partial, run_generate
from mlms_nb.generation.metrics import generation_row, request_records
from mlms_nb.generation.prompts import open_prompts
from mlms_nb.generation.records import GenerateLoop
from mlms_nb.generation.step import open_step_model
from mlms_nb.generation.traced import trace_generation
from mlms_nb.launchers import stop_reason
from mlms_nb.profilers.load import LoadMeter
from mlms_nb.schema.levels import TraceLevel

log = logging.getLogger(__name__)


def loop_label(scenario: str, kv_cache: bool) -> str:
    """The ``latency`` frame's scenario of a generate loop: ``generate (KV cache)``, ``generate (no KV cache)``."""
    return f"{scenario} ({'KV cache' if kv_cache else 'no KV cache'})"


def measure_generation(job, emit: Callable, watch) -> None:
    """Run one framework's generate scenario, emitting each measurement as it is made (see the module)."""
    manifest, opts = job.manifest, job.options
    gen, fw = opts.generation, manifest.framework.name
    scenario = opts.scenario if opts.scenario in ("generate", "generate-server") else (
        "generate-server" if opts.scenario == "server" else "generate")
    sampling = Sampling(greedy=gen.sampling == "greedy", temperature=gen.temperature, top_k=gen.top_k,
                        seed=gen.sampling_seed)
    greedy_runs = len(opts.framework) > 1 or len(gen.kv_modes) > 1
    reporter = Reporter(emit, fw) if opts.progress else None
    phase = Phases(watch, reporter)
    for index, kv in enumerate(gen.kv_modes):
        cache = "with" if kv else "without"
        phase(f"loading the model ({cache} KV cache; the first time, its one-time conversion too)")
        built, t0 = built_ns(), time.perf_counter_ns()
        step = open_step_model(manifest, kv_cache=kv, device=opts.device, threads=opts.threads, trust=opts.trust)
        conversion_ns = built_ns() - built  # an export or port built while opening: reported apart from the load
        load_ns = time.perf_counter_ns() - t0 - conversion_ns
        log.info("opened %s (%s KV cache) in %.0f ms%s", manifest.key, cache, load_ns / 1e6,
                 f", after a one-time conversion of {conversion_ns / 1e9:.1f} s" if conversion_ns else "")
        try:
            if index == 0:
                emit(Opened(fw, {"framework": fw, "device": opts.device, "threads": opts.threads,
                                 "artifact": manifest.model.graph_path or manifest.model.architecture or "",
                                 "details": {"kind": "step model", "vocab_size": int(step.vocab_size)}}))
                phase("reading the prompts")
                prompts = open_prompts(opts.dataset, manifest, int(step.vocab_size), gen.prompt_length,
                                       gen.prompt_column, opts.limit)
                first = [prompts.ids[i % len(prompts)] for i in range(opts.batch_sizes[0])]
                t1 = time.perf_counter_ns()
                generate_batch(step, first, gen.max_new_tokens, sampling, gen.stop_tokens)
                emit(ColdStart(fw, opts.batch_sizes[0], load_ns, time.perf_counter_ns() - t1,
                               conversion_ns=conversion_ns))
                if scenario == "generate-server" and max(opts.batch_sizes) > 1:
                    emit(Note(fw, f"{fw}: in the generate-server scenario a batch size is the most requests batched "
                                  "together; each batch takes the requests that have arrived"))
            for batch_size in opts.batch_sizes:
                phase(f"generating at batch size {batch_size} ({cache} KV cache)")
                log.info("timing %s at batch size %d (%s, %s KV cache)", fw, batch_size, scenario, cache)
                _time_one(fw, step, prompts.ids, batch_size, scenario, kv, opts, sampling, emit,
                          reporter.loop(batch_size, opts.timing) if reporter else None)
            level = opts.tracing.trace_level  # a TraceLevel since the options were validated
            if level > TraceLevel.NONE and index == 0:
                phase("the traced generate pass")
                trace = trace_generation(step, prompts.ids, opts.batch_sizes, gen.max_new_tokens, level, job.trace_id)
                emit(TracedPass(fw, trace, job.trace_id, []))
            if greedy_runs:
                phase("greedy decoding for the agreement across frameworks")
                emit(greedy_tokens(step, prompts.ids[:AGREEMENT_PROMPTS], gen.max_new_tokens))
        finally:
            step.close()


def _time_one(fw: str, step, prompts, batch_size: int, scenario: str, kv: bool, opts, sampling: Sampling,
              emit: Callable, progress=None) -> None:
    gen = opts.generation
    try:
        waited = wait_for_quiet_first(fw, batch_size, opts.timing, opts.threads, emit)
        timing = run_generate(scenario, step, prompts, batch_size, gen.max_new_tokens, opts.timing, sampling,
                              gen.stop_tokens, progress, load=LoadMeter(opts.threads))
        timing.extra.update(waited)
    except BaseException as stop:
        partial = loop_partial(stop)
        if partial is not None and partial.batches:
            emit(_record(fw, step, partial, batch_size, scenario, kv, gen, complete=False, reason=stop_reason(stop)))
        raise
    emit(_record(fw, step, timing, batch_size, scenario, kv, gen))




def _record(fw: str, step, timing, batch_size: int, scenario: str, kv: bool, gen, complete: bool = True,
            reason: str = "") -> GenerateLoop:
    requests = request_records(timing)
    row = generation_row(timing, requests, gen.ttft_limit_ms, gen.tpot_limit_ms, getattr(step, "num_layers", None))
    if scenario.startswith("generate-server"):  # a request's TPOT moves with the batch its arrival joins: the
        row["unstable"] = False                 # scenario's spread, not noise (as its latency's: assemble.py)
    latency = np.asarray([round(r["latency_ms"] * 1e6) for r in requests], dtype=np.int64)
    return GenerateLoop(fw, batch_size, scenario, kv, row, requests, latency, timing.wall_ns, timing.warmup_calls,
                        dict(timing.extra), complete, reason)
