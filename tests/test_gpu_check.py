"""The GPU check's dry run (issue 26): on a machine without a GPU every step that can run on the CPU runs, every
other step says why it was skipped, and the JSON and markdown reports are written; so the script cannot rot
between the runs on a GPU machine."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # ~40 s on 2 quiet cores: four small evaluations (two traced)
def test_the_dry_run_runs_what_the_cpu_can_and_says_why_for_the_rest(tmp_path):
    out = tmp_path / "gpu"
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=600, env={**_env(), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    steps = report["steps"]
    assert report["dry_run"] and list(steps) == ["environment", "gpu_tests", "batch_sweep", "kernels", "cupti",
                                                 "roofline", "timeline"]
    assert steps["cupti"]["status"] == "skipped" and "without a GPU" in steps["cupti"]["why"]
    assert all(s["status"] in ("ok", "skipped") for s in steps.values()), steps
    assert all(s.get("why") for s in steps.values() if s["status"] == "skipped")
    assert steps["gpu_tests"]["status"] == "skipped" and steps["batch_sweep"]["status"] == "ok"
    rows = steps["batch_sweep"]["figures"]["rows"]
    assert {(r["model"], r["batch_size"]) for r in rows} == {(m, b) for m in ("efficientnet_lite0", "resnet50")
                                                               for b in (1, 2)}
    assert all(r["median_ms"] > 0 and r["energy_method"] for r in rows)
    assert steps["roofline"]["figures"]["layers"] > 0 and steps["roofline"]["figures"]["above_100pct_unflagged"] == 0
    assert steps["timeline"]["figures"]["spans"] == 20_000
    text = (out / "gpu_check.md").read_text()
    assert "| resnet50 | 2 |" in text and "Energy:" in text and (out / "timeline.html").stat().st_size > 0


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
