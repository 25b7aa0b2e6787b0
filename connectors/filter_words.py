"""The filter language's words: its limits, its tokens (``_tokens``: names, numbers, strings with
their escapes, operators), its string literals re-emitted (``_emit_string``) and the one-line
refusal every check raises (``_refuse``); connectors/filters.py parses them into a ``Filter``."""

from __future__ import annotations

import re
import unicodedata

from dhim_ray.errors import ConfigError

#: Characters in a filter expression: Milvus parses longer ones, but a query needs no more.
MAX_FILTER_CHARS = 4096
#: Brackets inside brackets (and operators inside operators), and ``not``s in one expression.
MAX_DEPTH = 32
MAX_NOTS = 32
#: Unescaped ``%`` and ``_`` in one ``like`` pattern: milvus-lite's matching cost grows with
#: the square of their number, and one pattern of thousands holds every other client.
MAX_LIKE_WILDCARDS = 8
#: Values in one ``in [...]`` list.
MAX_LIST = 1024
INT64 = (-(2**63), 2**63 - 1)

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?(?![A-Za-z0-9_]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>()\[\],!])
""", re.X | re.S)
_KEYWORDS = {"and", "or", "not", "in", "like", "true", "false", "is", "null"}
_ESCAPES = {"\\": "\\", '"': '"', "'": "'"}
#: Functions a filter may call: name -> whether it is a condition (else a value).
FUNCTIONS = {"array_contains": True, "array_contains_all": True, "array_contains_any": True,
             "json_contains": True, "json_contains_all": True, "json_contains_any": True, "array_length": False}
_COMPARE = ("==", "!=", "<", "<=", ">", ">=")
_OPPOSITE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_DUAL = {"and": "or", "or": "and"}
_FLIP = str.maketrans("<>", "><")
_EXAMPLE = "write a boolean expression over the collection's fields, e.g. 'label == 3'"


def _character(expr: str, at: int) -> str:
    """What is wrong with the character at ``at``, as a message says it."""
    char, where = expr[at], f"at character {at + 1}"
    named = {"\x00": "a NUL character", ";": "';' (one expression, no statements)",
             "{": "'{' (templates are not supported)", "}": "'}'", "=": "'=' (compare with ==)",
             "&": "'&' (write 'and')", "|": "'|' (write 'or')"}
    if char in named:
        return f"{named[char]} {where} is not part of a filter"
    if char in "0123456789":
        return f"the number {where} is not written as a filter takes it: decimal digits, a '.', an exponent " \
               "(16, 1000, 2.5, 1e3; no 0x, no '_')"
    if char.isdigit():
        return f"the digit {ascii(char)} {where} is not ASCII; write 0-9"
    if unicodedata.category(char) == "Cc":
        return f"the control character {ord(char):#04x} {where}"
    if 0xD800 <= ord(char) <= 0xDFFF:
        return f"a lone surrogate {ascii(char)} {where} (not text; check the client's encoding)"
    if char.isspace() or not char.isprintable():
        return f"the character {ascii(char)} {where} is not an ASCII space or text"
    return f"{ascii(char)} {where} is not part of a filter"


def _string(expr: str, raw: str, at: int) -> str:
    """A quoted literal's value: its escapes read, a control character or another escape refused."""
    out, i = [], 1
    while i < len(raw) - 1:
        char = raw[i]
        if char == "\\":
            nxt = raw[i + 1]
            if nxt not in _ESCAPES:
                raise _refuse(expr, f"the escape {ascii(chr(92) + nxt)} at character {at + i + 1} is not one a "
                                    "filter takes (\\\\, \\\", \\')")
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        if not char.isprintable() or 0xD800 <= ord(char) <= 0xDFFF:
            raise _refuse(expr, f"{_character(expr, at + i)}, inside a string (escape nothing but \\\\, \\\" and \\')")
        out.append(char)
        i += 1
    return "".join(out)


def _tokens(expr: str) -> list[tuple[str, str, int]]:
    """(kind, text, position) of each token but spaces; a character no token starts with is refused."""
    out, at = [], 0
    while at < len(expr):
        found = _TOKEN.match(expr, at)
        if found is None:
            if expr[at] in "\"'":
                raise _refuse(expr, f"the string opened at character {at + 1} is not closed")
            raise _refuse(expr, _character(expr, at))
        if found.lastgroup != "space":
            out.append((found.lastgroup, found.group(), at))
        at = found.end()
    return out


def _emit_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wildcards(pattern: str) -> int:
    count, i = 0, 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        count += pattern[i] in "%_"
        i += 1
    return count


def shown(expr: str, chars: int = 80) -> str:
    """The expression as a message quotes it: whole up to ``chars``, else its start and its length."""
    return ascii(expr) if len(expr) <= chars else f"{ascii(expr[:chars])}... ({len(expr):,} characters)"


def _refuse(expr: str, why: str) -> ConfigError:
    return ConfigError(f"filter={shown(expr)}: {why}; {_EXAMPLE}", field="filter")
