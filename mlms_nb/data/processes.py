"""The pipeline's readers as worker processes (``reader="processes"``): :class:`ProcessReaders` gives
:class:`mlms_nb.data.pipeline.Stream` the same ``submit(chunk) -> Future`` as its thread pool, so ordering, prefetch,
skipped inputs and errors are the stream's own logic whichever reader runs.

- Processes come from the ``forkserver`` start method, never ``fork``: this process may have torch, TensorFlow or
  ONNX Runtime threads running, which a fork would copy mid-lock. The fork server is a clean interpreter started
  once per Python process (it imports numpy, PIL and this package's readers once; each worker forks from it in
  tens of ms) and lives as long as this process, like multiprocessing's resource tracker.
- Each worker gets the dataset (pickled) and the preprocessing: a :class:`~mlms_nb.data.transforms.Preprocessor`
  travels as its manifest and trust flag and is rebuilt in the worker, so a trusted manifest's code steps run
  there only when this run is trusted; any other preprocess callable is pickled as it is. What cannot be pickled
  (a Python iterator's items live in this process) is read by threads instead, with a note (:func:`why_not`).
- Batches come back through shared memory (``multiprocessing.shared_memory``): a ring of ``prefetch`` buffers,
  each sized for ``chunk_size`` inputs from the first batch (which, like any batch that does not fit, comes through
  the pipe). The receiver thread copies a batch out of its buffer at once (one memcpy, ~19 MB for 32 inputs of
  3x224x224 float32), so the consumer may keep a batch as long as it likes, exactly as with threads.
- Errors raised by ``dataset.read`` arrive at the consumer as the same exception (or, when it cannot be pickled, a
  `DatasetError` saying which one); a worker that dies is one `DatasetError` naming its exit code.
- ``shutdown`` (normal end, an error, an early close, KeyboardInterrupt) stops and joins every worker (terminated
  after a grace period when one is stuck in a read) and unlinks the ring: nothing is left in ``/dev/shm``.

Workers ignore SIGINT: a Ctrl-C reaches the consumer, whose close stops them.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import secrets
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from multiprocessing import connection, shared_memory
from typing import Any, Callable

import numpy as np

from mlms_nb.data.batch import READER_NICENESS, Batch, lower_priority
from mlms_nb.errors import DatasetError

START_METHOD = "forkserver"
PRELOAD = ["numpy", "PIL.Image", "mlms_nb.data.processes", "mlms_nb.data.datasets", "mlms_nb.data.transforms"]
"""Imported once in the fork server (none of them imports a framework), so each worker starts in tens of ms."""
GRACE_S = 5.0
"""How long shutdown waits for a worker to finish the chunk in hand before terminating it."""
_ALIGN = 64


def _context():
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload(PRELOAD)  # no effect once the fork server runs (it is started once per process)
    return ctx


def start_server() -> None:
    """Start the fork server in the background (a clean interpreter importing `PRELOAD`, ~1-2 s once per process),
    so that the first stream's workers fork at once. Starting it (fork + exec) is safe beside framework threads."""
    from multiprocessing import forkserver

    _context()
    threading.Thread(target=forkserver.ensure_running, name="mlms-forkserver-start", daemon=True).start()


def preprocess_recipe(preprocess) -> tuple:
    """What travels to a worker: a Preprocessor as its manifest and trust flag (rebuilt there, code steps compiled
    there under the same trust), anything else as itself."""
    from mlms_nb.data.transforms import Preprocessor

    if type(preprocess) is Preprocessor:
        return ("preprocessor", preprocess.manifest, bool(preprocess.trust))
    return ("object", preprocess)


