"""The options of `evaluate` and the other verbs, written once (pydantic models).

Each option is one field: its name (the Python keyword), type, default, bounds, a ``description`` (the help text)
and ``json_schema_extra={"cli": "--min-time", "unit": "s"}`` (the flag of ``mlms`` and ``%mlms``). From these
come the validation of the Python call (:func:`takes` gives a facade function its signature and validates its
keywords), the argparse table of the CLI and the magic and their help texts (:func:`mlms_nb.commands.arguments`
reads :func:`fields`). A sub-model
groups options (:class:`Timing`, :class:`Tracing`); the Python signature lists them flat, in field order.

Errors and advice name an option the way the caller spells it: ``min_time_s=`` in Python, ``--min-time`` on the
command line and in the magic (:func:`spelling` switches; :func:`spell` writes a name).

The machinery (the :class:`Options` base, :func:`fields`, :func:`takes`, :func:`doc`, the spelling of names in
errors) lives in :mod:`mlms_nb._options_base` and is re-exported here; every option is written in this module.
"""
from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mlms_nb._options_base import (  # noqa: F401  (the machinery, re-exported: import it from here)
    Options, OptionsError, _opt, cli_words, current_spelling, doc, fields, python_default, register_flags, spell,
    spell_on, spelling, takes)
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import FRAMEWORKS, canonical_framework
from mlms_nb.schema.levels import TraceLevel



# ---------------------------------------------------------------------------------------------- evaluate

class Timing(Options):
    """When a timed loop stops: after ``min_repeats`` calls AND ``min_time_s`` seconds, or at a maximum.
    ``warmup``: untimed calls first, a count or "auto" (until the median of the last 5 calls is within
    ``warmup_tolerance`` of the 5 before; at least 10, at most ``max_warmup``)."""
    warmup: int | Literal["auto"] = _opt("auto", "untimed calls before timing: a count, or auto (until stable)",
                                         "--warmup", "calls")
    min_repeats: int = _opt(20, "timed calls per batch size, at least", "--min-repeats", "calls", ge=1)
    min_time_s: float = _opt(1.0, "seconds of timed calls per batch size, at least", "--min-time", "s", ge=0)
    max_time_s: float = _opt(120.0, "seconds of timed calls per batch size, at most", "--max-time", "s", gt=0)
    target_qps: float | None = _opt(None, "server scenario: target queries per second", "--qps", "queries/s", gt=0)
    latency_bound_ms: float | None = _opt(None, "server scenario: p99 bound", "--latency-bound", "ms", gt=0)
    max_warmup: int = _opt(50, "auto warm-up: at most this many calls", unit="calls", ge=1,
                           extra={"internal": True})
    warmup_tolerance: float = _opt(0.05, "auto warm-up: relative change of the median that counts as settled",
                                   gt=0, extra={"internal": True})
    max_repeats: int = _opt(100_000, "timed calls per batch size, at most", unit="calls", ge=1,
                            extra={"internal": True})
    seed: int = _opt(0, "seed of the server scenario's arrivals", extra={"internal": True})

    @staticmethod
    def rule(record: dict) -> str:
        """The stopping rule of a recorded options dict, in words (``at least 20 calls and at least 1 s``)."""
        rule = []
        if record.get("min_repeats") is not None:
            rule.append(f"at least {record['min_repeats']} calls")
        if record.get("min_time_s") is not None:
            rule.append(f"at least {record['min_time_s']:g} s")
        return " and ".join(rule)

    @field_validator("warmup", mode="before")
    @classmethod
    def _warmup(cls, value: Any) -> Any:
        text = str(value).strip()
        if text == "auto":
            return "auto"
        if isinstance(value, bool) or not text.isdigit():
            raise ValueError("expected a count of calls >= 0, or auto")
        return int(text)


