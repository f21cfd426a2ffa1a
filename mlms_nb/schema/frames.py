"""How a frame's schema is written down: :class:`Column` (name, dtype, unit, meaning, when present) and
:class:`FrameSchema` (a frame's columns in order, the key of its rows, and the checks that hold a pandas frame to
them). :mod:`mlms_nb.schema.evaluation` declares the evaluation's frames with them.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlms_nb.errors import MlmsError


@dataclass(frozen=True)
class Column:
    """One column: its ``name``, the pandas ``dtype`` the runner gives it (``Int64``: integers that may be
    missing), its ``unit`` ("" when it has none) and what it means; ``when`` says when the column is present, if not
    always."""
    name: str
    dtype: str
    unit: str
    doc: str
    when: str = ""


class SchemaError(MlmsError, KeyError):
    """A column name that the evaluation schema does not define."""

    def __str__(self) -> str:  # KeyError would quote the sentence
        return str(self.args[0])


@dataclass(frozen=True)
class FrameSchema:
    """The columns of one evaluation frame, in order; ``key`` names the columns that identify a row."""
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def __getitem__(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise SchemaError(f"the {self.name} frame has no column {name!r}; it has: {', '.join(self.names)}")

    def pick(self, *names: str) -> tuple[str, ...]:
        """``names``, checked against the schema (a name it does not define raises `SchemaError`)."""
        return tuple(self[n].name for n in names)

    def frame(self, rows: list[dict]):
        """A pandas frame of ``rows`` with this schema's columns, in order, as its dtypes say."""
        import pandas as pd

        frame = pd.DataFrame(rows, columns=list(self.names))
        for column in self.columns:
            if column.dtype in ("int64", "Int64", "float64", "bool"):
                frame[column.name] = frame[column.name].astype(column.dtype)
        return frame

    def units(self) -> dict[str, str]:
        return {c.name: c.unit for c in self.columns if c.unit}

    def problems(self, frame) -> list[str]:
        """How ``frame`` departs from the schema: unknown or missing columns (those present always), wrong
        dtypes, columns out of order. Empty when it conforms (an empty frame with no columns conforms)."""
        if len(frame.columns) == 0:
            return []
        known = {c.name: c for c in self.columns}
        out = [f"{self.name}: unknown column {name!r}" for name in frame.columns if name not in known]
        out += [f"{self.name}: missing column {c.name!r}" for c in self.columns
                if not c.when and c.name not in frame.columns]
        for name in frame.columns:
            if name in known and str(frame[name].dtype) not in _DTYPES[known[name].dtype]:
                out.append(f"{self.name}: column {name!r} is {frame[name].dtype}, expected {known[name].dtype}")
        present = [n for n in self.names if n in frame.columns]
        if [n for n in frame.columns if n in known] != present:
            out.append(f"{self.name}: columns out of order; expected {present}")
        return out


_DTYPES = {"str": ("str", "object", "string"), "object": ("object",), "int64": ("int64",), "Int64": ("Int64",),
           "float64": ("float64",), "bool": ("bool",)}
"""The pandas dtypes each schema dtype accepts (text columns are ``str`` in pandas 3, ``object`` before)."""
