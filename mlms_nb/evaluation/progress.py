"""Progress of one framework's passes, shown where the user is.

:class:`~mlms_nb.evaluation.reporter.Reporter` runs beside the work (in this process or a worker process): it emits
:class:`~mlms_nb.evaluation.records.PassProgress` records, at most every ``interval_s`` seconds and at each pass's
end, so they cross a process boundary like any record. :class:`ProgressDisplay` runs in the runner: one
``tqdm.auto`` bar per framework (a terminal line on stderr, an ipywidget in a notebook), reset for each pass (full
pass, warm-up, timed loop) with inputs done, inputs/s and the ETA; when the framework is done the bar becomes a
one-line summary of its full pass and stays. In a notebook the bar is plain HTML (a ``<progress>`` element) redrawn
in place through a display id -- no ipywidget: a saved notebook reopens with the summary line (no "model not
found"), the line wraps instead of being clipped, and no widget traffic marks the kernel idle while it works. Where nobody watches (stderr redirected to a file or a pipe, outside a
notebook kernel) there is no bar -- its carriage-return redraws would fill the log -- only that summary line.
"""
from __future__ import annotations

import math
import sys
import time

from mlms_nb.evaluation.records import FullPass, PassProgress, TimedLoop


class ProgressDisplay:
    """One tqdm bar per framework, fed by the records of its work (see the module). ``enabled=False``: nothing."""

    def __init__(self, model: str, enabled: bool, live: bool | None = None):
        self.model = model
        self.enabled = enabled
        #: draw live bars (a terminal or a notebook); otherwise only each framework's summary line, on stderr
        self.live = watched() if live is None else live
        self.bars: dict[str, object] = {}
        self.full_pass: dict[str, dict] = {}
        self.loops: dict[str, int] = {}

    def on_record(self, record) -> None:
        if not self.enabled:
            return
        if isinstance(record, FullPass):
            self.full_pass[record.framework] = record.row
        elif isinstance(record, TimedLoop):
            self.loops[record.framework] = self.loops.get(record.framework, 0) + 1
        elif isinstance(record, PassProgress):
            if self.live:
                self._show(record)
            else:
                self.bars.setdefault(record.framework, None)

    def _show(self, p: PassProgress) -> None:
        bar = self.bars.get(p.framework)
        if bar is None:
            if in_kernel():
                bar = self.bars[p.framework] = HtmlBar(total=p.total, desc=self._desc(p),
                                                       bar_format=STEP_FORMAT if p.step else None)
            else:
                from tqdm import tqdm

                bar = self.bars[p.framework] = tqdm(total=p.total, unit="input", leave=True, dynamic_ncols=True,
                                                   mininterval=0.2, desc=self._desc(p),
                                                   bar_format=STEP_FORMAT if p.step else None)
        if bar.desc.rstrip(": ") != self._desc(p) or (p.done < bar.n):  # a new pass: the same bar, reset
            bar.set_description_str(self._desc(p), refresh=False)
            bar.bar_format = STEP_FORMAT if p.step else None
            bar.reset(total=p.total)
        if p.total != bar.total:  # a loop's estimate moved
            _set_total(bar, p.total)
        if p.done > bar.n:
            bar.update(p.done - bar.n)
        if p.finished:  # its last state shows, whatever tqdm's refresh interval
            bar.refresh()

    def _desc(self, p: PassProgress) -> str:
        return f"{self.model} {p.framework}: {p.name}"

    def finish(self, framework: str) -> None:
        """The framework is done: its bar becomes the one-line summary of its full pass, and stays."""
        if framework not in self.bars:
            return
        bar = self.bars.pop(framework)
        summary = self.summary(framework)
        if bar is None:  # not live: the summary alone, as one line of the log
            if summary:
                print(summary, file=sys.stderr, flush=True)
            return
        if summary or bar.bar_format == STEP_FORMAT:  # a step's name would say it is still at it
            bar.bar_format = "{desc}"
            bar.set_description_str(summary or f"{self.model} {framework}: done", refresh=False)
        bar.refresh()
        bar.close()

    def summary(self, framework: str) -> str | None:
        """One line: the framework's full pass (inputs, wall time, inputs/s, where the time went) and its timed
        loops; None before its full pass was recorded."""
        row = self.full_pass.get(framework)
        summary = None
        if row:
            summary = (f"{self.model} {framework}: full pass {int(row['inputs']):,} inputs in {row['wall_s']:.3g} s = "
                       f"{row['inputs_per_s']:.4g} inputs/s (batch {int(row['batch_size'])}; preprocessing "
                       f"{row['preprocess_s']:.3g} s in {int(row['workers'])} worker {row.get('reader') or 'threads'}, "
                       f"inference {row['inference_s']:.3g} s, waited {row['wait_s']:.3g} s)")
            loops = self.loops.get(framework, 0)
            if loops:
                summary += f"; {loops} timed loop{'s' if loops > 1 else ''}"
        return summary

    def close(self) -> None:
        for framework in list(self.bars):
            self.finish(framework)


