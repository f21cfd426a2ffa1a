"""Stream the event array of a JSON trace file in parsed chunks, without holding the whole file or its
whole object tree in memory.

A vectorised scanner (numpy over each block of bytes) tracks string state and bracket depth, finds the event
array (the top-level array, or the ``"traceEvents"`` array of a top-level object) and the end of every event
in it; each run of whole events is handed to :func:`orjson.loads` as one small JSON array. The bytes outside
the event array are parsed at the end as the file's *skeleton* (``{"schemaVersion": 1, ..., "traceEvents":
[]}``). Anything malformed raises :class:`~mlms_nb.tracing.errors.TraceFormatError` naming the file and the
byte offset.
"""
from __future__ import annotations

import gzip
import io
import os
from typing import Iterator

import numpy as np
import orjson

from .errors import TraceFormatError

_QUOTE, _BSLASH, _OPEN, _CLOSE = 1, 2, 3, 4
_LUT = np.zeros(256, np.uint8)
_LUT[ord('"')] = _QUOTE
_LUT[ord("\\")] = _BSLASH
_LUT[ord("{")] = _OPEN
_LUT[ord("[")] = _OPEN
_LUT[ord("}")] = _CLOSE
_LUT[ord("]")] = _CLOSE
_TRANSLATE = bytes(_LUT.tolist())
_WS = b" \t\r\n"
_LBRACE, _LBRACKET, _RBRACE = ord("{"), ord("["), ord("}")


