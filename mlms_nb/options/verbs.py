"""The options of the verbs other than `evaluate` (diverge, history, layers, compare, roofline, scheduler, agent,
agents), and `MODELS`, every options model whose flags the CLI and the magic know."""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import field_validator

from mlms_nb.options.base import Options, option, register_flags
from mlms_nb.options.evaluate import (AgentsWhere, EvaluateOptions, Generation, Isolation, Remote, Timing, Tls,
                                      Tracing, frameworks_list)


# ---------------------------------------------------------------------------------------------- the other verbs

class DivergeOptions(Options):
    """See :func:`mlms_nb.diverge`."""
    frameworks: list[str] = option(["torch", "onnxruntime"], "comma-separated frameworks (the first is the reference), "
                                 "e.g. torch,onnxruntime,tensorflow", "--framework",
                                 extra={"python_default": ("torch", "onnxruntime"), "python_type": "str | Iterable[str]",
                                        "metavar": "NAMES"})
    dataset: Any = option(None, "imagenet-samples | an image folder | a .npz file; with outputs, any dataset evaluate "
                        "takes (default: imagenet-samples; with outputs, the model's evaluation default)", "--dataset",
                        extra={"python_type": "str | os.PathLike | Iterable | None", "metavar": "DATASET"})
    tolerance: float = option(1e-4, "max_rel_error above which a layer (with outputs: an output) diverges",
                            "--tolerance", "fraction", ge=0)
    limit: int | None = option(None, "use at most this many inputs (default: all; with outputs, 16: every value of "
                             "every output is kept)", "--limit", "inputs", ge=1)
    quantized: bool | str = option(False, "also compare an INT8-quantized ONNX Runtime copy (layers only)", "--quantized")
    batch_size: int = option(4, "inputs per call", "--batch-size", "inputs", ge=1)
    latency_repeats: int = option(5, "timed calls per layer latency (layers only)", "--latency-repeats", "calls", ge=1)
    trust: bool = option(False, "trust this run's manifest: its model.entrypoint and code steps; see docs/trust.md",
                       "--trust")
    outputs: bool = option(False, "compare every output of the model instead of its layers: any model (several inputs "
                         "and outputs, dynamic sizes, no built-in architecture needed)", "--outputs")
    metrics: Any = option(None, "with outputs: metrics beside the errors, built-in names (mse, mae, iou, exact_match; "
                        "from Python also {name: fn(output, reference) -> float}), also computed against a "
                        "dataset's targets", "--metrics",
                        extra={"python_type": "str | Iterable[str] | Mapping[str, Callable] | None",
                               "metavar": "NAMES"})

    @field_validator("frameworks", mode="before")
    @classmethod
    def _frameworks(cls, value: Any) -> list[str]:
        return frameworks_list(value)

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, value: Any) -> Any:
        if isinstance(value, str):  # the command line's mse,iou
            return [name.strip() for name in value.split(",") if name.strip()] or None
        return value  # names, or {name: callable} from Python (the divergence checks them)

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class HistoryOptions(Options):
    """See :func:`mlms_nb.history`."""
    model: str | None = option(None, "only this model", "--model")
    framework: str | None = option(None, "only this framework", "--framework")
    version: str | None = option(None, "only manifest versions in this range, e.g. ^1.0", "--version")
    complete: bool | None = option(None, "only complete (True) or interrupted (False) evaluations")
    limit: int | None = option(None, "at most this many rows", "--limit", "rows", ge=1, extra={"cli_default": 50})
    url: str | None = option(None, "the store's SQLAlchemy URL (default: the store under MLMS_HOME)")

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, value: Any) -> Any:
        return None if value is None else frameworks_list(value)[0]


class LayersOptions(Options):
    """See :func:`mlms_nb.layers`."""
    what: Literal["occurrence", "latency", "memory"] = option("latency", "which table", "--what")
    by: Literal["layer", "type"] = option("layer", "latency per layer or per layer type", "--by")
    framework: str | None = option(None, "only this framework (default: every traced framework, one panel each)",
                                 "--framework")
    phase: Literal["prefill", "decode"] | None = option(None, "a generate run's trace: only this phase (default: "
                                                        "prefill and decode side by side)", "--phase")


