"""Print the sha256 of the JupyterLab extension's sources (labextension/src, style, package.json, tsconfig.json,
yarn.lock): the prebuilt labextension/build is committed with this checksum in labextension/build/sources.sha256, so
scripts/setup.sh skips the Node.js build when the sources have not changed and tests/test_lab_build.py fails when they
changed without a rebuild. Standard library only (setup.sh runs it before any install)."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

SOURCES = ("src", "style", "package.json", "tsconfig.json", "yarn.lock")


def sources_sha256(labextension: Path) -> str:
    """One sha256 over every source file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    files = []
    for name in SOURCES:
        path = labextension / name
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    for path in files:
        digest.update(path.relative_to(labextension).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "labextension"
    print(sources_sha256(root))
