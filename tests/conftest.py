"""Shared fixtures: every test writes under its own MLMS_HOME; converted models are shared per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# One cache of converted models (ONNX, Keras) for the whole run, so each is built once.
SESSION_HOME = Path(os.environ.get("MLMS_TEST_HOME", REPO / ".mlms_home" / "tests"))


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