STEP_FORMAT = "{desc} [{elapsed}]"
"""How a step (no inputs to count) shows: its name and the time it has taken (tqdm's bar format)."""


def watched() -> bool:
    """True where a live bar reads well: stderr is a terminal, or this is a notebook's kernel (an HTML bar is drawn
    there, whatever stderr is)."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stderr
        pass
    return in_kernel()


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where rich output is shown)."""
    shell = sys.modules.get("IPython")
    ipython = getattr(shell, "get_ipython", lambda: None)() if shell else None
    return ipython is not None and "IPKernelApp" in getattr(ipython, "config", {})


class HtmlBar:
    """A progress bar for a notebook as static HTML, redrawn in place (``update_display_data``) at most every
    ``mininterval_s``; it answers the part of tqdm's interface :class:`ProgressDisplay` uses. With
    ``bar_format = "{desc}"`` it shows only its description (the summary line), which wraps."""

    def __init__(self, total: int | None, desc: str, mininterval_s: float = 0.2, bar_format: str | None = None):
        from IPython.display import display

        self.total, self.desc, self.n = total, desc, 0
        self.bar_format = bar_format
        self.mininterval_s = mininterval_s
        self._start = self._last = time.monotonic()
        self.handle = display(self._bundle(), raw=True, display_id=True)

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc
        if refresh:
            self.refresh()

    def reset(self, total: int | None = None) -> None:
        self.n, self.total, self._start = 0, total, time.monotonic()
        self.refresh()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.mininterval_s:
            self.refresh()

    def refresh(self) -> None:
        self._last = time.monotonic()
        if self.handle is not None:
            self.handle.update(self._bundle(), raw=True)

    def close(self) -> None:
        self.refresh()

    def text(self) -> str:
        if self.bar_format == "{desc}":
            return self.desc
        elapsed = time.monotonic() - self._start
        if self.bar_format == STEP_FORMAT:
            return f"{self.desc} [{_clock(elapsed)}]"
        rate = self.n / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - self.n) / rate if rate > 0 else float("nan")
            left = f", about {_clock(eta)} left" if math.isfinite(eta) and self.n < self.total else ""
            return (f"{self.desc}: {min(100, 100 * self.n // self.total)}% {self.n:,}/{self.total:,} inputs "
                    f"[{_clock(elapsed)}{left}, {rate:.4g} inputs/s]")
        return f"{self.desc}: {self.n:,} inputs [{_clock(elapsed)}, {rate:.4g} inputs/s]"

    def _bundle(self) -> dict:
        import html

        text = self.text()
        bar = "" if self.bar_format in ("{desc}", STEP_FORMAT) or not self.total else (
            f'<progress value="{min(self.n, self.total)}" max="{self.total}" '
            'style="width:16em;vertical-align:middle;margin-right:0.6em"></progress>')
        return {"text/plain": text,
                "text/html": f'<div class="mlms-progress" style="white-space:normal;overflow-wrap:anywhere">{bar}'
                             f'<span>{html.escape(text)}</span></div>'}


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def _set_total(bar, total: int | None) -> None:
    """Change a running bar's total (tqdm's ``reset`` would zero it); a notebook bar's widget follows."""
    bar.total = total
    widget = getattr(bar, "container", None)
    if widget is not None and total is not None:
        widget.children[1].max = total
