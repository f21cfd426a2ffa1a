"""The garbage collector held off while a bulk builder makes many objects that are none of them garbage."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """No collection inside the block (tens of thousands of new tuples or arrays, none of them garbage:
    collections would only walk them); the collector is enabled again after it only if it was before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
