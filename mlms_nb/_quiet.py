"""Keep framework chatter out of the user's way while mlms-nb works: TensorFlow's C++/absl INFO and WARNING lines,
Kineto's ``USDT:`` lines, ONNX Runtime's ``[W:onnxruntime:...]`` warnings, the Python warnings the frameworks raise
(Keras ``UserWarning``s) and their loggers' records (onnx_ir's "Replaced initializer", torch's "FakeTensor cache
stats"). Anything else written to stderr (a real error, a progress bar, our own log lines) still gets through, in
order, as it is written. What was kept back is not lost: it is appended to :func:`chatter_log`
(``$MLMS_HOME/logs/frameworks.log``), one block per call with its time and label.

The C++ lines are written straight to file descriptor 2, below Python's ``sys.stderr``, so :func:`quiet` points
fd 2 at a pipe for the duration of the block; a thread reads the pipe, drops the chatter lines and forwards
everything else to where fd 2 pointed before (a terminal, a log file, or the pipe ipykernel reads in a notebook).

The few messages that matter to a user (a missing execution provider, a layer built without its input shape, a NaN
in numpy) are also translated into one sentence of ours by :mod:`mlms_nb._translate` (a matching Python warning
from anywhere, the user's numpy included, goes to the log too, its sentence standing in for it).

``MLMS_VERBOSE=1``, ``--verbose`` on a verb (or ``quiet(verbose=True)``) shows everything, untranslated. Bottom
layer: imports only :mod:`mlms_nb.paths` and :mod:`mlms_nb._translate`.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mlms_nb._translate import hear
from mlms_nb.paths import mlms_home

VERBOSE_ENV = "MLMS_VERBOSE"

#: Lines dropped from fd 2 (matched at the start of each line, after stripping leading whitespace).
CHATTER = re.compile(
    r"""(?:
        WARNING:\ All\ log\ messages\ before\ absl::InitializeLog\(\)\ is\ called     # absl's preamble
      | [IW]\d{4}\ \d\d:\d\d:\d+\.\d+\s+\d+\ \S+:\d+\]                                 # absl/glog, torch._logging
      | \d{4}-\d\d-\d\d\ \d\d:\d\d:\d\d\.\d+:\ [IW]\ \S+\.cc:\d+\]                      # TF's own C++ logger
      | USDT:                                                                             # Kineto probes
      | .*oneDNN\ custom\ operations\ are\ on
      | .*This\ TensorFlow\ binary\ is\ optimized
      | .*(?:To\ enable\ the\ following\ instructions|rebuild\ TensorFlow\ with\ the\ appropriate\ compiler)
      | .*Unable\ to\ register\ cu(?:DNN|FFT|BLAS)\ factory
      | .*computation\ placer\ already\ registered
      | .*Could\ not\ find\ cuda\ drivers\ on\ your\ machine
      | (?:\x1b\[[\d;]*m)?\d{4}-\d\d-\d\d\ \d\d:\d\d:\d\d\.\d+\ \[[IW]:onnxruntime:       # ORT's logger (ANSI-coloured)
      | \[IPKernelApp\]\ \w+\ \|\ (?:Kernel\ is\ running\ over\ TCP|KeyboardInterrupt\ caught\ in\ kernel)  # a report's kernel
    )""", re.VERBOSE)

#: Python loggers whose records are kept in the log instead of printed (their children too)
_LOGGERS = ("tensorflow", "absl", "h5py", "keras", "onnx_ir", "onnxscript", "onnx", "tf2onnx", "onnxruntime", "torch")
#: Python packages whose warnings are kept in the log (a warning raised in, or attributed to, one of them)
_PACKAGES = ("tensorflow", "keras", "tf_keras", "absl", "torch", "onnx", "onnx_ir", "onnxscript", "onnxruntime",
             "tf2onnx", "h5py", "google")
_lock = threading.Lock()
_depth = 0


def is_verbose() -> bool:
    """True when ``MLMS_VERBOSE`` is set to anything but ``""``, ``0``, ``false`` or ``no``."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def is_chatter(line: str) -> bool:
    """Whether one line of stderr is framework chatter that :func:`quiet` drops."""
    return bool(CHATTER.match(line.lstrip()))


def filter_chatter(text: str) -> str:
    """``text`` without its chatter lines (line ends kept)."""
    return "".join(line for line in text.splitlines(keepends=True) if not is_chatter(line))


class _Forwarder(threading.Thread):
    """Reads the pipe fd 2 now points at; forwards every segment (a line, or a ``\\r``-ended progress update)
    that is not chatter to ``sink`` (the fd that was fd 2 before)."""

    def __init__(self, read_fd: int, sink: int):
        super().__init__(name="mlms-quiet", daemon=True)
        self.read_fd, self.sink = read_fd, sink
        self.dropped: list[str] = []  # the chatter kept back, for the log

    def run(self) -> None:
        pending = b""
        try:
            while True:
                chunk = os.read(self.read_fd, 65536)
                if not chunk:
                    break
                pending += chunk
                segments = re.split(rb"(?<=[\n\r])", pending)
                pending = segments.pop()  # the unfinished tail (b"" when the chunk ended a line)
                self._forward(segments)
            if pending:
                self._forward([pending])
        finally:
            os.close(self.read_fd)

    def _forward(self, segments: list[bytes]) -> None:
        kept = []
        for seg in segments:
            text = seg.decode("utf-8", "replace")
            if is_chatter(text):
                self.dropped.append(_ANSI.sub("", text).rstrip("\r\n"))
                hear("line", None, self.dropped[-1])  # one that matters becomes a sentence of ours (_translate)
            else:
                kept.append(seg)
        if kept:
            data = b"".join(kept)
            try:
                while data:
                    data = data[os.write(self.sink, data):]
            except OSError:
                pass


_ANSI = re.compile(r"\x1b\[[\d;]*m")


_ACTIVE: list[tuple[int, _Forwarder]] = []  # (the real fd 2, its forwarder) of each filter in force


def restore_stderr() -> None:
    """Point fd 2 back at the real stderr now, what the filters hold forwarded first: for a process about to end
    with ``os._exit`` (a second Ctrl-C), whose last sentence must not die in a pipe no thread will drain."""
    for saved, forwarder in reversed(list(_ACTIVE)):
        _flush_python_streams()
        os.dup2(saved, 2)
        forwarder.join(timeout=0.5)


@contextmanager
def _fd2_filtered(kept: list[str]) -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all: nothing to filter
        yield
        return
    read_fd, write_fd = os.pipe()
    forwarder = _Forwarder(read_fd, saved)
    forwarder.start()
    _flush_python_streams()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    _ACTIVE.append((saved, forwarder))
    try:
        yield
    finally:
        _ACTIVE.remove((saved, forwarder))
        _flush_python_streams()
        os.dup2(saved, 2)  # closes our last write end of the pipe: the forwarder sees EOF
        forwarder.join(timeout=2.0)  # a child process still holding the pipe keeps it open: don't wait on it
        if not forwarder.is_alive():  # else the forwarder keeps writing to `saved` until the child lets go
            os.close(saved)
        kept.extend(forwarder.dropped)


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


class _Keep(logging.Handler):
    """Keeps the framework loggers' records (formatted, one line each) in a list."""

    def __init__(self, kept: list[str]):
        super().__init__(logging.NOTSET)
        self.kept = kept

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            self.kept.append(f"{record.levelname} {record.name}: {message}")
            hear("line", None, message)
        except Exception:  # a record whose arguments do not format: keep its template
            self.kept.append(f"{record.levelname} {record.name}: {record.msg}")


def _framework_loggers() -> list[str]:
    """The framework loggers of `_LOGGERS` and those below them that stop their records (``propagate`` off, a
    handler of their own): each gets our handler, or their records would never reach it."""
    below = [name for name, logger in list(logging.root.manager.loggerDict.items())
             if isinstance(logger, logging.Logger) and (logger.handlers or not logger.propagate)
             and name.split(".", 1)[0] in _LOGGERS and name not in _LOGGERS]
    return [*_LOGGERS, *below]


def _framework_file(filename: str) -> bool:
    parts = Path(filename).parts
    return any(p in ("site-packages", "dist-packages") for p in parts) and any(p in _PACKAGES for p in parts)


@contextmanager
def _python_quiet(kept: list[str]) -> Iterator[None]:
    """The frameworks' Python warnings and log records go to ``kept`` instead of the screen; every other warning
    (ours, the user's) is shown as before."""
    handler = _Keep(kept)
    saved = {}
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            text = str(message)
            translated = hear("warning", category.__name__, text)  # ours to say in one sentence (_translate)
            if translated or _framework_file(filename) or "The structure of `inputs` doesn't match" in text:
                kept.append(f"{category.__name__} ({Path(filename).name}:{lineno}): {text}")
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        for name in _framework_loggers():
            logger = logging.getLogger(name)
            # a framework's own console handlers (torch._logging puts one on "torch", "torch.onnx", ...) are set
            # aside meanwhile; a handler installed inside the block writes to fd 2, where the line filter drops it
            screens = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)
                       and not isinstance(h, logging.FileHandler)]
            saved[name] = (logger.propagate, screens)
            logger.propagate = False
            for screen in screens:
                logger.removeHandler(screen)
            logger.addHandler(handler)
        try:
            yield
        finally:
            for name, (propagate, screens) in saved.items():
                logger = logging.getLogger(name)
                logger.removeHandler(handler)
                for screen in screens:
                    logger.addHandler(screen)
                logger.propagate = propagate