class Tracing(Options):
    """The traced pass that follows the untimed sweep."""
    trace_level: str = _opt("NONE", "deepest trace level: " + ", ".join(level.name for level in TraceLevel),
                            "--trace-level", extra={"metavar": "LEVEL"})
    trace_repeats: int = _opt(5, "traced calls per batch size", "--trace-repeats", "calls", ge=1)

    @field_validator("trace_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> str:
        try:
            return TraceLevel.parse(value).name
        except MlmsError as err:
            raise ValueError(str(err)) from None


class Generation(Options):
    """Text generation (``scenario`` generate or generate-server, a ``task: text-generation`` manifest): mlms-nb's
    generate loop (:mod:`mlms_nb.generation.loop`) and MLPerf's latency definitions (docs/language-models.md)."""
    max_new_tokens: int = _opt(32, "generate: new tokens per request, at most (fewer when a stop token comes)",
                               "--max-new-tokens", "tokens", ge=1)
    sampling: Literal["greedy", "sample"] = _opt("greedy", "generate: greedy (argmax; the same tokens in every "
                                                 "framework) or sample (seeded, at --temperature among --top-k)",
                                                 "--sampling")
    temperature: float = _opt(1.0, "generate, sampling: divide the logits by this", "--temperature", gt=0)
    top_k: int = _opt(0, "generate, sampling: only the k most likely tokens (0: all)", "--top-k", "tokens", ge=0)
    sampling_seed: int = _opt(0, "generate, sampling: the seed (the same seed gives the same tokens)",
                              "--sampling-seed")
    stop_tokens: list[int] = _opt([], "generate: token ids that end a request (it keeps them), e.g. 50256",
                                  "--stop-tokens", extra={"metavar": "IDS", "python_type": "str | Iterable[int]",
                                                          "python_default": ()})
    kv_cache: Literal["both", "on", "off"] = _opt("both", "generate: with the model's KV cache (on), without it (off: "
                                                  "the whole sequence again per token) or both, each measured",
                                                  "--kv-cache")
    prompt_column: str | None = _opt(None, "generate: the prompts' column of a JSONL or Parquet dataset (default: "
                                     "prompt, text or input_ids)", "--prompt-column", extra={"metavar": "NAME"})
    prompt_length: int = _opt(16, "generate: tokens per synthetic prompt (the default dataset: seeded random ids)",
                              "--prompt-length", "tokens", ge=1)
    ttft_limit_ms: float | None = _opt(None, "generate: goodput counts requests whose time to first token is at most "
                                       "this", "--ttft-limit", "ms", gt=0)
    tpot_limit_ms: float | None = _opt(None, "generate: goodput counts requests whose time per output token is at "
                                       "most this", "--tpot-limit", "ms", gt=0)

    @field_validator("stop_tokens", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> list[int]:
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else (
            [value] if isinstance(value, int) else list(value or []))
        out = []
        for item in items:
            if isinstance(item, bool) or not str(item).lstrip("-").isdigit() or int(item) < 0:
                raise ValueError(f"{item!r} is not a token id (an integer >= 0)")
            out.append(int(item))
        return out

    @property
    def kv_modes(self) -> list[bool]:
        """The KV-cache settings to measure, in order."""
        return {"both": [True, False], "on": [True], "off": [False]}[self.kv_cache]


_BYTE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any) -> int:
    """``4GiB``, ``1.5G``, ``500MB``, ``2e9`` or an int -> bytes (k/M/G are powers of 1000, KiB/MiB/GiB of 1024)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(value).lower())
    if isinstance(value, bool) or not match or match.group(2) not in _BYTE_UNITS:
        raise ValueError("expected a size such as 4GiB or 500MB")
    size = int(float(match.group(1)) * _BYTE_UNITS[match.group(2)])
    if size <= 0:
        raise ValueError("expected a size above 0, such as 4GiB")
    return size


def size_text(size: int) -> str:
    """Bytes as a person writes them back: ``2GiB``, ``1.5GiB``, ``512MiB`` (``parse_bytes`` reads each)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size}B"


