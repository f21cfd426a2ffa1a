"""The report's parts that need no evaluation: the table formatter, the chatter filter on a real fd 2, the
cleanup of notebook outputs, and the sentences a user gets for bad input or a missing Chromium. Seconds."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from mlms_nb.errors import MlmsError
from mlms_nb.reporting import build_report
from mlms_nb.reporting.chromium import ChromiumNotFoundError
from mlms_nb.reporting.cleanup import clean_stream, strip_noise
from mlms_nb.display import format_frame, split_columns, table_html, table_text, width_of

TF_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795450502.467845    9651 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors.\n"
    "USDT:2026-11-23 16:14:53 9598:9598 SyncActivityProfilerHandler.cpp:52] profiler_start\n")


# ---------------------------------------------------------------------------------------------- tables

def test_units_in_headers_one_precision_per_column_key_columns_first():
    frame = pd.DataFrame({"median_ms": [36.8535, 247.2887, 10.335], "framework": ["torch", "torch", "onnxruntime"],
                          "batch_size": [1, 2, 1], "memory_bytes": [1.6e6, 3.2e6, 4.8e6],
                          "throughput_per_s": [26.78, 3.3868, 96.75], "iqr_over_median": [0.045, 2.7167, 0.2079],
                          "flops": [7.9e8, 1.58e9, 7.9e8], "unstable": [False, True, True]})
    table = format_frame(frame)
    assert list(table.columns[:2]) == ["framework", "batch size"]
    assert table["median (ms)"].tolist() == ["36.9", "247.3", "10.3"]  # decimals for the small values too
    assert table["memory (MiB)"].tolist() == ["1.53", "3.05", "4.58"]
    assert table["throughput (/s)"].tolist() == ["26.78", "3.39", "96.75"]  # three digits for the smallest
    assert table["IQR/median (%)"].tolist() == ["4.5", "271.7", "20.8"]  # percentages: one decimal
    assert table["flops (MFLOP)"].tolist() == ["790", "1,580", "790"]  # one prefix per column
    assert table["unstable"].tolist() == ["no", "yes", "yes"]


def test_large_numbers_get_separators_and_missing_values_a_dash():
    table = format_frame(pd.DataFrame({"load_ms": [2521.4, np.nan], "samples": [100000, 6]}))
    assert table["load (ms)"].tolist() == ["2,521", "-"]
    assert table["calls"].tolist() == ["100,000", "6"]


def test_a_wide_table_is_split_with_its_key_columns_repeated():
    frame = pd.DataFrame({"framework": ["torch"], "batch_size": [1],
                          **{f"metric_{i}_with_a_long_name_ms": [float(i)] for i in range(12)}})
    parts = split_columns(format_frame(frame), max_chars=80)
    assert len(parts) > 1
    for part in parts:
        assert list(part.columns[:2]) == ["framework", "batch size"]
        assert sum(width_of(part[c], c) for c in part.columns) <= 80
    shown = set().union(*(set(p.columns) for p in parts))
    assert len(shown) == 2 + 12
    html = table_html(frame, "Wide", max_chars=80)
    assert html.count("<table") == len(parts) and "columns continue" in html
    assert "Wide" in table_text(frame, "Wide", max_chars=80)


# ---------------------------------------------------------------------------------------------- quiet

QUIET_SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    from mlms_nb._quiet import quiet
    with quiet():
        os.write(2, {lines!r}.encode())
        os.write(2, b"a real error\\n")
        print("python stderr", file=sys.stderr, flush=True)
        warnings.warn_explicit("The structure of `inputs` doesn't match the expected structure", UserWarning,
                               "keras/src/models/functional.py", 238, module="keras.src.models.functional")
    os.write(2, b"after\\n")
""")


