"""Shared fixtures: every test writes under its own MLMS_HOME; converted models are shared per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

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
