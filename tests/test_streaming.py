"""Streaming datasets (issue 11 items 4-5): the pipeline's memory is bounded by its prefetch whatever the dataset's
size (counted structurally: inputs pulled ahead, chunks alive), every format streams, a Python iterable is a
dataset, the full pass is measured and carried to --json, and progress is one bar per framework that ends as a
one-line summary. The measured speed and memory at scale are in benchmarks/streaming.py, not here."""
from __future__ import annotations

import io
import os
import pickle
import re
import threading
import time
import wave

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import mlms_nb
from mlms_nb.data.datasets import (
    AudioFolder, IterableDataset, NpyFolder, NpzDataset, TableDataset, open_dataset,
)
from mlms_nb.data.pipeline import READER_NICENESS, Stream
from mlms_nb.data.transforms import Preprocessor
from mlms_nb.errors import DatasetError
from mlms_nb.evaluation.progress import ProgressDisplay
from mlms_nb.evaluation.records import FullPass, PassProgress
from mlms_nb.manifest import Manifest


DIMS = (1, 1, 4)


def tensor_manifest(dims=DIMS) -> Manifest:
    return Manifest.model_validate({
        "name": "streamed", "version": "1.0.0", "framework": {"name": "torch"},
        "inputs": [{"name": "x", "type": "tensor", "element_type": "float32", "layout": "NCHW",
                    "dimensions": list(dims)}],
        "outputs": [{"name": "y", "type": "classification"}], "model": {"entrypoint": "x:y"}})


class Counting:
    """A generator of ``n`` inputs that counts how many were pulled."""

    def __init__(self, n: int, dims=(4,)):
        self.n, self.dims, self.pulled = n, dims, 0

    def __iter__(self):
        for i in range(self.n):
            self.pulled += 1
            yield np.full(self.dims, i, np.float32)


def test_memory_is_bounded_by_the_prefetch_not_the_dataset():
    source = Counting(2000)
    dataset = IterableDataset(iter(source), name="counting")
    batch, prefetch = 8, 2
    ahead = []
    with Stream(dataset, None, batch, workers=2, prefetch=prefetch) as stream:
        consumed = 0
        for b in stream:
            consumed += len(b)
            ahead.append(source.pulled - consumed)
            time.sleep(0.0005)  # a slow model: the readers must wait for it, not run away
        stats = stream.stats
    assert consumed == 2000 and stats.inputs == 2000 and stats.batches == 250
    # chunks alive at once (read ahead, in flight, held by the consumer) never exceed the prefetch ...
    assert stats.peak_in_flight <= prefetch
    # ... so inputs pulled from the source beyond what the consumer took stay under a few batches
    assert max(ahead) <= (prefetch + 2) * batch, max(ahead)
    assert stats.wait_ns >= 0 and stats.read_ns > 0


