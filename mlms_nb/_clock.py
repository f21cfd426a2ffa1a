"""Wall-clock stamps and ids shared by every record mlms-nb writes."""
from __future__ import annotations

import datetime as _dt
import uuid


def now_utc() -> str:
    """The current time as ISO 8601 in UTC, to the microsecond (sorts as text)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def new_id() -> str:
    """A new random id: 32 lowercase hex digits."""
    return uuid.uuid4().hex
