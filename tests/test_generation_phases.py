"""Introspection of a generate run by phase (issue 21, item 5): the zoo's tiny GPT-2 decoder generated at trace level
FRAMEWORK in PyTorch (random weights from its config, few tokens), its layer latency per phase (the prefill apart
from the decode steps, which are aggregated with their spread), its roofline per phase (costs at each phase's
shapes: decode is one token against the KV cache, so it is memory-bound), through the facade and the options; the
layers-by-phase table printed to PDF (issue 37, item 4: no word broken, the phase in every part)."""
from __future__ import annotations

import os
import shutil

import pytest

import mlms_nb
from mlms_nb.errors import MlmsError

FAST = dict(warmup=1, min_repeats=2, min_time_s=0, threads=1, progress=False)
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import os

    old = os.environ.get("MLMS_HOME")
    os.environ["MLMS_HOME"] = str(tmp_path_factory.mktemp("home"))
    try:
        yield mlms_nb.evaluate("tiny_gpt2", scenario="generate", batch_sizes=2, kv_cache="on",
                               max_new_tokens=NEW_TOKENS, trace_level="FRAMEWORK", history=False, **FAST)
    finally:
        if old is None:
            os.environ.pop("MLMS_HOME", None)
        else:
            os.environ["MLMS_HOME"] = old


def test_layer_latency_is_per_phase_with_the_decode_steps_aggregated(run):
    table = mlms_nb.layers(run).table
    assert list(dict.fromkeys(table["phase"])) == ["prefill", "decode"]  # as they ran
    reps = table.groupby("phase")["repetitions"].max()
    assert reps["prefill"] == 1 and reps["decode"] == NEW_TOKENS - 1  # one traced batch: 1 prefill, 3 decode steps
    assert (table["framework"] == "torch").all()
    decode = table[table["phase"] == "decode"]
    assert (decode["self_p25_ms"] <= decode["self_median_ms"]).all()
    assert (decode["self_median_ms"] <= decode["self_p75_ms"]).all()
    assert "decode step" in table.attrs["note"]
    # a phase alone, and the per-type and occurrence tables carry the phase too
    assert set(mlms_nb.layers(run, phase="decode").table["phase"]) == {"decode"}
    assert set(mlms_nb.layers(run, by="type").table["phase"]) == {"prefill", "decode"}
    assert set(mlms_nb.layers(run, what="occurrence").table["phase"]) == {"prefill", "decode"}


def test_layer_phase_charts_put_the_phases_side_by_side(run):
    figure = mlms_nb.layers(run).plot(backend="matplotlib")
    titles = [ax.get_title().replace("\n", " ") for ax in figure.axes]
    assert len(titles) == 2 and "prefill" in titles[0] and "decode" in titles[1]
    left, right = (ax.get_position() for ax in figure.axes)
    assert right.x0 > left.x1  # side by side, not one under the other


def test_a_phase_on_a_trace_without_phases_is_refused_in_one_sentence():
    from mlms_nb.analyses.layers import only_phase
    import pandas as pd

    with pytest.raises(MlmsError, match="phase") as err:
        only_phase(pd.DataFrame({"framework": ["torch"], "layer_index": [0]}), "decode")
    assert "\n" not in str(err.value)


def test_roofline_per_phase_shows_decode_memory_bound_and_keeps_the_roof_check(run):
    table = mlms_nb.roofline(run).table
    assert set(table["phase"]) == {"prefill", "decode"}
    costed = table[table["flops"] > 0]
    ridge = table.attrs["ridge_flop_per_byte"]
    decode, prefill = costed[costed["phase"] == "decode"], costed[costed["phase"] == "prefill"]
    assert (decode["bound"] == "memory").all() and (decode["intensity_flop_per_byte"] < ridge).all()
    # the same matmul layer reads its weights once for the whole prompt: far higher intensity in prefill
    fc = "transformer.h.0.mlp.c_fc"
    pi = prefill.set_index("layer_name").loc[fc, "intensity_flop_per_byte"]
    di = decode.set_index("layer_name").loc[fc, "intensity_flop_per_byte"]
    assert pi > 5 * di
    assert table["roof_check"].notna().all() and "roof_check_why" in table  # the check ran on every point
    assert "KV cache of" in table.attrs["note"]
    figure = mlms_nb.roofline(run).plot(backend="matplotlib")
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert any(lbl.startswith("decode, memory-bound") for lbl in labels)
    assert any(lbl.startswith("prefill") for lbl in labels)
    assert set(mlms_nb.roofline(run, phase="prefill").table["phase"]) == {"prefill"}


def test_phase_is_an_option_of_the_layers_and_roofline_verbs(run):
    with pytest.raises(MlmsError, match="phase"):
        mlms_nb.layers(run, phase="generate")
    from mlms_nb.options import cli_words
    from mlms_nb.options import LayersOptions, RooflineOptions

    assert cli_words(LayersOptions, {"phase": "decode"}) == ["--phase", "decode"]
    assert cli_words(RooflineOptions, {"phase": "prefill"}) == ["--phase", "prefill"]


