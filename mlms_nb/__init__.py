"""mlms-nb: MLModelScope rebuilt for the notebook."""
from __future__ import annotations

__version__ = "0.1.0"
