"""A framework profiler that writes files (ONNX Runtime's session profile, TensorFlow's XSpace), run while a
predictor traces: profile into a temporary folder, import the profile into the tracer on stop.

:class:`FrameworkProfile` holds what both need: the folder (removed when the session ends, whatever happens),
the Unix - ``perf_counter_ns`` clock offset read at the start (profilers stamp the Unix clock), and the
``perf_counter_ns`` window of each traced ``predict`` call, by call number (the profiled runs are moved into
these windows, :mod:`mlms_nb.tracing.align`).
"""
from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from mlms_nb._fs import owned
from mlms_nb.tracing.align import wall_offset_ns


class FrameworkProfile:
    """One profiling session of one predictor (see the module docstring).

    ``windows``: call number -> ``(start_ns, end_ns, predict span id, native thread id)``; ``state``: what the
    framework's ``begin`` returned (its profiled session, say)."""

    def __init__(self, prefix: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=owned(prefix)))
        self.wall_offset_ns = wall_offset_ns()
        self.windows: dict[int, tuple[int, int, int, int]] = {}
        self.state: Any = None
        self._calls = itertools.count()

    @classmethod
    def start(cls, prefix: str, begin: Callable[[Path], Any]) -> "FrameworkProfile":
        """Make the folder and run ``begin(folder)``, which starts the framework's profiler writing there; the
        folder is removed again when ``begin`` raises."""
        profile = cls(prefix)
        try:
            profile.state = begin(profile.folder)
        except BaseException:
            profile.discard()
            raise
        return profile

    @contextlib.contextmanager
    def call(self, parent: int) -> Iterator[int]:
        """Time one traced framework call made inside the block (``perf_counter_ns`` around it); yields its call
        number (TensorFlow marks the call with it). ``parent``: the id of the ``predict`` span it runs in."""
        number = next(self._calls)
        t0 = time.perf_counter_ns()
        yield number
        self.windows[number] = (t0, time.perf_counter_ns(), parent, threading.get_native_id())

    def finish(self, tracer, metadata_key: str, read: Callable[["FrameworkProfile"], dict]) -> None:
        """``read(self)`` ends the framework's profile and adds its spans to ``tracer``, returning a summary that
        goes to ``tracer.metadata[metadata_key]``; the folder is removed whatever happens."""
        try:
            found = read(self)
            tracer.metadata.setdefault(metadata_key, {}).update(found)
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the folder and whatever the profiler wrote into it."""
        shutil.rmtree(self.folder, ignore_errors=True)
