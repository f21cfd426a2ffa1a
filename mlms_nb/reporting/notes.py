"""A report's footnotes: each table's note (an analysis writes it as one paragraph of clauses, one line per
framework when a table holds several) shown as short numbered notes. Each distinct note is shown once in the whole
report, under the first table it explains; every table it explains names its number in its title (issue 37: the
same ceilings' method was repeated under every roofline table, a 25-line paragraph each time)."""
from __future__ import annotations

import html
from typing import Iterable, Sequence


def clauses(text: str) -> list[str]:
    """The clauses of a note: its lines, each cut at ``; `` outside parentheses (a clause's own ``(a; b)`` stays
    whole)."""
    out: list[str] = []
    for line in str(text or "").splitlines():
        depth, start = 0, 0
        for i, ch in enumerate(line):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth <= 0 and line.startswith("; ", i):
                out.append(line[start:i])
                start = i + 2
        out.append(line[start:])
    return [c.strip().rstrip(";").strip() for c in out if c.strip().rstrip(";").strip()]


def notes_of(text: str, frameworks: Iterable[str] = ()) -> list[str]:
    """The notes of one table's note text, in order. A note written once per framework (``torch: ...`` on one line,
    ``onnxruntime: ...`` on the next) gives each clause the lines share once, without a framework, and each other
    clause with its framework in front."""
    names = {str(f) for f in frameworks}
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    split = []
    for line in lines:
        head, sep, rest = line.partition(": ")
        split.append((head, clauses(rest)) if sep and head in names else ("", clauses(line)))
    per_framework = [parts for head, parts in split if head]
    shared = set.intersection(*map(set, per_framework)) if len(per_framework) > 1 else set()
    out: list[str] = []
    for head, parts in split:
        out += [part if (not head or part in shared) else f"{head}: {part}" for part in parts]
    return list(dict.fromkeys(out))


LONG_ASIDE = 200
"""A note's closing parenthesis holding more characters than this becomes a note of its own."""


def long_aside(note: str) -> tuple[str, str]:
    """``("head", "aside")`` when ``note`` ends with a parenthesis of more than :data:`LONG_ASIDE` characters, else
    ``(note, "")``."""
    if not note.endswith(")"):
        return note, ""
    depth = 0
    for i in range(len(note) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(note[i], 0)
        if depth == 0:
            inner = note[i + 1:-1].strip()
            return (note[:i].rstrip(), inner) if len(inner) > LONG_ASIDE and note[:i].strip() else (note, "")
    return note, ""


def numbers_text(numbers: Sequence[int]) -> str:
    """``[1, 3, 4, 5]`` -> ``"notes 1, 3-5"`` (``"note 2"`` for one)."""
    ns = sorted(set(numbers))
    if not ns:
        return ""
    runs, first = [], ns[0]
    for prev, cur in zip(ns, ns[1:] + [None]):
        if cur != prev + 1:
            runs.append(str(first) if first == prev else f"{first}-{prev}")
            first = cur
    return ("notes " if len(ns) > 1 else "note ") + ", ".join(runs)


class Footnotes:
    """The numbered notes of one report: each distinct note gets the next number the first time it is added."""

    def __init__(self, frameworks: Iterable[str] = ()):
        self.numbers: dict[str, int] = {}
        self.frameworks = list(frameworks)

    def add(self, text: str, whole: bool = False) -> tuple[list[int], list[tuple[int, str]]]:
        """The numbers of the notes in ``text`` (``whole``: ``text`` is one note, not cut into clauses), and the
        ones new to this report, ``(number, note)``, to be shown where they are first referenced."""
        refs, new = [], []
        for note in ([" ".join(str(text).split())] if whole else notes_of(text, self.frameworks)):
            head, aside = long_aside(note)
            if aside:  # a long closing aside (how a ceiling was measured) is a note of its own, told once
                note = f"{head} (see note {self._number(aside, new)})"
            if note:
                refs.append(self._number(note, new))
        return list(dict.fromkeys(refs)), new

    def _number(self, note: str, new: list[tuple[int, str]]) -> int:
        if note not in self.numbers:
            self.numbers[note] = len(self.numbers) + 1
            new.append((self.numbers[note], note))
        return self.numbers[note]


class NoteList:
    """Numbered notes shown under the table that first references them (small type, one per line)."""

    def __init__(self, notes: Sequence[tuple[int, str]]):
        self.notes = list(notes)

    def _repr_html_(self) -> str:
        items = "".join(f'<li value="{n}">{html.escape(text)}</li>' for n, text in self.notes)
        return f'<ol class="mlms-notes">{items}</ol>'

    def __repr__(self) -> str:
        return "\n".join(f"[{n}] {text}" for n, text in self.notes)


NOTES = Footnotes()
"""The report being made: :func:`start` numbers its notes from 1 (a report is one kernel's run of the template)."""


def start(frameworks: Iterable[str]) -> None:
    """A new report: its notes are numbered from 1; ``frameworks`` name the per-framework lines of a note."""
    global NOTES
    NOTES = Footnotes(frameworks)


def referenced(text: str, whole: bool = False) -> tuple[str, NoteList | None]:
    """``(" (notes 1, 3-5)", the new notes to show)`` for a note text of the report being made."""
    refs, new = NOTES.add(text, whole)
    return (f" ({numbers_text(refs)})" if refs else ""), (NoteList(new) if new else None)
