"""Putting back what an outage kept aside: evaluations written to ``$MLMS_HOME/unsaved/`` because the store could not
take them (:mod:`mlms_nb.store.keeping`) are completed into the store.

Each fallback file ``unsaved/<evaluation id>.json`` has a note beside it, ``<id>.json.store``, naming the store it
was meant for (its URL, password hidden). The next time that store is opened successfully, by any process, each
such file is written into it row by row (``HistoryStore.keep``: a row the failing process left half written --
``running``, or ``partial``/``crash`` once that process was gone -- is replaced by the whole result), and the file
moves to ``unsaved/imported/``. ``mlms history import PATH`` (``mlms_nb.history_import``) does the same for any
file or folder of them, into the store named (notes or not).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from mlms_nb.evaluation.result import Evaluation
from mlms_nb.paths import mlms_home

log = logging.getLogger(__name__)

NOTE_SUFFIX = ".store"
IMPORTED = "imported"


def unsaved_dir() -> Path:
    return mlms_home() / "unsaved"


def store_label(url: str) -> str | None:
    """How a store is named in a note: its engine's URL (as ``HistoryStore.display_url`` says it: the driver
    chosen, the password hidden); None when it is not a URL a store could open."""
    try:
        from mlms_nb.store.db import engine_for

        return engine_for(url).url.render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: no note, the file waits for `mlms history import`
        return None


def note_target(fallback: Path, url: str) -> None:
    """Write, beside ``fallback``, which store it was meant for (best effort: it is only a hint)."""
    label = store_label(url)
    if label is None:
        return
    try:
        fallback.with_name(fallback.name + NOTE_SUFFIX).write_text(label + "\n", encoding="utf-8")
    except OSError:
        pass


def pending(label: str) -> list[Path]:
    """The fallback files meant for the store named ``label``."""
    folder = unsaved_dir()
    try:
        notes = sorted(folder.glob(f"*.json{NOTE_SUFFIX}"))
    except OSError:
        return []
    found = []
    for note in notes:
        try:
            if note.read_text(encoding="utf-8").strip() == label:
                found.append(note.with_name(note.name.removesuffix(NOTE_SUFFIX)))
        except OSError:
            continue
    return [path for path in found if path.is_file()]


def put_back(store, paths: list[Path], move: bool = True) -> list[str]:
    """Write each evaluation file in ``paths`` (folders: their ``*.json``) into ``store``, row by row; returns the
    evaluation ids written. With ``move``, a file put back under ``unsaved/`` moves to ``unsaved/imported/``."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    done = []
    for file in files:
        evaluation = Evaluation.load(file)
        for framework in evaluation.frameworks:
            store.keep(evaluation, framework)
        done.append(evaluation.id)
        if move and file.parent.resolve() == unsaved_dir().resolve():
            _retire(file)
    return done


def _retire(file: Path) -> None:
    target = file.parent / IMPORTED
    try:
        target.mkdir(exist_ok=True)
        os.replace(file, target / file.name)
        file.with_name(file.name + NOTE_SUFFIX).unlink(missing_ok=True)
    except OSError:
        pass  # another process put it back at the same time


def put_back_pending(store) -> list[str]:
    """At a successful open: put back the fallback files meant for ``store``; a file that cannot be read or written
    is left where it is, with a warning (opening the store never fails for it)."""
    done = []
    for file in pending(store.display_url):
        try:
            done += put_back(store, [file])
        except Exception as err:  # noqa: BLE001 - one bad file breaks only itself
            log.warning("mlms: could not put %s back into the history store (%s); it stays there: "
                        "`mlms history import %s` tries again", file, " ".join(str(err).split())[:300], file)
    if done:
        log.warning("mlms: put back into the history store %d evaluation(s) an outage had kept in %s: %s",
                    len(done), unsaved_dir(), ", ".join(done))
    return done
