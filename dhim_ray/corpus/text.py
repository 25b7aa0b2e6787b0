"""Text cleaning: Kim (2014)'s clean_string, as in the DHIM paper and its reference
code, in two flavours. ``unicode`` (the default) keeps every letter and digit of any
script (and emoji); ``ascii`` is the reference code's, which erases everything but
ASCII letters and digits ("Zürich" -> "z rich") and is kept to reproduce the paper.
On ASCII text the two are identical."""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from dhim_ray.errors import DataError

Cleaning = Literal["unicode", "ascii"]
CLEANINGS = ("unicode", "ascii")

_KEEP = re.compile(r"[^A-Za-z0-9(),!?\'\`]")
# \w is Unicode-aware (letters and digits of every script, and "_"); "_" goes as in the
# ASCII rule. Emoji and pictographs are kept as words the tokenizer may know.
_KEEP_UNICODE = re.compile(r"[^\w(),!?\'\`\u2600-\u27BF\U0001F000-\U0001FAFF]|_")
_RULES = [
    (re.compile(r"\'s"), " 's"),
    (re.compile(r"\'ve"), " 've"),
    (re.compile(r"n\'t"), " n't"),
    (re.compile(r"\'re"), " 're"),
    (re.compile(r"\'d"), " 'd"),
    (re.compile(r"\'ll"), " 'll"),
    (re.compile(r","), " , "),
    (re.compile(r"!"), " ! "),
    (re.compile(r"\("), " ( "),
    (re.compile(r"\)"), " ) "),
    (re.compile(r"\?"), " ? "),
]
_SPACES = re.compile(r"\s{2,}")
# A character either cleaner keeps: a text without one is empty after cleaning.
_ANY_KEPT = re.compile(r"[^\W_]|[(),!?\'\`\u2600-\u27BF\U0001F000-\U0001FAFF]")
_ANY_KEPT_ASCII = re.compile(r"[A-Za-z0-9(),!?\'\`]")


def clean_string(text: str, cleaning: Cleaning = "unicode") -> str:
    """Kim (2014)'s tokenisation: keep letters, digits and ``(),!?'` ``, split contractions, pad
    punctuation, collapse spaces, lowercase.

    >>> clean_string("It's a BERT-based model, isn't it?"), clean_string("Zürich café", "ascii")
    ("it 's a bert based model , is n't it ?", 'z rich caf')"""
    if cleaning == "ascii":
        text = _KEEP.sub(" ", text)
    else:
        text = _KEEP_UNICODE.sub(" ", unicodedata.normalize("NFC", text))
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return _SPACES.sub(" ", text).strip().lower()


_SURROGATE = re.compile("[\ud800-\udfff]")


def not_text(text: str, field: str) -> str | None:
    """Why ``text`` (a request's ``field``) is not text it can be sent on with: a lone UTF-16
    surrogate (valid JSON, but no UTF-8 encodes it); None where it is text."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (f"{field}: a lone surrogate {ascii(found.group())} at character {found.start() + 1} is not text (a "
            "client's broken encoding); send the text as UTF-8")


def has_text(text: str, cleaning: Cleaning = "unicode") -> bool:
    """Whether ``clean_string(text, cleaning)`` is non-empty, without building it (a
    scan over millions of rows asks only this)."""
    if cleaning == "ascii":
        return _ANY_KEPT_ASCII.search(text) is not None
    return _ANY_KEPT.search(unicodedata.normalize("NFC", text)) is not None


def clean_and_truncate(text: str, max_words: int, cleaning: Cleaning = "unicode") -> str:
    """``clean_string`` then keep the first ``max_words`` whitespace words."""
    return " ".join(clean_string(text, cleaning).split()[:max_words])


def check_texts(texts, features) -> list[str]:
    """Every text must be a non-empty string after cleaning (say which is not): the texts
    cleaned and cut to ``features.max_words`` (a FeatureConfig's), once, as the encoder reads them."""
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
        raise DataError("texts: expected a list of strings", field="texts")
    prepared = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataError(f"text {i} is a {type(t).__name__}: expected a string")
        prepared.append(clean_and_truncate(t, features.max_words, features.cleaning))
        if not prepared[-1]:
            raise empty_text(i, t)
    return prepared


def empty_text(i: int, text: str) -> DataError:
    """The one error for text ``i`` with no words left after cleaning (the library, the CLI, the service)."""
    return DataError(f"text {i} ({text[:30]!r}) is empty after cleaning: give some words to hash")
