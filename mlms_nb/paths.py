"""Where mlms-nb keeps things on disk: MLMS_HOME (cache, converted artifacts, history)."""
from __future__ import annotations

import os
from pathlib import Path


def mlms_home() -> Path:
    """The root of everything mlms-nb writes: ``$MLMS_HOME`` or the user's cache dir."""
    env = os.environ.get("MLMS_HOME")
    if env:
        home = Path(env).expanduser()
    else:
        import platformdirs

        home = Path(platformdirs.user_cache_dir("mlms-nb"))
    home.mkdir(parents=True, exist_ok=True)
    return home


def cache_dir() -> Path:
    """Downloaded assets, stored by sha256."""
    path = mlms_home() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifacts_dir() -> Path:
    """Artifacts that mlms-nb builds itself (ONNX and TensorFlow conversions)."""
    path = mlms_home() / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def builtin_manifest_dir() -> Path:
    """The manifests shipped with mlms-nb: inside the wheel, or the repository's ``manifests/`` in a checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "_manifests"
    if packaged.is_dir():
        return packaged
    return here.parent / "manifests"
