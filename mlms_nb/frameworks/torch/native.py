"""The compiled layer call (``_recorder.cpp``): built once per torch installation, found again, or said why not.

:class:`~mlms_nb.frameworks.torch.tracing.LayerHooks` times a layer call either in Python or, where this module
can give it one, with the compiled ``LayerCall``: the same record, the sizes read from the ATen tensor instead of
through torch's Python getters (Lite0 at batch 1: FRAMEWORK tracing +3.5% -> +0.6% per call, see the source's
header). Built with the C++ compiler (``$CXX``, else ``g++``) against the headers and libraries the installed torch
wheel ships, into ``$MLMS_NATIVE_CACHE`` (default: the user cache folder, ``mlms-nb/native``), under a key of the
source, the flags (the paths of the torch it links to: each virtualenv builds its own), torch's version and the
Python ABI, so another torch or a changed source builds anew and nothing stale is loaded. About 15 s on 2 cores, once; ``scripts/setup.sh`` builds it ahead (``python -m
mlms_nb.frameworks.torch.native``). Where it cannot be built (no compiler, no headers, a failed build: remembered
beside the key, so later processes do not try again) or ``MLMS_NATIVE=0``, layer calls are timed in Python and
:func:`status` says why; the spans are the same either way (tests/test_trace_torch.py compares them).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("_recorder.cpp")
_NAME = "mlms_nb.frameworks.torch._recorder"
_loaded: dict[str, object] = {}  # "module": the module, or "reason": why there is none (this process decided)


def cache_dir() -> Path:
    """Where built recorders are kept: ``$MLMS_NATIVE_CACHE``, else the user cache folder's ``mlms-nb/native``."""
    configured = os.environ.get("MLMS_NATIVE_CACHE")
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("mlms-nb")) / "native"


def _compiler() -> str:
    return os.environ.get("CXX") or "g++"


def _flags() -> list[str]:
    """The compiler and its flags: against the installed torch's headers and libraries, its C++ ABI."""
    root = Path(torch.__file__).parent
    include, lib = root / "include", root / "lib"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [_compiler(), "-O2", "-shared", "-fPIC", "-std=c++20", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{sysconfig.get_paths()['include']}", f"-I{include}",
            f"-I{include / 'torch/csrc/api/include'}", f"-L{lib}", f"-Wl,-rpath,{lib}"]


def _command(output: Path) -> list[str]:
    """The compiler command that builds the recorder into ``output``."""
    return [*_flags(), str(SOURCE), "-o", str(output), "-ltorch_python", "-lc10", "-ltorch", "-ltorch_cpu"]


def _key() -> str:
    """The source's content, the flags, torch's version and the Python ABI (not where the source lies)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(_flags()).encode())
    digest.update(f"{torch.__version__} {sys.version} {sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return f"torch-{torch.__version__.replace('+', '_')}-{digest.hexdigest()[:16]}"


def _unbuildable() -> str | None:
    """Why the recorder cannot be built here, before trying; None if it can be tried."""
    compiler = _compiler()
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler} not found; set CXX)"
    if not (Path(torch.__file__).parent / "include/torch/csrc/autograd/python_variable.h").exists():
        return "this torch ships no C++ headers"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python.h for this interpreter (the python3-dev package)"
    return None


@contextlib.contextmanager
def _locked(folder: Path):
    """One builder at a time per cache folder (tests run several processes); unlocked where there is no fcntl."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not a POSIX system: build unlocked
        yield
        return
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(verbose: bool = False) -> Path:
    """The built recorder's path (building it if it is not there yet); raises RuntimeError saying why not."""
    folder = cache_dir()
    key = _key()
    target = folder / f"{key}{sysconfig.get_config_var('EXT_SUFFIX')}"
    failed = folder / f"{key}.failed"
    if target.exists():
        return target
    if failed.exists():
        raise RuntimeError(f"an earlier build failed ({failed}): {failed.read_text().strip()}")
    reason = _unbuildable()
    if reason:
        raise RuntimeError(reason)
    with _locked(folder):
        if target.exists():  # another process built it meanwhile
            return target
        if verbose:
            print(f"mlms-nb: compiling the torch layer recorder for torch {torch.__version__} (once, about 15 s)",
                  file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            output = Path(work) / target.name
            run = subprocess.run(_command(output), capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                lines = [line for line in (run.stderr or run.stdout).splitlines() if "error" in line.lower()]
                why = (lines or (run.stderr or run.stdout).splitlines() or ["no output"])[0][:300]
                failed.write_text(f"{_command(output)[0]} exited {run.returncode}: {why}\n")
                raise RuntimeError(f"the build failed: {why}")
            os.replace(output, target)
    return target


def _load(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(_NAME, str(path))
    spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def recorder() -> ModuleType | None:
    """The compiled recorder module (built on first use if need be), or None: :func:`status` says why."""
    if "module" in _loaded or "reason" in _loaded:
        return _loaded.get("module")  # type: ignore[return-value]
    if os.environ.get("MLMS_NATIVE", "1") == "0":
        _loaded["reason"] = "MLMS_NATIVE=0"
        return None
    try:
        _loaded["module"] = _load(build(verbose=True))
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as e:
        _loaded["reason"] = str(e) or type(e).__name__
        return None
    return _loaded["module"]  # type: ignore[return-value]


def status() -> str:
    """How layer calls are timed in this process: ``compiled`` or ``python (<why>)``."""
    return "compiled" if recorder() is not None else f"python ({_loaded['reason']})"


if __name__ == "__main__":  # scripts/setup.sh: build ahead, say how it went, never fail the set-up
    try:
        print(f"torch layer recorder: {build(verbose=True)}")
    except RuntimeError as e:
        print(f"torch layer recorder not built, layer calls will be timed in Python: {e}", file=sys.stderr)
