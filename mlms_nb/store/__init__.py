"""The history store: every evaluation, trace reference and machine-ceiling measurement, in SQLite or any
SQLAlchemy database (:class:`~mlms_nb.store.history.HistoryStore`)."""
from mlms_nb.store.history import HistoryError, HistoryStore, NotInHistoryError, default_url

__all__ = ["HistoryError", "HistoryStore", "NotInHistoryError", "default_url"]
