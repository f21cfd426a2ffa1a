#!/usr/bin/env bash
# The GPU check (issue 26), one command: bash scripts/gpu_check.sh [--dry-run] OUT_DIR
# On a GPU machine (no package registry there): installs what the image lacks from the wheels carried in
# .gpu_wheels/ (made here by `bash scripts/gpu_wheels.sh`), then runs scripts/gpu_check.py, which writes
# OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md. With --dry-run (CI, any CPU machine): the steps that can run on
# the CPU run at small sizes, and each other step says why it was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
dry=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry=1; done
if [ -d .gpu_wheels ] && [ "$dry" = 0 ]; then
  # the image's torch/onnxruntime stay; only what mlms-nb needs beside them comes from the carried wheels
  "$PY" -m pip install -q --no-index --find-links .gpu_wheels --no-deps .gpu_wheels/*.whl
  "$PY" -m pip install -q --no-index --find-links .gpu_wheels --no-deps -e . 2>/dev/null \
    || echo "gpu_check: mlms-nb runs from the checkout (PYTHONPATH)" >&2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu_check.py "$@"