def test_a_stream_given_up_early_stops_its_readers():
    source = Counting(10_000)
    stream = Stream(IterableDataset(iter(source)), None, 4, workers=2, prefetch=2)
    first = next(stream)
    stream.close()
    time.sleep(0.3)
    assert len(first) == 4 and source.pulled <= 4 * 4


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread priorities are a POSIX facility")
def test_readers_run_below_the_model_threads_priority():
    seen = set()

    def preprocess(x):
        seen.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return x

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with Stream(IterableDataset(iter(Counting(16))), preprocess, 4, workers=2) as stream:
        assert sum(len(b) for b in stream) == 16
    assert seen == {min(19, mine + READER_NICENESS)}
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the consumer (the model's caller) keeps its priority
    seen.clear()
    with Stream(IterableDataset(iter(Counting(8))), preprocess, 4, workers=1, niceness=0) as stream:
        assert sum(len(b) for b in stream) == 8 and stream.stats.niceness == 0
    assert seen == {mine}  # on a busy machine: readers at the model's own priority
    with pytest.raises(DatasetError, match="niceness must be 0"):
        Stream(IterableDataset(iter(Counting(8))), preprocess, 4, niceness=20)


def test_python_iterables_lists_functions_and_generators():
    pairs = [(np.full(DIMS, i, np.float32), i % 3) for i in range(10)]
    listed = open_dataset(pairs, tensor_manifest())
    assert isinstance(listed, IterableDataset) and listed.labeled and listed.size() == 10
    batches = list(listed.iter_batches(4, None))
    assert [len(b) for b in batches] == [4, 4, 2] and batches[0].labels.tolist() == [0, 1, 2, 0]
    assert list(listed.iter_batches(4, None))[2].ids == ["python:list[8]", "python:list[9]"]  # read again

    def make():
        return (np.zeros(DIMS, np.float32) for _ in range(5))

    from_function = open_dataset(make, tensor_manifest())
    assert from_function.size() is None and not from_function.labeled
    assert sum(len(b) for b in from_function.iter_batches(2, None)) == 5
    assert sum(len(b) for b in from_function.iter_batches(2, None)) == 5

    once = IterableDataset(x for x in make())
    head = once.head(2, None)  # the timed loops' sample: kept, and replayed by the pass
    assert len(head) == 2 and sum(len(b) for b in once.iter_batches(2, None)) == 5
    with pytest.raises(DatasetError, match="read already"):
        list(once.iter_batches(2, None))

    named = IterableDataset([{"signal": np.zeros((3,), np.float32), "sr": np.array(16000)}] * 3)
    batch = next(named.iter_batches(3, None))
    assert batch.data["signal"].shape == (3, 3) and batch.data["sr"].shape == (3,)


def test_npz_is_memory_mapped_or_read_in_blocks(tmp_path):
    x = np.arange(6 * 4, dtype=np.float32).reshape(6, *DIMS)
    np.savez(tmp_path / "plain.npz", x=x, y=np.arange(6))
    np.savez_compressed(tmp_path / "packed.npz", x=x, y=np.arange(6))
    plain = NpzDataset(tmp_path / "plain.npz", manifest=tensor_manifest())
    packed = NpzDataset(tmp_path / "packed.npz", manifest=tensor_manifest())
    assert isinstance(plain.x, np.memmap) and not plain.compressed and packed.compressed
    for ds in (plain, packed):
        batches = list(ds.iter_batches(4, None))
        assert np.array_equal(np.concatenate([b.data for b in batches]), x)
        assert np.concatenate([b.labels for b in batches]).tolist() == list(range(6))


def test_an_uncompressed_npz_reaches_onnxruntime_as_views_of_its_memory_map(tmp_path):
    """Issue 25: for a framework that reads a read-only array in place, the batches are slices of the memory map
    taken by the consumer (no reader threads, no copy); torch, which would share an unwritable buffer, gets copies;
    a limit and a short last batch behave as with readers."""
    x = np.arange(7 * 4, dtype=np.float32).reshape(7, *DIMS)
    np.savez(tmp_path / "plain.npz", x=x, y=np.arange(7))
    ort_manifest = tensor_manifest().model_copy(update={"framework": tensor_manifest().framework.model_copy(
        update={"name": "onnxruntime"})})
    plain = NpzDataset(tmp_path / "plain.npz", manifest=ort_manifest)
    with plain.iter_batches(3, None, limit=5) as stream:
        batches = list(stream)
    assert [len(b) for b in batches] == [3, 2] and stream.stats.workers == 0 and stream.stats.inputs == 5
    assert all(np.shares_memory(b.data, plain.x) and not b.data.flags.writeable for b in batches)
    assert np.array_equal(np.concatenate([b.data for b in batches]), x[:5])
    assert [i for b in batches for i in b.ids] == [f"plain.npz[{i}]" for i in range(5)]
    ids = batches[0].ids  # spelled only when read, but a sequence of str like a list in every other way
    assert ids == ["plain.npz[0]", "plain.npz[1]", "plain.npz[2]"] and ids != ["plain.npz[0]"] and len(ids) == 3
    assert ids[-1] == "plain.npz[2]" and ids[1:] == ["plain.npz[1]", "plain.npz[2]"] and "plain.npz[1]" in ids
    assert pickle.loads(pickle.dumps(ids)) == ids and list(ids) == ids.tolist()
    copied = NpzDataset(tmp_path / "plain.npz", manifest=tensor_manifest())  # torch
    with copied.iter_batches(3, None) as stream:
        batches = list(stream)
    assert stream.stats.workers > 0 and all(b.data.flags.writeable for b in batches)
    assert not any(np.shares_memory(b.data, copied.x) for b in batches)


@pytest.mark.parametrize("classes", [10, 100])
def test_batch_scoring_and_summaries_are_numpy_per_row_whatever_the_width(classes):
    """Issue 25: rows of fewer than 64 elements are reduced across a transposed copy (numpy reduces along a short
    axis at a fixed cost per row); the softmax, the top-k and each row's min/max/mean/std must be what the
    per-row computation gives, NaN rows included, at both widths."""
    from mlms_nb.data.datasets.base import IndexedIds
    from mlms_nb.data.postprocess import softmax, top_k
    from mlms_nb.evaluation.outputs import OutputRecorder

    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((300, classes)) * 4).astype(np.float32)
    logits[7] = np.nan
    exact = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    exact /= exact.sum(axis=1, keepdims=True)
    probs = softmax(logits)
    assert probs.shape == logits.shape and probs.dtype == np.float32 and np.isnan(probs[7]).all()
    np.testing.assert_allclose(np.delete(probs, 7, axis=0), np.delete(exact, 7, axis=0), rtol=1e-5, atol=1e-7)
    order, _ = top_k(probs, 5)
    assert np.array_equal(np.delete(order, 7, axis=0), np.argsort(-np.delete(exact, 7, axis=0), axis=1)[:, :5])
    manifest = tensor_manifest().model_copy(update={"outputs": [tensor_manifest().outputs[0].model_copy(
        update={"type": "tensor"})]})
    recorder = OutputRecorder(manifest, "torch", "summary")
    finite = np.delete(logits, 7, axis=0)
    for start in range(0, len(finite), 64):  # calls of 64 in dataset order: summarised as one group
        recorder.add(IndexedIds("d.npz", range(start, min(start + 64, len(finite)))), {"y": finite[start:start + 64]})
    frame = recorder.frame()
    assert frame["input_id"].tolist() == [f"d.npz[{i}]" for i in range(len(finite))]
    rows = finite.astype(np.float64)
    for column, per_row in (("min", rows.min(axis=1)), ("max", rows.max(axis=1)), ("mean", rows.mean(axis=1)),
                            ("std", rows.std(axis=1))):
        np.testing.assert_allclose(frame[column].to_numpy(), per_row, rtol=1e-12, atol=1e-15)
    assert frame["shape"].tolist() == [[classes]] * len(finite) and frame["shape"][0] is not frame["shape"][1]


