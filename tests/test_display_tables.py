"""Trace and analysis tables for people (issue 22, Deliver 3): digits from the measured spread, row by row; counts
and identifiers as integers; a trace's spans previewed in ms with units in the headers, within the width of an
A4 page. Issue 37, item 4: no word broken in a header or a cell, the key columns in every part of a split table,
the user's rounding and selection kept, every table the library returns formatted. Real frames: a Trace built from
a spans frame, the tracing-overhead, layer and roofline frames as the runs and analyses make them."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from mlms_nb.display import (Table, for_people, format_frame, overhead_frame, render_text, spans_for_people,
                             split_columns, spread_decimals, table_html, table_text)
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
    assert html.count("<tr>") <= (SHOWN_ROWS + 1) * html.count("<table") and "duration (ms)" in html
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


def test_a_ratio_and_its_interval_read_to_one_precision():
    """Columns read together share a precision, the finest of theirs: a latency ratio, its interval and the
    speedup it stands for (across agents: ``1.00`` beside ``0.568`` before), run A's and run B's throughput
    (``1.12`` beside ``0.514``)."""
    from mlms_nb.analyses import normalized

    latency = pd.DataFrame({"framework": ["torch"] * 2, "batch_size": [1, 1], "median_ms": [394.0, 693.0],
                            "median_ci_low_ms": [380.0, 600.0], "median_ci_high_ms": [410.0, 800.0]})
    runs = [type("Run", (), {"latency": latency.iloc[[i]], "agent": name})() for i, name in enumerate(["one", "two"])]
    table = normalized.compute(runs, by="agent")
    headers = ("latency ratio", "latency ratio low", "latency ratio high", "speedup")
    text = table_text(table[["agent", "framework", "batch_size", "latency_ratio", "latency_ratio_low",
                             "latency_ratio_high", "speedup"]])
    cells = [v for h in headers for v in _cells(text, h)]
    assert len(cells) == 8 and {len(v.split(".")[1]) for v in cells} == {3}, text
    assert _cells(text, "speedup") == ["1.000", "0.569"] and _cells(text, "latency ratio")[0] == "1.000"
    frame = pd.DataFrame({"framework": ["torch"], "a_throughput_per_s": [1.12], "b_throughput_per_s": [0.514]})
    text = table_text(frame)
    assert _cells(text, "a throughput (/s)") == ["1.120"] and _cells(text, "b throughput (/s)") == ["0.514"], text


# ---------------------------------------------------------------------------------------------- issue 37, item 4

E_NOTATION = re.compile(r"\d[eE][+-]?\d")


def layers_by_phase() -> pd.DataFrame:
    """A layer-latency-per-type table of a generate run as :func:`mlms_nb.analyses.layers.latency` makes it (the
    columns and order of notebook 09's): two ``Linear`` rows told apart only by their phase."""
    types = ["Conv1D", "Linear", "NewGELUActivation", "Embedding", "LayerNorm", "Dropout"]
    median = np.array([8.445, 2.854, 0.2286, 0.1131, 0.1077, 0.05269])
    n = len(types)
    return pd.DataFrame({
        "framework": ["torch"] * 2 * n, "batch_size": [1] * 2 * n, "phase": ["prefill"] * n + ["decode"] * n,
        "layer_type": types * 2, "repetitions": [1] * n + [3] * n, "calls_per_predict": [8.0, 1, 2, 2, 5, 5] * 2,
        "median_ms": np.r_[median, median / 7], "p25_ms": np.r_[median, median / 7.5],
        "p75_ms": np.r_[median, median / 6.5], "iqr_ms": np.r_[median * 0, median / 50],
        "mean_ms": np.r_[median, median / 7], "total_ms": np.r_[median, median / 7 * 3],
        "share_pct": np.r_[median, median / 7] * 7.6})


def html_cells(html: str) -> list[tuple[str, str, str]]:
    """(tag, style, inner HTML) of every header and cell of an HTML table."""
    return re.findall(r'<(th|td) class="\w+" style="([^"]*)">(.*?)</\1>', html)


def test_no_header_or_cell_breaks_inside_a_word():
    """Every header and text cell wraps between its words only (inline CSS, which JupyterLab keeps; print.css says
    the same), a number never wraps, a short word with a hyphen stays on one line; a long identifier gets break
    opportunities (<wbr>) only after its separators or between the 16-character groups of a hash, and reads
    whole; plain text never wraps."""
    path = "/root/.cache/mlms-nb/artifacts/efficientnet_lite0/onnxruntime/model.onnx"
    sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    frame = pd.DataFrame({"framework": ["onnxruntime-int8", "tensorflow"], "batch_size": [1, 8],
                          "phase": ["prefill", "decode"], "graph_path": [path, path], "sha256": [sha, sha],
                          "kv_cache_bytes_per_token_per_layer": [18432.0, 18432.0], "median_ms": [2.5, 20.25]})
    html = table_html(frame)
    assert "anywhere" not in html and "break-all" not in html
    cells = html_cells(html)
    assert len(cells) >= 3 * 7  # every header and cell found (the keys again in a second part)
    for tag, style, inner in cells:
        text = re.sub(r"<[^>]+>", "", inner)
        if style.startswith("text-align:right") and tag == "td":
            assert "white-space:nowrap" in style and "<wbr>" not in inner  # a number never wraps
        else:
            assert "overflow-wrap:normal" in style and "word-break:normal" in style, style
        for before, after in zip(inner.split("<wbr>"), inner.split("<wbr>")[1:]):
            hash_groups = len(before) >= 16 and before[-16:].isalnum() and after[:1].isalnum()
            assert not before[-1:].isalnum() or hash_groups, (before, after)  # after a separator, or a hash group
        assert "<wbr>" not in inner or len(text) > 24
    shown = [re.sub(r"<[^>]+>", "", inner) for _, _, inner in cells]
    assert '<span style="white-space:nowrap">onnxruntime-int8</span>' in html  # no break after its hyphen
    assert path in shown and sha in shown and "prefill" in shown and "onnxruntime-int8" in shown
    assert "kv cache (KiB/token/layer)" in shown and "batch size" in shown
    text = table_text(frame)
    assert path in text and sha in text and "kv cache (KiB/token/layer)" in text


def test_every_part_of_a_split_table_keeps_the_columns_that_tell_its_rows_apart():
    """Notebook 09's layers-by-phase table and notebook 05's per-layer table are wider than a page: every part
    starts with framework, batch size, phase and layer type (05: layer and layer type), in HTML and in plain text,
    so the prefill's and the decode's Linear rows stay apart; no maker had to name them (leading text columns)."""
    phases = for_people(layers_by_phase())
    keys = ["framework", "batch size", "phase", "layer type"]
    parts = [part.split("</thead>")[0] for part in phases._repr_html_().split('<table class="mlms-split"')[1:]]
    assert len(parts) >= 2
    for part in parts:
        assert [re.sub(r"<[^>]+>", "", inner) for _, _, inner in html_cells(part)][:4] == keys, part
    text = repr(phases)
    heads = [line for line in text.splitlines() if line.lstrip().startswith("framework")]
    assert len(heads) >= 2 and all(line.split()[:5] == ["framework", "batch", "size", "phase", "layer"] for line in heads)
    for block in text.split("\n\n"):
        rows = [line.split()[:5] for line in block.splitlines()[1:]]
        assert len({tuple(r) for r in rows}) == len(rows)  # each part's rows told apart by its keys
    layer = pd.DataFrame({"layer": [f"_blocks.{i}._project_conv" for i in range(3)], "layer_type": ["Conv2d"] * 3,
                          **{f"max_rel_error[torch~{fw}]": [1e-6, 2e-5, 3e-4] for fw in ("onnxruntime", "tensorflow",
                                                                                        "onnxruntime-int8")},
                          **{f"latency_ms[{fw}]": [0.3, 0.5, 0.2] for fw in ("torch", "onnxruntime", "tensorflow")}})
    for part in split_columns(format_frame(layer), max_chars=80):
        assert list(part.columns[:2]) == ["layer", "layer type"], list(part.columns)


def test_a_users_rounding_and_selection_are_what_the_display_shows():
    """``ev.latency[cols].round(3)`` shows three decimals (the spread's digits otherwise); a selection that drops
    the CI shows the digits the whole frame had, so one throughput reads the same in every view; a measured
    number keeps two figures at least (a throughput of 1.808/s whose CI allows one is 1.8, never 2)."""
    latency = for_people(pd.DataFrame({
        "framework": ["torch", "torch"], "batch_size": [1, 8], "samples": [20, 20],
        "median_ms": [1971.2, 4431.9], "median_ci_low_ms": [1500.0, 3200.0], "median_ci_high_ms": [2600.0, 5900.0],
        "iqr_ms": [900.0, 2100.0], "throughput_per_s": [0.51423, 1.80812]}))
    whole = repr(latency)
    assert _cells(whole, "throughput (/s)") == ["0.51", "1.8"], whole
    picked = repr(latency[["framework", "batch_size", "median_ms", "throughput_per_s"]])
    assert _cells(picked, "throughput (/s)") == ["0.51", "1.8"] and _cells(picked, "median (ms)") == ["1,971", "4,432"]
    rounded = latency[["framework", "batch_size", "median_ms", "iqr_ms", "throughput_per_s"]].round(3)
    text = repr(rounded)
    assert _cells(text, "throughput (/s)") == ["0.514", "1.808"] and _cells(text, "median (ms)") == ["1,971.200",
                                                                                                  "4,431.900"]
    assert ">1.808<" in rounded._repr_html_()
    some = repr(latency.round({"throughput_per_s": 1}))
    assert _cells(some, "throughput (/s)") == ["0.5", "1.8"] and _cells(some, "median (ms)") == ["1,971", "4,432"]
    sizes = for_people(pd.DataFrame({"name": ["a", "b"], "memory_bytes": [19613184.0, 4.0e6]})).round(1)
    assert _cells(repr(sizes), "memory (bytes)") == ["19,613,184.0", "4,000,000.0"]  # rounded: in its own unit


def test_a_selection_of_span_columns_shows_those_columns_in_their_units():
    """The whole spans frame previews in ms; a user's selection (``spans[["name", ..., "start_ns", "attrs"]]``)
    shows exactly what was selected: ns stay ns (not silently ms), ``attrs`` stays."""
    n = 70
    start = 1_795_450_502_467_845_000 + np.arange(n, dtype="int64") * 1_000
    trace = Trace(spans_frame({
        "span_id": np.arange(1, n + 1), "parent_id": np.zeros(n, dtype="int64"), "name": ["predict"] * n,
        "level": ["MODEL"] * n, "kind": ["model"] * n, "start_ns": start, "end_ns": start + 123_456,
        "attrs": ['{"framework": "torch", "batch": 1}'] * n}), metadata={"trace_id": "t"})
    picked = trace.spans[["name", "kind", "start_ns", "duration_ns", "attrs"]]
    text = repr(picked)
    assert "start (ns)" in text and "duration (ns)" in text and "attrs" in text and "(ms)" not in text, text
    assert _cells(text, "duration (ns)")[0] == "123,456" and '{"framework": "torch", "batch": 1}' in text
    assert "… and 10 more rows" in text
    html = picked._repr_html_()
    assert "start (ns)" in html and "framework" in html and "10 more rows" in html
    assert "start (ms)" in repr(trace.spans)  # the whole frame: the preview


def test_what_the_library_returns_is_formatted_no_e_notation_and_bytes_with_units():
    """Analysis tables (a roofline, a layer memory table), a counters summary grouped by the user and a text cut
    at a space: counts as integers, bytes and FLOPs with a prefix, never e-notation or six decimals."""
    from mlms_nb.analyses import batch_scaling, roofline
    from mlms_nb.schema.counters import counters_frame

    costs = pd.DataFrame({"layer_index": [0, 1], "layer_name": ["conv", "bn"], "layer_type": ["Conv2d", "BatchNorm"],
                          "flops": [3.1209e10, 4.0e6], "bytes": [40140800.0, 4.0e6]})
    latency = pd.DataFrame({"framework": "torch", "batch_size": 1, "layer_index": [0, 1], "name": ["conv", "bn"],
                            "layer_type": ["Conv2d", "BatchNorm"], "self_median_ms": [20.563934, 1.0],
                            "self_p25_ms": [19.0, 0.9], "self_p75_ms": [25.0, 1.2]})
    roof = roofline.compute(costs, latency, 1e11, 1e10)
    for shown in (repr(roof), roof._repr_html_(), repr(roof[["layer_name", "flops", "bytes", "median_ms"]])):
        assert not E_NOTATION.search(shown) and "20.563934" not in shown and "40140800" not in shown
    assert "flops (GFLOP)" in repr(roof) and "bytes (MiB)" in repr(roof)
    bs = np.array([1, 2, 4])
    median = bs / np.array([100.0, 180.0, 300.0]) * 1e3
    scaling = batch_scaling.compute(pd.DataFrame({
        "framework": "torch", "batch_size": bs, "scenario": "single-stream", "samples": 20, "median_ms": median,
        "median_ci_low_ms": median * 0.97, "median_ci_high_ms": median * 1.05, "throughput_per_s": 1e3 * bs / median}))
    assert "6.666667" not in repr(scaling) and not E_NOTATION.search(repr(scaling)) and "(ms)" in repr(scaling)
    counters = Trace(spans_frame({"span_id": [1], "parent_id": [0], "name": ["predict"], "level": ["MODEL"],
                                  "kind": ["model"], "start_ns": [0], "end_ns": [1]}),
                     counters=counters_frame({"ts_ns": [0, 1, 2], "source": ["perf"] * 3,
                                              "metric": ["instructions", "instructions", "cache-misses"],
                                              "value": [4.849145e8, 4.9e8, 0.0], "unit": ["count"] * 3,
                                              "device": ["cpu"] * 3}), metadata={"trace_id": "t"}).counters
    summary = counters.groupby(["source", "metric", "unit"], observed=True)["value"].agg(["count", "median"])
    assert not E_NOTATION.search(repr(summary)) and "487,457,250" in repr(summary), repr(summary)
    long = "a sentence of many words that is longer than the column allows for"
    cut = table_text(pd.DataFrame({"how": [long]}), max_text=30)
    assert "a sentence of many words…" in cut and "a sentence of many words t" not in cut
