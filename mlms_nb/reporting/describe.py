"""What was measured and how, as tables: the runs, their stack, manifests with checksums, options, and the
command that reproduces each run. Reads only an Evaluation's public attributes (``stack``, ``options``,
``manifests``, ...); every table has one row per item and one value column per run (labels as headers)."""
from __future__ import annotations

import shlex
from typing import Sequence

import pandas as pd

from mlms_nb.options import EvaluateOptions, Generation, cli_words, fields

#: Options shown (in this order) with the label they get; the rest follow under their own names.
OPTION_LABELS = {
    "batch_sizes": "batch sizes (inputs per call)", "dataset": "dataset", "limit": "input limit",
    "scenario": "scenario", "device": "device", "threads": "threads (requested)", "trace_level": "trace level",
    "trace_repeats": "traced calls per batch size", "warmup": "warm-up", "min_repeats": "timed calls, at least",
    "min_time_s": "timed seconds per batch size, at least (s)", "max_time_s": "timed seconds, at most (s)",
    "max_repeats": "timed calls, at most", "target_qps": "target queries per second (/s)",
    "latency_bound_ms": "p99 latency bound (ms)", "isolation": "isolation", "clock": "clock",
}


def _text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def by_run(rows: dict[str, list[str]], labels: Sequence[str], key: str = "what") -> pd.DataFrame:
    """``{item: [value per run]}`` -> a frame with the item column and one column per run label."""
    headers = [label or "value" for label in labels]
    frame = pd.DataFrame([[item, *values] for item, values in rows.items()], columns=[key, *headers])
    frame.attrs["keys"] = [key]
    return frame


def runs_table(evaluations, labels: Sequence[str]) -> pd.DataFrame:
    rows: dict[str, list[str]] = {}

    def put(item: str, values) -> None:
        rows[item] = [_text(v) for v in values]

    put("model", [f"{e.model} {e.model_version}".strip() for e in evaluations])
    put("evaluation id", [e.id for e in evaluations])
    put("created (UTC)", [str(e.created_at)[:19].replace("T", " ") for e in evaluations])
    put("frameworks", [e.frameworks for e in evaluations])
    put("history ids", [e.history_ids or "not stored" for e in evaluations])
    put("complete", [e.complete for e in evaluations])
    put("traced", [", ".join(e.traces) or "no" for e in evaluations])
    return by_run(rows, labels)


def stack_table(evaluations, labels: Sequence[str]) -> pd.DataFrame:
    """Hardware and software, one row per item (framework versions included)."""
    rows: dict[str, list[str]] = {}
    items: list[tuple[str, str, str]] = [
        ("CPU", "hardware", "cpu_model"), ("architecture", "hardware", "cpu_arch"),
        ("physical cores", "hardware", "physical_cores"), ("logical CPUs", "hardware", "logical_cores"),
        ("memory (GiB)", "hardware", "memory_bytes"), ("GPUs", "hardware", "gpus"),
        ("OS", "software", "os"), ("kernel", "software", "kernel"), ("Python", "software", "python"),
        ("host", "", "hostname")]
    for label, part, key in items:
        values = []
        for e in evaluations:
            source = (e.stack.get(part) or {}) if part else e.stack
            value = source.get(key)
            if key == "memory_bytes" and value:
                value = f"{value / 2**30:.1f}"
            elif key == "gpus":
                value = ", ".join(str(g.get("name")) for g in value or []) or "none"
            values.append(value)
        rows[label] = [_text(v) for v in values]
    software = []
    for e in evaluations:
        software += [k for k in (e.stack.get("software") or {}) if k not in ("os", "kernel", "python",
                                                                            "python_implementation") and k not in software]
    for name in software:
        rows[f"{name} version"] = [_text((e.stack.get("software") or {}).get(name)) for e in evaluations]
    return by_run(rows, labels)


GENERATION_OPTIONS = frozenset(name for name, _ in fields(Generation, internal=True))
"""The options of the generation group: they shape a generate run only (a classifier's report leaves them out)."""


def applies(evaluation, name: str) -> bool:
    """Whether option ``name`` shapes ``evaluation``'s numbers: a generation option only in a generate run."""
    return name not in GENERATION_OPTIONS or evaluation.generates


