"""The Chrome/Kineto importer's fast path (tracing/chrome/rawfeed.py) gives the same frames as its per-event loop,
on Kineto-shaped traces holding each kind of args the fast path must either read right or hand back: ids of other
types, nested or escaped id keys, duplicated keys, floats, ids too long for int64, missing args, memory events with
missing fields, metadata/counter/begin-end events and GPU activity."""
from __future__ import annotations

import pandas as pd
import pytest

from mlms_nb.errors import TraceFormatError

from mlms_nb.tracing.chrome import importer, rawfeed


def _op(i: int, args: str, cat: str = "cpu_op", name: str = "aten::conv2d", ts: float = 0.0, pid="1",
        tid="1") -> str:
    return (f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid}, '
            f'"ts": {100 + i * 10 + ts}, "dur": 5.125, "args": {args}}}')


def _ordinary(n: int = 40) -> list[str]:
    """A small Kineto trace's events: nested ops with ids of growing digit counts, memory events."""
    out = []
    for i in range(n):
        ext = 7 ** (i % 12)
        out.append(_op(i, f'{{\n "External id": {ext},"Record function id": 0, "Concrete Inputs": ["", "[1, 1]"], '
                          f'"Input Dims": [[1, 3, {8 + i % 3}, 32], []], "Ev Idx": {i}\n}}'))
        out.append(_op(i, f'{{"External id": {ext + 1}, "Ev Idx": {1000 + i}}}', cat="user_annotation",
                       name="predict", ts=1))
        out.append(f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, '
                   f'"ts": {100 + i * 10 + 2}, "args": {{"Total Reserved": 0, "Total Allocated": {64 * i}, '
                   f'"Bytes": {64 if i % 2 else -64}, "Device Id": -1, "Device Type": 0, "Addr": {10 ** 14 + i}, '
                   f'"Ev Idx": {2000 + i}}}}}')
    return out


def _write(tmp_path, events: list[str], name: str = "t.json"):
    path = tmp_path / name
    path.write_text('{"schemaVersion": 1, "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n'
                    + ",\n".join(events) + '\n], "traceName": "x"}')
    return path


def _both(path, monkeypatch):
    """(fast frames, per-event frames, how many runs the fast path took)."""
    took = []
    real = rawfeed.feed_raw

    def counting(cols, run):
        ok = real(cols, run)
        took.append(ok)
        return ok

    def read():
        try:
            return importer.read_chrome(path)
        except TraceFormatError:  # both paths must refuse it
            return None

    monkeypatch.setattr(rawfeed, "feed_raw", counting)
    fast = read()
    monkeypatch.setattr(rawfeed, "feed_raw", lambda cols, run: False)
    ref = read()
    monkeypatch.setattr(rawfeed, "feed_raw", real)
    return fast, ref, sum(took)


def _assert_same(fast, ref):
    assert (fast is None) == (ref is None)
    if ref is None:
        return
    for a, b in zip(fast[:2], ref[:2]):
        a = a.drop(columns=["trace_id"], errors="ignore")
        b = b.drop(columns=["trace_id"], errors="ignore")
        pd.testing.assert_frame_equal(a, b)
    fm, rm = dict(fast[2]), dict(ref[2])
    fm.pop("trace_id"), rm.pop("trace_id")
    assert fm == rm