class Isolation(Options):
    """Where each framework's work runs (:mod:`mlms_nb.launchers`): in this process, or in a worker process of its
    own (``isolate``), which a per-call timeout, a per-run timeout and a memory limit can stop; a crash there is
    reported on the result while this process (the CLI, the notebook's kernel) lives on."""
    isolate: bool = _opt(False, "run each framework in a worker process of its own: a crash, a hang past a timeout "
                         "or a memory limit is reported on the result and the other frameworks go on", "--isolate")
    call_timeout_s: float | None = _opt(None, "stop a predict call that runs longer than this (in this process for "
                                        "ONNX Runtime; for every framework with --isolate)", "--call-timeout", "s",
                                        gt=0)
    run_timeout_s: float | None = _opt(None, "stop a framework's whole run (load, accuracy, timing, tracing) after "
                                       "this long; needs --isolate", "--run-timeout", "s", gt=0)
    memory_limit_bytes: int | None = _opt(None, "the worker process's memory limit, e.g. 4GiB (its heap and private "
                                          "mappings, RLIMIT_DATA); needs --isolate", "--memory-limit", "bytes",
                                          extra={"metavar": "SIZE", "python_type": "int | str | None"})

    @field_validator("memory_limit_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_bytes(value)

    @model_validator(mode="after")
    def _worker_only(self) -> "Isolation":
        for name in ("run_timeout_s", "memory_limit_bytes"):
            value = getattr(self, name)
            if value is not None and not self.isolate:
                shown = size_text(value) if name == "memory_limit_bytes" else value  # as the user wrote it: 2GiB
                raise ValueError(f"{spell(name, shown)} limits a worker process: add {spell_on('isolate')} "
                                 "to run each framework in one")
        return self

    @property
    def launcher(self) -> str:
        """The launcher that runs each framework's work: ``process`` when isolated, else ``inline``."""
        return "process" if self.isolate else "inline"


class Tls(Options):
    """Dask's TLS (``distributed.security.Security``): each side's certificate and key, signed by a CA every side
    trusts; every connection is then encrypted and addresses start with ``tls://`` (docs/agents.md)."""
    tls_ca_file: str | None = _opt(None, "TLS: the CA certificate every side trusts (PEM file)", "--tls-ca-file",
                                   extra={"metavar": "PATH"})
    tls_cert: str | None = _opt(None, "TLS: this side's certificate (PEM file)", "--tls-cert", extra={"metavar": "PATH"})
    tls_key: str | None = _opt(None, "TLS: this side's private key (PEM file; not needed when it is in --tls-cert)",
                               "--tls-key", extra={"metavar": "PATH"})


class _AgentsWhere(Options):
    """The mlms agents (Dask workers started by ``mlms agent``) of the scheduler at ``on`` that satisfy ``where``."""
    on: str | None = _opt(None, "the mlms agents of the Dask scheduler at this address, e.g. tcp://host:8786 "
                          "(evaluate: default here)", "--on", extra={"metavar": "ADDRESS"})
    where: str | None = _opt(None, "what an agent must have, e.g. 'torch>=2.0 device=cpu arch=x86_64 team=vision' "
                             "(frameworks with version ranges, device, arch, host, name, threads>=N, cores>=N, "
                             "memory>=SIZE, labels key=value)", "--where", extra={"metavar": "CONSTRAINTS"})


class _Agents(_AgentsWhere):
    """Where to evaluate: on one (or every) agent of the scheduler at ``on`` that satisfies ``where``."""
    all_agents: bool = _opt(False, "run on every matching agent in parallel, one evaluation each", "--all")

    @model_validator(mode="after")
    def _needs_on(self) -> "_Agents":
        for name in ("where", "all_agents", "tls_ca_file", "tls_cert", "tls_key"):
            if getattr(self, name) and not self.on:
                raise ValueError(f"{spell(name, getattr(self, name)) if name != 'all_agents' else spell_on(name)} "
                                 f"chooses among agents: add {spell('on', 'tcp://host:8786')}, the scheduler's address")
        return self


class Remote(Tls, _Agents):
    """On which agents to evaluate (``on``, ``where``, ``all_agents``), and the TLS files to reach them."""


def _frameworks(value: Any) -> list[str]:
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value or [])
    names = [canonical_framework(str(v)) for v in items if str(v).strip()]
    for name in names:
        if name not in FRAMEWORKS:
            raise ValueError(f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    if not names:
        raise ValueError(f"expected at least one framework: {', '.join(FRAMEWORKS)}")
    return names


class EvaluateOptions(Options):
    """Everything that shapes an evaluation (see :func:`mlms_nb.evaluate`)."""
    framework: list[str] = _opt(["torch"], "comma-separated frameworks, e.g. torch,onnxruntime,tensorflow",
                                "--framework",
                                extra={"python_default": "torch", "python_type": "str | Iterable[str]",
                                       "metavar": "NAMES"})
    batch_sizes: list[int] = _opt([1], "comma-separated batch sizes (inputs per call), e.g. 1,8", "--batch-sizes",
                                  "inputs",
                                  extra={"python_default": (1,), "python_type": "str | int | Iterable[int]",
                                         "metavar": "SIZES"})
    dataset: Any = _opt(None, "imagenet-samples | synthetic[:N] | a folder of images, audio or .npy | a .npz, "
                        "Parquet or Arrow file; from Python also a Dataset or any iterable of inputs (default: "
                        "labeled photos for pretrained classifiers, else synthetic). Class labels (integer ids of "
                        "the manifest's labels file, for top-1/top-5): a folder's subfolder names, a .npz array "
                        "'y', a Parquet/Arrow column 'label', Python (input, label) pairs; ground truth per output: "
                        "'target' or 'target:<output>' (docs/datasets.md)", "--dataset",
                        extra={"python_type": "str | os.PathLike | Dataset | Iterable | None", "metavar": "DATASET"})
    scenario: Literal["single-stream", "offline", "server", "generate", "generate-server"] = _opt(
        "single-stream", "single-stream (p90), offline (throughput) or server (Poisson arrivals; p99); for a causal "
        "language model generate (static batches: TTFT, TPOT, tokens/s) or generate-server (Poisson arrivals at --qps, "
        "batched as they arrive; goodput)", "--scenario")
    device: str = _opt("cpu", "cpu or cuda[:N]", "--device")
    threads: int | None = _opt(None, "intra-op threads (default: the framework's)", "--threads", ge=1)
    graph_optimization_level: Literal["disabled", "basic", "extended", "all"] | None = _opt(
        None, "ONNX Runtime graph optimisation level: disabled | basic | extended | all (default: the manifest's, "
        "else all)", "--graph-optimization-level")

    tracing: Tracing = Field(default_factory=Tracing)
    timing: Timing = Field(default_factory=Timing)
    generation: Generation = Field(default_factory=Generation)
    isolation: Isolation = Field(default_factory=Isolation)
    remote: Remote = Field(default_factory=Remote)
    limit: int | None = _opt(None, "use at most this many dataset inputs", "--limit", "inputs", ge=1)
    reader: Literal["threads", "processes"] = _opt(
        "threads", "what decodes and preprocesses the dataset during the full pass: threads (default) or processes "
        "(for preprocessing that holds the GIL; a Python iterable is read by threads)", "--reader")
    reader_niceness: int = _opt(
        19, "how many nice steps below the model's threads the readers run (0 to 19): 19 lets them use only CPU the "
        "model leaves idle; 0 on a machine busy with other work", "--reader-niceness", "nice steps", ge=0, le=19)
    keep_probabilities: bool = _opt(False, "keep every input's class probabilities (Evaluation.probabilities)")
    capture_outputs: str = _opt("summary", "what Evaluation.outputs keeps of every output: none, summary (shape, min, "
                                "max, mean, std per input), all (also the values) or first:N (values of the first N "
                                "inputs); kept values are compared across frameworks (Evaluation.output_agreement)",
                                "--capture-outputs")
    trust: bool = _opt(False, "trust this run's model and manifest: code steps, model.entrypoint, and model files that "
                       "can run code (TorchScript, .pt2, SavedModel, Keras with custom objects); see docs/trust.md",
                       "--trust")
    progress: bool = _opt(True, "show progress bars (stderr in a terminal, a widget in a notebook): inputs done, "
                          "inputs/s and the time left of each pass", "--no-progress",
                          extra={"cli_help": "no progress bars"})
    history: bool | str = _opt(True, "store the result in the history store (True: the default store; a string: an "
                               "SQLAlchemy URL)", "--no-history",
                               extra={"cli_help": "do not store the result in the history store"})

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, value: Any) -> list[str]:
        return _frameworks(value)

    @field_validator("capture_outputs", mode="before")
    @classmethod
    def _capture(cls, value: Any) -> str:
        text = f"first:{value}" if isinstance(value, int) and not isinstance(value, bool) else str(value).strip().lower()
        head, _, number = text.partition(":")
        if text in ("none", "summary", "all") or (head == "first" and number.isdigit()):
            return text
        raise ValueError(f"expected none, summary, all or first:N (N a number of inputs), got {value!r}")

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, bytes):
            raise ValueError("expected a dataset name, a path or (from Python) an iterable, got bytes")
        return value  # a name or path (text), or a Python dataset / iterable (opened by the evaluation)

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _batch_sizes(cls, value: Any) -> list[int]:
        items = [value] if isinstance(value, int) else (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value))
        sizes = []
        for item in items:
            try:
                size = int(item)
                if isinstance(item, bool) or (isinstance(item, float) and item != size):
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f"{item!r} is not an integer") from None
            if size < 1:
                raise ValueError(f"{size} is not a positive integer")
            sizes.append(size)
        if not sizes:
            raise ValueError("expected at least one batch size, e.g. 1,8")
        return list(dict.fromkeys(sizes))  # a size given twice is measured once, where it first appears

    @model_validator(mode="after")
    def _server_needs_a_rate(self) -> "EvaluateOptions":
        if self.scenario in ("server", "generate-server") and self.timing.target_qps is None:
            raise ValueError(f"the server scenario needs a target rate: {spell('target_qps')} (queries per second)")
        if self.remote.on and self.isolation.isolate:
            raise ValueError(f"{spell_on('isolate')} runs each framework in a worker process here; with "
                             f"{spell('on', self.remote.on)} it runs on an agent: use one or the other")
        return self

    def record(self) -> dict:
        """What `Evaluation.options` keeps: the options that shape the numbers, flat, plus how it was run."""
        flat = self.flat()
        for name in ("framework", "keep_probabilities", "trust", "progress", "history", "on", "where", "all_agents",
                     "tls_ca_file", "tls_cert", "tls_key"):
            flat.pop(name)
        if flat.get("dataset") is not None and not isinstance(flat["dataset"], str):  # a Python object: its name
            flat["dataset"] = str(getattr(flat["dataset"], "name", None) or f"python:{type(flat['dataset']).__name__}")
        isolation = ("a worker process per framework, one after another" if self.isolation.isolate
                     else "in-process (frameworks run one after another)")
        return {**flat, "isolation": isolation, "clock": "time.perf_counter_ns"}