def options_table(evaluations, labels: Sequence[str]) -> pd.DataFrame:
    """The recorded options of each run that apply to its workload (a generation option only for a generate run;
    ``n/a`` beside a run it does not apply to)."""
    rows: dict[str, list[str]] = {}
    names = list(OPTION_LABELS)
    for e in evaluations:
        names += [k for k in e.options if k not in names and k != "predictors"]
    for name in names:
        if any(name in e.options and applies(e, name) for e in evaluations):
            rows[OPTION_LABELS.get(name, name.replace("_", " "))] = [
                _text(e.options.get(name)) if applies(e, name) else "n/a" for e in evaluations]
    frameworks = list(dict.fromkeys(fw for e in evaluations for fw in (e.options.get("predictors") or {})))
    for fw in frameworks:
        for key, label in (("threads", "threads"), ("device", "device"), ("artifact", "model file")):
            values = [((e.options.get("predictors") or {}).get(fw) or {}).get(key) for e in evaluations]
            if any(v is not None for v in values):
                rows[f"{fw}: {label}"] = [_text(v) for v in values]
    if len(evaluations) < 2:
        return by_run(rows, labels, key="option")
    # several runs: side by side, the options that differ first and marked, values short enough that the runs'
    # columns fit the page together (a long model path would push B's column under A's)
    differ = {name: len(set(values)) > 1 for name, values in rows.items()}
    ordered = {name: [_short(v) for v in rows[name]] for name in sorted(rows, key=lambda n: not differ[n])}
    frame = by_run(ordered, labels, key="option")
    frame.insert(1, "differs", ["yes" if differ[name] else "" for name in ordered])
    frame.attrs["keys"] = ["option", "differs"]
    return frame


def _short(text: str, most: int = 36) -> str:
    """A value cut to ``most`` characters, keeping its end (a path's file name, a hash's tail)."""
    return text if len(text) <= most else "…" + text[-(most - 1):]


def manifests_table(evaluations, labels: Sequence[str]) -> pd.DataFrame:
    """One row per run, framework and asset: the manifest, the framework it asks for, the asset and its sha256."""
    rows = []
    for label, e in zip(labels, evaluations):
        for fw, manifest in (e.manifests or {}).items():
            model = manifest.get("model") or {}
            framework = manifest.get("framework") or {}
            ran = ((e.options or {}).get("predictors") or {}).get(fw) or {}
            checksums = {**(ran.get("asset_sha256") or {}), **(model.get("sha256") or {})}  # a conversion's, read
            assets = [k for k in ("graph_path", "weights_path") if model.get(k)] + [
                k for k in checksums if not model.get(k)]
            for asset in assets or [None]:
                rows.append({"run": label, "framework": fw,
                             "manifest": f"{manifest.get('name', '?')} {manifest.get('version', '')}".strip(),
                             "framework version wanted": _text(framework.get("version")),
                             "asset": asset.replace("_path", "") if asset else "-",
                             "source": _text(model.get(asset)) if asset else "-",
                             "sha256": checksums.get(asset, "not recorded with the run") if asset else "-"})
    frame = pd.DataFrame(rows)
    if len(labels) == 1 and not frame.empty:
        frame = frame.drop(columns=["run"])
    return frame


def reproduce_command(evaluation) -> str:
    """The ``mlms eval`` command line that repeats this evaluation's measurement: the model (its manifest's path
    when it was run from the user's file: ``options["manifest"]``), the frameworks, and every recorded option that differs from its default, spelled
    by the options model (:func:`mlms_nb.options.cli_words`), so no option is left out or spelled by hand. A
    dataset that was a Python object cannot be named on a command line: the command says so in a comment."""
    o = dict(evaluation.options or {})
    words = ["mlms", "eval", o.get("manifest") or evaluation.model or "MODEL", "--framework",
             ",".join(evaluation.frameworks)]
    dataset = o.get("dataset")
    python_data = isinstance(dataset, str) and dataset.startswith("python:")
    if python_data:
        o.pop("dataset")
    command = " ".join(shlex.quote(w) for w in words + cli_words(EvaluateOptions, o))
    return command + (f"  # the dataset was a Python object ({dataset}): pass it again" if python_data else "")


COMMAND_WIDTH = 88
"""The longest line of a command as the report shows it (characters): it fits an A4 page's code block."""


def command_lines(command: str, width: int = COMMAND_WIDTH) -> str:
    """``command`` (one shell line) as lines of at most ``width`` characters joined by `` \\`` continuations, broken
    only between arguments and never between a flag and its value, so that copying the block into a shell runs the
    same command (a trailing ``# comment`` goes on a line of its own, above)."""
    body, sep, comment = command.partition("  # ")
    words = shlex.split(body)
    groups: list[list[str]] = []
    for word in words:
        if groups and groups[-1][0].startswith("-") and len(groups[-1]) == 1 and not word.startswith("-"):
            groups[-1].append(word)  # a flag keeps its value on its line
        else:
            groups.append([word])
    lines, line = [], ""
    for group in groups:
        text = " ".join(shlex.quote(w) for w in group)
        if line and len(line) + 1 + len(text) + 2 > width:
            lines.append(line)
            line = "  " + text
        else:
            line = f"{line} {text}" if line else text
    lines.append(line)
    return (f"# {comment}\n" if sep else "") + " \\\n".join(lines)
