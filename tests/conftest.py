"""Shared fixtures: every test writes under its own MLMS_HOME; converted models are shared per session."""
from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# Under pytest-xdist (the README's `-n 2` on a 2-core machine) each worker's frameworks get one intra-op thread: two
# workers with a thread pool of two each spin-wait against each other and run several times slower. Kernels and
# subprocesses the tests start inherit it. A test that passes `threads=` still gets what it asks for.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(_var, "1")

# Each test run gets its own MLMS_HOME (history store, traces, trust list, converted models: nothing an earlier run
# left can make a test pass or fail), shared by the run's xdist workers; runs of earlier days are removed. (Converted
# models are not shared across runs through a link: a manifest's files are confined to MLMS_HOME once resolved.)
_TESTS_HOME = Path(os.environ.get("MLMS_TEST_HOME", REPO / ".mlms_home" / "tests"))
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or os.environ.setdefault("MLMS_TEST_RUN", uuid.uuid4().hex[:12])
SESSION_HOME = _TESTS_HOME / "runs" / _RUN_ID


def _prepare_session_home() -> None:
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    for old in (_TESTS_HOME / "runs").iterdir():
        try:
            if old != SESSION_HOME and time.time() - old.stat().st_mtime > 86_400:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def pytest_collection_modifyitems(config, items):
    """The fast tests first, then those marked slow (a stable sort: each module's order is kept), so that with ``-x``
    a broken basic behaviour stops the run in its first minutes; xdist's ``worksteal`` then hands the slow ones to
    whichever worker is free."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


def pytest_configure(config):
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):  # not xdist's controller
        _prepare_session_home()


@pytest.fixture
def mlms_home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty MLMS_HOME for one test."""
    home = tmp_path / "mlms_home"
    monkeypatch.setenv("MLMS_HOME", str(home))
    return home


@pytest.fixture
def shared_home(monkeypatch) -> Path:
    """The session-wide MLMS_HOME holding converted models (and a history store) that tests may share."""
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("MLMS_HOME", str(SESSION_HOME))
    return SESSION_HOME


@pytest.fixture(scope="session")
def converted_models() -> Path:
    """SESSION_HOME with the ONNX and Keras artifacts of efficientnet_lite0 built (once per session; a cached,
    current artifact is reused). Frameworks that are not installed are skipped over."""
    from mlms_nb._optional import is_available

    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(SESSION_HOME))
        from mlms_nb.frameworks.convert import convert

        for framework, module in (("onnxruntime", "onnx"), ("tensorflow", "keras")):
            if is_available("torch") and is_available(module):
                convert("efficientnet_lite0", to=framework)
    return SESSION_HOME


@pytest.fixture(scope="module")
def models_home(converted_models) -> Path:
    """For a whole test module: MLMS_HOME is the session's home, with the converted models in it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(converted_models))
        yield converted_models


@pytest.fixture(scope="session")
def real_evaluation():
    """One real evaluation, made once per session: efficientnet_lite0 in PyTorch, batch size 1, two synthetic
    inputs, a few timed calls; not stored. Tests that store copies give them new ids."""
    pytest.importorskip("torch", reason="the real evaluation needs PyTorch: pip install -e '.[torch]'")
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(SESSION_HOME))
        import mlms_nb

        return mlms_nb.evaluate("efficientnet_lite0", framework="torch", batch_sizes=[1], dataset="synthetic:2",
                                warmup=1, min_repeats=5, min_time_s=0, progress=False, history=False)


@pytest.fixture(scope="session")
def traced_evaluation(converted_models):
    """One real traced evaluation shared by the analyses, the analysis verbs and the reports (made once per session,
    stored in the session's history): EfficientNet-Lite0 in PyTorch and ONNX Runtime, batch sizes 1 and 2, 4 of the
    packaged labelled photos, FRAMEWORK-level trace of 3 calls per batch size. ``.for_framework("torch")`` is the
    PyTorch part (same id); ``history_ids`` has one row per framework. Tests must not change it.

    Made once per test run (the first pytest-xdist worker to ask evaluates; every worker, that one included, reads it
    back from the history store, traces and all, as ``load_evaluation`` gives it to a user)."""
    pytest.importorskip("torch", reason="the traced evaluation needs PyTorch: pip install -e '.[torch]'")
    pytest.importorskip("onnxruntime", reason="the traced evaluation needs ONNX Runtime: pip install -e '.[onnx]'")
    from tests.helpers import once_per_run

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(converted_models))
        import mlms_nb

        def evaluate() -> str:
            return mlms_nb.evaluate("efficientnet_lite0", framework="torch,onnxruntime", batch_sizes=[1, 2],
                                    dataset="imagenet-samples", limit=4, trace_level="FRAMEWORK", trace_repeats=3,
                                    warmup=2, min_repeats=5, min_time_s=0.05, progress=False).id

        return mlms_nb.load_evaluation(once_per_run("traced_evaluation", evaluate))


from tests.pg_support import postgres_server, postgres_url  # noqa: E402,F401  (a real PostgreSQL on loopback)