# ---------------------------------------------------------------------------------------------- the other verbs

class DivergeOptions(Options):
    """See :func:`mlms_nb.diverge`."""
    frameworks: list[str] = _opt(["torch", "onnxruntime"], "comma-separated frameworks (the first is the reference), "
                                 "e.g. torch,onnxruntime,tensorflow", "--framework",
                                 extra={"python_default": ("torch", "onnxruntime"), "python_type": "str | Iterable[str]",
                                        "metavar": "NAMES"})
    dataset: Any = _opt(None, "imagenet-samples | an image folder | a .npz file; with outputs, any dataset evaluate "
                        "takes (default: imagenet-samples; with outputs, the model's evaluation default)", "--dataset",
                        extra={"python_type": "str | os.PathLike | Iterable | None", "metavar": "DATASET"})
    tolerance: float = _opt(1e-4, "max_rel_error above which a layer (with outputs: an output) diverges",
                            "--tolerance", "fraction", ge=0)
    limit: int | None = _opt(None, "use at most this many inputs (default: all; with outputs, 16: every value of "
                             "every output is kept)", "--limit", "inputs", ge=1)
    quantized: bool | str = _opt(False, "also compare an INT8-quantized ONNX Runtime copy (layers only)", "--quantized")
    batch_size: int = _opt(4, "inputs per call", "--batch-size", "inputs", ge=1)
    latency_repeats: int = _opt(5, "timed calls per layer latency (layers only)", "--latency-repeats", "calls", ge=1)
    trust: bool = _opt(False, "trust this run's manifest: its model.entrypoint and code steps; see docs/trust.md",
                       "--trust")
    outputs: bool = _opt(False, "compare every output of the model instead of its layers: any model (several inputs "
                         "and outputs, dynamic sizes, no built-in architecture needed)", "--outputs")
    metrics: Any = _opt(None, "with outputs: metrics beside the errors, built-in names (mse, mae, iou, exact_match; "
                        "from Python also {name: fn(output, reference) -> float}), also computed against a "
                        "dataset's targets", "--metrics",
                        extra={"python_type": "str | Iterable[str] | Mapping[str, Callable] | None",
                               "metavar": "NAMES"})

    @field_validator("frameworks", mode="before")
    @classmethod
    def _frameworks(cls, value: Any) -> list[str]:
        return _frameworks(value)

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
    model: str | None = _opt(None, "only this model", "--model")
    framework: str | None = _opt(None, "only this framework", "--framework")
    version: str | None = _opt(None, "only manifest versions in this range, e.g. ^1.0", "--version")
    complete: bool | None = _opt(None, "only complete (True) or interrupted (False) evaluations")
    limit: int | None = _opt(None, "at most this many rows", "--limit", "rows", ge=1, extra={"cli_default": 50})
    url: str | None = _opt(None, "the store's SQLAlchemy URL (default: the store under MLMS_HOME)")

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, value: Any) -> Any:
        return None if value is None else _frameworks(value)[0]


