#!/usr/bin/env bash
# The GPU check (issue 26), one command: bash scripts/gpu_check.sh [--dry-run] [--steps a,b] OUT_DIR
# On a GPU machine (no package registry there): installs what the image lacks from the wheels carried in
# .gpu_wheels/1, .gpu_wheels/2, ... (made here by `bash scripts/gpu_wheels.sh`; one folder per call, as one call
# carries 64 MiB) into .gpu_site/, then runs scripts/gpu_check.py, which writes OUT_DIR/gpu_check.json and
# OUT_DIR/gpu_check.md after every step. `--install-only` installs and stops (every call but the last). With --dry-run (CI, any CPU machine): the steps that can run on the CPU run at small sizes, and
# each other step says why it was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
dry=0; install_only=0
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && dry=1
  [ "$arg" = "--install-only" ] && install_only=1
done
if [ "$dry" = 0 ]; then
  # a private target folder: the image's torch/onnxruntime/numpy stay as they are, no system site-packages is
  # written (PEP 668 images refuse it), and a second call on the same warm machine finds the first call's installs
  for folder in .gpu_wheels/*/; do
    if [ ! -e "$folder/.installed" ] && compgen -G "$folder*.whl" > /dev/null; then
      "$PY" -m pip install -q --no-index --no-deps --upgrade --target .gpu_site "$folder"*.whl
      touch "$folder/.installed"
      echo "gpu_check: installed $(ls "$folder"*.whl | wc -l) wheels from $folder into .gpu_site" >&2
    fi
  done
fi
[ "$install_only" = 1 ] && exit 0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu_site ] && [ "$dry" = 0 ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu_site"
exec "$PY" scripts/gpu_check.py "$@"
