"""Silence framework chatter while mlms-nb works: TensorFlow's C++/absl INFO and WARNING lines, Kineto's
``USDT:`` lines, Keras ``UserWarning``s and TF/absl Python log records. Anything else written to stderr (a real
error, a progress bar, our own log lines) still gets through, in order, as it is written.

The C++ lines are written straight to file descriptor 2, below Python's ``sys.stderr``, so :func:`quiet` points
fd 2 at a pipe for the duration of the block; a thread reads the pipe, drops the chatter lines and forwards
everything else to where fd 2 pointed before (a terminal, a log file, or the pipe ipykernel reads in a notebook).

``MLMS_VERBOSE=1`` (or ``quiet(verbose=True)``) shows everything. Bottom layer: imports nothing from mlms_nb.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

VERBOSE_ENV = "MLMS_VERBOSE"

#: Lines dropped from fd 2 (matched at the start of each line, after stripping leading whitespace).
CHATTER = re.compile(
    r"""(?:
        WARNING:\ All\ log\ messages\ before\ absl::InitializeLog\(\)\ is\ called     # absl's preamble
      | [IW]\d{4}\ \d\d:\d\d:\d+\.\d+\s+\d+\ [\w.\-]+:\d+\]                           # absl/glog INFO, WARNING
      | \d{4}-\d\d-\d\d\ \d\d:\d\d:\d\d\.\d+:\ [IW]\ \S+\.cc:\d+\]                      # TF's own C++ logger
      | USDT:                                                                             # Kineto probes
      | .*oneDNN\ custom\ operations\ are\ on
      | .*This\ TensorFlow\ binary\ is\ optimized
      | .*(?:To\ enable\ the\ following\ instructions|rebuild\ TensorFlow\ with\ the\ appropriate\ compiler)
      | .*Unable\ to\ register\ cu(?:DNN|FFT|BLAS)\ factory
      | .*computation\ placer\ already\ registered
      | .*Could\ not\ find\ cuda\ drivers\ on\ your\ machine
      | \[IPKernelApp\]\ \w+\ \|\ (?:Kernel\ is\ running\ over\ TCP|KeyboardInterrupt\ caught\ in\ kernel)  # a report's kernel
    )""", re.VERBOSE)

_LOGGERS = ("tensorflow", "absl", "h5py", "keras")
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
        self.dropped = 0

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
            if is_chatter(seg.decode("utf-8", "replace")):
                self.dropped += 1
            else:
                kept.append(seg)
        if kept:
            data = b"".join(kept)
            try:
                while data:
                    data = data[os.write(self.sink, data):]
            except OSError:
                pass


@contextmanager
def _fd2_filtered() -> Iterator[None]:
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
    try:
        yield
    finally:
        _flush_python_streams()
        os.dup2(saved, 2)  # closes our last write end of the pipe: the forwarder sees EOF
        forwarder.join(timeout=2.0)  # a child process still holding the pipe keeps it open: don't wait on it
        if not forwarder.is_alive():  # else the forwarder keeps writing to `saved` until the child lets go
            os.close(saved)


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


@contextmanager
def _python_quiet() -> Iterator[None]:
    """Keras/TF/absl Python warnings off, their loggers raised to ERROR."""
    levels = {}
    with warnings.catch_warnings():
        for module in (r"keras(\..*)?", r"tensorflow(\..*)?", r"absl(\..*)?", r"tf_keras(\..*)?"):
            warnings.filterwarnings("ignore", module=module)
        warnings.filterwarnings("ignore", message=r"The structure of `inputs` doesn't match")
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            levels[name] = logger.level
            if logger.getEffectiveLevel() < logging.ERROR:
                logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


@contextmanager
def quiet(verbose: bool | None = None) -> Iterator[None]:
    """Run a block with framework chatter silenced (see the module doc). ``verbose``: show everything (default:
    the ``MLMS_VERBOSE`` environment variable). Re-entrant: an inner ``quiet`` inside an outer one does nothing."""
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
        with _python_quiet(), _fd2_filtered():
            yield
    finally:
        with _lock:
            _depth -= 1