class LayersOptions(Options):
    """See :func:`mlms_nb.layers`."""
    what: Literal["occurrence", "latency", "memory"] = _opt("latency", "which table", "--what")
    by: Literal["layer", "type"] = _opt("layer", "latency per layer or per layer type", "--by")
    framework: str | None = _opt(None, "only this framework (default: every traced framework, one panel each)",
                                 "--framework")
    phase: Literal["prefill", "decode"] | None = _opt(None, "a generate run's trace: only this phase (default: "
                                                      "prefill and decode side by side)", "--phase")


class CompareOptions(Options):
    """See :func:`mlms_nb.compare`."""
    framework_a: str | None = _opt(None, "the framework of run A whose layers to compare (default: every framework "
                                   "both runs traced, side by side)", "--framework-a")
    framework_b: str | None = _opt(None, "the framework of run B (default: the same as --framework-a)",
                                   "--framework-b")


class RooflineOptions(Options):
    """See :func:`mlms_nb.roofline`."""
    per: Literal["layer", "model"] = _opt("layer", "each traced layer, or the model", "--per")
    framework: str | None = _opt(None, "only this framework", "--framework")
    device: str | None = _opt(None, "the device whose ceilings to use (default: the evaluation's)", "--device")
    phase: Literal["prefill", "decode"] | None = _opt(None, "a generate run's trace: only this phase (default: "
                                                      "both, each layer a point per phase)", "--phase")


