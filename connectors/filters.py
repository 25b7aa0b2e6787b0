"""A user's filter expression parsed into our own tree (``parse_filter``) and re-emitted from it
(``Filter.text``): Milvus never runs the text as typed. The grammar, and the inputs that kill
milvus-lite that it refuses, are in docs/guarantees.md; a filter Milvus still
refuses (a type it will not compare) is mapped to one line by ``refused_by_milvus``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dhim_ray.connectors.filter_words import (
    _COMPARE,
    _DUAL,
    _EXAMPLE,
    _FLIP,
    _KEYWORDS,
    _OPPOSITE,
    FUNCTIONS,
    INT64,
    MAX_DEPTH,
    MAX_FILTER_CHARS,
    MAX_LIKE_WILDCARDS,
    MAX_LIST,
    MAX_NOTS,
    _emit_string,
    _refuse,
    _string,
    _tokens,
    _wildcards,
)
from dhim_ray.corpus.columns import FILTER_WORDS
from dhim_ray.errors import ConfigError


def _negate(comparison: str) -> str:
    left, op, right = comparison.split(" ", 2)
    return f"{left} {_OPPOSITE[op]} {right}"


def _joined(items: list[str]) -> str:
    """A list's literals as Milvus reads a list."""
    return "[" + ", ".join(items) + "]"


@dataclass(frozen=True)
class Filter:
    """A parsed filter: ``text``, the canonical expression Milvus is sent, and the ``fields`` it names."""

    text: str
    fields: frozenset[str]

    def check_fields(self, fields: Sequence[str]) -> None:
        """A ConfigError naming a field the collection lacks (Milvus' names are case-sensitive)."""
        missing = sorted(self.fields - set(fields))
        if missing:
            raise _refuse(self.text, f"the collection has no field {missing[0]!r} (its fields: {', '.join(fields)})")


