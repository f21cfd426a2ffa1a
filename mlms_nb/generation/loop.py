"""mlms-nb's own generate loop over a :class:`~mlms_nb.generation.step.StepModel`, and the two scenarios that time it.

:func:`generate_batch` runs one static batch: prefill, then one decode step per new token, choosing each token
(greedy, or seeded sampling) and stopping a row at a stop token or ``max_new_tokens``; the batch ends when every row
has. The clock (``time.perf_counter_ns``, as in :mod:`mlms_nb.evaluation.scenarios`) is read right after each step
returns (the step model returns host arrays, so that is the token's arrival): the first token's arrival and every
later token's are stamped, and nothing else happens between two steps but choosing the tokens.

The scenarios (MLPerf's, for LLMs):

- ``generate`` (offline): static batches of ``batch_size`` prompts back to back, after the same warm-up as the timed
  loops (:func:`mlms_nb.evaluation.scenarios.warm_up`: a count, or until the median settles) and until the same
  stopping rule holds (``min_repeats`` batches and ``min_time_s`` seconds, or a maximum). A request arrives when its
  batch starts.
- ``generate-server``: requests arrive as a Poisson process at ``target_qps`` (seeded); one worker takes every request
  that has arrived, up to ``batch_size``, as one batch when it is free (batched as they arrive); a request's TTFT and
  latency count from its arrival, so queueing shows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.scenarios import warm_up
from mlms_nb.generation.step import StepModel
from mlms_nb.options import Timing, spell
from mlms_nb.profilers.load import LoadMeter

GENERATE_SCENARIOS = ("generate", "generate-server")


@dataclass(frozen=True)
class Sampling:
    """How the loop picks a token from the logits: ``greedy`` (argmax), or sampling at ``temperature`` among the
    ``top_k`` most likely (0: all), seeded by ``seed`` (Gumbel-max: the same seed gives the same tokens)."""
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    seed: int = 0

    def chooser(self) -> Callable[[np.ndarray], np.ndarray]:
        if self.greedy:
            return lambda logits: logits.argmax(-1).astype(np.int64, copy=False)
        rng = np.random.default_rng(self.seed)

        def sample(logits: np.ndarray) -> np.ndarray:
            scaled = logits.astype(np.float64) / max(self.temperature, 1e-6)
            if 0 < self.top_k < scaled.shape[-1]:
                kth = np.partition(scaled, -self.top_k, axis=-1)[:, -self.top_k][:, None]
                scaled = np.where(scaled >= kth, scaled, -np.inf)
            return np.argmax(scaled + rng.gumbel(size=scaled.shape), axis=-1).astype(np.int64)
        return sample


@dataclass
class BatchRun:
    """One static batch through the loop: per row its prompt length, its output tokens and the arrival stamp (ns)
    of each; the call's start and the prefill's end (ns); the KV cache's bytes at the end; the logits of every step
    (``keep_logits``: ``(steps, rows, vocab)``)."""
    prompt_tokens: np.ndarray
    tokens: list[np.ndarray]
    stamps_ns: list[np.ndarray]
    start_ns: int
    prefill_end_ns: int
    kv_cache_bytes: int = 0
    positions: int = 0
    logits: list[np.ndarray] = field(default_factory=list)


def left_pad(prompts: Sequence[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Prompts of any lengths as ``int64 (B, T)`` ids and mask, left-padded (the contract of the step model)."""
    if not len(prompts):
        raise MlmsError("no prompts to generate from")
    width = max(len(p) for p in prompts)
    if width == 0:
        raise MlmsError("a prompt has no tokens: each prompt needs at least one token id")
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
    return ids, mask


def generate_batch(step: StepModel, prompts: Sequence[np.ndarray], max_new_tokens: int, sampling: Sampling = Sampling(),
                   stop_ids: Sequence[int] = (), keep_logits: bool = False, pad_id: int = 0,
                   choose: Callable[[np.ndarray], np.ndarray] | None = None) -> BatchRun:
    """Generate up to ``max_new_tokens`` tokens for every prompt (see the module docstring)."""
    if max_new_tokens < 1:
        raise MlmsError(f"{spell('max_new_tokens')} must be at least 1, got {max_new_tokens}")
    clock = time.perf_counter_ns
    choose = choose or sampling.chooser()
    stop = np.asarray(list(stop_ids), dtype=np.int64)
    ids, mask = left_pad(prompts, pad_id)
    rows = ids.shape[0]
    start = clock()
    logits, state = step.prefill(ids, mask)
    first = clock()
    kept = [logits] if keep_logits else []
    out = np.empty((rows, max_new_tokens), dtype=np.int64)
    stamps = np.empty(max_new_tokens, dtype=np.int64)
    stamps[0] = first
    lengths = np.full(rows, max_new_tokens, dtype=np.int64)
    done = np.zeros(rows, dtype=bool)
    token = choose(logits)
    out[:, 0] = token
    steps = 1
    width = ids.shape[1]
    grown = np.ones((rows, width + max_new_tokens - 1), dtype=np.int64)  # the mask for every step, made once
    grown[:, :width] = mask
    for k in range(1, max_new_tokens):
        if stop.size:  # nothing per token to check without stop tokens: the hot path is the framework's call
            ended = ~done & np.isin(token, stop)
            lengths[ended] = k
            done |= ended
            if done.all():
                break
        mask = grown[:, :width + k]
        logits, state = step.decode(token[:, None], mask, state)
        stamps[k] = clock()
        if keep_logits:
            kept.append(logits)
        token = np.where(done, pad_id, choose(logits)) if stop.size else choose(logits)
        out[:, k] = token
        steps = k + 1
    else:
        if stop.size:
            ended = ~done & np.isin(token, stop)
            lengths[ended] = steps
    lengths = np.minimum(lengths, steps)
    cache = int(step.kv_cache_bytes(state))
    return BatchRun(mask[:, :ids.shape[1]].sum(axis=1), [out[r, :lengths[r]].copy() for r in range(rows)],
                    [stamps[:lengths[r]].copy() for r in range(rows)], start, first, cache, mask.shape[1], kept)


