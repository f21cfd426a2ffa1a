"""``%mlms VERB ...``: the IPython face of the same verbs as the CLI (see commands.py).

Each verb's options are parsed with IPython's ``magic_arguments`` from the one argument list in
commands.py; results display as a mime bundle (HTML + plain text). ``-o`` returns the result object,
``--save VAR`` stores it in the user namespace.
"""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .commands import ARGUMENTS, RUNNERS, VERBS, help_text
from .errors import MlmsError


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


@magics_class
class MlmsMagics(Magics):
    @line_magic
    def mlms(self, line: str = ""):
        """MLModelScope in the notebook: ``%mlms models``, ``%mlms eval MODEL ...``, ``%mlms history``."""
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
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(MlmsMagics)