class _Scheduler(Options):
    host: str | None = _opt(None, "the interface to listen on (default: 127.0.0.1 for the scheduler; for an agent, "
                            "the one that reaches the scheduler)", "--host")
    port: int = _opt(8786, "the port to listen on (0: any free port)", "--port", ge=0, le=65535)
    insecure: bool = _opt(False, "listen beyond 127.0.0.1 without TLS (anyone who can reach the port can then run "
                          "code on every agent)", "--insecure")


class SchedulerOptions(Tls, _Scheduler):
    """See :func:`mlms_nb.scheduler`."""
    tls_setup: str | None = _opt(None, "make (or reuse) a CA and a certificate in this folder and listen with TLS; "
                                 "prints the flags agents and notebooks pass", "--tls-setup", extra={"metavar": "DIR"})


class _Agent(Options):
    scheduler: str | None = _opt(None, "the Dask scheduler's address, e.g. tcp://host:8786", "--scheduler",
                                 extra={"metavar": "ADDRESS"})
    name: str | None = _opt(None, "the agent's name (default: HOST-Nt-PID, unique per process)", "--name")
    labels: dict[str, str] | None = _opt(None, "labels an evaluation's --where can ask for, e.g. team=vision,site=lab",
                                  "--labels", extra={"metavar": "K=V,...", "python_type": "str | dict[str, str]"})
    nthreads: int = _opt(1, "intra-op threads a model gets on this agent unless the evaluation sets --threads (the "
                         "agent runs one evaluation at a time)", "--nthreads", "threads", ge=1)
    serves: list[str] | None = _opt(None, "serve only these frameworks, e.g. torch (default: every one installed)",
                                    "--frameworks", extra={"metavar": "NAMES", "python_type": "str | Iterable[str] | None"})
    traces: str | None = _opt(None, "a folder every agent and the notebook share: the agent writes the traces it "
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
        return None if value is None else _frameworks(value)


class AgentOptions(Tls, _Agent):
    """See :func:`mlms_nb.agent`."""


class AgentsOptions(Tls, _AgentsWhere):
    """See :func:`mlms_nb.agents`."""


MODELS: tuple[type[Options], ...] = (EvaluateOptions, Timing, Tracing, Generation, Isolation, Remote, DivergeOptions, HistoryOptions,
                                      LayersOptions, RooflineOptions, SchedulerOptions, AgentOptions, AgentsOptions)
register_flags(*MODELS)
