"""Unit prefixes: one per column (MiB, GFLOP, GFLOP/s, ...) chosen for its typical magnitude."""
from __future__ import annotations

BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))
DECIMAL = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""))


def prefix_for(typical: float, table) -> tuple[float, str]:
    """The (factor, prefix) of ``table`` (:data:`BINARY` or :data:`DECIMAL`) that ``typical`` is at least."""
    for factor, name in table:
        if typical >= factor:
            return factor, name
    return table[-1]
