"""Reading a manifest's YAML within bounds, so that no file can crash or exhaust the process.

A manifest is refused with a `ManifestError` (one sentence, with the line and column where there is
one) when it is:

- larger than `MAX_BYTES` (1 MiB; the built-in manifests are under 2 KiB), or not a regular file;
- not UTF-8 text;
- nested deeper than `MAX_DEPTH` (50) mappings/sequences. This is checked on PyYAML's event stream,
  which is iterative, before anything recursive (composing, constructing, validating) sees the tree;
- larger than `MAX_VALUES` (100,000) values once its aliases are expanded: an alias (``*a``) counts
  as the whole node its anchor (``&a``) names, so a "billion laughs" is refused after a few hundred
  events, in microseconds and without allocating it; an alias inside the node it refers to (a
  recursive structure) is refused too;
- holding a value YAML cannot construct (``2001-13-45`` as a date, ``!!float abc``) or an integer beyond
  ±2^128 (Python could not even print it in decimal past 4,300 digits);
- holding the same key twice in one mapping (YAML would keep the last one silently); the message
  names the key's path (``framework.name``). Merge keys (``<<``) are not duplicates.

Only PyYAML's safe loader is used (no Python tags); its C version when it is installed.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from mlms_nb.errors import ManifestError

MAX_BYTES = 1 << 20
MAX_DEPTH = 50
MAX_VALUES = 100_000
MAX_INT_BITS = 128

_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# The event walk uses PyYAML's pure-Python parser: it is iterative with no depth limit of its own, so the depth
# check below always answers first with the node's path. libyaml (PyYAML >= 6.0.3's C parser) has a nesting limit
# of its own that it checks while scanning ahead, before any event reaches us.
_EVENT_PARSER = yaml.SafeLoader


class _Loader(_PARSER):
    """The safe loader, whose constructor's own failures (``2001-13-45`` as a date, a 5,000-digit int, ``!!float
    abc``: ValueError and the like) become YAML errors at the node's line and column."""

    def construct_object(self, node, deep=False):
        try:
            value = super().construct_object(node, deep=deep)
            if type(value) is int and value.bit_length() > MAX_INT_BITS:  # 0xfff...: no decimal-digit limit applies
                raise ValueError(f"integers beyond ±2^{MAX_INT_BITS} are not supported")
            return value
        except yaml.YAMLError:
            raise
        except Exception as err:  # noqa: BLE001 - PyYAML's constructors raise ValueError, AttributeError, ...
            value = node.value if isinstance(node.value, str) else node.tag
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value {value[:40]!r} ({str(err)[:120]})", node.start_mark) from None


_LOADER = _Loader


def read_manifest_yaml(path: str | os.PathLike) -> Any:
    """The YAML data of the manifest file at ``path``, read within the bounds above."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file; a manifest is a YAML file")
        if st.st_size > MAX_BYTES:
            raise ManifestError(_too_big(path, st.st_size))
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise ManifestError(f"{path}: cannot read the manifest ({err.strerror or err})") from None
    if len(raw) > MAX_BYTES:  # grew since the stat
        raise ManifestError(_too_big(path, len(raw)))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _line_column(raw, err.start)
        raise ManifestError(f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line}, column {column}); "
                            "save the file as UTF-8") from None
    return parse_yaml_text(text, str(path))


def parse_yaml_text(text: str, where: str = "<manifest>") -> Any:
    """The YAML data of ``text``, checked by `check_events` first; ``where`` prefixes every message."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ManifestError(_too_big(where, len(text.encode("utf-8", "surrogatepass"))))
    try:
        check_events(text, where)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as err:
        raise ManifestError(f"{where}: not valid YAML{_mark(err, text)}: {_problem(err)}") from None


def _too_big(where: Any, size: int) -> str:
    return (f"{where}: the file is {size:,} bytes, over the {MAX_BYTES:,}-byte (1 MiB) limit for a manifest; "
            "keep large data in asset files")


class _Frame:
    __slots__ = ("is_map", "anchor", "values", "keys", "key", "expect_key", "index")

    def __init__(self, is_map: bool, anchor: str | None):
        self.is_map, self.anchor, self.values = is_map, anchor, 1
        self.keys: dict[str, int] = {}
        self.key: Any = None  # the current key (mapping) or index (sequence): this frame's path component
        self.expect_key = True
        self.index = -1


