"""The JupyterLab extension is committed prebuilt so that set-up needs no Node.js build: the build must be the one
made from the sources as they are (scripts/setup.sh skips the build while labextension/build/sources.sha256 matches)."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_build_matches_the_sources():
    sources_sha256 = runpy.run_path(str(ROOT / "scripts" / "labextension_sources_sha256.py"))["sources_sha256"]
    recorded = (ROOT / "labextension" / "build" / "sources.sha256").read_text().strip()
    assert recorded == sources_sha256(ROOT / "labextension"), (
        "labextension/ sources changed since labextension/build was made: run `bash scripts/setup.sh` (it rebuilds with "
        "jlpm and records the checksum) and commit labextension/build")


def test_the_build_is_a_complete_federated_extension():
    meta = json.loads((ROOT / "labextension" / "build" / "package.json").read_text())
    assert meta["name"] == json.loads((ROOT / "labextension" / "package.json").read_text())["name"]
    load = meta["jupyterlab"]["_build"]["load"]  # e.g. static/remoteEntry.<hash>.js
    assert (ROOT / "labextension" / "build" / load).is_file()
