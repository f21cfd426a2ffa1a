"""The ``mlms`` command: the same verbs as ``%mlms``, printing text tables or ``--json``. Exit codes: 0 done,
1 something not measured (an error, timeout or crash in one framework, or every framework failing while it ran) or
not stored in the history, 2 refused before measuring: a usage error or an `MlmsError` (one sentence on stderr), 130
interrupted, 143 stopped by SIGTERM/SIGHUP (what was measured
is printed and stored)."""
from __future__ import annotations

import logging
import sys

from mlms_nb.commands import cli_parser, run
from mlms_nb.errors import MlmsError, RunFailedError


def main(argv: list[str] | None = None) -> int:
    parser = cli_parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 0
    # our own progress lines at INFO; the libraries' (onnx_ir's "Replaced initializer", torch's "FakeTensor cache
    # stats" at exit) only from WARNING up, and while a verb runs those go to $MLMS_HOME/logs/frameworks.log
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("mlms_nb").setLevel(logging.INFO)
    try:
        out = run(args.verb, args)
    except MlmsError as err:
        print(f"mlms {args.verb}: {err}", file=sys.stderr)
        return 1 if isinstance(err, RunFailedError) else 2
    except KeyboardInterrupt:
        print(f"mlms {args.verb}: interrupted", file=sys.stderr)
        return 130
    print(out.json() if getattr(args, "json", False) else out.text)
    for note in out.notes:  # a framework warning that matters, in one sentence of ours (mlms_nb._translate)
        print(f"mlms {args.verb}: {note}", file=sys.stderr)
    return out.exit_code


if __name__ == "__main__":
    sys.exit(main())