def check_events(text: str, where: str = "<manifest>") -> None:
    """Walk the YAML event stream once, refusing deep nesting, alias blow-up and duplicate keys."""
    stack: list[_Frame] = []
    sizes: dict[str, int] = {}  # anchor -> values it expands to
    total = 0
    last_alias: tuple[str, Any] | None = None
    for event in yaml.parse(text, Loader=_EVENT_PARSER):
        kind = type(event)
        if kind in (yaml.MappingStartEvent, yaml.SequenceStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise ManifestError(
                    f"{where}: {_path(stack) or 'the document'} nests deeper than {MAX_DEPTH} levels "
                    f"(line {event.start_mark.line + 1}, column {event.start_mark.column + 1}); "
                    "a manifest needs only a few levels")
            _enter_node(stack, where, event, None)
            stack.append(_Frame(kind is yaml.MappingStartEvent, event.anchor))
            total += 1
        elif kind in (yaml.MappingEndEvent, yaml.SequenceEndEvent):
            frame = stack.pop()
            if frame.anchor is not None:
                sizes[frame.anchor] = frame.values
            if stack:
                stack[-1].values += frame.values
        elif kind is yaml.ScalarEvent:
            _enter_node(stack, where, event, event.value)
            if event.anchor is not None:
                sizes[event.anchor] = 1
            if stack:
                stack[-1].values += 1
            total += 1
        elif kind is yaml.AliasEvent:
            _enter_node(stack, where, event, f"*{event.anchor}")
            if any(f.anchor == event.anchor for f in stack):
                raise ManifestError(
                    f"{where}: {_path(stack)}: alias *{event.anchor} at line {event.start_mark.line + 1}, column "
                    f"{event.start_mark.column + 1} is inside the node it refers to (a recursive structure); "
                    "remove the alias")
            size = sizes.get(event.anchor, 1)
            if stack:
                stack[-1].values += size
            total += size
            last_alias = (event.anchor, event.start_mark)
        else:
            continue
        if total > MAX_VALUES:
            if last_alias is not None:
                anchor, mark = last_alias
                raise ManifestError(
                    f"{where}: the YAML expands to more than {MAX_VALUES:,} values through its aliases "
                    f"(*{anchor} at line {mark.line + 1}, column {mark.column + 1} repeats its anchor's content); "
                    "a manifest needs far fewer, so remove the anchors and aliases")
            raise ManifestError(f"{where}: the YAML holds more than {MAX_VALUES:,} values; "
                                "a manifest needs far fewer, so keep large data in asset files")


def _enter_node(stack: list[_Frame], where: str, event: Any, scalar: str | None) -> None:
    """Account for a node starting inside the top frame: a mapping key (checked for duplicates) or a value."""
    if not stack:
        return
    top = stack[-1]
    if not top.is_map:
        top.index += 1
        top.key = top.index
        return
    if not top.expect_key:
        top.expect_key = True
        return
    top.expect_key = False
    if scalar is None:  # a mapping or sequence used as a key (the constructor refuses it)
        top.key = "?"
        return
    line = event.start_mark.line + 1
    if scalar != "<<" and scalar in top.keys:
        top.key = scalar
        raise ManifestError(
            f"{where}: {_path(stack)}: duplicate key at line {line}, column {event.start_mark.column + 1} "
            f"(first at line {top.keys[scalar]}); remove one of them")
    top.keys.setdefault(scalar, line)
    top.key = scalar


def _path(stack: list[_Frame]) -> str:
    """``framework.name`` / ``preprocess[2].resize`` for the node being read."""
    parts = []
    for frame in stack:
        key = frame.key
        if key is None:
            break
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            text = key if key and key.isprintable() and len(key) <= 60 else repr(key[:60])
            parts.append(f".{text}" if parts else text)
    if len(parts) > 8:  # a deep path: its start, how deep, its end
        parts = parts[:4] + [f"…({len(parts) - 6} more levels)…"] + parts[-2:]
    return "".join(parts)


def _line_column(data: bytes | str, offset: int) -> tuple[int, int]:
    before = data[:offset]
    newline = b"\n" if isinstance(data, bytes) else "\n"
    line = before.count(newline) + 1
    return line, offset - (before.rfind(newline) + 1) + 1


def _mark(err: yaml.YAMLError, text: str) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if mark is not None:
        return f" at line {mark.line + 1}, column {mark.column + 1}"
    position = getattr(err, "position", None)  # ReaderError: a character offset
    if isinstance(position, int):
        line, column = _line_column(text, position)
        return f" at line {line}, column {column}"
    return ""


def _problem(err: yaml.YAMLError) -> str:
    problem = getattr(err, "problem", None)
    if problem:
        return str(problem)
    if isinstance(err, yaml.reader.ReaderError):
        return f"character #x{err.character:04x} is not allowed in YAML" if isinstance(err.character, int) else err.reason
    return str(err).split("\n")[0]
