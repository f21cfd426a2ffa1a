"""The machinery of the options model (:mod:`mlms_nb.options` holds the options themselves): the :class:`Options`
base, :func:`_opt` (one option: default, help, flag, unit), :func:`fields` (the flat table the CLI and the magic
read), :func:`cli_words` (flags that give recorded option values back), :func:`takes` (a facade function's signature and validation), :func:`doc`, and how errors spell a name
(``min_time_s=`` in Python, ``--min-time`` on the command line: :func:`spelling`, :func:`spell`).
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import inspect
from enum import Enum
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlms_nb.errors import MlmsError

_SPELLING: contextvars.ContextVar[str] = contextvars.ContextVar("mlms_nb_spelling", default="python")


class OptionsError(MlmsError, ValueError):
    """An option with a bad value, or an unknown one; the sentence names it as the caller spells it."""


@contextlib.contextmanager
def spelling(kind: str):
    """Within the block, `spell` writes options as ``"cli"`` flags (the CLI and the magic) or ``"python"`` keywords."""
    token = _SPELLING.set(kind)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def current_spelling() -> str:
    """How options are written in messages right now: ``"python"`` or ``"cli"`` (see `spelling`)."""
    return _SPELLING.get()


def spell(name: str, value: Any = ...) -> str:
    """``min_time_s=...`` / ``min_time_s=0.5`` in Python; ``--min-time`` / ``--min-time 0.5`` for the CLI."""
    flag = _FLAGS.get(name)
    if _SPELLING.get() == "cli" and flag:
        return flag if value is ... else f"{flag} {value}"
    return f"{name}=..." if value is ... else f"{name}={value!r}"


def spell_on(name: str) -> str:
    """A switch turned on as the caller writes it: ``isolate=True`` in Python, ``--isolate`` for the CLI."""
    return _FLAGS[name] if _SPELLING.get() == "cli" and name in _FLAGS else f"{name}=True"


def option(default: Any, description: str, cli: str | None = None, unit: str = "", **kw) -> Any:
    extra = {k: v for k, v in (("cli", cli), ("unit", unit)) if v}
    extra.update(kw.pop("extra", {}))
    return Field(default, description=description, json_schema_extra=extra or None, **kw)


class Options(BaseModel):
    """Base of the option models: unknown keywords are errors, and a failed validation is one `OptionsError`."""
    model_config = ConfigDict(extra="forbid", frozen=True)  # validated once; below the facade, never changed

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise OptionsError(_sentence(err, type(self))) from None

    @classmethod
    def from_keywords(cls, **keywords: Any) -> "Options":
        """The model from flat keywords (``min_time_s=0.5`` goes to ``timing``)."""
        data: dict[str, Any] = {}
        for key, value in keywords.items():
            owner = _owner(cls, key)
            if owner is None or owner == key:
                data[key] = value  # a top-level option, or an unknown one (validation names it)
            else:
                data.setdefault(owner, {})[key] = value
        return cls(**data)

    def flat(self) -> dict[str, Any]:
        """The options as flat keywords (sub-models expanded in place)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            out.update(value.flat() if isinstance(value, Options) else {name: value})
        return out


# ---------------------------------------------------------------------------------------------- fields, flat

def _is_model(cls: type[Options], name: str) -> bool:
    annotation = cls.model_fields[name].annotation if name in cls.model_fields else None
    return isinstance(annotation, type) and issubclass(annotation, Options)


def _owner(cls: type[Options], name: str) -> str | None:
    """The top-level field that holds flat keyword ``name``: itself, or the sub-model containing it."""
    for top in cls.model_fields:
        if top == name and not _is_model(cls, top):
            return top
        if _is_model(cls, top) and name in cls.model_fields[top].annotation.model_fields:
            return top
    return None


def fields(cls: type[Options], internal: bool = False) -> list[tuple[str, Any]]:
    """``(name, FieldInfo)`` of the flat options of ``cls`` in order (sub-models expanded in place)."""
    out = []
    for name, info in cls.model_fields.items():
        if _is_model(cls, name):
            out += fields(info.annotation, internal)
        elif internal or not (info.json_schema_extra or {}).get("internal"):
            out.append((name, info))
    return out


_FLAGS: dict[str, str] = {}
"""Option name -> its flag, for :func:`spell`: filled by :func:`register_flags` from every verb's options model."""


def register_flags(*models: type[Options]) -> None:
    """Learn the flags of ``models`` (mlms_nb.options registers all of its models at import)."""
    _FLAGS.update({name: (info.json_schema_extra or {})["cli"] for model in models
                   for name, info in fields(model, True) if (info.json_schema_extra or {}).get("cli")})


def cli_words(cls: type[Options], values: dict[str, Any]) -> list[str]:
    """The command-line flags that give ``cls`` the flat option ``values`` (as `Options.flat` or a run's recorded
    options hold them; names that are no option of ``cls`` are ignored): one flag per option that has one and
    differs from its default, spelled as the parser reads it back (lists comma-joined, switches bare)."""
    words: list[str] = []
    for name, info in fields(cls):
        flag = (info.json_schema_extra or {}).get("cli")
        if not flag or name not in values:
            continue
        value, default = values[name], info.get_default(call_default_factory=True)
        if isinstance(default, Enum) and value is not None and not isinstance(value, Enum):
            value = _member(type(default), value)  # a recorded name ("FRAMEWORK") against the model's member
        if value == default or value is None:
            continue
        if isinstance(default, bool):
            words.append(flag)  # a switch: --trust turns it on, --no-progress off; either way, away from the default
        elif isinstance(value, (list, tuple)):
            words += [flag, ",".join(map(str, value))]
        else:
            words += [flag, value.name if isinstance(value, Enum) else str(value)]
    return words