@pytest.mark.parametrize("framework", ["onnxruntime", "torch"])
def test_full_pass_figures_do_not_depend_on_how_calls_are_grouped(tmp_path, monkeypatch, framework):
    """Issue 25: the full pass's scorer and output recorder work on groups of calls (`group_full`); a group per
    call and one group for the whole pass give the same record, accuracy, predictions, probabilities and outputs
    frame, an input holding NaN included (a .npz read as views of its map for onnxruntime, copied for torch)."""
    from mlms_nb.evaluation import outputs
    from mlms_nb.evaluation.full_pass import run_full_pass
    from mlms_nb.evaluation.outputs import OutputRecorder

    manifest = tensor_manifest().model_copy(update={"framework": tensor_manifest().framework.model_copy(
        update={"name": framework})})
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, *DIMS)).astype(np.float32)
    x[17, 0, 0, 2] = np.nan
    np.savez(tmp_path / "d.npz", x=x, y=rng.integers(0, 10, 300))
    weights = rng.standard_normal((4, 10)).astype(np.float32)

    def predict(batch):
        return {"y": batch["x"].reshape(len(batch["x"]), -1) @ weights}

    runs = []
    for inputs, values in ((1, 1), (10**9, 10**9)):
        monkeypatch.setattr(outputs, "GROUP_INPUTS", inputs)
        monkeypatch.setattr(outputs, "GROUP_VALUES", values)
        recorder = OutputRecorder(manifest, framework, "first:5")
        full, acc = run_full_pass(predict, manifest, open_dataset(tmp_path / "d.npz", manifest), Preprocessor(manifest),
                                  64, limit=None, keep_probabilities=True, trust=False, recorder=recorder)
        runs.append((full.row, acc, recorder.frame()))
    (one, acc_one, frame_one), (all_, acc_all, frame_all) = runs
    timing = ("wall_s", "inputs_per_s", "preprocess_s", "inference_s", "postprocess_s", "wait_s")
    assert {k: v for k, v in one.items() if k not in timing} == {k: v for k, v in all_.items() if k not in timing}
    assert one["inputs"] == 300 and one["nonfinite_inputs"] == 1
    assert acc_one.row == acc_all.row and acc_one.row["n"] == 299
    pd.testing.assert_frame_equal(acc_one.predictions, acc_all.predictions)
    assert np.array_equal(acc_one.probabilities, acc_all.probabilities, equal_nan=True)
    pd.testing.assert_frame_equal(frame_one, frame_all)
    assert len(frame_one) == 299 and "d.npz[17]" not in set(frame_one["input_id"])


