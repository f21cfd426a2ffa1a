#!/usr/bin/env bash
# Set up mlms-nb on a fresh machine: a virtualenv in .venv with every framework and the test tools.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The JupyterLab extension is committed prebuilt (labextension/build, with the sha256 of the sources it was built from
# in labextension/build/sources.sha256): while the sources match, the install below skips the Node.js build. When they
# changed, it rebuilds with jlpm (Node.js >= 20.19, packages from the npm registry) and records the new checksum;
# commit labextension/build with your change (tests/test_lab_build.py fails until you do).
labext_sha=$("$PYTHON" scripts/labextension_sources_sha256.py)
if [ "$(cat labextension/build/sources.sha256 2>/dev/null)" = "$labext_sha" ] && [ -f labextension/build/package.json ]; then
  export HATCH_JUPYTER_BUILDER_SKIP_NPM=1
else
  command -v node >/dev/null 2>&1 || echo "note: Node.js is not installed; rebuilding the JupyterLab extension needs \
Node.js >= 20.19 (Debian: apt-get install nodejs npm)" >&2
  touch labextension/src/index.ts  # the builder rebuilds only when a source is newer than the build
fi
# torch is pinned to 2.13.0 (the CPU wheel); tensorflow-cpu keeps CUDA builds out. Nothing is byte-compiled while
# installing (pip would do it on one core, most of a minute and a half); compileall below does it on all cores.
# Compiled ahead either way: where PYTHONDONTWRITEBYTECODE is set, nothing compiled later is kept.
# uv installs the same versions as pip (the same 207 distributions here) in under a third of the time (27 s against
# 91 s for pip on 2 cores, uv's cache empty, pip's full); uv does not read pip's configuration, so pip's index,
# find-links and constraints are handed to it. Where uv cannot be installed or fails, pip does the work.
.venv/bin/python -m pip install -q uv >/dev/null 2>&1 || true
uv_args=()
[ -x .venv/bin/uv ] && mapfile -t uv_args < <(.venv/bin/python scripts/uv_args.py)
install() {
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install -q --python .venv/bin/python "${uv_args[@]}" "$@" && return 0
    echo "note: uv could not install $*; pip will" >&2
  fi
  .venv/bin/python -m pip install -q --no-compile "$@"
}
# editables: what hatchling's exact editable install (dev-mode-exact) imports at start-up; the built editable wheel
# asks for it, but uv resolves a local project from pyproject.toml and never sees that requirement
install -e '.[all,dev]' 'editables~=0.3'
[ -n "${HATCH_JUPYTER_BUILDER_SKIP_NPM:-}" ] || echo "$labext_sha" > labextension/build/sources.sha256
# foolbox only carries the 20 labeled ImageNet photos (imagenet-samples); its dependencies are not needed.
install --no-deps 'foolbox==3.3.4'
# keras-hub (TensorFlow generation: GPT-2/Llama/Qwen2 with ported weights) requires tensorflow-text, which requires
# the full `tensorflow` distribution beside tensorflow-cpu; what generation uses imports without it (pyproject's
# tf-generate extra is the route with every dependency).
install --no-deps 'keras-hub>=0.32,<0.33'
# Left out: what nothing here imports, a third of the 25k files (40 s -> 26 s on 2 cores): packages' own test suites,
# pip, and transformers' model folders other than those mlms-nb's zoo, its Keras ports and its tests build (a user's
# other architecture is compiled in memory when imported, as any module without a .pyc).
# The compiled torch layer call (mlms_nb/frameworks/torch/native.py): about 15 s of one core, built beside compileall
# into the user cache, once per torch; where it cannot be built, layer calls are timed in Python and set-up goes on.
.venv/bin/python -m mlms_nb.frameworks.torch.native &
native_build=$!
compiled_out='/(tests|test)/|/site-packages/pip/|/transformers/models/(?!(auto|bert|gpt2|gpt_neox|llama|mistral|qwen2|vit)/)[^/]+/'
.venv/bin/python -m compileall -q -j 0 -x "$compiled_out" .venv/lib/python3*/site-packages >/dev/null 2>&1 || true  # a few packages ship files for other Pythons
# mlms-nb's own modules too (installed editable, they are imported from here): every process the tests start (CLI
# runs, kernels, workers, agents) otherwise compiles each one it imports, about 0.35 s for the facade alone; a module
# edited later is compiled again where the cache cannot be written, never read stale (its .pyc records the source's
# mtime and size). 2 s here; the suite's worker time 990 -> 935 s on 2 cores.
.venv/bin/python -m compileall -q -j 0 mlms_nb analyses tests >/dev/null
wait "$native_build" || true
# the kernel the example notebooks run on
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
# Debian's chromium: the timeline tests and benchmark render pages in it headless, and PDF reports are printed by it
# (Playwright is pointed at it and never downloads a browser of its own). poppler-utils: pdftotext, pdfimages and
# pdfinfo, with which the report tests read the PDFs back. postgresql: the shared-history tests start a real server
# (initdb + pg_ctl) on loopback. Installed only when missing, apt-get exists and we are root.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v pdftotext >/dev/null 2>&1 || missing+=(poppler-utils)
{ command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl; } >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >/dev/null 2>&1 || echo "note: apt-get could not install ${missing[*]}; the browser, PDF and PostgreSQL tests will be skipped" >&2
fi
