"""``%mlms VERB ...``: the IPython face of the CLI's verbs (see commands.py), and ``%%mlms trace``: run a cell
under the tracer (see `mlms_nb.trace`). They behave like IPython's own magics:

- a failed ``%mlms`` raises `UsageError` (one sentence, no traceback), so "Run All", nbclient and papermill stop
  at that cell; Ctrl-C does the same, after keeping (and showing) what was measured;
- ``%%mlms trace`` keeps the trace (``--save``, ``--chrome``) and then fails with the cell's own error;
- the line is taken as typed (``@no_var_expand``): a verb's RUN argument may name a notebook variable holding an
  Evaluation or a Trace, and ``--save VAR`` names the variable to store the result in; ``-o`` returns it.

Results display as a mime bundle (HTML + plain text) rendered by :mod:`mlms_nb.display`; analyses show their
table, then their figure.
"""
from __future__ import annotations

import argparse
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.display import display

from mlms_nb import api
from mlms_nb import display as render
from mlms_nb.commands import VERBS, add_arguments, help_text, run
from mlms_nb.errors import MlmsError


class _Parser(argparse.ArgumentParser):
    """argparse that raises `UsageError` (shown as one line, and the cell fails) instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def verb_parser(verb: str) -> _Parser:
    parser = add_arguments(_Parser(prog=f"%mlms {verb}", description=VERBS[verb], add_help=False), verb)
    parser.add_argument("-o", dest="return_value", action="store_true", help="return the result object")
    parser.add_argument("--save", metavar="VAR", default=None, help="store the result in this variable")
    return parser


def trace_parser() -> _Parser:
    parser = _Parser(prog="%%mlms trace", add_help=False, description="Run the cell under the tracer: an "
                     "APPLICATION span for the cell, plus the spans of every predictor opened in it.")
    parser.add_argument("--level", default="FRAMEWORK", help="deepest trace level: APPLICATION, MODEL, FRAMEWORK, "
                        "ML_LIBRARY, SYSTEM_LIBRARY, HARDWARE, FULL (default: FRAMEWORK)")
    parser.add_argument("--chrome", metavar="PATH", default=None, help="also write the trace as Chrome trace JSON")
    parser.add_argument("-o", dest="return_value", action="store_true", help="return the Trace")
    parser.add_argument("--save", metavar="VAR", default=None, help="store the Trace in this variable")
    return parser


def _words(line: str, prog: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as err:  # an unbalanced quote
        raise UsageError(f"{prog}: {err}") from None


def _wants_help(words: list[str]) -> bool:
    return "-h" in words or "--help" in words


@magics_class
class MlmsMagics(Magics):
    @no_var_expand
    @line_cell_magic
    def mlms(self, line: str = "", cell: str | None = None):
        if cell is not None:
            return self._trace_cell(line, cell)
        words = _words(line, "%mlms")
        if not words or words[0] in ("help", "-h", "--help"):
            print(help_text())
            return None
        verb = words[0]
        if verb not in VERBS:
            raise UsageError(f"%mlms: unknown verb {verb!r}; the verbs are {', '.join(VERBS)} (`%mlms --help`)")
        if verb in ("agent", "scheduler"):  # they serve until stopped: the kernel would do nothing else
            raise UsageError(f"%mlms {verb} runs until it is stopped, which would hold this kernel: start it in a "
                             f"terminal (`mlms {verb} ...`) or with subprocess (example_notebooks/08_agents.ipynb)")
        parser = verb_parser(verb)
        if _wants_help(words[1:]):
            print(parser.format_help())
            return None
        args = parser.parse_args(words[1:])
        # RUN may name a notebook variable holding an Evaluation or Trace; eval's MODEL a live model or Manifest
        for name in ("run", "run_a", "run_b", "model", "inputs"):
            ref = getattr(args, name, None)
            if isinstance(ref, str) and ref.isidentifier() and ref in self.shell.user_ns:
                setattr(args, name, self.shell.user_ns[ref])
        try:
            out = run(verb, args)
        except MlmsError as err:
            raise UsageError(f"%mlms {verb}: {err}") from None
        except KeyboardInterrupt:
            raise UsageError(f"%mlms {verb}: interrupted (Ctrl-C)") from None
        if args.save:
            self.shell.user_ns[args.save] = out.value
        if out.exit_code == 130:  # interrupted inside the sweep: show what was measured, then stop Run All
            display(out)
            kept = f"; it is in `{args.save}`" if args.save else ""
            raise UsageError(f"%mlms {verb}: interrupted (Ctrl-C); the result above holds what was measured before "
                             f"it{kept}")
        if verb == "eval" and out.exit_code:  # an error, timeout, crash or stop signal in a framework, or not stored
            display(out)
            kept = f" (it is in `{args.save}`)" if args.save else ""
            runs = out.value if isinstance(out.value, list) else [out.value]  # --all: one evaluation per agent
            missing = "; ".join(m for ev in runs for m in ev.missing()) or "; ".join(
                w for ev in runs for w in ev.warnings if "not saved" in w)
            raise UsageError(f"%mlms {verb}: {missing}; the result above holds what was measured{kept}")
        if args.return_value:
            return out.value
        display(out)
        if out.figure is not None:
            from mlms_nb.analyses import show

            show(out.figure)
        return None

    def _trace_cell(self, line: str, cell: str):
        words = _words(line, "%%mlms")
        if not words or words[0] != "trace":
            raise UsageError("%%mlms: the cell verb is `trace`: %%mlms trace [--level FRAMEWORK] [--chrome PATH] "
                             "[--save VAR] [-o]")
        parser = trace_parser()
        if _wants_help(words[1:]):
            print(parser.format_help())
            return None
        args = parser.parse_args(words[1:])
        try:
            session = api.trace(args.level, name="%%mlms trace cell")
        except MlmsError as err:
            raise UsageError(f"%%mlms trace: {err}") from None
        with session:
            result = self.shell.run_cell(cell)
        if args.chrome:
            session.trace.to_chrome(args.chrome)
        if args.save:
            self.shell.user_ns[args.save] = session.trace
        error = result.error_in_exec or result.error_before_exec
        if error is not None:  # the trace is kept; the cell fails with its own error, shown once
            _raise_shown(self.shell, error)
        if args.return_value:
            return session.trace
        display(render.mimebundle(session.trace), raw=True)
        return None


MlmsMagics.mlms.__doc__ = help_text()


def _raise_shown(shell, error: BaseException) -> None:
    """Raise ``error`` again, so the cell fails ("Run All", nbclient and papermill stop, as pyinstrument's
    magic stops on Ctrl-C), without printing the traceback the inner cell already printed: a one-shot handler for
    this very exception; any other error is shown as usual."""
    saved = shell.custom_exceptions, shell.CustomTB

    def handler(self, etype, value, tb, tb_offset=None):
        shell.custom_exceptions, shell.CustomTB = saved
        if value is not error:
            return self.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        return None

    shell.set_custom_exc((type(error),), handler)
    raise error


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(MlmsMagics)
