"""``%mlms VERB ...``: the IPython face of the same verbs as the CLI (see commands.py), and
``%%mlms trace``: run a cell under the tracer (see `mlms_nb.trace`). A verb's RUN argument may name a notebook
variable holding an Evaluation or a Trace; analyses display their table, then their figure.

Each verb's options are parsed with IPython's ``magic_arguments`` from the one argument list in
commands.py; results display as a mime bundle (HTML + plain text). ``-o`` returns the result object,
``--save VAR`` stores it in the user namespace.
"""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from mlms_nb.commands import ARGUMENTS, RUNNERS, VERBS, help_text
from mlms_nb.errors import MlmsError


def _verb_function(verb: str):
    """A function carrying the verb's magic_arguments parser (``%mlms VERB -h`` prints it)."""
    def verb_function(line):  # pragma: no cover - only its parser is used
        return line

    verb_function.__doc__ = VERBS[verb]
    func = argument("--save", metavar="VAR", default=None, help="store the result in this variable")(verb_function)
    func = argument("-o", dest="return_value", action="store_true", help="return the result object")(func)
    for flags, kwargs in reversed(ARGUMENTS[verb]):
        func = argument(*flags, **kwargs)(func)
    return magic_arguments(name=f"%mlms {verb}")(func)


_VERB_FUNCTIONS = {verb: _verb_function(verb) for verb in VERBS}


@magic_arguments(name="%%mlms trace")
@argument("--level", default="FRAMEWORK",
          help="deepest trace level: APPLICATION, MODEL, FRAMEWORK, ML_LIBRARY, SYSTEM_LIBRARY, HARDWARE, FULL")
@argument("--chrome", metavar="PATH", default=None, help="also write the trace as Chrome trace JSON (Perfetto)")
@argument("-o", dest="return_value", action="store_true", help="return the Trace")
@argument("--save", metavar="VAR", default=None, help="store the Trace in this variable")
def _trace_cell(line):  # pragma: no cover - only its parser is used
    """Run the cell under the tracer: an APPLICATION span for the cell, plus the spans of every predictor
    opened in it."""
    return line


@magics_class
class MlmsMagics(Magics):
    @line_cell_magic
    def mlms(self, line: str = "", cell: str | None = None):
        """MLModelScope in the notebook: ``%mlms models``, ``%mlms eval MODEL ...``, ``%mlms history``;
        ``%%mlms trace [--level L]`` runs a cell under the tracer."""
        if cell is not None:
            return self._cell(line, cell)
        words = shlex.split(line)
        if not words or words[0] in ("help", "-h", "--help"):
            print(help_text())
            return None
        verb, rest = words[0], line.split(None, 1)[1] if len(words) > 1 else ""
        if verb not in VERBS:
            print(f"%mlms: unknown verb {verb!r}\n\n{help_text()}")
            return None
        parser = _VERB_FUNCTIONS[verb].parser
        if "-h" in words[1:] or "--help" in words[1:]:
            print(parser.format_help())
            return None
        try:
            args = parse_argstring(_VERB_FUNCTIONS[verb], rest)
        except UsageError as err:
            print(f"%mlms {verb}: {err}\n{parser.format_usage()}")
            return None
        for name in ("run", "run_a", "run_b"):  # RUN may name a notebook variable holding an Evaluation or Trace
            ref = getattr(args, name, None)
            if isinstance(ref, str) and ref.isidentifier() and ref in self.shell.user_ns:
                setattr(args, name, self.shell.user_ns[ref])
        try:
            out = RUNNERS[verb](args)
        except MlmsError as err:
            print(f"%mlms {verb}: {err}")
            return None
        if args.save:
            self.shell.user_ns[args.save] = out.value
        if args.return_value:
            return out.value
        display(out)
        if out.figure is not None:
            from mlms_nb.analyses import show

            show(out.figure)
        return None


    def _cell(self, line: str, cell: str):
        from mlms_nb.api import trace
        from mlms_nb.commands import trace_summary

        words = shlex.split(line)
        if not words or words[0] != "trace":
            print("%%mlms: the cell verb is `trace`: %%mlms trace [--level FRAMEWORK] [--save VAR] [-o]")
            return None
        if "-h" in words[1:] or "--help" in words[1:]:
            print(_trace_cell.parser.format_help())
            return None
        try:
            args = parse_argstring(_trace_cell, line.split(None, 1)[1] if len(words) > 1 else "")
            session = trace(args.level, name="%%mlms trace cell")
        except (UsageError, MlmsError) as err:
            print(f"%%mlms trace: {err}")
            return None
        with session:
            result = self.shell.run_cell(cell)
        if args.chrome:
            session.trace.to_chrome(args.chrome)
        if args.save:
            self.shell.user_ns[args.save] = session.trace
        if not result.success:
            return None
        if args.return_value:
            return session.trace
        display(trace_summary(session.trace))
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(MlmsMagics)