def chatter_log() -> Path:
    """Where what the frameworks said is kept: ``$MLMS_HOME/logs/frameworks.log``."""
    return mlms_home() / "logs" / "frameworks.log"


def _keep(kept: list[str], label: str) -> None:
    if not kept:
        return
    try:
        path = chatter_log()
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        with path.open("a", encoding="utf-8") as out:
            out.write(f"--- {stamp} {label} (pid {os.getpid()}): {len(kept)} line(s) the frameworks wrote\n")
            out.write("".join(line + "\n" for line in kept))
    except OSError:  # an unwritable MLMS_HOME must not cost a measurement
        pass


@contextmanager
def quiet(verbose: bool | None = None, label: str = "mlms-nb") -> Iterator[None]:
    """Run a block with framework chatter kept back (see the module doc) and appended to :func:`chatter_log` under
    ``label``. ``verbose``: show everything (default: the ``MLMS_VERBOSE`` environment variable). Re-entrant: an
    inner ``quiet`` inside an outer one does nothing."""
    global _depth
    if verbose is None:
        verbose = is_verbose()
    with _lock:
        outer = _depth == 0
        _depth += 1
    try:
        if verbose or not outer:
            yield
            return
        kept: list[str] = []
        try:
            with _python_quiet(kept), _fd2_filtered(kept):
                yield
        finally:
            _keep(kept, label)
    finally:
        with _lock:
            _depth -= 1


def quieted(label: str):
    """Decorator: run the function under :func:`quiet` (for the facade's verbs that open frameworks)."""
    import functools

    def wrap(function):
        @functools.wraps(function)
        def quiet_call(*args, **kwargs):
            with quiet(label=label):
                return function(*args, **kwargs)
        return quiet_call
    return wrap
