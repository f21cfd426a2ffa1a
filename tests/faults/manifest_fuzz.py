"""Seeded manifest fuzzing with hypothesis (issue 12): every case is accepted and runnable, or refused cleanly.

Each case starts from a built-in manifest and either applies 1-3 structural mutations to its data (delete
a key or item, retype a value to None/bool/0/-1/2^63/NaN/inf/""/a 5,000-character string/a list/a dict,
rename or add a key, duplicate a list item, nest a value up to 80 levels deep, a random number), written
back with yaml.safe_dump, or (about 1 case in 6) edits the YAML text itself (flip 1-6 characters, put an
odd scalar in a value (a bad date, a 5,000-digit int, a tag, an alias), repeat or cut a line, truncate). The file goes through the public `mlms_nb.load_manifest`. Outcomes:

- ``accepted``: then it must run: its `Preprocessor` on a real photo (imagenet-samples) gives an array of
  ``inputs[0].dimensions`` and ``element_type`` (for a tensor input without steps, a synthetic input has that
  shape), its `Postprocessor` on random logits gives finite probabilities and top-k of the right shape, and
  ``to_dict()`` parses back to the same manifest. Anything raised here, even an `MlmsError`, is a failure;
- ``refused_field_path``: a `ManifestError` whose message names a field path of the document;
- ``refused_yaml``: a `ManifestError` for YAML syntax, encoding or the reader's limits (with line and
  column), or a document that is not a mapping;
- ``other``: anything else (must be 0).

Run it alone: ``python tests/faults/manifest_fuzz.py --examples 3000 --seed 2`` prints one JSON line with
the outcome counts, the failures, the run time and the peak RSS of the process (VmHWM, bytes).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import re
import resource
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from mlms_nb.data.datasets import ImageNetSamples, SyntheticDataset
from mlms_nb.data.transforms import Postprocessor, Preprocessor, UntrustedCodeError
from mlms_nb.errors import DatasetError, ManifestError
from mlms_nb.manifest import Manifest, load_manifest, parse_manifest
from mlms_nb.paths import builtin_manifest_dir

BASES = sorted(p for p in builtin_manifest_dir().rglob("*.yaml"))
TEXTS = [p.read_text() for p in BASES]
DATA = [yaml.safe_load(t) for t in TEXTS]
KNOWN_FIELDS = set(Manifest.model_fields) - {"source"}
ODD_VALUES = [None, True, False, 0, -1, 1, 2 ** 63, -(2 ** 63), math.nan, math.inf, -math.inf, "", "x" * 5000,
              [], {}, [1, 2, 3], {"a": 1}, 0.5, 1e308, 224, 4097, "NCHW", "torch", [224, 224], ["lol"] * 3]
KEY_NAMES = sorted(KNOWN_FIELDS | {"size", "mean", "scale", "axis", "k", "layout", "color_mode", "dimensions",
                                   "type", "labels", "classes", "name", "version", "graph_path", "weights_path",
                                   "sha256", "weights", "op", "args", "decode", "resize", "center_crop",
                                   "normalize", "to_layout", "softmax", "top_k", "code", "interpolation", "<<"})
ODD_SCALARS = ["2001-13-45", "!!float abc", "!!int x", "9" * 5000, "0x" + "f" * 5000, "!!binary abc",
               "!!python/name:os.system", "!!python/object/apply:os.system [echo]", "*nowhere", "&a [*a]",
               "!!set {a, b}", "!!omap [a: 1]", "~", "[", "{a: 1, a: 2}", ".nan", "-.inf", "0o777", "1_000",
               "190:20:30", "'unterminated", "!custom x", '"\\x00"', '"\\ud800"', '"\\U0010ffff"', "2001-01-01",
               "!!timestamp 2001-02-30", "[" * 60 + "]" * 60, "1e400", "1.0e+400", "0b101", "-0", "Yes", "NO", "null"]
FLIP_CHARS = list(":-[]{}&*!|>#%@`'\"\t\n ,.?0123456789aeé\u00a0\u2028\x00\x07\x1b") + ["\ufeff"]
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)


def _slots(node, out):
    """Every (container, key) of the tree, depth first."""
    if isinstance(node, dict):
        for k in list(node):
            out.append((node, k))
            _slots(node[k], out)
    elif isinstance(node, list):
        for i in range(len(node)):
            out.append((node, i))
            _slots(node[i], out)
    return out


def _containers(node, kind, out):
    if isinstance(node, kind):
        out.append(node)
    for child in (node.values() if isinstance(node, dict) else node if isinstance(node, list) else []):
        _containers(child, kind, out)
    return out


def odd_value(draw):
    """A fresh copy of one of `ODD_VALUES` (never the shared object: later mutations must not change them)."""
    return copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))


def mutate(draw, data):
    """One structural mutation of ``data`` in place (the root may be replaced: the new root is returned)."""
    op = draw(st.sampled_from(["delete", "retype", "retype", "rename", "add", "duplicate", "nest", "number"]))
    slots = _slots(data, [])
    if op == "add":
        target = draw(st.sampled_from(_containers(data, dict, []) or [data]))
        if isinstance(target, dict):
            target[draw(st.sampled_from(KEY_NAMES) | TEXT)] = odd_value(draw)
        return data
    if op == "duplicate":
        lists = [lst for lst in _containers(data, list, []) if lst]
        if lists:
            target = draw(st.sampled_from(lists))
            item = target[draw(st.integers(0, len(target) - 1))]
            target.insert(draw(st.integers(0, len(target))), copy.deepcopy(item))
        return data
    if not slots:
        return odd_value(draw)
    container, key = draw(st.sampled_from(slots))
    if op == "delete":
        del container[key]
    elif op == "retype":
        container[key] = odd_value(draw)
    elif op == "rename" and isinstance(container, dict):
        container[draw(st.sampled_from(KEY_NAMES) | TEXT)] = container.pop(key)
    elif op == "nest":
        value = container[key]
        for _ in range(draw(st.integers(1, 80))):
            value = draw(st.sampled_from([[value], {"a": value}]))
        container[key] = value
    elif op == "number":
        container[key] = draw(st.integers(-(2 ** 64), 2 ** 64) | st.floats(allow_nan=True, allow_infinity=True)
                              | st.integers(-3, 5000))
    return data


def edit_text(draw, text: str) -> str:
    """Edit the YAML text itself: flip characters, repeat or cut a line, or truncate."""
    op = draw(st.sampled_from(["flip", "flip", "odd_scalar", "odd_scalar", "repeat_line", "cut_line", "truncate"]))
    lines = text.split("\n")
    if op == "odd_scalar":  # a value YAML reads as something odd: a bad date, a huge int, a tag, an alias
        slots = [i for i, line in enumerate(lines) if ": " in line or line.lstrip().startswith("- ")]
        i = draw(st.sampled_from(slots))
        head = lines[i].split(": ", 1)[0] + ": " if ": " in lines[i] else lines[i].split("- ", 1)[0] + "- "
        lines[i] = head + draw(st.sampled_from(ODD_SCALARS))
        return "\n".join(lines)
    if op == "repeat_line":
        i = draw(st.integers(0, len(lines) - 1))
        lines.insert(draw(st.integers(0, len(lines))), lines[i])
        return "\n".join(lines)
    if op == "cut_line":
        del lines[draw(st.integers(0, len(lines) - 1))]
        return "\n".join(lines)
    if op == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    chars = list(text)
    for _ in range(draw(st.integers(1, 6))):
        chars[draw(st.integers(0, len(chars) - 1))] = draw(st.sampled_from(FLIP_CHARS))
    return "".join(chars)


def top_keys(text: str) -> set[str]:
    try:  # with the loader mlms-nb uses (libyaml's accepts some text PyYAML's own refuses)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    except Exception:  # noqa: BLE001 - only used to recognise the document's own keys in messages
        return set()
    return {str(k) for k in data} if isinstance(data, dict) else set()


_YAML = re.compile(r"^(not valid YAML at line \d+, column \d+: |not UTF-8 text \(byte 0x[0-9a-f]{2} at line \d+, "
                   r"column \d+\)|a manifest is a YAML mapping, got |the YAML (expands to|holds) more than |the file is )")


def classify_refusal(message: str, where: str, keys: set[str]) -> str:
    rest = message[len(where) + 2:] if message.startswith(where + ": ") else None
    if rest is None:
        return "other"
    if _YAML.match(rest):
        return "refused_yaml"
    heads = keys | {repr(k[:60]) for k in keys} | KNOWN_FIELDS
    if any(rest.startswith(h + sep) for h in heads for sep in (": ", ".", "[", " nests deeper")):
        return "refused_field_path"
    return "other"


class Photo:
    path = None


def check_runnable(m: Manifest) -> None:
    """Accepted means it works: preprocessing, postprocessing, and a round trip through to_dict."""
    spec = m.fed_input
    if m.has_code:
        try:
            Preprocessor(m)
            Postprocessor(m)
        except UntrustedCodeError:
            return
        raise AssertionError("a code step ran without trust")
    if spec.type == "image" or m.preprocess:
        x = Preprocessor(m)(Photo.path)
    elif spec.dynamic:  # synthetic inputs need every size: refused with a sentence, nothing to run here
        try:
            SyntheticDataset(m, count=1)
        except DatasetError:
            return
        raise AssertionError("synthetic inputs of dynamic dimensions were not refused")
    else:
        x = SyntheticDataset(m, count=1).item(0)
    fits = len(x.shape) == len(spec.dimensions) and all(
        not isinstance(d, int) or d == got for d, got in zip(spec.dimensions, x.shape))  # null or a symbol: any size
    assert fits and x.dtype == np.dtype(spec.element_type), (x.shape, x.dtype)
    classes = m.outputs[0].classes or 1000
    logits = np.random.default_rng(0).normal(size=(2, classes)).astype(np.float32)
    pred = Postprocessor(m)(logits)
    k = min(next((s.args.k for s in reversed(m.postprocess) if s.op == "top_k"), 5), classes)
    assert pred.probabilities.shape == (2, classes) and np.isfinite(pred.probabilities).all()
    assert pred.top_k_indices.shape == (2, k)
    again = parse_manifest(m.to_dict(), source=m.source)
    assert again.to_dict() == m.to_dict()


def run(examples: int, fuzz_seed: int) -> dict:
    outcomes: Counter = Counter()
    failures: list[dict] = []
    scratch = tempfile.TemporaryDirectory(prefix="mlms-fuzz-")
    folder = Path(scratch.name)
    Photo.path = ImageNetSamples.locate()[0][2]

    @seed(fuzz_seed)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=("generate",))
    @given(st.data())
    def case(draw_data):
        draw = draw_data.draw
        base = draw(st.integers(0, len(BASES) - 1))
        if draw(st.integers(0, 5)) == 0:
            text = edit_text(draw, TEXTS[base])
            how = "text"
        else:
            data = copy.deepcopy(DATA[base])
            for _ in range(draw(st.integers(1, 3))):
                data = mutate(draw, data)
            text = yaml.dump(data, Dumper=DUMPER, allow_unicode=True, sort_keys=False, width=1 << 16)
            how = "data"
        path = folder / f"{BASES[base].parent.name}-{BASES[base].stem}.yaml"
        path.write_bytes(text.encode("utf-8"))
        try:
            manifest = load_manifest(path)
        except ManifestError as err:
            outcome = classify_refusal(str(err), str(path), top_keys(text))
            if outcome == "other":
                failures.append({"how": how, "error": str(err)[:500], "text": text[:2000]})
        except BaseException as err:  # noqa: BLE001 - the point is to catch whatever escapes
            if isinstance(err, KeyboardInterrupt):
                raise
            outcome = "other"
            failures.append({"how": how, "error": f"{type(err).__name__}: {str(err)[:300]}",
                             "traceback": traceback.format_exc()[-1500:], "text": text[:2000]})
        else:
            try:
                check_runnable(manifest)
                outcome = "accepted_runnable"
            except BaseException as err:  # noqa: BLE001
                if isinstance(err, KeyboardInterrupt):
                    raise
                outcome = "other"
                failures.append({"how": how, "error": f"accepted, then {type(err).__name__}: {str(err)[:300]}",
                                 "traceback": traceback.format_exc()[-1500:], "text": text[:2000]})
        outcomes[outcome] += 1

    t0 = time.perf_counter()
    with scratch:
        case()
    elapsed = time.perf_counter() - t0
    return {"seed": fuzz_seed, "cases": sum(outcomes.values()), "outcomes": dict(outcomes),
            "failures": failures[:20], "elapsed_s": round(elapsed, 2), "peak_rss_bytes": peak_rss_bytes()}


def peak_rss_bytes() -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--address-space-gib", type=float, default=6.0,
                        help="RLIMIT_AS for this process, so a runaway case fails with MemoryError instead of "
                             "exhausting the machine")
    args = parser.parse_args(argv)
    limit = int(args.address_space_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(json.dumps(run(args.examples, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