def test_npy_folder_parquet_arrow_and_audio_folder(tmp_path):
    manifest = tensor_manifest()
    for label in ("0", "2"):
        (tmp_path / "npy" / label).mkdir(parents=True)
        for i in range(2):
            np.save(tmp_path / "npy" / label / f"{i}.npy", np.full(DIMS, int(label), np.float32))
    npy = open_dataset(tmp_path / "npy", manifest)
    assert isinstance(npy, NpyFolder) and npy.labeled
    batch = next(npy.iter_batches(4, None))
    assert batch.labels.tolist() == [0, 0, 2, 2] and batch.data[:, 0, 0, 0].tolist() == [0, 0, 2, 2]

    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    def jpeg(seed: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), np.uint8)).save(out, "JPEG")
        return out.getvalue()

    images = pa.table({"image": [jpeg(0), b"not an image", jpeg(1)], "label": [3, 4, 5]})
    pq.write_table(images, tmp_path / "images.parquet", row_group_size=2)
    image_manifest = Manifest.model_validate({**tensor_manifest().to_dict(), "inputs": [
        {"name": "x", "type": "image", "layout": "NCHW", "dimensions": [3, 32, 32]}]})
    table = open_dataset(tmp_path / "images.parquet", image_manifest)
    assert isinstance(table, TableDataset) and table.column == "image" and table.labeled and len(table) == 3
    batches = list(table.iter_batches(2, Preprocessor(image_manifest)))
    assert [b.data.shape for b in batches] == [(2, 3, 32, 32)] and batches[0].labels.tolist() == [3, 5]
    assert [i for i, _ in table.skipped] == ["images.parquet[1]"]

    arrays = pa.table({"values": [np.full(4, i, np.float32) for i in range(5)]})
    feather.write_feather(arrays, tmp_path / "arrays.arrow")
    arrow = open_dataset(tmp_path / "arrays.arrow", manifest)
    assert not arrow.labeled and len(arrow) == 5
    values = np.concatenate([b.data for b in arrow.iter_batches(2, Preprocessor(manifest))])
    assert values.shape == (5, *DIMS) and values[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4]

    (tmp_path / "audio" / "dog").mkdir(parents=True)
    for i in range(2):
        with wave.open(str(tmp_path / "audio" / "dog" / f"{i}.wav"), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
            w.writeframes(np.zeros(80, np.int16).tobytes())
    audio = AudioFolder(tmp_path / "audio", labels=["cat", "dog"])
    assert audio.labels.tolist() == [1, 1]

    def decode(path):  # the io helper's audio steps do this; here only the paths' arrival is checked
        with wave.open(str(path)) as w:
            return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)

    assert next(audio.iter_batches(2, decode)).data.shape == (2, 80)


