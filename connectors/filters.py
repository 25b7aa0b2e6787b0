"""A user's filter expression, checked before it reaches Milvus.

A filter is the user's input, and Milvus does not guard itself against all of it: milvus-lite
2.5.1's server process dies on an integer divided or taken modulo by zero (``label / 0``,
``label % (1 - 1)``, ``label // 2``), parses ``label == 3; drop ...`` as ``label == 3`` and
``((label == 3)`` as if it were balanced, and waits 10-30 s on a ``{template}``. So an
expression is tokenised here first and refused in one line unless it is made of Milvus'
expression tokens (fields, numbers, quoted strings, operators, brackets), balanced, with every
``/`` and ``%`` over a non-zero number written out, and naming at least one field. What passes
can still be refused by Milvus (a field it lacks, ``1 == 1``): that refusal is mapped to the
same one line by the connector (``refused_by_milvus``), never to an outage.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dhim_ray.errors import ConfigError

#: Characters in a filter expression: Milvus parses longer ones, but a query needs no more.
MAX_FILTER_CHARS = 4096
#: Brackets inside brackets, and ``not``s in one expression: no query needs more.
MAX_DEPTH = 32
MAX_NOTS = 32

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||\*\*|[-+*/%<>()\[\],!])
""", re.X | re.S)
_KEYWORDS = {"and", "or", "not", "in", "like", "true", "false", "exists", "is", "null"}
_PAIRS = {")": "(", "]": "["}
_EXAMPLE = "write a boolean expression over the collection's fields, e.g. 'label == 3'"


def shown(expr: str, chars: int = 80) -> str:
    """The expression as a message quotes it: whole up to ``chars``, else its start and its length."""
    return repr(expr) if len(expr) <= chars else f"{expr[:chars]!r}... ({len(expr):,} characters)"


def _refuse(expr: str, why: str) -> ConfigError:
    return ConfigError(f"filter={shown(expr)}: {why}; {_EXAMPLE}")


def tokens(expr: str) -> list[tuple[str, str, int]]:
    """(kind, text, position) of each token but spaces; a character no token starts with is refused."""
    out, at = [], 0
    while at < len(expr):
        found = _TOKEN.match(expr, at)
        if found is None:
            char = expr[at]
            if char in "\"'":
                raise _refuse(expr, f"the string opened at character {at + 1} is not closed")
            name = {"\x00": "a NUL character", ";": "';' (one expression, no statements)",
                    "{": "'{' (templates are not supported)", "}": "'}'", "=": "'=' (compare with ==)"}.get(
                char, repr(char) if char.isprintable() else f"the control character {ord(char):#04x}")
            raise _refuse(expr, f"{name} at character {at + 1} is not part of a Milvus expression")
        if found.lastgroup != "space":
            out.append((found.lastgroup, found.group(), at))
        at = found.end()
    return out


def check_filter(expr: str | None, fields: Sequence[str] | None = None) -> str | None:
    """A filter expression fit to send to Milvus (stripped; None or blank: no filter), or a
    ConfigError saying in one line what is wrong with it. ``fields``: the collection's field
    names, where known (a name not among them is refused, naming them)."""
    if expr is None or (isinstance(expr, str) and not expr.strip()):
        return None
    if not isinstance(expr, str):
        raise ConfigError(f"filter: must be a string, not {type(expr).__name__}; {_EXAMPLE}")
    if len(expr) > MAX_FILTER_CHARS:
        raise _refuse(expr, f"longer than {MAX_FILTER_CHARS:,} characters")
    toks = tokens(expr)
    stack: list[str] = []
    nots = 0
    named = False
    for i, (kind, text, at) in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if kind == "name":
            low = text.lower()
            nots += low == "not"
            is_field = low not in _KEYWORDS and not (nxt and nxt[1] == "(")
            if is_field and fields is not None and text not in fields:
                raise _refuse(expr, f"the collection has no field {text!r} (its fields: {', '.join(fields)})")
            named = named or is_field
        elif text in "([":
            stack.append(text)
            if len(stack) > MAX_DEPTH:
                raise _refuse(expr, f"brackets nested deeper than {MAX_DEPTH}")
            if text == "[" and nxt and nxt[1] == "]":
                raise _refuse(expr, f"the list at character {at + 1} is empty")
        elif text in ")]":
            if not stack or stack.pop() != _PAIRS[text]:
                raise _refuse(expr, f"{text!r} at character {at + 1} closes nothing")
        elif text == "!":
            nots += 1
        elif text in "/%":
            sign = 1 if nxt and nxt[1] in "+-" else 0
            divisor = toks[i + 1 + sign] if i + 1 + sign < len(toks) else None
            if divisor is None or divisor[0] != "number" or float(divisor[1]) == 0:
                raise _refuse(expr, f"'{text}' at character {at + 1} must divide by a non-zero number written out "
                                    "(a zero divisor stops milvus-lite)")
        if nots > MAX_NOTS:
            raise _refuse(expr, f"more than {MAX_NOTS} 'not's")
    if stack:
        raise _refuse(expr, f"{len(stack)} bracket{'s' if len(stack) > 1 else ''} left open")
    if not named:
        raise _refuse(expr, "it names no field, so it holds for every row or none")
    return expr.strip()


def refused_by_milvus(exc: Exception) -> bool:
    """Whether Milvus refused a call for its filter expression (not for being down): a parse
    error (1100, 'invalid expr') or one found evaluating it (2000: a type or plan check)."""
    code = getattr(exc, "code", None)
    text = str(exc).lower()
    return code in (1100, 2000) or "invalid expr" in text or "cannot parse expression" in text \
        or "field not exist" in text
