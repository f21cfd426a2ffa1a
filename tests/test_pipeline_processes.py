"""The pipeline's readers as worker processes (``reader="processes"``, issue 11 item 4): the same batches, ids,
labels, order and skipped inputs as threads on a real image folder; a reader's error reaches the consumer as the
same one sentence; a trusted code step runs in the workers; an early close, an error or a KeyboardInterrupt leaves
no worker process and no shared-memory segment behind. Speed is in benchmarks/streaming.py, not here.

Cost: the fork server starts once per test process (~1-2 s: it imports numpy, PIL and the readers); every stream
after that forks its two workers from it in tens of ms, so the streams here are cheap."""
from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import psutil
import pytest

from mlms_nb.data.datasets import ImageFolder, ImageNetSamples, IterableDataset
from mlms_nb.data.datasets.base import Dataset
from mlms_nb.data.pipeline import Batch, Stream
from mlms_nb.data.transforms import Preprocessor
from mlms_nb.errors import DatasetError
from mlms_nb.manifest import parse_manifest

WORKERS = 2


def image_manifest(pre=None):
    """A 32x32 image classifier's manifest (the model is never loaded: only its preprocessing runs)."""
    spec = {"name": "procs_test", "framework": {"name": "torch"},
            "inputs": [{"type": "image", "element_type": "float32", "layout": "NCHW", "dimensions": [3, 32, 32],
                        "mean": [127.0] * 3, "scale": [128.0] * 3}],
            "outputs": [{"type": "classification"}], "model": {"entrypoint": "x:y"}}
    if pre is not None:
        spec["preprocess"] = pre
    return parse_manifest(spec)


def code_manifest(source: str):
    return image_manifest([{"decode": {}}, {"resize": {"size": [32, 32]}}, {"code": {"source": source}}])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The 20 imagenet-samples photos in CLASS/ subfolders, plus one corrupt JPEG."""
    root = tmp_path_factory.mktemp("photos")
    samples = ImageNetSamples()
    for path, label in zip(samples.paths, samples.labels):
        (root / str(label)).mkdir(exist_ok=True)
        shutil.copy(path, root / str(label) / path.name)
    (root / "0").mkdir(exist_ok=True)
    (root / "0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


@pytest.fixture(scope="module")
def preprocess():
    return Preprocessor(image_manifest())


@pytest.fixture(scope="module")
def by_threads(folder, preprocess):
    dataset = ImageFolder(folder)
    with dataset.iter_batches(6, preprocess, workers=WORKERS) as stream:
        batches = list(stream)
    return batches, list(dataset.skipped)


def ours() -> set[str]:
    """This process's shared-memory segments."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"mlms_{os.getpid()}_")}


def leftover_children(before: set[int]) -> set[int]:
    """Children of this process started since ``before``, other than multiprocessing's fork server and resource
    tracker (one each per process, by design)."""
    from multiprocessing import forkserver, resource_tracker

    servers = {getattr(forkserver._forkserver, "_forkserver_pid", None),
               getattr(resource_tracker._resource_tracker, "_pid", None)}
    alive = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
             and p.status() != psutil.STATUS_ZOMBIE}
    return alive - before - servers


