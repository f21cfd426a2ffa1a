"""The options of `evaluate` and the other verbs, written once (pydantic models).

Each option is one field: its name (the Python keyword), type, default, bounds, a ``description`` (the help text)
and ``json_schema_extra={"cli": "--min-time", "unit": "s"}`` (the flag of ``mlms`` and ``%mlms``). From these
come the validation of the Python call (:func:`takes` gives a facade function its signature and validates its
keywords), the argparse table of the CLI and the magic and their help texts (:func:`mlms_nb.commands.arguments`
reads :func:`fields`). A sub-model groups options (:class:`Timing`, :class:`Tracing`); the Python signature lists
them flat, in field order.

Errors and advice name an option the way the caller spells it: ``min_time_s=`` in Python, ``--min-time`` on the
command line and in the magic (:func:`spelling` switches; :func:`spell` writes a name).

The public API, whatever module it lives in: import it from here. Inside, top to bottom: `verbs` (the other
verbs' options and `MODELS`) > `evaluate` (the options of an evaluation) > `base` (the :class:`Options` base,
:func:`option`, :func:`fields`, :func:`takes`, :func:`doc`, :func:`cli_words`, the spelling of names in errors).
"""
from __future__ import annotations

from mlms_nb.options.base import (Options, OptionsError, cli_words, current_spelling, doc, fields, option,
                                  python_default, register_flags, spell, spell_on, spelling, takes)
from mlms_nb.options.evaluate import (AgentsWhere, EvaluateOptions, Generation, Isolation, Remote, Timing, Tls, Tracing,
                                      frameworks_list, parse_bytes, size_text)
from mlms_nb.options.verbs import (MODELS, AgentOptions, AgentsOptions, CompareOptions, DivergeOptions, HistoryOptions,
                                   LayersOptions, RooflineOptions, SchedulerOptions)

__all__ = [
    "MODELS", "AgentOptions", "AgentsOptions", "AgentsWhere", "CompareOptions", "DivergeOptions", "EvaluateOptions",
    "Generation", "HistoryOptions", "Isolation", "LayersOptions", "Options", "OptionsError", "Remote",
    "RooflineOptions", "SchedulerOptions", "Timing", "Tls", "Tracing", "cli_words", "current_spelling", "doc",
    "fields", "frameworks_list", "option", "parse_bytes", "python_default", "register_flags", "size_text", "spell",
    "spell_on", "spelling", "takes",
]