def why_not(dataset, preprocess) -> tuple[str | None, bytes | None]:
    """``(None, payload)`` when ``dataset`` and ``preprocess`` can go to worker processes (``payload``: what each
    worker unpickles), else ``(reason, None)``: one sentence saying why they are read by threads."""
    if multiprocessing.current_process().daemon:  # e.g. a Dask worker: a daemonic process may not have children
        return (f"this process ({multiprocessing.current_process().name}) is a daemonic process, which may not start "
                "reader processes, so the dataset is read by threads"), None
    if not getattr(dataset, "process_readable", True):
        return (f"dataset {dataset.name!r} is a Python iterable whose items exist only in this process, so it is "
                "read by threads, not processes"), None
    try:
        return None, pickle.dumps((dataset, preprocess_recipe(preprocess)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - any pickling failure means: not for processes
        return (f"dataset {getattr(dataset, 'name', '?')!r} or its preprocessing cannot be pickled for a worker "
                f"process ({type(err).__name__}: {err}), so it is read by threads"), None


class ProcessReaders:
    """``workers`` reader processes for one stream. ``submit(chunk)`` sends a chunk to the least busy worker and
    returns a Future of its `Batch`; ``account(read_ns, skipped)`` is called (from the receiver thread) as each chunk
    comes back, before its Future is set. ``transport``: ``"shm"`` (a ring of shared-memory buffers) or ``"pipe"``
    (every batch pickled through the worker's pipe; for comparison)."""

    def __init__(self, payload: bytes, workers: int, prefetch: int, chunk_size: int,
                 account: Callable[[int, int], None], transport: str = "shm", niceness: int = READER_NICENESS):
        if transport not in ("shm", "pipe"):
            raise DatasetError(f"transport must be 'shm' or 'pipe', got {transport!r}")
        self.prefetch, self.chunk_size, self.account, self.transport = prefetch, chunk_size, account, transport
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.futures: dict[int, tuple[Future, int | None, int]] = {}  # seq -> (future, ring slot, worker)
        self.outstanding = [0] * workers
        self.seq = 0
        self.ring: list[shared_memory.SharedMemory] = []
        self.free: list[int] = []
        self.transfer_ns = 0  # receiver time taking batches in: receiving, unpickling, copying out of shared memory
        ctx = _context()
        env = dict(os.environ)
        self.conns, self.procs = [], []
        try:
            for i in range(workers):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=_worker, args=(theirs, payload, env, niceness), name=f"mlms-read-{i}", daemon=True)
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
        except BaseException:
            self.shutdown()
            raise
        self.receiver = threading.Thread(target=self._receive, name="mlms-receive", daemon=True)
        self.receiver.start()

    # ------------------------------------------------------------------ the feeder's side
    def submit(self, chunk: Any) -> Future:
        future: Future = Future()
        with self.lock:
            seq, self.seq = self.seq, self.seq + 1
            worker = min(range(len(self.conns)), key=lambda i: (self.outstanding[i], (i - seq) % len(self.conns)))
            slot = self.free.pop() if self.free else None  # held until received: never more than prefetch
            self.outstanding[worker] += 1
            self.futures[seq] = (future, slot, worker)
            where = None if slot is None else (self.ring[slot].name, self.ring[slot].size)
        try:
            self.conns[worker].send((seq, chunk, where))
        except (OSError, ValueError) as err:  # the worker is gone: the receiver says why
            if not self.closing.is_set():
                self._fail(DatasetError(f"could not send a chunk to a dataset reader process ({err})"))
        return future

    # ------------------------------------------------------------------ the receiver thread
    def _receive(self) -> None:
        live = dict(zip(self.conns, self.procs))
        while live and not self.closing.is_set():
            try:
                ready = connection.wait(list(live), timeout=0.1)
            except (OSError, ValueError):  # closed under us: the stream is ending
                return
            for conn in ready:
                t0 = time.perf_counter_ns()
                try:
                    message = conn.recv()  # a batch sent through the pipe is read and unpickled here
                except (EOFError, OSError):
                    proc = live.pop(conn)
                    if not self.closing.is_set():
                        proc.join(1.0)
                        self._fail(DatasetError(f"a dataset reader process stopped unexpectedly (exit code "
                                                f"{proc.exitcode}); reader='threads' reads in this process"))
                    continue
                except Exception as err:  # noqa: BLE001 - a batch that cannot be unpickled here
                    self._fail(DatasetError(f"a dataset reader process sent what this process cannot read "
                                            f"({type(err).__name__}: {err})"))
                    continue
                self._deliver(*message, received_ns=time.perf_counter_ns() - t0)

    def _deliver(self, kind: str, seq: int, body: Any, read_ns: int, received_ns: int = 0) -> None:
        with self.lock:
            future, slot, worker = self.futures.pop(seq)
            self.outstanding[worker] -= 1
        batch = error = None
        try:
            if kind == "error":
                error = body
            else:
                t0 = time.perf_counter_ns()
                batch = self._unpack(body, slot) if kind == "shm" else body
                if kind == "pipe" and self.transport == "shm" and not self.ring:
                    self._make_ring(batch)
                self.transfer_ns += time.perf_counter_ns() - t0 + received_ns
        except BaseException as err:  # noqa: BLE001 - the consumer gets it with the batch it waits for
            error = err
        finally:
            if slot is not None:  # free before the consumer hears of it: its next chunk may need this buffer
                with self.lock:
                    self.free.append(slot)
        self.account(read_ns, 0 if batch is None else len(batch.skipped))
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(batch)

    def _unpack(self, body: tuple, slot: int) -> Batch:
        layout, labels, ids, skipped, targets = body
        buf = self.ring[slot].buf
        data = {}
        for key, dtype, shape, offset in layout:
            count = int(np.prod(shape, dtype=np.int64))
            data[key] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
        return Batch(data[None] if None in data else data, labels, ids, skipped, targets)

    def _make_ring(self, batch: Batch) -> None:
        """``prefetch`` buffers, each sized for ``chunk_size`` inputs like ``batch`` (the first one back)."""
        arrays = _arrays(batch)
        if arrays is None or not len(batch):
            return
        size = sum(_aligned(a.nbytes // len(batch) * self.chunk_size) for a in arrays.values())
        if size == 0:
            return
        prefix = f"mlms_{os.getpid()}_{secrets.token_hex(4)}"
        ring = []
        try:
            for k in range(self.prefetch):
                ring.append(shared_memory.SharedMemory(name=f"{prefix}_{k}", create=True, size=size))
        except OSError:  # no room in /dev/shm: the pipe carries every batch
            _release(ring)
            return
        with self.lock:
            if self.closing.is_set():
                _release(ring)
                return
            in_use = {s for _, s, _ in self.futures.values() if s is not None}
            self.free = [k for k in range(len(ring)) if k not in in_use]
            self.ring = ring

    def _fail(self, err: BaseException) -> None:
        """Every chunk still awaited fails with ``err`` (a worker died: the stream cannot go on)."""
        with self.lock:
            pending = [future for future, _, _ in self.futures.values()]
        for future in pending:
            if not future.done():
                future.set_exception(err)

    # ------------------------------------------------------------------ the end
    def shutdown(self) -> None:
        """Stop the workers (a chunk in hand is finished, or the worker terminated after `GRACE_S`), join them and
        unlink the ring. Safe to call twice."""
        self.closing.set()
        receiver = getattr(self, "receiver", None)
        if receiver is not None:
            receiver.join()  # it notices within 0.1 s (or once the message it is receiving is in)
        for conn in self.conns:
            conn.close()  # a waiting worker sees EOF; a sending one, a broken pipe
        deadline = time.monotonic() + GRACE_S
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
        self.procs = []
        with self.lock:
            ring, self.ring, self.free = self.ring, [], []
        _release(ring)
        self._fail(DatasetError("the stream was closed"))


def _release(ring: list) -> None:
    for shm in ring:
        try:
            shm.close()
        except BufferError:  # a view is still alive somewhere: the name goes now, the memory with the view
            pass
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _arrays(batch: Batch) -> dict | None:
    """The batch's arrays by name (None for a single array), or None when they cannot go into shared memory."""
    arrays = dict(batch.data) if isinstance(batch.data, Mapping) else {None: batch.data}
    if all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays.values()):
        return arrays
    return None


# ---------------------------------------------------------------------------------------------- the worker

def _worker(conn, payload: bytes, env: dict, niceness: int = READER_NICENESS) -> None:
    """One reader process: reads the chunks it is sent until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority(niceness)  # below the model's threads, as reader threads are (see lower_priority)
    os.environ.clear()  # the fork server's environment is the one it started with: take this run's
    os.environ.update(env)
    attached: dict[str, shared_memory.SharedMemory] = {}
    try:
        try:
            dataset, recipe = pickle.loads(payload)
            preprocess = _rebuild(recipe)
        except BaseException as err:  # noqa: BLE001 - every chunk sent then fails with this error
            setup_error = _portable(err)
        else:
            setup_error = None
        while True:
            try:
                seq, chunk, where = conn.recv()
            except (EOFError, OSError):
                return
            t0 = time.perf_counter_ns()
            if setup_error is not None:
                message = ("error", seq, setup_error, 0)
            else:
                try:
                    batch = dataset.read(chunk, preprocess)
                    message = _pack(batch, where, attached, seq)
                except BaseException as err:  # noqa: BLE001 - the consumer raises it
                    message = ("error", seq, _portable(err), 0)
            message = message[:3] + (time.perf_counter_ns() - t0,)
            try:
                conn.send(message)
            except (OSError, ValueError):  # the stream was closed
                return
            except Exception as err:  # noqa: BLE001 - a batch that does not pickle
                conn.send(("error", seq, DatasetError(f"a dataset reader process could not send its batch back "
                                                      f"({type(err).__name__}: {err})"), message[3]))
    finally:
        for shm in attached.values():
            try:
                shm.close()
            except BufferError:
                pass


def _rebuild(recipe: tuple):
    if recipe[0] == "preprocessor":
        from mlms_nb.data.transforms import Preprocessor

        return Preprocessor(recipe[1], trust=recipe[2])
    return recipe[1]


def _pack(batch: Batch, where: tuple | None, attached: dict, seq: int) -> tuple:
    """The batch into its shared-memory buffer when it has one and the batch fits, else whole through the pipe."""
    arrays = _arrays(batch) if where is not None else None
    if arrays is None or sum(_aligned(a.nbytes) for a in arrays.values()) > where[1]:
        return ("pipe", seq, batch)
    name = where[0]
    shm = attached.get(name)
    if shm is None:
        shm = attached[name] = _attach(name)
    layout, offset = [], 0
    for key, array in arrays.items():
        target = np.ndarray(array.shape, dtype=array.dtype, buffer=shm.buf, offset=offset)
        target[...] = array
        del target
        layout.append((key, array.dtype, array.shape, offset))
        offset += _aligned(array.nbytes)
    return ("shm", seq, (layout, batch.labels, batch.ids, batch.skipped, batch.targets))  # targets: pickled


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach to the consumer's buffer. A forkserver child shares the consumer's resource tracker, so the
    registration Python 3.11 makes on attach is the consumer's own (a set: no duplicate), removed when the consumer
    unlinks the buffer; unregistering here would remove the consumer's."""
    return shared_memory.SharedMemory(name=name)


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (the consumer raises the same exception), else a `DatasetError` naming it."""
    try:
        pickle.loads(pickle.dumps(err))
        err.__traceback__ = None
        return err
    except Exception:  # noqa: BLE001
        return DatasetError(f"a dataset reader process failed: {type(err).__name__}: {err}")


__all__ = ["GRACE_S", "ProcessReaders", "START_METHOD", "preprocess_recipe", "start_server", "why_not"]
