"""1,000 seeded, fuzzed manifests (issue 12): each accepted and runnable, or refused with a ManifestError that
names the field path (or the line and column, for YAML); no other exception, and no process over 2 GiB.

The fuzz runs in a child process (tests/faults/manifest_fuzz.py) so that its peak RSS (VmHWM) is its own,
not that of whatever else this pytest process loaded; the child also caps its address space, so a runaway
case would fail with MemoryError instead of exhausting the machine. About 12 s on 2 cores, hence slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis", reason="the fuzz needs hypothesis (pip install -e '.[dev]')")

HERE = Path(__file__).resolve().parent
EXAMPLES = 1000
SEED = int(os.environ.get("MLMS_FUZZ_SEED", "12"))
TWO_GIB = 2 << 30


@pytest.mark.slow
def test_fuzzed_manifests_are_runnable_or_refused_with_a_path(tmp_path):
    env = dict(os.environ, MLMS_HOME=str(tmp_path / "home"), MLMS_MANIFEST_PATH="", MLMS_ALLOW_PATHS="")
    done = subprocess.run([sys.executable, str(HERE / "manifest_fuzz.py"), "--examples", str(EXAMPLES),
                           "--seed", str(SEED)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = report["outcomes"]
    print(f"manifest fuzz, seed {SEED}: {outcomes}, {report['elapsed_s']} s, "
          f"peak RSS {report['peak_rss_bytes'] / 2**20:.0f} MiB")
    assert report["cases"] >= EXAMPLES
    assert outcomes.get("other", 0) == 0, json.dumps(report["failures"][:5], indent=1)
    # the mutations reach all three outcomes, so the oracle is exercised, not vacuous
    assert outcomes.get("accepted_runnable", 0) >= 50
    assert outcomes.get("refused_field_path", 0) >= 300 and outcomes.get("refused_yaml", 0) >= 10
    assert report["peak_rss_bytes"] < TWO_GIB


def test_the_oracle_tells_refusals_apart():
    """The classifier the fuzz relies on: a field path, YAML with line/column, anything else is 'other'."""
    sys.path.insert(0, str(HERE))
    try:
        from manifest_fuzz import classify_refusal
    finally:
        sys.path.remove(str(HERE))
    where = "/m/x.yaml"
    assert classify_refusal(f"{where}: inputs[0].dimensions[1]: expected", where, set()) == "refused_field_path"
    assert classify_refusal(f"{where}: colour: unknown field", where, {"colour"}) == "refused_field_path"
    assert classify_refusal(f"{where}: not valid YAML at line 3, column 1: found", where, set()) == "refused_yaml"
    assert classify_refusal(f"{where}: a manifest is a YAML mapping, got list", where, set()) == "refused_yaml"
    assert classify_refusal(f"{where}: <manifest>: unknown field", where, set()) == "other"
    assert classify_refusal("RecursionError", where, set()) == "other"