def open_trace_file(path) -> io.BufferedIOBase:
    """Open a trace file for reading bytes; gzip files (by magic number) are decompressed on the fly."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise TraceFormatError(f"trace file {os.fspath(path)!r} does not exist") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{os.fspath(path)!r} is a directory, not a JSON trace file") from None
    magic = f.peek(2)[:2] if hasattr(f, "peek") else b""
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


class EventStream:
    """``for events in EventStream(path): ...`` yields lists of parsed events (whatever JSON values the
    event array holds), in file order. ``header`` (the top-level object's keys before the event array, a
    dict; ``{}`` for a top-level array) is set before the first chunk is yielded; ``skeleton`` (the whole
    top-level value with an empty event array) and ``top`` (``"object"`` / ``"array"``) after the last."""

    def __init__(self, path, *, block_size: int = 8 << 20):
        self.path = os.fspath(path)
        self.block_size = block_size
        self.header: dict = {}
        self.skeleton = None
        self.top: str | None = None
        self.events_seen = 0

    def _fail(self, what: str) -> TraceFormatError:
        return TraceFormatError(f"trace file {self.path!r} is not a valid trace: {what}")

    # -------------------------------------------------------------------------------------- block scanning

    def _structural(self, block: bytes, in_str: bool, bs_carry: int):
        """Structural characters of ``block`` (outside strings): (positions, chars, +1/-1), and the string
        state / trailing backslash run carried to the next block."""
        cls = np.frombuffer(block.translate(_TRANSLATE), np.uint8)
        idx = np.flatnonzero(cls)
        t = cls[idx]
        is_bs = t == _BSLASH
        if bs_carry or is_bs.any():
            q, bs_carry = self._unescaped_quotes(idx, t, is_bs, bs_carry, len(block))
        else:
            q = t == _QUOTE
            bs_carry = 0
        qcount = np.cumsum(q, dtype=np.int64)
        inside = ((qcount - q) & 1).astype(bool)
        if in_str:
            inside = ~inside
        struct = (t >= _OPEN) & ~inside
        new_in_str = in_str ^ bool(qcount[-1] & 1) if len(qcount) else in_str
        sidx = idx[struct]
        delta = np.where(t[struct] == _OPEN, 1, -1).astype(np.int64)
        chars = np.frombuffer(block, np.uint8)[sidx]
        return sidx, chars, delta, new_in_str, bs_carry

    @staticmethod
    def _unescaped_quotes(idx, t, is_bs, bs_carry: int, n: int):
        """Which quotes are not escaped (an even run of backslashes, possibly begun in the previous block,
        precedes them), and the length of the backslash run at the end of the block."""
        m = len(idx)
        k = np.arange(m)
        prev_adj = np.zeros(m, bool)
        prev_adj[1:] = idx[1:] == idx[:-1] + 1
        prev_bs = np.zeros(m, bool)
        prev_bs[1:] = is_bs[:-1]
        run_start = is_bs & ~(prev_adj & prev_bs)
        start_k = np.maximum.accumulate(np.where(run_start, k, -1))
        runlen = k - start_k + 1
        if bs_carry and m and idx[0] == 0 and is_bs[0]:
            runlen[start_k == 0] += bs_carry
        escaped = np.zeros(m, bool)
        escaped[1:] = prev_adj[1:] & prev_bs[1:] & ((runlen[:-1] & 1) == 1)
        if bs_carry & 1 and m and idx[0] == 0 and t[0] == _QUOTE:
            escaped[0] = True
        q = (t == _QUOTE) & ~escaped
        new_carry = int(runlen[-1]) if m and is_bs[-1] and idx[-1] == n - 1 else 0
        return q, new_carry

    # -------------------------------------------------------------------------------------- chunk parsing

    def _parse_chunk(self, raw: bytes, abs_start: int) -> list:
        body = raw.lstrip(_WS + b",")
        if not body.strip(_WS):
            return []
        try:
            out = orjson.loads(b"[" + body + b"]")
        except orjson.JSONDecodeError as exc:
            where = abs_start + (len(raw) - len(body)) + max(getattr(exc, "pos", 1) - 1, 0)
            raise self._fail(f"malformed JSON in the event array near byte {where} ({exc.msg})") from None
        self.events_seen += len(out)
        return out

    def _is_events_key(self, head: bytes) -> bool:
        head = head.rstrip(_WS)
        if not head.endswith(b":"):
            return False
        return head[:-1].rstrip(_WS).endswith(b'"traceEvents"')

    # -------------------------------------------------------------------------------------- the stream

    def __iter__(self) -> Iterator[list]:
        f = open_trace_file(self.path)
        try:
            yield from self._run(f)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise self._fail(f"it could not be read ({exc})") from None
        finally:
            f.close()

    def _run(self, f) -> Iterator[list]:
        in_str, bs_carry, depth = False, 0, 0
        phase = 0  # 0: before the event array, 1: inside it, 2: after it
        arr_depth = 0
        buf = b""  # bytes not yet handed on; buf[0] is at absolute offset buf_abs
        buf_abs = 0
        scanned = 0  # absolute offset of the next byte to scan
        head = b""
        tail = []
        while True:
            block = f.read(self.block_size)
            if not block:
                break
            if phase == 2:
                tail.append(block)
                continue
            buf += block
            pos, chars, delta, in_str, bs_carry = self._structural(block, in_str, bs_carry)
            pos += scanned
            scanned += len(block)
            if not len(pos):
                continue
            dep = np.cumsum(delta) + depth
            depth = int(dep[-1])
            if (dep < 0).any():
                raise self._fail(f"a bracket closes nothing near byte {int(pos[np.argmax(dep < 0)])}")
            i = 0
            if phase == 0:
                if self.top is None:
                    first = buf[: int(pos[0]) - buf_abs].strip(_WS)
                    if first.startswith(b"\xef\xbb\xbf"):
                        first = first[3:].strip(_WS)
                    if first:
                        raise self._fail("it does not start with a JSON object or array")
                    if chars[0] == _LBRACKET:
                        self.top, arr_depth = "array", 1
                    elif chars[0] == _LBRACE:
                        self.top, arr_depth = "object", 2
                    else:
                        raise self._fail("it does not start with a JSON object or array")
                if self.top == "array":
                    k = 0
                else:
                    k = None
                    for j in np.flatnonzero((chars == _LBRACKET) & (dep == 2)).tolist():
                        if self._is_events_key(buf[: int(pos[j]) - buf_abs]):
                            k = j
                            break
                if k is None:
                    continue
                cut = int(pos[k]) + 1 - buf_abs
                head, buf, buf_abs = buf[:cut], buf[cut:], int(pos[k]) + 1
                if self.top == "object":
                    try:
                        self.header = orjson.loads(head + b"]}")
                    except orjson.JSONDecodeError as exc:
                        raise self._fail(f"malformed JSON before the traceEvents array ({exc.msg})") from None
                phase, i = 1, k + 1
            if phase == 1:
                sub_dep = dep[i:]
                ends = np.flatnonzero(sub_dep == arr_depth - 1)
                stop = int(ends[0]) + i if len(ends) else len(dep)
                ev_ends = np.flatnonzero((chars[i:stop] == _RBRACE) & (dep[i:stop] == arr_depth))
                if len(ev_ends):
                    last = int(pos[int(ev_ends[-1]) + i])
                    cut = last + 1 - buf_abs
                    chunk, buf = buf[:cut], buf[cut:]
                    start_abs, buf_abs = buf_abs, last + 1
                    events = self._parse_chunk(chunk, start_abs)
                    del chunk
                    if events:
                        yield events
                    del events
                if len(ends):
                    arr_end = int(pos[stop])
                    cut = arr_end - buf_abs
                    chunk, rest = buf[:cut], buf[cut + 1:]
                    events = self._parse_chunk(chunk, buf_abs)
                    if events:
                        yield events
                    del events, chunk
                    tail.append(rest)
                    buf = b""
                    phase = 2
        if phase != 2:
            where = "before its event array" if phase == 0 and self.top is None else (
                "without a traceEvents array" if phase == 0 else
                f"inside the event array after {self.events_seen} events")
            if phase == 0 and self.top == "object" and depth == 0 and not in_str:
                raise self._fail("it is a JSON object without a \"traceEvents\" array")
            if phase == 0 and self.top is None:
                raise self._fail("it is empty" if scanned == 0 else "it holds no JSON object or array")
            raise TraceFormatError(f"trace file {self.path!r} is truncated: it ends {where}")
        rest = b"".join(tail)
        try:
            self.skeleton = orjson.loads(head + b"]" + rest)
        except orjson.JSONDecodeError as exc:
            if self.top == "object" and not rest.rstrip(_WS).endswith(b"}"):
                raise TraceFormatError(f"trace file {self.path!r} is truncated: it ends after its event array "
                                       f"without closing the top-level {self.top}") from None
            raise self._fail(f"malformed JSON after the event array ({exc.msg})") from None