def test_the_timeline_shows_each_step_as_a_phase_band(run):
    from mlms_nb.analyses import timeline

    tl = timeline.compute(run.traces["torch"].spans)
    bands = tl.attrs["phases"]
    assert list(bands["label"]) == ["prefill"] + [f"decode step {k}" for k in range(1, NEW_TOKENS)]
    assert (bands["batch_size"] == 2).all() and (bands["duration_ns"] > 0).all()
    assert (bands["start_ns"].diff().dropna() > 0).all() and (bands["start_ns"].iloc[1:].to_numpy()
                                                              >= bands["end_ns"].iloc[:-1].to_numpy()).all()
    figure = timeline.plot(tl, "matplotlib")
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert "band: prefill" in labels and any(lbl.startswith("band: decode") for lbl in labels)
    assert {t.get_text() for t in figure.axes[0].texts} >= {"prefill", "d1"}
    layout = timeline.plot(tl, "bokeh")
    fig = layout.select_one({"name": "timeline"})
    decode = fig.select_one({"name": "timeline_phase_decode"})
    assert list(decode.data["label"]) == [f"decode step {k}" for k in range(1, NEW_TOKENS)]
    hovers = [t for t in fig.tools if type(t).__name__ == "HoverTool" and ("phase", "@label") in t.tooltips]
    assert hovers


def test_a_trace_without_phases_has_no_bands():
    from mlms_nb.analyses import timeline
    from mlms_nb.schema.levels import TraceLevel
    from mlms_nb.tracing.tracer import Tracer

    tracer = Tracer(TraceLevel.MODEL)
    with tracer.span("predict", TraceLevel.MODEL, "model", batch=1):
        pass
    tl = timeline.compute(tracer.trace().spans)
    assert tl.attrs["phases"].empty
    assert timeline.plot(tl, "matplotlib").axes[0].get_legend().get_title().get_text() == "colour: layer type"


def test_the_lab_panels_trace_index_carries_the_phases(run, tmp_path):
    from mlms_nb.server import lod_files

    folder = run.traces["torch"].save(tmp_path / "trace")
    meta, _, _ = lod_files.build(folder if folder.is_dir() else folder.parent)
    labels = [p["label"] for p in meta["phases"]]
    assert labels == ["prefill"] + [f"decode step {k}" for k in range(1, NEW_TOKENS)]
    assert all(0 <= p["start_ns"] < p["end_ns"] <= meta["extent_ns"] for p in meta["phases"])


def test_the_report_shows_the_phase_charts_of_a_generate_run(run):
    from IPython.utils.capture import capture_output

    from mlms_nb.reporting import phases

    with capture_output() as shown:  # outside a kernel, the section's rich outputs print their text forms
        phases.phases([run], [""], "matplotlib")
    text = shown.stdout
    assert "Left out:" not in text and "per phase" in text and "memory-bound layers" in text
    assert text.count("display.Image object") == 2  # the layer latency per phase, the roofline per phase
    with capture_output() as nothing:  # no run with a phase-tagged trace: no section at all
        phases.phases([], [], "matplotlib")
    assert not nothing.stdout and not nothing.outputs


def test_the_reports_layers_section_keeps_the_phases_apart(run):
    from IPython.utils.capture import capture_output

    from mlms_nb.reporting import sections

    with capture_output() as shown:
        sections.layers([run], [""], "matplotlib")
    text = shown.stdout
    assert "Left out:" not in text and "prefill" in text and "decode" in text
    assert "display.Image object" in text


@pytest.mark.slow  # Chromium prints a page (~5 s)
@pytest.mark.skipif(shutil.which("pdftotext") is None or (shutil.which("chromium") is None
                                                          and not os.environ.get("MLMS_CHROMIUM")),
                    reason="needs Chromium and poppler-utils (scripts/setup.sh installs them)")
def test_the_layers_by_phase_table_prints_whole_words_and_the_phase_in_every_part(run, tmp_path):
    """Notebook 09's layers-by-phase table, printed as the PDF exporter prints a notebook (``nbconvert --to
    mlms_pdf``): pdftotext finds every header and cell word whole (``prefill``, not ``prefil l``; ``batch size``,
    not ``b at c h si ze``) and every part of the split table starts with framework, batch size, phase and layer
    type, so the prefill's Linear and the decode's stay apart."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from mlms_nb.reporting.exporter import MlmsPdfExporter
    from tests.helpers import broken_words, pdf_text

    table = mlms_nb.layers(run, by="type").table
    html = table._repr_html_()
    cell = new_code_cell("layers")
    cell.outputs = [new_output("display_data", data={"text/html": html, "text/plain": repr(table)})]
    pdf, _ = MlmsPdfExporter().from_notebook_node(new_notebook(cells=[new_markdown_cell("# Layers by phase"), cell]))
    (tmp_path / "layers.pdf").write_bytes(pdf)
    text = pdf_text(tmp_path / "layers.pdf")
    words = {"framework", "batch", "size", "phase", "prefill", "decode", "layer", "type", "repetitions", "calls",
             "predict", "median", "torch", *map(str, table["layer_type"])}
    assert broken_words(text, words) == [], text
    parts = html.count('<table class="mlms-split"')
    assert parts >= 2 and text.count("framework batch size phase layer type") == parts, text
    assert "prefill" in text and "decode" in text