@pytest.mark.parametrize("verbose", [False, True])
def test_quiet_drops_framework_chatter_from_fd_2_unless_verbose(verbose):
    env = dict(os.environ, MLMS_VERBOSE="1" if verbose else "0")
    done = subprocess.run([sys.executable, "-c", QUIET_SCRIPT.format(lines=TF_LINES)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "a real error" in err and "python stderr" in err and err.rstrip().endswith("after")
    assert ("oneDNN" in err and "USDT:" in err and "absl::InitializeLog" in err and "UserWarning" in err) == verbose
    assert err.index("a real error") < err.index("python stderr") < err.index("after")  # order kept


def test_quiet_drops_kineto_lines_of_a_real_torch_profiler():
    script = textwrap.dedent("""
        import os, torch
        from torch.profiler import profile
        from mlms_nb._quiet import quiet
        os.write(2, b"--loud--\\n")
        with profile():
            torch.ones(3) + 1
        os.write(2, b"--quiet--\\n")
        with quiet(), profile():
            torch.ones(3) + 1
        os.write(2, b"--end--\\n")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MLMS_VERBOSE="0"))
    assert done.returncode == 0, done.stderr
    loud, quiet = done.stderr.split("--loud--")[1].split("--quiet--")
    if "USDT:" not in loud:
        pytest.skip("this torch build prints no Kineto USDT lines")
    assert "USDT:" not in quiet and quiet.strip() == "--end--"


def test_quiet_keeps_onnxruntime_and_library_log_chatter_in_the_log_file(tmp_path):
    """A real ONNX Runtime session that serializes its optimized graph warns on fd 2 (ANSI-coloured); onnx_ir logs
    "Replaced initializer" at INFO: inside `quiet` neither reaches stderr, both are in $MLMS_HOME/logs, our own
    lines and other warnings still show."""
    script = textwrap.dedent(f"""
        import logging, os, sys, warnings
        import onnx, onnxruntime as ort
        from onnx import TensorProto, helper
        from mlms_nb._quiet import chatter_log, quiet
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = {str(tmp_path / "opt.onnx")!r}
        with quiet(label="test block"):
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            logging.getLogger("onnx_ir.passes.common").info("Replaced initializer 'a' with existing initializer 'b'")
            logging.getLogger("mlms_nb.test").info("our own progress line")
            warnings.warn("a warning of the user's own", UserWarning)
        print("LOG=" + str(chatter_log()), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MLMS_VERBOSE="0", MLMS_HOME=str(tmp_path / "home")))
    assert done.returncode == 0, done.stderr
    assert "onnxruntime" not in done.stderr and "Replaced initializer" not in done.stderr
    assert "our own progress line" in done.stderr and "a warning of the user's own" in done.stderr
    log = Path(done.stdout.split("LOG=")[1].strip()).read_text()
    assert "test block" in log and "Replaced initializer" in log and "[W:onnxruntime:" in log
    assert "\x1b[" not in log  # the colour codes are left out of the log


# ---------------------------------------------------------------------------------------------- cleanup

def test_cleanup_keeps_real_errors_and_drops_chatter_progress_and_widgets():
    text = (TF_LINES + "mlms eval efficientnet_lite0:   0%|          | 0/4 [00:00<?, ?sweep/s]\r"
            "mlms eval efficientnet_lite0:  25%|██▌       | 1/4 [00:17<00:52, 17.55s/sweep]\r"
            "/x/site-packages/keras/src/models/functional.py:238: UserWarning: The structure of `inputs` doesn't "
            "match the expected structure.\nExpected: ['x']\nReceived: inputs=Tensor\n  warnings.warn(msg)\n"
            "ValueError: something the user must see\n")
    assert clean_stream(text) == "ValueError: something the user must see\n"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text=TF_LINES),
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "1"},
                                                     "text/plain": "HBox(children=(...))"}),
        nbformat.v4.new_output("stream", name="stdout", text="kept\n")])])
    counts = strip_noise(nb)
    assert [o.get("text") for o in nb.cells[0].outputs] == ["kept\n"]
    assert counts == {"streams": 1, "widgets": 1}


# ---------------------------------------------------------------------------------------------- bad input

def test_bad_input_gets_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MlmsError, match="name at least one run"):
        build_report([])
    with pytest.raises(MlmsError, match="paper must be A4 or Letter"):
        build_report(["1"], pdf="r.pdf", paper="A3")
    monkeypatch.setenv("MLMS_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(ChromiumNotFoundError) as err:
        build_report(["1"], pdf="r.pdf")
    message = str(err.value)
    assert "apt-get install chromium" in message and "\n" not in message
    assert not (tmp_path / "r.pdf").exists()


def test_cli_without_chromium_says_what_to_install(tmp_path):
    env = dict(os.environ, MLMS_CHROMIUM=str(tmp_path / "no-such-chromium"), MLMS_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "report", "1", "--pdf", str(tmp_path / "r.pdf")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("mlms report: PDF reports need Chromium")
    assert "apt-get install chromium" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_latency_digits_follow_the_ci_and_frames_show_themselves_for_people():
    """torch.utils.benchmark's rule: a median whose 95% CI is +-0.1 ms at 13 ms has 2 significant figures; one whose
    CI is +-21 ms at 150 ms has 1; the column gets the fewest. Counts stay integers (no e-notation), stored times
    read to the second, and a derived frame (a selection, a groupby) still shows itself the same way."""
    from mlms_nb.display import for_people, significant_figures

    assert significant_figures([13.0, 150.0, 5.0], [12.9, 115.0, 5.0], [13.1, 157.0, 5.0]).tolist() == [2, 1, 4]
    frame = for_people(pd.DataFrame({
        "framework": ["torch", "onnxruntime"], "median_ms": [13.0123, 150.4567], "median_ci_low_ms": [12.91, 115.0],
        "median_ci_high_ms": [13.11, 157.0], "context_switches": [21.0, 3_000_000.0],
        "created_at": ["2026-11-26T17:13:28.544663+00:00", "2026-11-26T17:14:00Z"]}))
    text = repr(frame)
    assert "e+" not in text and "3,000,000" in text and " 21 " in text + " "
    assert "2026-11-26 17:13:28Z" in text and "544663" not in text
    assert "median (ms)" in text and "13.0123" not in text and "150.4567" not in text
    derived = frame[frame["framework"] == "torch"].groupby("framework")[["median_ms"]].sum()
    assert "median (ms)" in repr(derived) and "framework" in repr(derived)  # the index is kept as a column
    assert "<table" in derived._repr_html_() and isinstance(derived, pd.DataFrame)
