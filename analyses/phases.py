"""A generate run's phases in the analyses: a trace whose predict calls are tagged ``prefill`` or ``decode``
(:mod:`mlms_nb.generation.traced`) gets a ``phase`` column in its layer tables (:mod:`.layers`), a point per
phase in its roofline (:mod:`.roofline`) and a band per step in its timeline (:mod:`.timeline`); the phases keep
one colour each in every chart."""
from __future__ import annotations

import pandas as pd

from ._plot import PALETTE, AnalysisError

_GROUP = ["framework", "batch_size"]
PHASES = ("prefill", "decode")


def groups(calls: pd.DataFrame) -> list[str]:
    """The keys one repetition's group is made of: framework and batch size, and the phase in a generate trace."""
    return _GROUP + ["phase"] if "phase" in calls and (calls["phase"] != "").any() else list(_GROUP)


def only_phase(table: pd.DataFrame, phase: str | None) -> pd.DataFrame:
    """The rows of one phase (``prefill`` or ``decode``) of a per-phase frame; ``None``: every row. Refused in one
    sentence when the frame has no such phase (a trace that is not a generate run's has none)."""
    if phase is None:
        return table
    if phase not in PHASES:
        raise AnalysisError(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    have = sorted(set(table["phase"]) - {""}) if "phase" in table else []
    if phase not in have:
        raise AnalysisError(f"phase {phase!r}: this trace's predict calls carry "
                            + (f"the phases {', '.join(have)}" if have else "no phase (only a generate run's "
                               "traced pass tags prefill and decode)"))
    attrs = table.attrs
    out = table[table["phase"] == phase].reset_index(drop=True)
    out.attrs = dict(attrs)
    return out


PHASE_COLOURS = {"prefill": PALETTE[0], "decode": PALETTE[4]}
"""The colour of each phase, in the order the phases run (the roofline's points, the timeline's bands)."""
