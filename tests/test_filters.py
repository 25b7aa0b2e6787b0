"""A user's filter, parsed before it reaches Milvus: what milvus-lite would crash on, parse as
something else, or wait on is refused in one line naming the filter; what passes is re-emitted
from the parse tree, so Milvus runs exactly what was checked."""

from __future__ import annotations

import pytest

from dhim_ray.connectors.filters import check_filter
from dhim_ray.errors import ConfigError

REFUSED = [
    ("label / 0 == 1", "'/' at character 7: a filter does no arithmetic but 'FIELD % N'"),
    ("label % 0 == 1", "'%' at character 7 must divide by a positive whole number"),
    ("year / 0 > 1", "a filter does no arithmetic but 'FIELD % N'"),
    ("label // 2 == 1", "'/' at character 7: a filter does no arithmetic"),
    ("label % (1 - 1) == 1", "must divide by a positive whole number written out"),
    ("label % -0 == 1", "must divide by a positive whole number"),
    ("score % 0.0 > 1", "must divide by a positive whole number"),
    ("label % ", "must divide by a positive whole number"),
    # what milvus-lite 2.5.1 stops on or answers wrongly (tests/test_filter_differential.py)
    ("label + 1 in [2, 3]", "'+' at character 7: a filter does no arithmetic"),
    ("1 in [1] and label == 1", "the left side of 'in' must be a field"),
    ('"a" in ["a"] and label == 1', "the left side of 'in' must be a field"),
    ("row % 2 in [0]", "the left side of 'in' must be a field"),
    ("big - 1 == 9223372036854775807", "'-' at character 5: a filter does no arithmetic"),
    ("label % 2 % 3 == 1", "a filter does no arithmetic but one 'FIELD % N'"),
    ("2 % 2 == 0 and label == 1", "'%' at character 3 takes a field on its left"),
    ("array_contains == 1", "'array_contains' at character 1 is a word Milvus reads as a function or keyword"),
    ("ARRAY_CONTAINS == 1", "is a word Milvus reads as a function or keyword"),
    ("big == -9223372036854775808", "milvus-lite reads -9223372036854775808 (character 9) as -9223372036854775807"),
    ('label_name like "____"', "'_' wildcards alone"), ('label_name like "%_%_%_%_"', "'_' wildcards alone"),
    ('s like "a_"', "ends in '_', which milvus-lite matches as a prefix"),
    ('s like "100\\\\%%"', "escapes a wildcard outside '%...%'"),
    ('s like "100\\\\"', "has a '\\' that escapes no '%', '_' or '\\'"),
    ('not (key like "k%")', "'not' before a 'like' or a function call"),
    ("label == 0x10", "the number at character 10 is not written as a filter takes it: decimal digits"),
    ("label == 1_000", "no 0x, no '_'"),
    # what milvus-lite read differently from a checker that mirrored its grammar (each stopped it)
    ("label % 0\u0663 == 0", "the digit '\\u0663' at character 10 is not ASCII; write 0-9"),
    ("label == \uff13", "is not ASCII; write 0-9"),
    ('label == 1 "\\q or label % 0 == 0 or label_name == " label "\\q"', "unexpected"),
    ('label_name == "\\q" or label % 0 == 0', "the escape '\\\\q' at character 16 is not one a filter takes"),
    ('label_name == "a\nb"', "the control character 0x0a at character 17, inside a string"),
    ("n / -1 == 0", "'/' at character 3: a filter does no arithmetic"),
    ("n % -1 == 0", "'%' at character 3 must divide by a positive whole number"),
    ("label == 9223372036854775808", "outside the 64-bit range"),
    ('text like "' + "%" * 4000 + 'x"', "4000 wildcards (% and _), at most 8"),
    ('text like "' + "%a" * 400 + '"', "400 wildcards"),
    ("label == \ud800", "a lone surrogate"),
    ('key == "\udc80"', "a lone surrogate"),
    ("label ==\u00a03", "the character '\\xa0' at character 9 is not an ASCII space"),
    ("label % 2", "is a value, not a condition"),
    ("(label == 1) == 2", "is a condition, not a value"),
    ("label == 1 or", "it ends where a value was expected"),
    ("label in [a]", "a list holds literals"),
    ("label in [1,]", "a value was expected after ','"),
    ("label == 1 == 2", "two comparisons in a row are a range"),
    ("evil(label)", "is not a function a filter takes"),
    ("-label == 1", "negates numbers written out only"),
    ("true", "it names no field"),
    ("false", "it names no field"),
    ("1", "it names no field"),
    ("'\") or true or (\"'", "it names no field"),
    ("label in []", "the list at character 10 is empty"),
    ("label == 3; label == 4", "';' (one expression, no statements) at character 11"),
    ("label == 3 && || label == 4", "where a value was expected"),
    ("id > 0; drop collection dbp16", "';' (one expression, no statements)"),
    ("((label == 3)", "1 bracket left open"),
    ("(label == 3]", "']' at character 12 closes nothing"),
    ("label == {x}", "'{' (templates are not supported)"),
    ("label = 3", "'=' (compare with ==)"),
    ("label == 1\x00", "a NUL character at character 11"),
    ("label == 1\x07", "the control character 0x07 at character 11"),
    ("text == \"open", "the string opened at character 9 is not closed"),
    ("not " * 1000 + "label == 1", "more than 32 'not's"),
    ("(" * 40 + "label == 1" + ")" * 40, "nested deeper than 32"),
    ("label == 1 or " * 400 + "label == 2", "longer than 4,096 characters"),
]


