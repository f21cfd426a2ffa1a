"""Trace and analysis tables for people (issue 22, Deliver 3): digits from the measured spread, row by row; counts
and identifiers as integers; a trace's spans previewed in ms with units in the headers, within the width of an
A4 page. Real frames: a Trace built from a spans frame, the tracing-overhead and layer frames as the runs make them."""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb.display import (Table, overhead_frame, render_text, spans_for_people, spread_decimals,
                             table_html, table_text)
from mlms_nb.display.columns import MAX_CHARS
from mlms_nb.display.people import SHOWN_ROWS
from mlms_nb.schema.spans import spans_frame
from mlms_nb.tracing.trace import Trace


def _cells(text: str, header: str) -> list[str]:
    """The cells of one column of a plain-text table (right-aligned under its header)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if f"  {header}" in f"  {line}")
    end = f"  {lines[head]}".index(f"  {header}") + len(header)
    out = []
    for line in lines[head + 1:]:
        if not line.strip():
            break
        out.append(line[:end].split()[-1])
    return out


def test_layer_rows_read_to_the_place_their_own_notch_supports():
    """A layer table has the median, the IQR and the repetitions but no bootstrap CI: the box plot's notch
    (1.57 IQR / sqrt(n)) stands in, per row. 0.39912 ms with IQR 0.001 over 25 calls has 3 figures (0.399);
    8.1234 ms with IQR 4 over 5 calls has 1, shown with the 2 every measured number keeps (8.1: "8" would read as
    a whole number); the prefixed self-time columns follow their own spread."""
    frame = pd.DataFrame({"layer_index": [0, 1], "name": ["conv", "gemm"], "repetitions": [25, 5],
                          "median_ms": [0.39912, 8.1234], "p25_ms": [0.3987, 6.0], "p75_ms": [0.3997, 10.0],
                          "iqr_ms": [0.001, 4.0], "self_median_ms": [0.21234, 8.1234], "self_iqr_ms": [0.1, 0.01]})
    text = table_text(frame)
    assert _cells(text, "median (ms)")[:2] == ["0.399", "8.1"], text
    assert _cells(text, "p75 (ms)") == ["0.400", "10.0"]
    assert _cells(text, "self median (ms)") == ["0.21", "8.12"], text
    assert "self IQR (ms)" in text and "repetitions" in text and _cells(text, "repetitions") == ["25", "5"]


def test_tracing_overhead_medians_read_to_their_noise():
    """The overhead's noise (the two medians' CI half-widths over each median, summed) bounds each median's
    relative spread: +-117% leaves 1 figure (223.4 -> 223: never rounded left of the point), +-0.5% leaves 2."""
    frame = pd.DataFrame({"framework": ["torch", "onnxruntime"], "batch_size": [1, 1],
                          "trace_level": ["FRAMEWORK"] * 2, "untraced_median_ms": [223.4123, 2.171234],
                          "traced_median_ms": [145.9321, 2.27891], "traced_calls": [5, 5],
                          "overhead_pct": [-34.7, 4.96], "noise_pct": [117.5, 0.5]})
    text = render_text(Table(overhead_frame(frame), "Tracing overhead"))
    assert _cells(text, "untraced median (ms)") == ["223", "2.2"], text
    assert _cells(text, "traced median (ms)") == ["146", "2.3"]
    assert _cells(text, "traced calls") == ["5", "5"] and "within noise (±117.5%)" in text and "+5.0% (±0.5%)" in text


def test_a_range_beside_a_rate_gives_its_digits_in_the_columns_scale():
    """A roofline point's achieved rate between its p25 and p75 rates (``achieved_low/high_flops_per_s``) reads to
    the figures that range supports (two at least), after the column is scaled to GFLOP/s."""
    frame = pd.DataFrame({"layer_index": [0, 1], "achieved_flops_per_s": [42.123e9, 6.2e9],
                          "achieved_low_flops_per_s": [42.10e9, 5.0e9], "achieved_high_flops_per_s": [42.15e9, 7.5e9]})
    text = table_text(frame)
    assert "achieved (GFLOP/s)" in text and _cells(text, "achieved (GFLOP/s)") == ["42.1", "6.2"], text
    assert set(spread_decimals(frame)) == {"achieved_flops_per_s", "achieved_low_flops_per_s",
                                           "achieved_high_flops_per_s"}


def test_trace_spans_preview_in_ms_with_ids_whole_and_a_cell_wide():
    """``trace.spans`` shows itself as a preview (name, level, kind, start and duration in ms, layer index as an
    integer or '-') of its first rows; the frame keeps its ns columns and every pandas operation; thread ids and
    span ids have no thousands separators; every text line fits an A4 page / a notebook cell."""
    n = 5000
    start = 1_795_450_502_467_845_000 + np.arange(n, dtype="int64") * 1_234_567
    trace = Trace(spans_frame({
        "span_id": np.arange(1, n + 1), "parent_id": np.zeros(n, dtype="int64"),
        "name": [f"_blocks.{i % 16}._project_conv" for i in range(n)], "level": ["FRAMEWORK"] * n,
        "kind": ["layer"] * n, "start_ns": start, "end_ns": start + 123_456 + np.arange(n) * 1000,
        "thread": [123456] * n, "layer_index": [i % 53 if i % 7 else -1 for i in range(n)],
        "layer_type": ["Conv"] * n}), metadata={"trace_id": "t"})
    spans = trace.spans
    assert "duration_ns" in spans.columns and spans["duration_ns"].dtype == "int64"
    text = repr(spans)
    assert "start (ms)" in text and "duration (ms)" in text and "e+" not in text and "e-" not in text
    assert _cells(text, "duration (ms)")[:2] == ["0.123", "0.124"], text
    assert _cells(text, "start (ms)")[:2] == ["0.000", "1.235"]
    assert _cells(text, "layer index")[:2] == ["-", "1"]
    assert "123456" in text and "123,456" not in text
    assert f"the first {SHOWN_ROWS} of 5,000 spans" in text
    assert max(len(line) for line in text.splitlines() if "spans;" not in line) <= MAX_CHARS
    derived = spans[spans["layer_index"] >= 0]
    assert type(derived) is type(spans) and len(derived) < n and "duration (ms)" in repr(derived)
    grouped = spans.groupby("name", observed=True)[["duration_ns"]].sum()
    assert "duration (ns)" in repr(grouped)  # not spans any more: shown as a plain people frame
    html = spans._repr_html_()
    assert html.count("<tr>") <= SHOWN_ROWS + 2 and "duration (ms)" in html
    assert "123456" in table_html(spans_for_people(spans[["span_id", "thread"]]))


def test_a_long_format_value_reads_in_its_units_prefix_to_its_iqr():
    """The machine ceilings (one row per metric: value, iqr, unit) read 76.5 GFLOP/s, not 76,513,947,298 FLOP/s;
    each value to the figures half its IQR allows; a unit without a prefix (FLOP/byte) is left as it is."""
    frame = pd.DataFrame({"framework": ["torch"] * 3, "metric": ["peak_flops_per_s", "copy_bytes_per_s", "ridge"],
                          "value": [76_513_947_298.0, 24_777_105_287.0, 3.0876], "iqr": [43_413_207.0, 7.37e9, np.nan],
                          "unit": ["FLOP/s", "bytes/s", "FLOP/byte"]})
    text = table_text(frame)
    assert _cells(text, "unit") == ["GFLOP/s", "GB/s", "FLOP/byte"], text
    assert _cells(text, "value") == ["76.5", "25", "3.09"], text
    assert "76,513" not in text and frame["value"].iloc[0] == 76_513_947_298.0  # the frame keeps its numbers