def test_full_pass_in_the_evaluation_and_json(real_evaluation):
    full = real_evaluation.full_pass
    assert full["framework"].tolist() == ["torch"] and int(full["inputs"].iloc[0]) == 2
    row = full.iloc[0]
    assert row["wall_s"] > 0 and row["inputs_per_s"] == pytest.approx(2 / row["wall_s"])
    assert row["inference_s"] <= row["wall_s"] and row["preprocess_s"] >= 0 and row["wait_s"] >= 0
    from mlms_nb import display

    result = display.render_json(real_evaluation)["results"][0]["full_pass"]
    assert {"inputs", "wall_s", "inputs_per_s", "preprocess_s", "inference_s", "wait_s"} <= set(result)
    assert "Full pass: torch: 2 inputs in" in real_evaluation.to_text()
    back = type(real_evaluation).from_json(real_evaluation.to_json())
    pd.testing.assert_frame_equal(back.full_pass, full)


def test_a_live_model_on_a_python_generator_reports_accuracy_and_throughput():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    rng = np.random.default_rng(0)
    pairs = ((rng.standard_normal(4).astype(np.float32), int(i % 3)) for i in range(24))
    ev = mlms_nb.evaluate(model, inputs={"type": "tensor", "dimensions": [4]},
                          outputs={"type": "classification", "classes": 3}, dataset=pairs, batch_sizes=[1, 8],
                          warmup=1, min_repeats=2, min_time_s=0, progress=False, history=False)
    assert int(ev.full_pass["inputs"].iloc[0]) == 24 and int(ev.full_pass["batch_size"].iloc[0]) == 8
    assert int(ev.accuracy["n"].iloc[0]) == 24 and len(ev.predictions) == 24
    assert ev.options["dataset"].startswith("python:")


def _one_framework_run(display: ProgressDisplay) -> None:
    for done in (0, 32, 64):
        display.on_record(PassProgress("onnxruntime", "full pass", done, 64, finished=done == 64))
    display.on_record(PassProgress("onnxruntime", "timed loop, batch 32", 0, 320))
    display.on_record(PassProgress("onnxruntime", "timed loop, batch 32", 320, 320, finished=True))
    display.on_record(FullPass("onnxruntime", {"inputs": 64, "wall_s": 2.0, "inputs_per_s": 32.0, "batch_size": 32,
                                               "preprocess_s": 1.5, "workers": 2, "inference_s": 1.8, "wait_s": 0.1}))
    display.finish("onnxruntime")


SUMMARY = ("m onnxruntime: full pass 64 inputs in 2 s = 32 inputs/s (batch 32; preprocessing 1.5 s in 2 worker threads, "
           "inference 1.8 s, waited 0.1 s)")


def test_progress_is_one_bar_per_framework_ending_in_a_summary(capsys):
    _one_framework_run(ProgressDisplay("m", enabled=True, live=True))
    err = capsys.readouterr().err
    assert "m onnxruntime: full pass" in err and "64/64" in err and "timed loop, batch 32" in err
    assert err.rstrip().splitlines()[-1].endswith(SUMMARY.split(": ", 1)[1])
    # stderr to a file or a pipe (pytest's capture is one): no bar redraws in the log, the summary line alone
    _one_framework_run(ProgressDisplay("m", enabled=True))
    assert capsys.readouterr().err == SUMMARY + "\n"
    quiet = ProgressDisplay("m", enabled=False)
    quiet.on_record(PassProgress("torch", "full pass", 0, 4))
    quiet.finish("torch")
    assert capsys.readouterr().err == ""


def test_a_step_without_inputs_shows_its_name_and_time_then_gives_way(capsys):
    """A step of the work (loading the model, a one-time conversion) shows as its name and the time taken, not as
    '0 inputs'; the pass after it is a bar again; a framework that ends on a step says it is done."""
    display = ProgressDisplay("m", enabled=True, live=True)
    display.on_record(PassProgress("torch", "fetching and converting the model's files (once)", 0, None, step=True))
    display.on_record(PassProgress("torch", "loading the model", 0, None, step=True))
    display.on_record(PassProgress("torch", "full pass", 4, 4, finished=True))
    display.on_record(PassProgress("torch", "greedy decoding", 0, None, step=True))
    display.finish("torch")
    err = capsys.readouterr().err
    assert re.search(r"m torch: loading the model \[\d\d:\d\d\]", err) and "4/4" in err
    assert not re.search(r"(converting|loading)[^\n\r]*input", err)
    assert err.rstrip().splitlines()[-1].strip().endswith("m torch: done")