@pytest.mark.parametrize("expr, words", REFUSED, ids=[e[:40] for e, _ in REFUSED])
def test_a_filter_milvus_would_crash_on_or_misread_is_one_line_naming_it(expr, words):
    with pytest.raises(ConfigError) as caught:
        check_filter(expr)
    message = str(caught.value)
    assert words in message and "\n" not in message and message.startswith("filter=")
    assert len(message) < 400  # a long filter is quoted by its start and its length, never whole


CANONICAL = [
    ("label == 3", "label == 3"), ("label % 2 == 0", "label % 2 == 0"), ("label%2==1", "label % 2 == 1"),
    ("score > 1.5", "score > 1.5"), ("x == 1.5e3", "x == 1500.0"), ("label == -3", "label == -3"),
    ("key like 'd%'", 'key like "d%"'), ('key like "%50\\\\%%"', 'key like "%50\\\\%%"'),
    ('key like "50\\\\%"', 'key == "50%"'), ('key like "%"', 'key >= ""'), ('key like "a_c%"', 'key like "a_c%"'),
    ('label_name == "tech" and row < 1000', 'label_name == "tech" and row < 1000'),
    ("label in [1,2] AND year >= 2020", "label in [1, 2] and year >= 2020"),
    ("1 < label <= 5", "1 < label <= 5"), ("array_contains(tags, 1)", "array_contains(tags, 1)"),
    ("array_contains_any(tags, [1,2])", "array_contains_any(tags, [1, 2])"), ('meta["a"] == 1', 'meta["a"] == 1'),
    ('key == "a;b{c}"', 'key == "a;b{c}"'), ("key == 'it\\'s'", 'key == "it\'s"'), ('key == "\u00e9\u4e2d"', 'key == "\u00e9\u4e2d"'),
    ('label == 1 && key != "x" || row <= 4', '(label == 1 and key != "x") or row <= 4'),
    ("label == 1 and (b == 2 or c == 3)", "label == 1 and (b == 2 or c == 3)"),
    # milvus-lite 2.5.1 runs no 'not': a negation is written out without it where it can be
    ("not (label == 1)", "label != 1"), ("!(label == 1)", "label != 1"), ("not (label in [1])", "label not in [1]"),
    ("not (label == 1 or label > 4)", "label != 1 and label <= 4"), ("not (1 < label <= 3)", "label <= 1 or label > 3"),
    ("not not label == 1", "label == 1"),
    ('not (key like "k")', 'key != "k"'),
]


@pytest.mark.parametrize("expr, sent", CANONICAL, ids=[e for e, _ in CANONICAL])
def test_what_passes_is_re_emitted_from_its_parse_and_reads_back_the_same(expr, sent):
    assert check_filter(f"  {expr} ") == sent
    assert check_filter(sent) == sent  # the canonical text is a fixed point of the parse


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