@dataclass
class GenerateTiming:
    """What one scenario's loop measured at one batch size: its batches (with each request's arrival, ns), the
    loop's wall time, the warm-up calls before it, and scenario extras (server: target and achieved QPS)."""
    batches: list[tuple[BatchRun, np.ndarray]]
    wall_ns: int
    warmup_calls: int
    extra: dict = field(default_factory=dict)


def run_generate(scenario: str, step: StepModel, prompts: Sequence[np.ndarray], batch_size: int, max_new_tokens: int,
                 cfg: Timing, sampling: Sampling = Sampling(), stop_ids: Sequence[int] = (),
                 progress=None, load: LoadMeter | None = None) -> GenerateTiming:
    """Warm up, then time ``scenario`` at ``batch_size`` (see the module docstring). Cut short (Ctrl-C, a stop, an
    error), the exception carries ``partial``: the batches measured so far (a `GenerateTiming`). ``progress``: the
    loop's phases, as :func:`mlms_nb.evaluation.scenarios.run_scenario` takes them (None: no reports). ``load``:
    the machine's load read before the warm-up, before the loop and after it (outside the loop); its columns join
    ``extra``."""
    if scenario not in GENERATE_SCENARIOS:
        raise MlmsError(f"unknown generate scenario {scenario!r}; expected one of {', '.join(GENERATE_SCENARIOS)}")
    cycle = [prompts[i % len(prompts)] for i in range(batch_size)]

    def call(batch: Sequence[np.ndarray]) -> BatchRun:
        return generate_batch(step, batch, max_new_tokens, sampling, stop_ids)

    nothing = lambda: None  # noqa: E731
    if load is not None:
        load.mark()
    warm = warm_up(call, cycle, cfg, progress.warm_up() if progress else None)
    if load is not None:
        load.mark()
    try:
        timed = (_offline if scenario == "generate" else _server)(
            call, prompts, batch_size, cfg, warm,
            progress.timed("offline" if scenario == "generate" else "server") if progress else nothing)
    finally:
        if progress:
            progress.done()
    if load is not None:
        load.mark()
        timed.extra.update(load.columns())
    return timed


def _offline(call, prompts, batch_size: int, cfg: Timing, warm: int, on_call) -> GenerateTiming:
    clock = time.perf_counter_ns
    min_ns, max_ns = int(cfg.min_time_s * 1e9), int(cfg.max_time_s * 1e9)
    batches: list[tuple[BatchRun, np.ndarray]] = []
    start = clock()
    taken = 0
    try:
        while True:
            batch = [prompts[(taken + i) % len(prompts)] for i in range(batch_size)]
            taken += batch_size
            run = call(batch)
            batches.append((run, np.full(batch_size, run.start_ns, dtype=np.int64)))
            on_call()
            elapsed = clock() - start
            n = len(batches)
            if (n >= cfg.min_repeats and elapsed >= min_ns) or n >= cfg.max_repeats or elapsed >= max_ns:
                break
    except BaseException as stop:
        stop.partial = GenerateTiming(batches, clock() - start, warm)  # type: ignore[attr-defined]
        raise
    return GenerateTiming(batches, clock() - start, warm)


def _server(call, prompts, batch_size: int, cfg: Timing, warm: int, on_call) -> GenerateTiming:
    if not cfg.target_qps or cfg.target_qps <= 0:
        raise MlmsError(f"the generate-server scenario needs a target rate: {spell('target_qps')} (requests per second)")
    from mlms_nb.evaluation.scenarios import sleep_until

    rng = np.random.default_rng(cfg.seed)
    count = min(max(cfg.min_repeats, int(np.ceil(cfg.target_qps * cfg.min_time_s))), cfg.max_repeats)
    clock = time.perf_counter_ns
    start = clock()
    arrivals = start + np.cumsum(rng.exponential(1e9 / cfg.target_qps, size=count)).astype(np.int64)
    batches: list[tuple[BatchRun, np.ndarray]] = []
    served = 0
    try:
        while served < count:
            now = clock()
            if now < arrivals[served]:
                sleep_until(int(arrivals[served]), clock)
                now = clock()
            waiting = int(np.searchsorted(arrivals, now, side="right")) - served
            take = max(1, min(batch_size, waiting))
            batch = [prompts[(served + i) % len(prompts)] for i in range(take)]
            run = call(batch)
            batches.append((run, arrivals[served:served + take].copy()))
            served += take
            on_call()
            if clock() - start > cfg.max_time_s * 1e9:
                break
    except BaseException as stop:
        stop.partial = GenerateTiming(batches, clock() - start, warm)  # type: ignore[attr-defined]
        raise
    wall = clock() - start
    return GenerateTiming(batches, wall, warm, {"target_qps": float(cfg.target_qps),
                                                "achieved_qps": served / (wall / 1e9)})


def loop_partial(stop: BaseException) -> Any:
    """The `GenerateTiming` a cut-short loop left on its exception, or None."""
    partial = getattr(stop, "partial", None)
    return partial if isinstance(partial, GenerateTiming) else None


__all__ = ["BatchRun", "GENERATE_SCENARIOS", "GenerateTiming", "Sampling", "generate_batch", "left_pad",
           "loop_partial", "run_generate"]