def test_an_ordinary_kineto_trace_takes_the_fast_path_and_gives_the_per_event_frames(tmp_path, monkeypatch):
    extra = ['{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}',
             '{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}',
             _op(90, '{"Op count": 0}', cat="Trace", name="PyTorch Profiler (0)", pid='"Spans"',
                 tid='"PyTorch Profiler"'),
             _op(91, '{"External id": 5, "flops": 1200, "Input Dims": [[2, 2]], "Sequence number": 12}'),
             _op(92, '{"External id" :  7 , "Fwd thread id": 0}'),
             _op(93, "{}"), _op(94, "null"),
             '{"ph": "X", "cat": "cpu_op", "name": "no_args", "pid": 1, "tid": 1, "ts": 95}',
             '{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 96, "args": {"Bytes": 8}}',
             '{"ph": "i", "name": "[memory]", "pid": "Mem", "tid": "Alloc", "ts": 96.5, "args": {"Bytes": 8}}',
             '{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 99}',
             '{"ph": "C", "name": "queue", "pid": 1, "ts": 97, "args": {"depth": 3}}',
             '{"ph": "B", "name": "step", "pid": 1, "tid": 2, "ts": 98}',
             '{"ph": "E", "pid": 1, "tid": 2, "ts": 99.5}']
    fast, ref, took = _both(_write(tmp_path, _ordinary() + extra), monkeypatch)
    assert took == 1
    _assert_same(fast, ref)
    spans = fast[0]
    assert spans["external_id"].max() == 7 ** 11 + 1 and (spans["ev_idx"] >= 0).sum() == 80
    assert len(fast[1]) == 2 * 42 + 1


@pytest.mark.parametrize("args", [
    '{"External id": -3, "Ev Idx": 1}',                 # negative: stays in attrs
    '{"External id": "12", "Ev Idx": 1}',               # a string
    '{"External id": 12.5}',                            # a float
    '{"External id": 12e3}',
    '{"External id": 123456789012345678901}',           # beyond int64
    '{"External id": 1234567890123456789}',             # 19 digits, within int64
    '{"x": {"External id": 3}, "Ev Idx": 2}',           # nested: not an id
    '{"External\\u0020id": 5, "x": {"External id": 7}}',  # escaped key spelling
    '{"External id": 1, "External id": 2}',             # duplicated key
    '{"My External id": 4, "Ev Idx": 3}',               # another key ending in an id key's name
    '{"name": "External id", "Ev Idx": 9}',             # an id key's name as a value
    '{"External id": true}', '{"External id": null}',
    '[1, 2]', '"text"',
])
def test_args_the_fast_path_must_read_right_or_hand_back(tmp_path, monkeypatch, args):
    events = _ordinary(6) + [_op(50, args), _op(51, args.replace("2", "3"))]
    fast, ref, _ = _both(_write(tmp_path, events), monkeypatch)
    _assert_same(fast, ref)


@pytest.mark.parametrize("event", [
    '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 101, "dur": 1, '
    '"args": {"device": 0, "stream": 7, "correlation": 11, "External id": 3}}',
    '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 100.5, "dur": 1, '
    '"args": {"correlation": 11, "External id": 3}}',
    '{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 96, "args": {"Bytes": "eight"}}',
    '{"ph": "X", "cat": "cpu_op", "name": 5, "pid": 1, "tid": 1, "ts": 96}',
    '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1.5, "tid": 1, "ts": 96}',
    '{"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 96, "cat": "ac2g", "name": "flow"}',
])
def test_events_of_other_kinds_give_the_per_event_frames(tmp_path, monkeypatch, event):
    fast, ref, _ = _both(_write(tmp_path, _ordinary(6) + [event]), monkeypatch)
    _assert_same(fast, ref)


def test_a_trace_of_many_runs_is_read_in_every_run(tmp_path, monkeypatch):
    """Runs of a few events; an id key that first appears late (not blanked in its first run, since the keys to
    blank are those of the runs before) still lands in its column."""
    late = [_op(400 + i, f'{{"External id": {i}, "Sequence number": {10 ** (i % 9)}, "Ev Idx": {i}}}')
            for i in range(60)]
    path = _write(tmp_path, _ordinary(300) + late)
    monkeypatch.setattr(importer, "BLOCK_BYTES", 4096)
    fast, ref, took = _both(path, monkeypatch)
    assert took > 10
    _assert_same(fast, ref)
    assert (fast[0]["sequence_number"] >= 0).sum() == 60
