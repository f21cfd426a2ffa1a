"""The measurement records one framework's work emits, in the order it makes them (see
:mod:`mlms_nb.evaluation.work`); the runner assembles the `Evaluation` from them (:mod:`mlms_nb.evaluation.assemble`).

Each is a small picklable value, so it crosses a process boundary unchanged (the ``process`` launcher) and reaches
the runner as soon as it is made: the history store keeps every measurement as it completes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mlms_nb.generation.records import GenerateLoop


@dataclass(frozen=True)
class Opened:
    """The predictor is open: what runs the model (``PredictorInfo.to_dict()``)."""
    framework: str
    info: dict


@dataclass(frozen=True)
class Note:
    """A warning about this framework's run (skipped inputs, ...), one sentence starting with the framework."""
    framework: str
    text: str


@dataclass(frozen=True)
class ColdStart:
    """Loading the model (assets already fetched) and its first inference, timed once (ns); ``state_check``: what
    the hidden-state check after the first inference saw (:func:`mlms_nb.evaluation.checks.check_hidden_state`)."""
    framework: str
    batch_size: int
    load_ns: int
    first_inference_ns: int
    state_check: str = ""
    #: one-time conversions built for this run (an ONNX export, a Keras port), timed apart: not part of ``load_ns``
    conversion_ns: int = 0


@dataclass(frozen=True)
class AccuracyPass:
    """Top-1/top-5 over the dataset (``row``: n, top1, top5, dataset, skipped), one prediction row per input, and
    the probabilities when asked to keep them."""
    framework: str
    row: dict
    predictions: pd.DataFrame
    probabilities: np.ndarray | None = None


@dataclass(frozen=True)
class OutputsPass:
    """Every output of every input, captured as ``capture_outputs`` asked (the ``outputs`` frame's rows)."""
    framework: str
    outputs: pd.DataFrame


@dataclass(frozen=True)
class TargetsPass:
    """Each output against the dataset's targets, averaged over the inputs (the ``target_metrics`` frame's rows)."""
    framework: str
    metrics: pd.DataFrame


@dataclass(frozen=True)
class FullPass:
    """Every input of the dataset through the model once, streamed (:mod:`mlms_nb.evaluation.full_pass`): ``row``
    holds the columns of :data:`mlms_nb.schema.evaluation.FULL_PASS` (inputs, wall_s, inputs_per_s, preprocess_s,
    inference_s, wait_s, ...)."""
    framework: str
    row: dict


@dataclass(frozen=True)
class PassProgress:
    """How far one pass has got (not a measurement: the runner shows it as a progress bar). ``name``: full pass,
    warm-up at batch N, timed loop at batch N; ``done`` and ``total`` count inputs (``total`` None or an estimate
    where the pass stops by a rule); ``finished`` on the last report of a pass. ``step``: a step of the work with no
    inputs to count (loading the model, a one-time conversion), shown as its name and the time it has taken."""
    framework: str
    name: str
    done: int
    total: int | None
    finished: bool = False
    step: bool = False


@dataclass(frozen=True)
class TimedLoop:
    """One scenario's timed loop at one batch size: raw latencies (int64 ns), the loop's wall time, the untimed
    warm-up calls before it, scenario extras (server: target/achieved qps, bound). ``complete`` is False when the
    loop was cut short (``reason``: interrupt, signal, timeout, error) before its stopping rule held."""
    framework: str
    batch_size: int
    scenario: str
    samples_ns: np.ndarray
    wall_ns: int
    warmup_calls: int
    extra: dict = field(default_factory=dict)
    complete: bool = True
    reason: str = ""


@dataclass(frozen=True)
class TracedPass:
    """The traced pass after the sweep: the `Trace`, and its overhead rows against the untraced medians."""
    framework: str
    trace: Any
    trace_id: str
    overhead: list = field(default_factory=list)


MEASUREMENTS = (ColdStart, FullPass, AccuracyPass, OutputsPass, TargetsPass, TimedLoop, TracedPass, GenerateLoop)
"""The records that hold a measurement (the history store keeps a framework's row from the first of them on)."""
