"""Text cleaning as in the DHIM paper and its reference code (Kim 2014's clean_string)."""

from __future__ import annotations

import re

_KEEP = re.compile(r"[^A-Za-z0-9(),!?\'\`]")
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


def clean_string(text: str) -> str:
    """Kim (2014)'s tokenisation: keep letters, digits and ``(),!?'` ``, split
    contractions, pad punctuation, collapse spaces, lowercase.

    >>> clean_string("It's a BERT-based model, isn't it?")
    "it 's a bert based model , is n't it ?"
    """
    text = _KEEP.sub(" ", text)
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return _SPACES.sub(" ", text).strip().lower()


def clean_and_truncate(text: str, max_words: int) -> str:
    """``clean_string`` then keep the first ``max_words`` whitespace words."""
    return " ".join(clean_string(text).split()[:max_words])