class CompareOptions(Options):
    """See :func:`mlms_nb.compare`."""
    framework_a: str | None = option(None, "the framework of run A whose layers to compare (default: every framework "
                                   "both runs traced, side by side)", "--framework-a")
    framework_b: str | None = option(None, "the framework of run B (default: the same as --framework-a)",
                                   "--framework-b")


class RooflineOptions(Options):
    """See :func:`mlms_nb.roofline`."""
    per: Literal["layer", "model"] = option("layer", "each traced layer, or the model", "--per")
    framework: str | None = option(None, "only this framework", "--framework")
    device: str | None = option(None, "the device whose ceilings to use (default: the evaluation's)", "--device")
    phase: Literal["prefill", "decode"] | None = option(None, "a generate run's trace: only this phase (default: "
                                                        "both, each layer a point per phase)", "--phase")


class _Scheduler(Options):
    host: str | None = option(None, "the interface to listen on (default: 127.0.0.1 for the scheduler; for an agent, "
                            "the one that reaches the scheduler)", "--host")
    port: int = option(8786, "the port to listen on (0: any free port)", "--port", ge=0, le=65535)
    insecure: bool = option(False, "listen beyond 127.0.0.1 without TLS (anyone who can reach the port can then run "
                          "code on every agent)", "--insecure")


class SchedulerOptions(Tls, _Scheduler):
    """See :func:`mlms_nb.scheduler`."""
    tls_setup: str | None = option(None, "make (or reuse) a CA and a certificate in this folder and listen with TLS; "
                                 "prints the flags agents and notebooks pass", "--tls-setup", extra={"metavar": "DIR"})


class _Agent(Options):
    scheduler: str | None = option(None, "the Dask scheduler's address, e.g. tcp://host:8786", "--scheduler",
                                 extra={"metavar": "ADDRESS"})
    name: str | None = option(None, "the agent's name (default: HOST-Nt-PID, unique per process)", "--name")
    labels: dict[str, str] | None = option(None, "labels an evaluation's --where can ask for, e.g. team=vision,site=lab",
                                  "--labels", extra={"metavar": "K=V,...", "python_type": "str | dict[str, str]"})
    nthreads: int = option(1, "intra-op threads a model gets on this agent unless the evaluation sets --threads (the "
                         "agent runs one evaluation at a time)", "--nthreads", "threads", ge=1)
    serves: list[str] | None = option(None, "serve only these frameworks, e.g. torch (default: every one installed)",
                                    "--frameworks", extra={"metavar": "NAMES", "python_type": "str | Iterable[str] | None"})
    traces: str | None = option(None, "a folder every agent and the notebook share: the agent writes the traces it "
                              "records there, and the history records where (default: traces travel back)", "--traces",
                              extra={"metavar": "DIR"})
    host: str | None = _Scheduler.model_fields["host"]
    insecure: bool = _Scheduler.model_fields["insecure"]

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> dict[str, str]:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        labels = {}
        for word in (w.strip() for w in str(value or "").replace(" ", ",").split(",")):
            key, eq, text = word.partition("=")
            if word and not (eq and key and text):
                raise ValueError(f"{word!r} is not key=value, e.g. team=vision,site=lab")
            if word:
                labels[key] = text
        return labels

    @field_validator("serves", mode="before")
    @classmethod
    def _serves(cls, value: Any) -> list[str] | None:
        return None if value is None else frameworks_list(value)


class AgentOptions(Tls, _Agent):
    """See :func:`mlms_nb.agent`."""


class AgentsOptions(Tls, AgentsWhere):
    """See :func:`mlms_nb.agents`."""


MODELS: tuple[type[Options], ...] = (EvaluateOptions, Timing, Tracing, Generation, Isolation, Remote, DivergeOptions, HistoryOptions,
                                      LayersOptions, RooflineOptions, SchedulerOptions, AgentOptions, AgentsOptions)
register_flags(*MODELS)
