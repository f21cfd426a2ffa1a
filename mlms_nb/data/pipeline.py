"""The streaming pipeline: a dataset's inputs read, decoded and preprocessed by worker threads (or processes) a few
batches ahead of the consumer, delivered in dataset order; memory is bounded by ``prefetch`` batches whatever the
dataset's size.

A dataset cuts its inputs into chunks (``dataset.chunks(size)``: cheap descriptors such as file paths or index
ranges, iterated in one feeder thread, so a Python generator is only ever pulled from one thread) and reads one
chunk into a `Batch` (``dataset.read(chunk, preprocess)``: decode + preprocess + stack, in a worker thread; PIL and
numpy release the GIL for the heavy parts). With ``reader="processes"`` the workers are processes
(:mod:`mlms_nb.data.processes`: for preprocessing that holds the GIL); the feeder, the ordering, the prefetch bound
and the consumer below are the same. :class:`Stream` runs the feeder and the workers; the consumer gets
batches of exactly ``batch_size`` inputs (the last one smaller unless ``drop_last``) and :class:`StreamStats` says
where the time went: ``read_ns`` (summed over the workers), ``wait_ns`` (the consumer waiting for data).

Per input, the data is an array (no batch axis) or a mapping name -> array (a model with several inputs); a batch
stacks them per name. Nothing here knows a file format: see :mod:`mlms_nb.data.datasets`.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from mlms_nb.data.batch import (READER_NICENESS, Batch, concat_batches, lower_priority,  # noqa: F401  (re-exported)
                                map_inputs, stack_inputs)
from mlms_nb.errors import DatasetError


def default_workers() -> int:
    """Readers (threads or processes): one per core, at most 4 (decoding more images at once only adds memory)."""
    return max(1, min(4, os.cpu_count() or 1))


READERS = ("threads", "processes")
"""What reads the chunks: worker threads of this process (the default) or worker processes."""


@dataclass
class StreamStats:
    """What one stream did. ``read_ns``: time the workers spent reading and preprocessing, summed over them (it can
    exceed the wall time with several workers); ``wait_ns``: time the consumer waited for the next batch;
    ``peak_in_flight``: the most chunks alive at once (submitted, read, or held by the consumer: never above
    ``prefetch``); ``reader``: what read the chunks (``threads`` or ``processes``); ``niceness``: how many nice steps
    below the consumer they ran (`lower_priority`); ``transfer_ns``: with processes, time this process spent taking
    batches in (copying them out of shared memory, or unpickling them)."""
    workers: int
    prefetch: int
    reader: str = "threads"
    niceness: int = 0
    inputs: int = 0
    batches: int = 0
    skipped: int = 0
    read_ns: int = 0
    wait_ns: int = 0
    peak_in_flight: int = 0
    transfer_ns: int = 0


_END = object()


class Stream:
    """Batches of ``dataset`` preprocessed in the background (see the module). Iterate it once; ``close()`` (or
    leaving the loop early and dropping it) stops the workers.

    ``reader``: ``"threads"`` or ``"processes"``; a dataset or preprocessing that cannot go to processes (a Python
    iterator) is read by threads, ``stats.reader`` says so and ``note`` says why. ``transport`` (processes only):
    ``"shm"`` (shared memory) or ``"pipe"``. ``niceness``: the readers' priority below the consumer's, 0 to 19
    (default `READER_NICENESS`; see `lower_priority`)."""

    def __init__(self, dataset, preprocess, batch_size: int, limit: int | None = None, drop_last: bool = False,
                 workers: int | None = None, prefetch: int | None = None, reader: str | None = None,
                 transport: str = "shm", niceness: int | None = None):
        self.dataset = dataset
        self.preprocess = preprocess
        self.batch_size = batch_size
        self.limit = limit
        self.drop_last = drop_last
        workers = default_workers() if workers is None else int(workers)
        prefetch = workers + 1 if prefetch is None else int(prefetch)
        if workers < 1 or prefetch < 1:
            raise DatasetError(f"a stream needs at least one worker and one batch of prefetch, got workers={workers}, "
                               f"prefetch={prefetch}")
        reader = "threads" if reader is None else reader
        if reader not in READERS:
            raise DatasetError(f"reader must be 'threads' or 'processes', got {reader!r}")
        self.note: str | None = None
        self.payload: bytes | None = None
        if reader == "processes":
            from mlms_nb.data.processes import why_not

            self.note, self.payload = why_not(dataset, preprocess)
            reader = "threads" if self.payload is None else reader
        self.transport = transport
        niceness = READER_NICENESS if niceness is None else int(niceness)
        if not 0 <= niceness <= 19:
            raise DatasetError(f"the readers' niceness must be 0 (the model's priority) to 19, got {niceness}")
        self.stats = StreamStats(workers=workers, prefetch=prefetch, reader=reader, niceness=niceness)
        self._batches = self._run()

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Batch:
        return next(self._batches)

    def close(self) -> None:
        """Stop reading ahead (the workers finish the chunk in hand and exit)."""
        self._batches.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the consumer side
    def _run(self) -> Iterator[Batch]:
        stats, want = self.stats, self.limit
        self.dataset.skipped = []
        if want == 0:
            return
        views = getattr(self.dataset, "reads_are_views", None)
        if stats.reader == "threads" and views is not None and views(self.preprocess):
            yield from self._views()
            return
        shared = _Shared(stats.prefetch)
        pool = self._readers(shared)
        feeder = threading.Thread(target=_feed, name="mlms-feed", daemon=True,
                                  args=(self.dataset, self.batch_size, want, pool.submit, shared, stats))
        try:
            feeder.start()
        except RuntimeError as err:  # no memory for a thread's stack (a worker process's memory limit)
            pool.shutdown()
            raise _thread_memory(err) from None
        delivered = 0
        pending: list[Batch] = []  # read but not yet delivered: less than one batch (after skipped inputs)
        holding = False
        try:
            while want is None or delivered < want:
                if holding:  # the consumer is done with the last chunk: its slot frees one for the feeder
                    shared.release()
                    holding = False
                t0 = time.perf_counter_ns()
                item = shared.ready.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                chunk = item.result()  # a worker's error arrives here
                stats.wait_ns += time.perf_counter_ns() - t0
                holding = True
                if chunk.skipped:
                    self.dataset.skipped.extend(chunk.skipped)
                    stats.skipped += len(chunk.skipped)
                if not len(chunk):
                    continue
                pending.append(chunk)
                if sum(len(b) for b in pending) < self.batch_size:
                    continue
                batch, pending = concat_batches(pending), []
                while len(batch) >= self.batch_size and (want is None or delivered < want):
                    size = self.batch_size if want is None else min(self.batch_size, want - delivered)
                    if size < self.batch_size and self.drop_last:  # the limit leaves a short last batch
                        return
                    out, batch = (batch, None) if len(batch) == size else (batch.slice(0, size), batch.slice(size, len(batch)))
                    delivered += size
                    stats.batches += 1
                    stats.inputs += size
                    yield out
                    if batch is None:
                        break
                if batch is not None and len(batch) and (want is None or delivered < want):
                    pending = [batch]
            if pending and (want is None or delivered < want):
                last = concat_batches(pending)
                if want is not None:
                    last = last.slice(0, min(len(last), want - delivered))
                if len(last) == self.batch_size or not self.drop_last:
                    delivered += len(last)
                    stats.batches += 1
                    stats.inputs += len(last)
                    yield last
            if delivered == 0 and self.dataset.skipped:
                first_id, first_reason = self.dataset.skipped[0]
                kind = getattr(self.dataset, "kind", "input")
                raise DatasetError(f"dataset {self.dataset.name!r}: none of its {len(self.dataset.skipped)} {kind}(s) "
                                   f"could be read (first: {first_id}: {first_reason})")
        finally:
            shared.stop.set()
            shared.release()  # wake the feeder if it waits for a slot
            pool.shutdown()  # processes: joins the workers and unlinks the shared memory
            stats.transfer_ns = getattr(pool, "transfer_ns", 0)

    def _views(self) -> Iterator[Batch]:
        """Batches read in the consumer, for a dataset whose reads are views (``reads_are_views``: nothing to
        overlap, so no reader threads to wake per batch); the time reading counts as read and as wait."""
        stats, want = self.stats, self.limit
        stats.workers = 0
        delivered = 0
        for chunk in self.dataset.chunks(self.batch_size):
            t0 = time.perf_counter_ns()
            batch = self.dataset.read(chunk, self.preprocess)
            n = len(batch)
            if want is not None and delivered + n > want:
                batch = batch.slice(0, want - delivered)
                n = len(batch)
            spent = time.perf_counter_ns() - t0
            stats.read_ns += spent
            stats.wait_ns += spent
            if n < self.batch_size and self.drop_last:
                return
            delivered += n
            stats.batches += 1
            stats.inputs += n
            yield batch
            if want is not None and delivered >= want:
                return

    def _readers(self, shared: "_Shared"):
        """The readers: ``submit(chunk) -> Future`` of its `Batch`, ``shutdown()``; threads or `ProcessReaders`."""
        stats = self.stats
        if stats.reader == "threads":
            return _ThreadReaders(self.dataset, self.preprocess, shared, stats)
        from mlms_nb.data.processes import ProcessReaders

        return ProcessReaders(self.payload, stats.workers, stats.prefetch, self.batch_size,
                              lambda read_ns, skipped: _account(shared, stats, read_ns, skipped), self.transport,
                              stats.niceness)


class _Shared:
    """What the consumer, the feeder and the workers share: the ordered queue of futures, the prefetch slots, the
    stop flag, and a lock for the counters."""

    def __init__(self, prefetch: int):
        self.ready: queue.Queue = queue.Queue()
        self.slots = threading.Semaphore(prefetch)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0  # chunks submitted and not yet given back by the consumer
        self.reading = 0  # chunks submitted and not yet read
        self.submitted = 0
        self.skipped = 0
        self.done = threading.Condition(self.lock)

    def release(self) -> None:
        with self.lock:
            self.in_flight -= 1
        self.slots.release()


class _ThreadReaders:
    """``workers`` reader threads: ``dataset.read(chunk, preprocess)`` in a thread pool."""

    def __init__(self, dataset, preprocess, shared: _Shared, stats: StreamStats):
        self.pool = ThreadPoolExecutor(max_workers=stats.workers, thread_name_prefix="mlms-read",
                                       initializer=lower_priority, initargs=(stats.niceness,))
        self.args = dataset, preprocess, shared, stats

    def submit(self, chunk: Any):
        dataset, preprocess, shared, stats = self.args
        return self.pool.submit(_read, dataset, chunk, preprocess, shared, stats)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _feed(dataset, batch_size: int, want: int | None, submit: Callable[[Any], Any], shared: _Shared,
          stats: StreamStats) -> None:
    """The feeder thread: one chunk of ``batch_size`` inputs per free prefetch slot, submitted in order. With a
    ``limit`` it submits no more than the limit still needs once skipped inputs are counted."""
    try:
        for chunk in dataset.chunks(batch_size):
            if want is not None:
                with shared.done:  # enough submitted unless some turn out unreadable: wait for the reads in flight
                    while shared.submitted - shared.skipped >= want and shared.reading > 0 and not shared.stop.is_set():
                        shared.done.wait(0.1)
                    if shared.submitted - shared.skipped >= want:
                        return
            while not shared.slots.acquire(timeout=0.1):
                if shared.stop.is_set():
                    return
            if shared.stop.is_set():
                return
            with shared.lock:
                shared.in_flight += 1
                shared.reading += 1
                shared.submitted += len(chunk)
                stats.peak_in_flight = max(stats.peak_in_flight, shared.in_flight)
            shared.ready.put(submit(chunk))
    except RuntimeError as err:  # the pool could not start a reader thread
        shared.ready.put(_thread_memory(err) if "thread" in str(err) else err)
    except BaseException as err:  # noqa: BLE001 - a generator's or a listing's error reaches the consumer
        shared.ready.put(err)
    finally:
        shared.ready.put(_END)


def _thread_memory(err: RuntimeError) -> MemoryError:
    """A thread that could not start is memory that could not be had (its stack): said as a MemoryError."""
    return MemoryError(f"cannot start a dataset reader thread ({err})")


def _read(dataset, chunk, preprocess, shared: _Shared, stats: StreamStats) -> Batch:
    t0 = time.perf_counter_ns()
    skipped = 0
    try:
        batch = dataset.read(chunk, preprocess)
        skipped = len(batch.skipped)
        return batch
    finally:
        _account(shared, stats, time.perf_counter_ns() - t0, skipped)


def _account(shared: _Shared, stats: StreamStats, read_ns: int, skipped: int) -> None:
    """One chunk read (``read_ns`` in its worker, ``skipped`` inputs unreadable): the counters the feeder's limit
    and the stats use."""
    with shared.done:
        stats.read_ns += read_ns
        shared.reading -= 1
        shared.skipped += skipped
        shared.done.notify_all()


__all__ = ["Batch", "READERS", "Stream", "StreamStats", "concat_batches", "default_workers", "map_inputs",
           "stack_inputs"]
