"""Keeping an evaluation as it is measured: the runner's sink (:class:`~mlms_nb.evaluation.runner.EvaluationRunner`)
writes each framework's row to the history store after every measurement (``HistoryStore.keep``), so an error, a
stop signal or the process dying loses nothing already measured.

When the store cannot be written (a corrupt file, a database locked past the retries, a server down), the
measurement is not lost either: the whole evaluation is written as JSON to a fallback file under
``$MLMS_HOME/unsaved/`` (``mlms_nb.load_evaluation`` reads it back), the result's warnings name that file and the
store's error, and ``saved`` is False (the CLI exits non-zero).
"""
from __future__ import annotations

import logging
from pathlib import Path

from mlms_nb._fs import atomic_write_text
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.paths import mlms_home
from mlms_nb.store.history import HistoryStore

log = logging.getLogger(__name__)


def fallback_path(evaluation: Evaluation) -> Path:
    """Where an evaluation the store could not take is written: ``$MLMS_HOME/unsaved/<id>.json``."""
    return mlms_home() / "unsaved" / f"{evaluation.id}.json"


class HistoryKeeper:
    """``keeper(evaluation, framework)`` after each measurement; ``finish(evaluation)`` after the run (traces,
    row ids). ``url``: the store's SQLAlchemy URL (None: the default store)."""

    def __init__(self, url: str | None = None):
        self.url = url
        self.store: HistoryStore | None = None
        self.error: str | None = None      # why the store could not be written, once it failed
        self.fallback: Path | None = None
        self.ids: dict[str, int] = {}

    @property
    def saved(self) -> bool:
        return self.error is None

    def kept(self, evaluation: Evaluation) -> bool:
        """Whether every framework of ``evaluation`` has its row in the store (a failed row when nothing was
        measured): what ``Evaluation.saved`` and ``--json``'s ``"saved"`` say, never just "no error"."""
        return self.saved and all(fw in self.ids for fw in evaluation.frameworks)

    def __call__(self, evaluation: Evaluation, framework: str) -> None:
        if self.error is None:
            try:
                if self.store is None:
                    self.store = HistoryStore(self.url)
                self.ids[framework] = self.store.keep(evaluation, framework)
                return
            except Exception as err:  # noqa: BLE001 - the measurement is worth more than the store
                self.error = str(err) or type(err).__name__
        self._write_fallback(evaluation)

    def finish(self, evaluation: Evaluation) -> None:
        """Traces saved and listed (where an agent wrote one to a shared folder, that path), ``history_ids`` set
        (the rows were kept as measured); or the fallback named."""
        if self.error is None and self.store is not None:
            try:
                for fw, trace in evaluation.traces.items():
                    shared = trace.metadata.get("saved_to")  # an agent wrote it to a folder every reader shares
                    path = shared if shared and Path(shared).exists() else \
                        trace.save(mlms_home() / "traces" / evaluation.id / fw)
                    self.store.add_trace(evaluation.id, trace.trace_id or f"{evaluation.id}-{fw}", "parquet",
                                         path=str(path))
            except Exception as err:  # noqa: BLE001
                self.error = str(err) or type(err).__name__
                self._write_fallback(evaluation)
        evaluation.history_ids = [self.ids[fw] for fw in evaluation.frameworks if fw in self.ids] if self.saved else []
        if self.error is not None:
            where = f"; the evaluation was written to {self.fallback} instead" if self.fallback else ""
            message = f"not saved to history: {self.error}{where}"
            if message not in evaluation.warnings:
                evaluation.warnings.append(message)
            log.warning("%s", message)

    def _write_fallback(self, evaluation: Evaluation) -> None:
        path = fallback_path(evaluation)
        try:
            atomic_write_text(path, evaluation.to_json())  # whole or absent, never half written
            self.fallback = path
        except Exception as err:  # noqa: BLE001 - the result in memory is all that is left; say so
            self.error = f"{self.error}; the fallback file {path} could not be written either ({err})"