class _Parser:
    """Recursive descent; each rule returns (canonical text, kind: cond, value, field or doc)."""

    def __init__(self, expr: str, in_doc: Mapping[str, tuple[str, str]] | None = None,
                 kinds: Mapping[str, str] | None = None):
        self.expr, self.toks, self.i = expr, _tokens(expr), 0
        self.in_doc = in_doc or {}
        self.doc_kinds = {path: kind for path, kind in self.in_doc.values()}
        self.kinds = {**(kinds or {}), **self.doc_kinds}  # a field's or a JSON path's kind: int, float, string, ...
        self.depth = self.nots = 0
        self.fields: set[str] = set()
        self.negation: dict[str, tuple[str, str]] = {}  # a condition's text -> its negation's, without 'not'

    # ---- tokens ----------------------------------------------------------------------------
    def peek(self, offset: int = 0) -> tuple[str, str, int] | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def word(self, offset: int = 0) -> str | None:
        """The next token as a keyword (lower case) or operator; None at the end."""
        tok = self.peek(offset)
        if tok is None:
            return None
        return tok[1].lower() if tok[0] == "name" and tok[1].lower() in _KEYWORDS else tok[1] if tok[0] == "op" \
            else None

    def take(self, *words: str) -> str | None:
        if self.word() in words:
            self.i += 1
            return self.toks[self.i - 1][1]
        return None

    def fail(self, why: str) -> ConfigError:
        return _refuse(self.expr, why)

    def where(self) -> str:
        tok = self.peek()
        return "at the end" if tok is None else f"at character {tok[2] + 1} ({ascii(tok[1][:20])})"

    def expect(self, word: str, what: str) -> None:
        if self.take(word) is None:
            raise self.fail(f"expected {what} {self.where()}")

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"brackets or operators nested deeper than {MAX_DEPTH}")

    # ---- grammar ---------------------------------------------------------------------------
    def parse(self) -> Filter:
        text, kind = self.or_()
        if self.peek() is not None:
            tok = self.peek()
            if tok[1] in ")]":
                raise self.fail(f"{tok[1]!r} at character {tok[2] + 1} closes nothing")
            raise self.fail(f"unexpected {ascii(tok[1][:20])} at character {tok[2] + 1}")
        if not self.fields:
            raise self.fail("it names no field, so it holds for every row or none")
        self.condition(kind, "the filter")
        return Filter(text, frozenset(self.fields))

    def condition(self, kind: str, what: str) -> None:
        if kind in ("value", "arith"):
            raise self.fail(f"{what} is a value, not a condition (compare it, e.g. 'label == 3')")

    def operand(self, kind: str, what: str) -> None:
        if kind in ("cond", "compound"):
            raise self.fail(f"{what} is a condition, not a value; join conditions with 'and' or 'or'")

    def joined(self, word: str, operators: tuple[str, ...], inner) -> tuple[str, str]:
        parts = [inner()]
        while self.take(*operators):
            parts.append(inner())
        if len(parts) == 1:
            return parts[0]
        for _, kind in parts:
            self.condition(kind, f"each side of '{word}'")
        text = self.join(word, parts)
        if all(t in self.negation for t, _ in parts):  # not (a or b) is (not a) and (not b)
            self.negation[text] = (self.join(_DUAL[word], [self.negation[t] for t, _ in parts]), "compound")
        return text, "compound"

    @staticmethod
    def join(word: str, parts: list[tuple[str, str]]) -> str:
        return f" {word} ".join(f"({t})" if k == "compound" else t for t, k in parts)

    def negated(self, text: str, negation: str, kind: str = "cond") -> tuple[str, str]:
        """A condition whose negation can be written without 'not' (milvus-lite 2.5.1 runs no 'not')."""
        self.negation[text], self.negation[negation] = (negation, kind), (text, "cond")
        return text, "cond"

    def or_(self):
        return self.joined("or", ("or", "||"), self.and_)

    def and_(self):
        return self.joined("and", ("and", "&&"), self.not_)

    def not_(self):
        if self.word() in ("not", "!"):
            self.i += 1
            self.nots += 1
            if self.nots > MAX_NOTS:
                raise self.fail(f"more than {MAX_NOTS} 'not's")
            self.nest()
            text, kind = self.not_()
            self.depth -= 1
            self.condition(kind, "what 'not' negates")
            if text in self.negation:
                return self.negation[text]
            self.plain(text)
            raise self.fail("'not' before a 'like' or a function call, which milvus-lite 2.5.1 cannot negate; write "
                            "the condition without 'not' (e.g. 'not (key == \"a\")' is 'key != \"a\"')")
        return self.predicate()

    def predicate(self):
        left, kind = self.value()
        word = self.word()
        if word in _COMPARE:
            return self.comparison(left, kind)
        if word == "in" or (word == "not" and self.word(1) == "in"):
            negated = self.take("not") is not None
            self.i += 1
            if kind not in ("field", "doc"):
                raise self.fail("the left side of 'in' must be a field, e.g. 'label in [1, 2]'")
            items = self.list_()
            for item in items if left in self.kinds else ():
                self.same_kind(left, item)
            if self.kinds.get(left) == "int":
                items = [self.whole_item(left, item) for item in items]
            values = _joined(items)
            text, negation = f"{left} in {values}", f"{left} not in {values}"
            return self.negated(*((negation, text) if negated else (text, negation)))
        if word == "like":
            return self.like(left, kind)
        if word == "is":
            self.i += 1
            negated = self.take("not") is not None
            self.expect("null", "'null' after 'is'")
            if kind != "field":
                raise self.fail("the left side of 'is null' must be a field" + (
                    " stored on its own (every row holds this one)" if kind == "doc" else ""))
            text, negation = f"{left} is null", f"{left} is not null"
            return self.negated(*((negation, text) if negated else (text, negation)))
        return left, kind

    def comparison(self, left: str, kind: str) -> tuple[str, str]:
        """``left`` compared once, or twice as a range, written out as milvus-lite runs it right."""
        parts, ops, kinds_seen = [left], [], {kind}
        while self.word() in _COMPARE and len(ops) < 2:
            ops.append(self.toks[self.i][1])
            self.i += 1
            right, right_kind = self.value()
            self.operand(right_kind, f"the right side of '{ops[-1]}'")
            parts.append(right)
            kinds_seen.add(right_kind)
        self.operand(kind, f"the left side of '{ops[0]}'")
        if len(ops) == 2 and not (set(ops) <= {"<", "<="} or set(ops) <= {">", ">="}):
            raise self.fail(f"'{ops[0]}' then '{ops[1]}': two comparisons in a row are a range, 'low < field < "
                            "high' (or with >); join others with 'and'")
        if self.word() in _COMPARE:
            raise self.fail(f"more than two comparisons in a row {self.where()}; join them with 'and'")
        for side, other in zip(parts, parts[1:]):
            self.same_kind(side, other)
        if "arith" in kinds_seen and (len(ops) > 1 or kind != "arith" or ops[0] not in ("==", "!=")
                                      or not parts[1].lstrip("-").isdigit()):
            raise self.fail("'FIELD % N' is compared with == or != and a whole number on its right, e.g. "
                            "'label % 2 == 0' (milvus-lite runs no other)")
        if all(k == "value" for k in kinds_seen):
            raise self.fail(f"'{ops[0]}' compares two literals; every comparison needs a field, e.g. 'label == 3'")
        if len(ops) == 1 and kind == "value":  # milvus-lite answers '2 != i' as '2 == i': the field goes left
            parts, ops = [parts[1], parts[0]], [ops[0].translate(_FLIP)]
        if len(ops) == 1 and self.kinds.get(parts[0]) == "int" and _is_float(parts[1]):
            return self.whole(parts[0], ops[0], parts[1])
        if len(ops) == 2 and self.kinds.get(parts[1]) == "int":
            for at, op, flip in ((0, ops[0], True), (2, ops[1], False)):
                if _is_float(parts[at]):
                    bound = self.bound(parts[1], op.translate(_FLIP) if flip else op, parts[at])
                    ops[at // 2] = bound[0].translate(_FLIP) if flip else bound[0]
                    parts[at] = bound[1]
        if len(ops) == 2 and parts[1] in self.doc_kinds:  # milvus-lite has no range over a JSON path
            low = f"{parts[1]} {ops[0].translate(_FLIP)} {parts[0]}"
            return self.joined_range(low, f"{parts[1]} {ops[1]} {parts[2]}")
        text = f"{parts[0]} {ops[0]} {parts[1]}" + (f" {ops[1]} {parts[2]}" if len(ops) == 2 else "")
        if len(ops) == 1:
            return self.negated(text, f"{parts[0]} {_OPPOSITE[ops[0]]} {parts[1]}")
        return self.negated(text, f"{parts[1]} {_OPPOSITE[ops[0]].translate(_FLIP)} {parts[0]} or {parts[1]} "
                                  f"{_OPPOSITE[ops[1]]} {parts[2]}", "compound")

    def like(self, left: str, kind: str) -> tuple[str, str]:
        """``left like pattern`` in the forms milvus-lite 2.5.1 runs right (tests/test_filter_differential.py):
        no wildcard is an equality, ``%`` alone any string; the rest is refused in one line."""
        self.i += 1
        if kind not in ("field", "doc"):
            raise self.fail("the left side of 'like' must be a field, e.g. 'key like \"news%\"'")
        if self.doc_kinds.get(left, "string") != "string":
            raise self.fail("'like' takes a string field, e.g. 'key like \"news%\"'")
        tok = self.peek()
        if tok is None or tok[0] != "string":
            raise self.fail(f"'like' takes a quoted pattern {self.where()}, e.g. 'key like \"news%\"'")
        self.i += 1
        pattern, at = _string(self.expr, tok[1], tok[2]), tok[2]
        if _wildcards(pattern) > MAX_LIKE_WILDCARDS:
            raise self.fail(f"the pattern at character {at + 1} has {_wildcards(pattern)} wildcards (% and "
                            f"_), at most {MAX_LIKE_WILDCARDS}")
        parts, i = [], 0  # (wildcard?, character)
        while i < len(pattern):
            if pattern[i] == "\\":
                if i + 1 == len(pattern) or pattern[i + 1] not in "%_\\":
                    raise self.fail(f"the pattern at character {at + 1} has a '\\' that escapes no '%', '_' or "
                                    "'\\' (a backslash itself is written \\\\ inside the pattern)")
                parts.append((False, pattern[i + 1]))
                i += 2
                continue
            parts.append((pattern[i] in "%_", pattern[i]))
            i += 1
        wild = [c for w, c in parts if w]
        literal = "".join(c for w, c in parts if not w)
        if not wild:
            return self.negated(f"{left} == {_emit_string(literal)}", f"{left} != {_emit_string(literal)}")
        if not literal:
            if "_" in wild:
                raise self.fail(f"the pattern at character {at + 1} is '_' wildcards alone, which milvus-lite does not "
                                "match by length; add a literal character")
            return self.negated(f'{left} >= ""', f'{left} < ""')  # '%' alone: any string
        if parts[-1] == (True, "_") or (parts[-1][0] and any(c == "_" for w, c in parts[-2:] if w)):
            raise self.fail(f"the pattern at character {at + 1} ends in '_', which milvus-lite matches as a prefix; "
                            "end it in a literal character or '%'")
        escaped = any(not w and c in "%_\\" for w, c in parts)
        if escaped and not (parts[0] == (True, "%") and parts[-1] == (True, "%") and len(wild) == 2):
            raise self.fail(f"the pattern at character {at + 1} escapes a wildcard outside '%...%', which milvus-lite "
                            "does not match; write '%100\\\\%%' (contains) or compare with ==")
        emitted = "".join(c if w else ("\\" + c if c in "%_\\" else c) for w, c in parts)
        return f"{left} like {_emit_string(emitted)}", "cond"

    def whole(self, field: str, op: str, value: str) -> tuple[str, str]:
        """``field op value`` for a field of whole numbers and a literal with a fraction or exponent."""
        x = float(value)
        if op in ("==", "!=") and not x.is_integer():  # never equal: the same constant for every row
            never, always = f"{field} < 0 and {field} > 0", f"{field} >= 0 or {field} <= 0"
            text, negation = (never, always) if op == "==" else (always, never)
            self.negation[text], self.negation[negation] = (negation, "compound"), (text, "compound")
            return text, "compound"
        op, n = self.bound(field, op, value)
        return self.negated(f"{field} {op} {n}", f"{field} {_OPPOSITE[op]} {n}")

    def bound(self, field: str, op: str, value: str) -> tuple[str, str]:
        """(op, whole number) for ``field op value`` (the field on the left) holding for the same rows."""
        x = float(value)
        n = math.floor(x) if op in ("<=", ">") or (op in ("==", "!=") and x.is_integer()) else math.ceil(x)
        if not INT64[0] < n <= INT64[1]:
            raise self.fail(f"{value} compared with {self.name_of(field) if field in self.doc_kinds else field}, "
                            "a field of whole numbers, is beyond their 64-bit range; drop the condition")
        return op, str(n)

    def whole_item(self, field: str, item: str) -> str:
        if not _is_float(item):
            return item
        if not float(item).is_integer():
            raise self.fail(f"{item} in a list for {field}, a field of whole numbers, matches no row; drop it")
        return self.bound(field, "==", item)[1]

    def name_of(self, path: str) -> str:
        return next(name for name, (p, _) in self.in_doc.items() if p == path)

    def same_kind(self, left: str, right: str) -> None:
        """Milvus compares a JSON path with a value of another type as false on every row, where
        a field of its own refuses it: refused here, with the field's kind."""
        for path, value in ((left, right), (right, left)):
            kind = self.kinds.get(path)
            literal = ("string" if value.startswith('"') else "int" if value[:1] in "-0123456789" else
                       "bool" if value in ("true", "false") else None)
            number = kind in ("int", "float")
            if kind in ("int", "float", "string", "bool") and literal and literal != ("int" if number else kind):
                name = self.name_of(path) if path in self.doc_kinds else path
                holds, write = {"string": ("strings", "a quoted string"), "bool": ("true or false", "true or false")
                                }.get(kind, ("numbers", "a number"))
                raise self.fail(f"{name} holds {holds}: compare it with {write}, not {value[:40]}")

    def plain(self, text: str) -> None:
        """Refuse a 'not' over a JSON path: milvus-lite 2.5.1 does not run it there."""
        found = next((p for p in self.doc_kinds if p in text), None)  # a string literal's '"' is escaped: exact
        if found is not None:
            name = self.name_of(found)
            raise self.fail(f"'not' before a condition on {name}: {name} is kept in the row's JSON document, where "
                            "milvus-lite cannot negate it; write the condition without 'not'")

    def joined_range(self, low: str, high: str) -> tuple[str, str]:
        text = f"{low} and {high}"
        self.negation[text] = (f"{_negate(low)} or {_negate(high)}", "compound")
        return text, "compound"

    def list_(self) -> list[str]:
        """A list's literals, each as written out."""
        self.expect("[", "a list '[...]' after 'in'")
        if self.word() == "]":
            raise self.fail(f"the list at character {self.toks[self.i - 1][2] + 1} is empty")
        items = [self.literal()]
        while self.take(","):
            if self.word() == "]":
                raise self.fail(f"a value was expected after ',' {self.where()}")
            if len(items) >= MAX_LIST:
                raise self.fail(f"a list of more than {MAX_LIST:,} values")
            items.append(self.literal())
        self.expect("]", "',' or ']' in the list")
        return items

    def literal(self) -> str:
        """A number, string or boolean literal (a list's item)."""
        start = self.i
        text, kind = self.factor()
        if kind != "value" or self.fields_from(start):
            raise self.fail(f"a list holds literals (numbers, strings, true, false), not fields, {self.where()}")
        return text

    def fields_from(self, start: int) -> bool:
        return any(t[0] == "name" and t[1].lower() not in _KEYWORDS for t in self.toks[start:self.i])

    def value(self):
        left, kind = self.factor()
        if self.word() in ("+", "-", "*", "/"):
            op, at = self.toks[self.i][1], self.toks[self.i][2]
            raise self.fail(f"'{op}' at character {at + 1}: a filter does no arithmetic but 'FIELD % N' (milvus-lite "
                            "wraps past 64 bits and truncates); compare the field itself, e.g. 'label < 3'")
        if self.take("%") is not None:
            at = self.toks[self.i - 1][2]
            right = (self.divisor("%", at), "value")
            if kind == "field" and self.kinds.get(left, "int") != "int":
                raise self.fail(f"'%' at character {at + 1} takes a field of whole numbers; {left} holds "
                                f"{self.kinds[left]} values")
            if kind not in ("field", "doc"):
                raise self.fail(f"'%' at character {at + 1} takes a field on its left, e.g. 'label % 2 == 0'")
            left, kind = self.arithmetic("%", (left, kind), right), "arith"
            if self.word() in ("+", "-", "*", "/", "%"):
                raise self.fail(f"{self.where()}: a filter does no arithmetic but one 'FIELD % N'")
        return left, kind

    def arithmetic(self, op: str, left: tuple[str, str], right: tuple[str, str]) -> str:
        """``left op right``, each side bracketed where it is itself arithmetic."""
        if {left[1], right[1]} & {"cond", "compound"}:
            raise self.fail(f"'{op}' takes numbers, not conditions, {self.where()}")
        if "doc" in (left[1], right[1]):
            name = self.name_of(left[0] if left[1] == "doc" else right[0])
            raise self.fail(f"'{op}' on {name}: {name} is kept in the row's JSON document, where Milvus does no "
                            "arithmetic; compare it instead")
        return " ".join((f"({left[0]})" if left[1] == "arith" else left[0], op,
                         f"({right[0]})" if right[1] == "arith" else right[0]))

    def divisor(self, op: str, at: int) -> str:
        tok = self.peek()
        if tok is None or tok[0] != "number" or not tok[1].isdigit() or int(tok[1]) == 0:
            raise self.fail(f"'{op}' at character {at + 1} must divide by a positive whole number written out, "
                            f"e.g. 'label {op} 2' (zero or a negative divisor stops milvus-lite)")
        self.i += 1
        return self.integer(tok)

    def integer(self, tok: tuple[str, str, int], negative: bool = False) -> str:
        value = -int(tok[1]) if negative else int(tok[1])
        if not INT64[0] <= value <= INT64[1]:
            raise self.fail(f"the number at character {tok[2] + 1} is outside the 64-bit range")
        if value == INT64[0]:
            raise self.fail(f"milvus-lite reads -9223372036854775808 (character {tok[2] + 1}) as "
                            "-9223372036854775807; write 'FIELD < -9223372036854775807' for it")
        return str(value)

    def factor(self):
        tok = self.peek()
        if tok is None:
            raise self.fail("it ends where a value was expected")
        kind, text, at = tok
        if text == "-" and kind == "op":
            nxt = self.peek(1)
            if nxt is None or nxt[0] != "number":
                raise self.fail(f"'-' at character {at + 1} negates numbers written out only")
            self.i += 1
            return self.number(nxt, negative=True), "value"
        if kind == "number":
            return self.number(tok), "value"
        if kind == "string":
            self.i += 1
            return _emit_string(_string(self.expr, text, at)), "value"
        if kind == "name":
            low = text.lower()
            if low in ("true", "false"):
                self.i += 1
                return low, "value"
            if low in _KEYWORDS:
                raise self.fail(f"'{text}' at character {at + 1} where a value was expected")
            nxt = self.peek(1)
            if nxt is not None and nxt[1] == "(":
                return self.call(tok)
            if low in FILTER_WORDS:
                raise self.fail(f"{text!r} at character {at + 1} is a word Milvus reads as a function or keyword, "
                                "not a field; no filter can name a field so called")
            self.i += 1
            self.fields.add(text)
            if text in self.in_doc:
                if self.word() == "[":
                    raise self.fail(f"{text!r} is not a JSON field: it takes no '[...]'")
                return self.in_doc[text][0], "doc"
            path = text
            while self.take("["):
                key = self.peek()
                if key is None or key[0] not in ("string", "number") or (key[0] == "number" and not key[1].isdigit()):
                    raise self.fail(f"'{text}[...]' takes a quoted key or a whole index {self.where()}")
                self.i += 1
                path += f"[{_emit_string(_string(self.expr, key[1], key[2])) if key[0] == 'string' else self.integer(key)}]"
                self.expect("]", "']'")
            return path, "field"
        if text == "(":
            self.i += 1
            self.nest()
            inner, inner_kind = self.or_()
            self.depth -= 1
            if self.take(")") is None:
                raise self.fail(f"1 bracket left open (expected ')' {self.where()})" if self.peek() is None or
                                self.peek()[1] != "]" else f"']' at character {self.peek()[2] + 1} closes nothing")
            return inner, "compound" if inner_kind in ("cond", "compound") else inner_kind
        if text in ")]":
            raise self.fail(f"{text!r} at character {at + 1} closes nothing")
        raise self.fail(f"{ascii(text)} at character {at + 1} where a value was expected")

    def number(self, tok: tuple[str, str, int], negative: bool = False) -> str:
        self.i += 1
        if tok[1].isdigit():
            return self.integer(tok, negative)
        value = float(tok[1])
        if not math.isfinite(value):
            raise self.fail(f"the number at character {tok[2] + 1} is too large")
        return repr(-value if negative else value)

    def call(self, tok: tuple[str, str, int]):
        name = tok[1]
        if name not in FUNCTIONS:
            raise self.fail(f"{name!r} at character {tok[2] + 1} is not a function a filter takes "
                            f"({', '.join(FUNCTIONS)})")
        self.i += 2
        field, kind = self.factor()
        if kind != "field":
            raise self.fail(f"{name}() takes a field first, e.g. '{name}(tags, 1)'")
        args = [field]
        while self.take(","):
            args.append(_joined(self.list_()) if self.word() == "[" else self.literal())
        self.expect(")", f"')' closing {name}(")
        return f"{name}({', '.join(args)})", "cond" if FUNCTIONS[name] else "value"


def _is_float(text: str) -> bool:
    """Whether a literal as emitted is a number with a fraction or an exponent."""
    return text[:1] in "-0123456789" and not text.lstrip("-").isdigit() and not text.startswith('"')


def parse_filter(expr: str | None) -> Filter | None:
    """A filter expression as our own tree's canonical text (None or blank: no filter), or a
    ConfigError saying in one line what is wrong with it."""
    if expr is None or (isinstance(expr, str) and not expr.strip()):
        return None
    if not isinstance(expr, str):
        raise ConfigError(f"filter: must be a string, not {type(expr).__name__}; {_EXAMPLE}", field="filter")
    if len(expr) > MAX_FILTER_CHARS:
        raise _refuse(expr, f"longer than {MAX_FILTER_CHARS:,} characters")
    parsed = _Parser(expr).parse()
    if len(parsed.text) > MAX_FILTER_CHARS:
        raise _refuse(expr, f"longer than {MAX_FILTER_CHARS:,} characters written out")
    return parsed


def check_filter(expr: str | Filter | None, fields: Sequence[str] | None = None,
                 in_doc: Mapping[str, tuple[str, str]] | None = None, kinds: Mapping[str, str] | None = None) -> str | None:
    """The canonical text of a filter, what Milvus is sent (None or blank: no filter), or a
    ConfigError saying in one line what is wrong with it. ``fields``: the collection's field
    names, where known (a name not among them is refused, naming them). ``in_doc``: the fields
    the collection keeps in a JSON document, name -> (path, kind): emitted as those paths. A
    ``Filter`` is parsed already: its text, not parsed again unless it names one of those.
    ``kinds``: field -> int, float, string, bool (whole-number fields compared in whole numbers)."""
    parsed = expr if isinstance(expr, Filter) else parse_filter(expr)
    if parsed is None:
        return None
    if fields is not None:
        parsed.check_fields(fields)
    if (in_doc and parsed.fields & in_doc.keys()) or (kinds and parsed.fields & kinds.keys()):
        return _Parser(parsed.text, in_doc, kinds).parse().text  # a canonical text parses to itself but for these
    return parsed.text


def refused_by_milvus(exc: Exception) -> bool:
    """Whether Milvus refused a call for its filter expression (not for being down): a parse
    error (1100, 'invalid expr') or one found evaluating it (2000: a type or plan check)."""
    code = getattr(exc, "code", None)
    text = str(exc).lower()
    return code in (1100, 2000) or "invalid expr" in text or "cannot parse expression" in text \
        or "field not exist" in text