def _member(kind: type[Enum], value: Any) -> Any:
    """The member of ``kind`` named (any case) or numbered ``value``; ``value`` itself when it is neither."""
    try:
        return kind[str(value).strip().upper().replace("-", "_")]
    except KeyError:
        try:
            return kind(value)
        except ValueError:
            return value


def _sentence(err: ValidationError, cls: type[Options]) -> str:
    """One sentence per problem, each naming the option as the caller spells it (an option of several types, such as
    ``history``, named once, with what each type expected)."""
    known = [name for name, _ in fields(cls)]
    every = {name for name, _ in fields(cls, True)}
    problems: dict[str, list[str]] = {}
    for e in err.errors(include_url=False):
        strs = [str(p) for p in e["loc"] if isinstance(p, str)]
        # a union's errors carry the member type after the option's name (('history', 'bool')): name the option
        name = next((p for p in reversed(strs) if p in every), strs[-1] if strs else "")
        message = e["msg"].removeprefix("Value error, ")
        ctx = e.get("ctx") or {}
        unit = next(((info.json_schema_extra or {}).get("unit", "") for n, info in fields(cls, True) if n == name), "")
        unit = f" {unit}" if unit else ""
        phrase = {"greater_than_equal": f"expected at least {ctx.get('ge'):g}{unit}" if "ge" in ctx else message,
                  "greater_than": f"expected more than {ctx.get('gt'):g}{unit}" if "gt" in ctx else message,
                  "int_parsing": "expected an integer", "int_type": "expected an integer",
                  "int_from_float": "expected an integer", "float_parsing": "expected a number",
                  "float_type": "expected a number", "bool_parsing": "expected true or false",
                  "bool_type": "expected true or false", "string_type": "expected a string",
                  "literal_error": f"expected {ctx.get('expected')}"}.get(e["type"], message)
        if isinstance(ctx.get("error"), OptionsError):  # a sub-model's sentence, already spelled
            problems.setdefault(str(ctx["error"]), [])
        elif e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, known, n=1)
            problems.setdefault(f"unknown option {spell(name, e['input'])}" + (
                f"; did you mean {close[0]}?" if close else f"; the options are {', '.join(known)}"), [])
        elif not name:
            problems.setdefault(message, [])
        else:
            problems.setdefault(spell(name, e["input"]), []).append(phrase)
    return "; ".join(f"{head}: {_either(list(dict.fromkeys(phrases)))}" if phrases else head
                     for head, phrases in problems.items())


def _either(phrases: list[str]) -> str:
    """``expected A, or B`` from ``expected A`` and ``expected B`` (a union's members)."""
    if len(phrases) > 1 and all(p.startswith("expected ") for p in phrases):
        return "expected " + ", or ".join(p.removeprefix("expected ") for p in phrases)
    return ", or ".join(phrases)


def python_default(info) -> Any:
    """The default a Python caller sees (a tuple where the model keeps a list; the string 'torch')."""
    extra = info.json_schema_extra or {}
    return extra["python_default"] if "python_default" in extra else info.get_default(call_default_factory=True)


def takes(cls: type[Options], *leading: str) -> Callable:
    """Decorate ``f(*leading, options)``: the result takes ``*leading`` and the options as keywords (its signature
    lists them with their defaults), validates them through ``cls`` and passes the model as the last argument."""
    def decorate(function: Callable) -> Callable:
        own = inspect.signature(function)
        kw_only = [name for name in leading if own.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY]
        positional = [name for name in leading if name not in kw_only]
        params = [own.parameters[name] for name in positional]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=python_default(info),
                                     annotation=(info.json_schema_extra or {}).get("python_type", info.annotation))
                   for name, info in fields(cls)]
        params += [own.parameters[name] for name in kw_only]  # keyword-only ones of the function's own, last
        signature = inspect.Signature(params, return_annotation=own.return_annotation)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as err:  # an unknown keyword: validation names it and suggests the right one
                if not all(k in signature.parameters for k in kwargs):
                    extra = {k: v for k, v in kwargs.items() if k not in signature.parameters}
                    cls.from_keywords(**extra)
                raise TypeError(f"{function.__name__}(): {err}") from None
            given = dict(bound.arguments)
            lead = [given.pop(name) for name in positional if name in given]
            own_keywords = {name: given.pop(name) for name in kw_only if name in given}
            return function(*lead, cls.from_keywords(**given), **own_keywords)

        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        wrapper.__doc__ = (function.__doc__ or "").rstrip() + "\n\n" + doc(cls)
        return wrapper
    return decorate


def doc(cls: type[Options]) -> str:
    """The options of ``cls`` as docstring lines: name (unit, default): description."""
    lines = ["Options (keywords; the CLI and magic flag in brackets):"]
    for name, info in fields(cls):
        extra = info.json_schema_extra or {}
        unit = f", {extra['unit']}" if extra.get("unit") else ""
        flag = f" [{extra['cli']}]" if extra.get("cli") else ""
        lines.append(f"    ``{name}`` (default {python_default(info)!r}{unit}){flag}: {info.description}")
    return "\n".join(lines)