#: The fields a milvus-lite collection keeps in its JSON document, as the connector names them.
IN_DOC = {name: (f'doc["{name}"]', kind) for name, kind in
          {"text": "string", "source": "string", "row": "int", "key": "string", "digest": "int"}.items()}
IN_DOC_SENT = [
    ("row < 3 and label == 1", 'doc["row"] < 3 and label == 1'), ("3 > row", 'doc["row"] < 3'),
    ("1 < row <= 5", 'doc["row"] > 1 and doc["row"] <= 5'),  # milvus-lite runs no range over a JSON path
    ("5 >= row > 1", 'doc["row"] <= 5 and doc["row"] > 1'), ("not (1 < row <= 5)", 'doc["row"] <= 1 or doc["row"] > 5'),
    ('not (row in [1, 2])', 'doc["row"] not in [1, 2]'), ('key like "k%"', 'doc["key"] like "k%"'), ('key in ["a, 3"]', 'doc["key"] in ["a, 3"]'),
    ('key == "doc[\\"row\\"]"', 'doc["key"] == "doc[\\"row\\"]"'), ("label % 2 == 0", "label % 2 == 0"),
]


@pytest.mark.parametrize("expr, sent", IN_DOC_SENT, ids=[e for e, _ in IN_DOC_SENT])
def test_a_field_kept_in_the_json_document_is_sent_as_its_path(expr, sent):
    assert check_filter(expr, in_doc=IN_DOC) == sent


KINDS = {"label": "int", "score": "float", "label_name": "string", "flag": "bool"}
WHOLE = [
    ("label == 1.0", "label == 1"), ("label < 2.5", "label < 3"), ("label <= 2.5", "label <= 2"),
    ("label > 5e-324", "label > 0"), ("label >= -0.5", "label >= 0"), ("2.5 > label", "label < 3"), ("3 != label", "label != 3"),
    ("label == 2.5", "label < 0 and label > 0"), ("label != 2.5", "label >= 0 or label <= 0"),
    ("not (label == 2.5)", "label >= 0 or label <= 0"), ("1.5 < label <= 3.5", "1 < label <= 3"),
    ("label in [1.0, 2]", "label in [1, 2]"), ("score == 1", "score == 1"), ("label == 3", "label == 3"),
]


@pytest.mark.parametrize("expr, sent", WHOLE, ids=[e for e, _ in WHOLE])
def test_a_field_of_whole_numbers_is_compared_in_whole_numbers(expr, sent):
    """milvus-lite refuses an INT64 field against 1.0 or 2.5: the same condition is written in whole numbers."""
    assert check_filter(expr, kinds=KINDS) == sent


@pytest.mark.parametrize("expr, words", [
    ("label > 1e300", "beyond their 64-bit range"), ("label in [2.5]", "matches no row"),
    ("score % 2 == 1", "'%' at character 7 takes a field of whole numbers; score holds float values"),
    ('label == "3"', "label holds numbers: compare it with a number"), ("label_name == 3", "label_name holds strings"),
    ("flag == 1", "flag holds true or false"),
])
def test_what_a_fields_kind_cannot_hold_is_one_line(expr, words):
    with pytest.raises(ConfigError) as caught:
        check_filter(expr, kinds=KINDS)
    assert words in str(caught.value) and "\n" not in str(caught.value)


IN_DOC_REFUSED = [
    ("row % 2 == 0", "'%' on row: row is kept in the row's JSON document, where Milvus does no arithmetic"),
    ("row % 3 == 1", "'%' on row"),
    ('row == "5"', 'row holds numbers: compare it with a number, not "5"'),  # Milvus: false on every row
    ("key in ['a', 3]", "key holds strings: compare it with a quoted string, not 3"),
    ("row == true", "row holds numbers"), ('row like "1%"', "'like' takes a string field"),
    ("key is null", "must be a field stored on its own"), ('row["a"] == 1', "'row' is not a JSON field"),
]


@pytest.mark.parametrize("expr, words", IN_DOC_REFUSED, ids=[e for e, _ in IN_DOC_REFUSED])
def test_what_milvus_lite_cannot_run_on_a_json_path_is_one_line(expr, words):
    assert check_filter(expr)  # a field of its own takes it
    with pytest.raises(ConfigError) as caught:
        check_filter(expr, in_doc=IN_DOC)
    assert words in str(caught.value) and "\n" not in str(caught.value)
