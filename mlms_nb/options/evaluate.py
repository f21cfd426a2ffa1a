"""The options of `evaluate` (pydantic models): timing, tracing, generation, isolation, the agents, and the
`EvaluateOptions` that gathers them. How an option is written is :mod:`mlms_nb.options` (the package's docstring).
"""
from __future__ import annotations

import os
import re
from enum import Enum
from typing import Any, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from mlms_nb.errors import MlmsError
from mlms_nb.manifest import FRAMEWORKS, canonical_framework
from mlms_nb.options.base import Options, option, spell, spell_on
from mlms_nb.schema.levels import TraceLevel


# ---------------------------------------------------------------------------------------------- evaluate

class Timing(Options):
    """When a timed loop stops: after ``min_repeats`` calls AND ``min_time_s`` seconds, or at a maximum.
    ``warmup``: untimed calls first, a count or "auto" (until the median of the last 5 calls is within
    ``warmup_tolerance`` of the 5 before; at least 10, at most ``max_warmup``)."""
    warmup: int | Literal["auto"] = option("auto", "untimed calls before timing: a count, or auto (until stable)",
                                         "--warmup", "calls")
    min_repeats: int = option(20, "timed calls per batch size, at least", "--min-repeats", "calls", ge=1)
    min_time_s: float = option(1.0, "seconds of timed calls per batch size, at least", "--min-time", "s", ge=0)
    max_time_s: float = option(120.0, "seconds of timed calls per batch size, at most", "--max-time", "s", gt=0)
    target_qps: float | None = option(None, "server scenario: target queries per second", "--qps", "queries/s", gt=0)
    latency_bound_ms: float | None = option(None, "server scenario: p99 bound", "--latency-bound", "ms", gt=0)
    wait_for_quiet_s: float = option(0.0, "before each timed loop, wait up to this long for a quiet machine (other "
                                   "programs leaving the model's threads a core each; mlms_nb.profilers.load), then "
                                   "time anyway with a warning; 0: do not wait", "--wait-for-quiet", "s", ge=0)
    max_warmup: int = option(50, "auto warm-up: at most this many calls", unit="calls", ge=1,
                           extra={"internal": True})
    warmup_tolerance: float = option(0.05, "auto warm-up: relative change of the median that counts as settled",
                                   gt=0, extra={"internal": True})
    max_repeats: int = option(100_000, "timed calls per batch size, at most", unit="calls", ge=1,
                            extra={"internal": True})
    seed: int = option(0, "seed of the server scenario's arrivals", extra={"internal": True})

    @staticmethod
    def rule(record: dict) -> str:
        """The stopping rule of a recorded options dict, in words (``at least 20 calls and at least 1 s``)."""
        rule = []
        if record.get("min_repeats") is not None:
            rule.append(f"at least {record['min_repeats']} calls")
        if record.get("min_time_s"):  # 0: no time rule, nothing to say
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
    trace_level: TraceLevel = option(TraceLevel.NONE, "deepest trace level: " + ", ".join(level.name for level in TraceLevel),
                                     "--trace-level", extra={"metavar": "LEVEL", "python_default": "NONE",
                                                             "python_type": "str | TraceLevel"})
    trace_repeats: int = option(5, "traced calls per batch size", "--trace-repeats", "calls", ge=1)

    @field_validator("trace_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> TraceLevel:
        try:
            return TraceLevel.parse(value)
        except MlmsError as err:
            raise ValueError(str(err)) from None

    @field_serializer("trace_level")
    def _level_name(self, level: TraceLevel) -> str:
        return level.name  # a record and its JSON keep the name ("FRAMEWORK"), as the flag and Python take it


class Generation(Options):
    """Text generation (``scenario`` generate or generate-server, a ``task: text-generation`` manifest): mlms-nb's
    generate loop (:mod:`mlms_nb.generation.loop`) and MLPerf's latency definitions (docs/language-models.md)."""
    max_new_tokens: int = option(32, "generate: new tokens per request, at most (fewer when a stop token comes)",
                               "--max-new-tokens", "tokens", ge=1)
    sampling: Literal["greedy", "sample"] = option("greedy", "generate: greedy (argmax; the same tokens in every "
                                                 "framework) or sample (seeded, at --temperature among --top-k)",
                                                 "--sampling")
    temperature: float = option(1.0, "generate, sampling: divide the logits by this", "--temperature", gt=0)
    top_k: int = option(0, "generate, sampling: only the k most likely tokens (0: all)", "--top-k", "tokens", ge=0)
    sampling_seed: int = option(0, "generate, sampling: the seed (the same seed gives the same tokens)",
                              "--sampling-seed")
    stop_tokens: list[int] = option([], "generate: token ids that end a request (it keeps them), e.g. 50256",
                                  "--stop-tokens", extra={"metavar": "IDS", "python_type": "str | Iterable[int]",
                                                          "python_default": ()})
    kv_cache: Literal["both", "on", "off"] = option("both", "generate: with the model's KV cache (on), without it (off: "
                                                  "the whole sequence again per token) or both, each measured",
                                                  "--kv-cache")
    prompt_column: str | None = option(None, "generate: the prompts' column of a JSONL or Parquet dataset (default: "
                                     "prompt, text or input_ids)", "--prompt-column", extra={"metavar": "NAME"})
    prompt_length: int = option(16, "generate: tokens per synthetic prompt (the default dataset: seeded random ids)",
                              "--prompt-length", "tokens", ge=1)
    ttft_limit_ms: float | None = option(None, "generate: goodput counts requests whose time to first token is at most "
                                       "this", "--ttft-limit", "ms", gt=0)
    tpot_limit_ms: float | None = option(None, "generate: goodput counts requests whose time per output token is at "
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
    isolate: bool = option(False, "run each framework in a worker process of its own: a crash, a hang past a timeout "
                         "or a memory limit is reported on the result and the other frameworks go on", "--isolate")
    call_timeout_s: float | None = option(None, "stop a predict call that runs longer than this (in this process for "
                                        "ONNX Runtime; for every framework with --isolate)", "--call-timeout", "s",
                                        gt=0)
    run_timeout_s: float | None = option(None, "stop a framework's whole run (load, accuracy, timing, tracing) after "
                                       "this long; needs --isolate", "--run-timeout", "s", gt=0)
    memory_limit_bytes: int | None = option(None, "the worker process's memory limit, e.g. 4GiB (its heap and private "
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
    tls_ca_file: str | None = option(None, "TLS: the CA certificate every side trusts (PEM file)", "--tls-ca-file",
                                   extra={"metavar": "PATH"})
    tls_cert: str | None = option(None, "TLS: this side's certificate (PEM file)", "--tls-cert", extra={"metavar": "PATH"})
    tls_key: str | None = option(None, "TLS: this side's private key (PEM file; not needed when it is in --tls-cert)",
                               "--tls-key", extra={"metavar": "PATH"})


class AgentsWhere(Options):
    """The mlms agents (Dask workers started by ``mlms agent``) of the scheduler at ``on`` that satisfy ``where``."""
    on: str | None = option(None, "the mlms agents of the Dask scheduler at this address, e.g. tcp://host:8786 "
                          "(evaluate: default here)", "--on", extra={"metavar": "ADDRESS"})
    where: str | None = option(None, "what an agent must have, e.g. 'torch>=2.0 device=cpu arch=x86_64 team=vision' "
                             "(frameworks with version ranges, device, arch, host, name, threads>=N, cores>=N, "
                             "memory>=SIZE, labels key=value)", "--where", extra={"metavar": "CONSTRAINTS"})


class _Agents(AgentsWhere):
    """Where to evaluate: on one (or every) agent of the scheduler at ``on`` that satisfies ``where``."""
    all_agents: bool = option(False, "run on every matching agent in parallel, one evaluation each", "--all")

    @model_validator(mode="after")
    def _needs_on(self) -> "_Agents":
        for name in ("where", "all_agents", "tls_ca_file", "tls_cert", "tls_key"):
            if getattr(self, name) and not self.on:
                raise ValueError(f"{spell(name, getattr(self, name)) if name != 'all_agents' else spell_on(name)} "
                                 f"chooses among agents: add {spell('on', 'tcp://host:8786')}, the scheduler's address")
        return self


class Remote(Tls, _Agents):
    """On which agents to evaluate (``on``, ``where``, ``all_agents``), and the TLS files to reach them."""


def frameworks_list(value: Any) -> list[str]:
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
    framework: list[str] = option(["torch"], "comma-separated frameworks, e.g. torch,onnxruntime,tensorflow",
                                "--framework",
                                extra={"python_default": "torch", "python_type": "str | Iterable[str]",
                                       "metavar": "NAMES"})
    batch_sizes: list[int] = option([1], "comma-separated batch sizes (inputs per call), e.g. 1,8", "--batch-sizes",
                                  "inputs",
                                  extra={"python_default": (1,), "python_type": "str | int | Iterable[int]",
                                         "metavar": "SIZES"})
    dataset: Any = option(None, "imagenet-samples | synthetic[:N] | a folder of images, audio or .npy | a .npz, "
                        "Parquet or Arrow file; from Python also a Dataset or any iterable of inputs (default: "
                        "labeled photos for pretrained classifiers, else synthetic). Class labels (integer ids of "
                        "the manifest's labels file, for top-1/top-5): a folder's subfolder names, a .npz array "
                        "'y', a Parquet/Arrow column 'label', Python (input, label) pairs; ground truth per output: "
                        "'target' or 'target:<output>' (docs/datasets.md)", "--dataset",
                        extra={"python_type": "str | os.PathLike | Dataset | Iterable | None", "metavar": "DATASET"})
    scenario: Literal["single-stream", "offline", "server", "generate", "generate-server"] = option(
        "single-stream", "single-stream (p90), offline (throughput) or server (Poisson arrivals; p99); for a causal "
        "language model generate (static batches: TTFT, TPOT, tokens/s) or generate-server (Poisson arrivals at --qps, "
        "batched as they arrive; goodput)", "--scenario")
    device: str = option("cpu", "cpu or cuda[:N]", "--device")
    threads: int | None = option(None, "intra-op threads (default: the framework's)", "--threads", ge=1)
    graph_optimization_level: Literal["disabled", "basic", "extended", "all"] | None = option(
        None, "ONNX Runtime graph optimisation level: disabled | basic | extended | all (default: the manifest's, "
        "else all)", "--graph-optimization-level")

    tracing: Tracing = Field(default_factory=Tracing)
    timing: Timing = Field(default_factory=Timing)
    generation: Generation = Field(default_factory=Generation)
    isolation: Isolation = Field(default_factory=Isolation)
    remote: Remote = Field(default_factory=Remote)
    limit: int | None = option(None, "use at most this many dataset inputs", "--limit", "inputs", ge=1)
    reader: Literal["threads", "processes"] = option(
        "threads", "what decodes and preprocesses the dataset during the full pass: threads (default) or processes "
        "(for preprocessing that holds the GIL; a Python iterable is read by threads)", "--reader")
    reader_niceness: int = option(
        19, "how many nice steps below the model's threads the readers run (0 to 19): 19 lets them use only CPU the "
        "model leaves idle; 0 on a machine busy with other work", "--reader-niceness", "nice steps", ge=0, le=19)
    keep_probabilities: bool = option(False, "keep every input's class probabilities (Evaluation.probabilities)")
    capture_outputs: str = option("summary", "what Evaluation.outputs keeps of every output: none, summary (shape, min, "
                                "max, mean, std per input), all (also the values) or first:N (values of the first N "
                                "inputs); kept values are compared across frameworks (Evaluation.output_agreement)",
                                "--capture-outputs")
    trust: bool = option(False, "trust this run's model and manifest: code steps, model.entrypoint, and model files that "
                       "can run code (TorchScript, .pt2, SavedModel, Keras with custom objects); see docs/trust.md",
                       "--trust")
    progress: bool = option(True, "show progress bars (stderr in a terminal, a widget in a notebook): inputs done, "
                          "inputs/s and the time left of each pass", "--no-progress",
                          extra={"cli_help": "no progress bars"})
    history: bool | str = option(True, "store the result in the history store (True: the default store; a string: an "
                               "SQLAlchemy URL)", "--no-history",
                               extra={"cli_help": "do not store the result in the history store"})

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, value: Any) -> list[str]:
        return frameworks_list(value)

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
        flat = {name: value.name if isinstance(value, Enum) else value for name, value in self.flat().items()}
        for name in ("framework", "keep_probabilities", "trust", "progress", "history", "on", "where", "all_agents",
                     "tls_ca_file", "tls_cert", "tls_key"):
            flat.pop(name)
        if flat.get("dataset") is not None and not isinstance(flat["dataset"], str):  # a Python object: its name
            flat["dataset"] = str(getattr(flat["dataset"], "name", None) or f"python:{type(flat['dataset']).__name__}")
        isolation = ("a worker process per framework, one after another" if self.isolation.isolate
                     else "in-process (frameworks run one after another)")
        return {**flat, "isolation": isolation, "clock": "time.perf_counter_ns"}
