"""A user's filter, checked before it reaches Milvus: what milvus-lite would crash on, parse as
something else, or wait on is refused in one line naming the filter; what Milvus takes passes."""

from __future__ import annotations

import pytest

from dhim_ray.connectors.filters import check_filter
from dhim_ray.errors import ConfigError

REFUSED = [
    ("label / 0 == 1", "'/' at character 7 must divide by a non-zero number written out"),
    ("label % 0 == 1", "'%' at character 7 must divide by a non-zero number"),
    ("year / 0 > 1", "must divide by a non-zero number"),
    ("label // 2 == 1", "'/' at character 7 must divide"),
    ("label / (1 - 1) == 1", "must divide by a non-zero number written out"),
    ("label / -0 == 1", "must divide by a non-zero number"),
    ("score / 0.0 > 1", "must divide by a non-zero number"),
    ("label % ", "must divide by a non-zero number"),
    ("true", "it names no field"),
    ("false", "it names no field"),
    ("1", "it names no field"),
    ("'\") or true or (\"'", "it names no field"),
    ("label in []", "the list at character 10 is empty"),
    ("label == 3; label == 4", "';' (one expression, no statements) at character 11"),
    ("id > 0; drop collection dbp16", "';' (one expression, no statements)"),
    ("((label == 3)", "1 bracket left open"),
    ("(label == 3]", "']' at character 12 closes nothing"),
    ("label == {x}", "'{' (templates are not supported)"),
    ("label = 3", "'=' (compare with ==)"),
    ("label == 1\x00", "a NUL character at character 11"),
    ("label == 1\x07", "the control character 0x07 at character 11"),
    ("text == \"open", "the string opened at character 9 is not closed"),
    ("not " * 1000 + "label == 1", "more than 32 'not's"),
    ("(" * 40 + "label == 1" + ")" * 40, "brackets nested deeper than 32"),
    ("label == 1 or " * 400 + "label == 2", "longer than 4,096 characters"),
]


@pytest.mark.parametrize("expr, words", REFUSED, ids=[e[:40] for e, _ in REFUSED])
def test_a_filter_milvus_would_crash_on_or_misread_is_one_line_naming_it(expr, words):
    with pytest.raises(ConfigError) as caught:
        check_filter(expr)
    message = str(caught.value)
    assert words in message and "\n" not in message and message.startswith("filter=")
    assert len(message) < 400  # a long filter is quoted by its start and its length, never whole


@pytest.mark.parametrize("expr", [
    "label == 3", "label % 2 == 0", "label / 2 == 1", "label % -1 == 0", "score * 1.5 > 2",
    'key like "d%"', 'label_name == "tech" and row < 1000', "label in [1, 2] and year >= 2020",
    "not (label == 1)", "!(label == 1)", "array_contains(tags, 1)", 'meta["a"] == 1',
    'key == "a;b{c}"', "label == 1 && key != \"x\" || row <= 4",
])
def test_what_milvus_takes_passes_as_written(expr):
    assert check_filter(f"  {expr} ") == expr


@pytest.mark.parametrize("blank", [None, "", "   "])
def test_no_filter(blank):
    assert check_filter(blank) is None


def test_a_field_the_collection_lacks_is_named_with_the_fields_it_has():
    fields = ["id", "label", "text", "year"]
    assert check_filter('label == 3 and text like "a%" and array_contains(year, 1)', fields)
    with pytest.raises(ConfigError, match=r"has no field 'lable' \(its fields: id, label, text, year\)"):
        check_filter("lable == 3", fields)
    with pytest.raises(ConfigError, match="has no field 'LABEL'"):
        check_filter("LABEL == 3", fields)  # Milvus' field names are case-sensitive