@pytest.fixture
def no_leaks():
    """Asserts, after the test, that no worker process and no shared-memory segment of ours is left."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    gc.collect()
    assert not multiprocessing.active_children()
    assert not leftover_children(before)
    assert not ours()


def test_processes_give_what_threads_give(folder, preprocess, by_threads, no_leaks):
    expected, skipped = by_threads
    dataset = ImageFolder(folder)
    with dataset.iter_batches(6, preprocess, workers=WORKERS, reader="processes") as stream:
        got = list(stream)
    stats = stream.stats
    assert stats.reader == "processes" and stats.workers == WORKERS and stream.note is None
    assert [len(b) for b in got] == [len(b) for b in expected] == [6, 6, 6, 2]
    for mine, theirs in zip(got, expected):
        assert mine.ids == theirs.ids
        np.testing.assert_array_equal(mine.labels, theirs.labels)
        assert mine.data.dtype == theirs.data.dtype == np.float32
        np.testing.assert_array_equal(mine.data, theirs.data)
    # the corrupt file is skipped and recorded, as with threads
    assert dataset.skipped == skipped and [i for i, _ in skipped] == ["0/broken.jpg"] and stats.skipped == 1
    assert stats.inputs == 20 and stats.batches == 4 and 0 < stats.peak_in_flight <= stats.prefetch
    assert stats.read_ns > 0 and stats.transfer_ns > 0  # read in the workers, taken in here


def test_a_limit_and_a_short_last_batch_are_the_streams_own(folder, preprocess, by_threads, no_leaks):
    expected, _ = by_threads
    with ImageFolder(folder).iter_batches(4, preprocess, workers=WORKERS, limit=7, reader="processes") as stream:
        got = list(stream)
    assert [len(b) for b in got] == [4, 3]
    assert [i for b in got for i in b.ids] == [i for b in expected for i in b.ids][:7]


def test_a_trusted_code_step_runs_in_the_workers(folder, no_leaks):
    source = "import os\ndef process(x):\n    return (x.astype(np.float32) / 255.0).transpose(2, 0, 1) + os.getpid()\n"
    trusted = Preprocessor(code_manifest(source), trust=True)  # refused without trust (test_data)
    with ImageFolder(folder).iter_batches(8, trusted, workers=WORKERS, reader="processes", limit=16) as stream:
        pids = {int(np.floor(b.data.min())) for b in stream}
    assert os.getpid() not in pids and 1 <= len(pids) <= WORKERS  # the step ran there, under the run's trust


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="priorities are a POSIX facility")
def test_reader_processes_run_below_the_models_priority(folder, no_leaks):
    from mlms_nb.data.pipeline import READER_NICENESS

    source = "import os\ndef process(x):\n    return np.full((3, 32, 32), os.getpriority(os.PRIO_PROCESS, 0), np.float32)\n"
    niceness = Preprocessor(code_manifest(source), trust=True)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with ImageFolder(folder).iter_batches(4, niceness, workers=WORKERS, reader="processes", limit=8) as stream:
        seen = {float(v) for b in stream for v in np.unique(b.data)}
    assert seen == {min(19, mine + READER_NICENESS)} and os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_a_readers_error_reaches_the_consumer_as_the_same_sentence(folder, no_leaks):
    messages = []
    for reader in ("threads", "processes"):
        with pytest.raises(DatasetError) as info:
            list(ImageFolder(folder).iter_batches(4, None, workers=WORKERS, reader=reader))
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "needs a Preprocessor" in messages[1]


def test_a_worker_that_dies_is_one_sentence(folder, no_leaks):
    dying = Preprocessor(code_manifest("import os\ndef process(x):\n    os._exit(3)\n"), trust=True)
    with pytest.raises(DatasetError, match=r"a dataset reader process stopped unexpectedly \(exit code 3\)"):
        list(ImageFolder(folder).iter_batches(4, dying, workers=WORKERS, reader="processes"))


@pytest.mark.parametrize("how", ["close", "exception", "interrupt", "dropped"])
def test_an_early_end_stops_the_workers_and_frees_the_memory(folder, preprocess, how, no_leaks):
    stream = ImageFolder(folder).iter_batches(2, preprocess, workers=WORKERS, reader="processes", prefetch=3)
    first, second = next(stream), next(stream)  # by now the ring of shared memory exists
    assert ours() and len(multiprocessing.active_children()) == WORKERS
    if how == "close":
        stream.close()
    elif how == "dropped":
        del stream
    else:
        error = KeyboardInterrupt if how == "interrupt" else RuntimeError
        with pytest.raises(error), stream:
            raise error()
    assert first.ids != second.ids and np.isfinite(second.data).all()  # batches stay valid after the end


class Pairs(Dataset):
    """A two-input dataset (a mapping name -> array per input): ``image`` and a scalar ``rate``."""

    name, kind = "pairs", "pair"

    def __len__(self) -> int:
        return 10

    def read(self, chunk, preprocess) -> Batch:
        return Batch({"image": np.stack([np.full((3, 4, 4), i, np.float32) for i in chunk]),
                      "rate": np.array([16000 + i for i in chunk], np.int64)}, None, [f"pair-{i}" for i in chunk])


def test_named_inputs_come_through_shared_memory(no_leaks):
    with Stream(Pairs(), None, 3, workers=WORKERS, reader="processes") as stream:
        got = list(stream)
    assert [b.ids[0] for b in got] == ["pair-0", "pair-3", "pair-6", "pair-9"]
    rates = np.concatenate([b.data["rate"] for b in got])
    assert rates.dtype == np.int64 and rates.tolist() == list(range(16000, 16010))
    assert [float(b.data["image"][0, 0, 0, 0]) for b in got] == [0, 3, 6, 9]
    assert stream.stats.transfer_ns > 0


def test_a_python_iterable_is_read_by_threads_with_a_note():
    stream = Stream(IterableDataset(iter([np.zeros(4, np.float32)] * 3)), None, 2, reader="processes")
    assert stream.stats.reader == "threads" and "read by threads" in stream.note
    assert [len(b) for b in stream] == [2, 1]
    with pytest.raises(DatasetError, match="reader must be 'threads' or 'processes'"):
        Stream(Pairs(), None, 2, reader="fibers")


def test_an_evaluation_records_which_reader_ran(tmp_path, no_leaks):
    torch = pytest.importorskip("torch")
    import mlms_nb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((12, 4)).astype(np.float32), y=np.arange(12) % 3)
    common = dict(inputs={"type": "tensor", "dimensions": [4]}, outputs={"type": "classification", "classes": 3},
                  batch_sizes=[4], warmup=1, min_repeats=2, min_time_s=0, progress=False, history=False,
                  reader="processes")
    ev = mlms_nb.evaluate(model, dataset=str(tmp_path / "d.npz"), **common)
    assert ev.full_pass["reader"].tolist() == ["processes"] and ev.options["reader"] == "processes"
    assert int(ev.full_pass["inputs"].iloc[0]) == 12 and int(ev.accuracy["n"].iloc[0]) == 12
    pairs = [(row, int(i % 3)) for i, row in enumerate(rng.standard_normal((8, 4)).astype(np.float32))]
    ev = mlms_nb.evaluate(model, dataset=pairs, **common)  # a Python iterable: threads, and a note says why
    assert ev.full_pass["reader"].tolist() == ["threads"]
    assert any("read by threads, not processes" in w for w in ev.warnings)


def test_an_npz_with_targets_is_memory_mapped_again_in_the_workers(tmp_path, no_leaks):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "t.npz", x=rng.standard_normal((10, 4)).astype(np.float32), y=np.arange(10) % 3,
             target=rng.standard_normal((10, 2)).astype(np.float32))
    from mlms_nb.data.datasets import NpzDataset

    got = {}
    for reader in ("threads", "processes"):
        with NpzDataset(tmp_path / "t.npz").iter_batches(4, None, workers=WORKERS, reader=reader) as stream:
            got[reader] = list(stream)
    for mine, theirs in zip(got["processes"], got["threads"]):
        assert mine.ids == theirs.ids and set(mine.targets) == set(theirs.targets) == {""}
        np.testing.assert_array_equal(mine.data, theirs.data)
        np.testing.assert_array_equal(mine.labels, theirs.labels)
        np.testing.assert_array_equal(mine.targets[""], theirs.targets[""])
