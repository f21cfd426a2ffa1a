"""What an evaluation asks of an agent (``where="torch>=2.0 device=cpu arch=x86_64 team=vision"``), and whether an
agent's advertised stack satisfies it.

One constraint per whitespace-separated word (commas separate too):

- ``torch``, ``torch>=2.0``, ``onnxruntime~=1.20``: the agent serves that framework, at a version in the
  range (PEP 440 specifiers, :mod:`packaging.specifiers`; aliases such as ``pytorch`` and ``ort`` accepted);
- ``device=cpu`` / ``device=cuda``: a CUDA device needs at least one GPU on the agent;
- ``arch=x86_64``, ``host=NAME``, ``name=AGENT``: the CPU architecture, the host name, the agent's name;
- ``threads>=2``, ``cores>=8``, ``memory>=16GiB`` (also ``=``, ``<=``, ``>``, ``<``): the agent's worker threads,
  the machine's logical CPUs and memory;
- any other ``key=value``: the agent's label ``key`` equals ``value`` (``mlms agent --labels key=value``).

Besides the user's words, the evaluation adds its own: every framework it runs, and each manifest's framework
version range (npm-style, as manifests write it).
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

from mlms_nb.errors import MlmsError
from mlms_nb.manifest import FRAMEWORKS, canonical_framework


class ConstraintError(MlmsError, ValueError):
    """A ``where`` constraint that cannot be read; the sentence names the word and the forms accepted."""


_FORMS = ("forms: torch, torch>=2.0, device=cpu|cuda, arch=x86_64, host=NAME, name=AGENT, threads>=N, cores>=N, "
          "memory>=16GiB, or a label key=value")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq, "=": operator.eq}
_NUMBERS = {"threads": "threads", "cores": "logical_cores", "memory": "memory_bytes"}
_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)\s*(>=|<=|==|!=|~=|===|=|>|<)?\s*(.*)$")


@dataclass(frozen=True)
class Constraint:
    """One word of ``where``: ``kind`` framework | version-range | device | arch | host | name | number | label."""
    word: str
    kind: str
    key: str
    op: str = ""
    value: Any = None

    def check(self, agent: dict) -> str | None:
        """None when ``agent`` (an advertised description) satisfies it, else what it lacks, in words."""
        stack = agent.get("stack") or {}
        hardware, software = stack.get("hardware") or {}, stack.get("software") or {}
        if self.kind in ("framework", "version-range"):
            version = (agent.get("frameworks") or {}).get(self.key)
            if version is None:
                return f"does not serve {self.key}"
            if self.kind == "framework" and self.value is not None and not self.value.contains(version,
                                                                                            prereleases=True):
                return f"has {self.key} {version}, not {self.value}"
            if self.kind == "version-range" and not _in_npm_range(version, self.value):
                return f"has {self.key} {version}, outside the manifest's range {self.value}"
            return None
        if self.kind == "device":
            if self.value == "cuda" and not hardware.get("gpus"):
                return "has no CUDA GPU"
            return None
        if self.kind == "number":
            have = agent.get("threads") if self.key == "threads" else hardware.get(self.key)
            if have is None or not _COMPARE[self.op](have, self.value):
                return f"has {self.word.split(self.op)[0].strip()} {have}"
            return None
        have = {"arch": hardware.get("cpu_arch"), "host": stack.get("hostname") or agent.get("host"),
                "name": agent.get("name")}.get(self.kind) if self.kind != "label" else \
            (agent.get("labels") or {}).get(self.key)
        if have is None or str(have) != str(self.value):
            what = f"label {self.key}" if self.kind == "label" else self.kind
            return f"has no {what}" if have is None else f"has {what} {have}"
        return None


def parse_where(where: str | None) -> list[Constraint]:
    """The constraints of a ``where`` string (see the module); an unreadable word is a `ConstraintError`."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    out = []
    for word in (w for w in re.split(r"[\s,]+", where or "") if w):
        match = _WORD.match(word)
        if not match:
            raise ConstraintError(f"where: cannot read {word!r}; {_FORMS}")
        key, op, rest = match.group(1), match.group(2) or "", match.group(3)
        fw = canonical_framework(key)
        if fw in FRAMEWORKS:
            spec = None
            if op:
                try:
                    spec = SpecifierSet(f"{op}{rest}")
                except InvalidSpecifier:
                    raise ConstraintError(f"where: {word!r} is not a version range (PEP 440, e.g. {fw}>=2.0)") from None
            out.append(Constraint(word, "framework", fw, op, spec))
        elif key in _NUMBERS:
            if op not in _COMPARE:
                raise ConstraintError(f"where: {word!r} needs a comparison, e.g. {key}>=2")
            out.append(Constraint(word, "number", _NUMBERS[key], op, _number(key, rest, word)))
        elif op != "=" or not rest:
            raise ConstraintError(f"where: cannot read {word!r}; {_FORMS}")
        elif key == "device":
            device = rest.split(":")[0].lower()
            if device not in ("cpu", "cuda"):
                raise ConstraintError(f"where: {word!r}: expected device=cpu or device=cuda")
            out.append(Constraint(word, "device", key, op, device))
        elif key in ("arch", "host", "name"):
            out.append(Constraint(word, key, key, op, rest))
        else:
            out.append(Constraint(word, "label", key, op, rest))
    return out


def evaluation_constraints(frameworks: list[str], version_ranges: dict[str, str]) -> list[Constraint]:
    """What the evaluation itself needs: each framework it runs, within its manifest's version range."""
    out = [Constraint(fw, "framework", fw) for fw in frameworks]
    out += [Constraint(f"{fw} {rng} (manifest)", "version-range", fw, value=rng) for fw, rng in version_ranges.items()
            if rng and rng.strip() not in ("*", "")]
    return out


def unmet(agent: dict, constraints: list[Constraint]) -> list[str]:
    """What ``agent`` lacks among ``constraints``, one phrase each (empty: it matches)."""
    return [f"{c.word}: {why}" for c in constraints if (why := c.check(agent)) is not None]


def _number(key: str, text: str, word: str) -> float:
    if key == "memory":
        from mlms_nb.options import parse_bytes

        try:
            return parse_bytes(text)
        except ValueError:
            raise ConstraintError(f"where: {word!r}: expected a size such as 16GiB") from None
    try:
        return float(text)
    except ValueError:
        raise ConstraintError(f"where: {word!r}: expected a number") from None


def _in_npm_range(version: str, npm_range: str) -> bool:
    import semantic_version

    try:
        return semantic_version.Version.coerce(str(version).split("+")[0]) in semantic_version.NpmSpec(npm_range)
    except ValueError:
        return True  # a range the manifest checks elsewhere; not a reason to refuse an agent
