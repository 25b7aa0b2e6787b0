"""ingest --keep-columns: a corpus' metadata kept as typed fields, returned with every hit and
usable in filters; on real Ray Data and real milvus-lite with the packaged encoder and BBC."""

from __future__ import annotations

import csv
import json

import pytest

from dhim_ray.connectors.milvus import MilvusTarget, _column_problems
from dhim_ray.corpus import columns
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import CollectionMismatchError, ConfigError, DataError
from dhim_ray.search import SearchRequest


@pytest.mark.parametrize("values, kind", [
    (["1", "-2", "+30"], "int"), (["1", "2.5", "1e3"], "float"), (["true", "False", " TRUE "], "bool"),
    (["2024-05-01"], "string"), (["1", ""], "string"), (["nan"], "string"),
    # a value a number would change keeps its digits as text: leading zeros, past 64 bits, past 15 digits
    (["99999999999999999999"], "string"), ([str(2**70 + 3), "1"], "string"), (["00001", "2"], "string"),
    (["007"], "string"), (["3.14159265358979323846"], "string"), (["01.5"], "string"),
    (["0", "-3"], "int"), (["0.5", "-0.001", ".25"], "float"), (["123456789012345"], "int"),
])
def test_a_text_column_is_the_narrowest_kind_its_values_parse_as(values, kind):
    assert columns.kind_of_strings(values) == kind


def test_blocks_that_disagree_settle_on_the_wider_kind():
    assert columns.wider(None, "int") == "int" and columns.wider("int", "float") == "float"
    assert columns.wider("bool", "int") == "string" and columns.wider("float", "string") == "string"
    assert columns.convert(["1", " 2"], "int") == [1, 2] and columns.convert([True, "false"], "bool") == [True, False]
    assert columns.convert([1, True, 2.5], "string") == ["1", "true", "2.5"]
    assert columns.string_bound(10) == 256 and columns.string_bound(300) == 512 and columns.string_bound(10**6) == 65535


def test_a_collection_takes_the_same_columns_of_kinds_its_fields_hold():
    have = {"title": ("string", 256), "year": ("int", 0)}
    assert _column_problems(have, {"title": ("string", 40), "year": ("int", 0)}) == []
    assert _column_problems(have, {"title": ("int", 4), "year": ("int", 0)}) == []  # numbers kept as text
    assert _column_problems(have, {"title": (None, 0), "year": (None, 0)}) == []  # kinds not known yet
    assert "it keeps columns title (string), year (int), this ingest title (string)" in _column_problems(
        have, {"title": ("string", 3)})[0]
    assert "year (int), this ingest title (string), year (float)" in _column_problems(
        have, {"title": ("string", 3), "year": ("float", 0)})[0]
    assert _column_problems(have, {"title": ("string", 300), "year": ("int", 0)}) == [
        "column 'title' has values of 300 bytes and its field takes 256"]


N = 60


@pytest.fixture(scope="module")
def model_dir(bbc16):
    return bbc16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """BBC texts with a title (string), a year (int), a score (float), a flag (bool) and a date
    (a string that looks like a date), in CSV: every value written as text."""
    texts = load_split(CorpusSpec("bbc", "train", limit=N)).texts
    rows = [{"text": t, "title": f"story {i}", "year": 1990 + i % 30, "score": round(i / 7, 3), "flag": i % 3 == 0,
             "date": f"2024-05-{1 + i % 28:02d}"} for i, t in enumerate(texts)]
    path = tmp_path_factory.mktemp("corpus") / "docs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "flag": "true" if r["flag"] else "false"} for r in rows)
    return path, rows


@pytest.mark.slow
def test_kept_columns_come_back_typed_with_every_hit_and_filter(ray_session, model_dir, corpus, tmp_path):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    path, rows = corpus
    target = MilvusTarget(str(tmp_path / "meta.db"), "docs")
    kept = ("title", "year", "score", "flag", "date")
    result = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1, keep_columns=kept), progress=False)
    assert result.verified
    with Searcher(model_dir, target) as s:
        assert s.info.columns == {"title": ("string", 256), "year": ("int", 0), "score": ("float", 0),
                                  "flag": ("bool", 0), "date": ("string", 256)}
        hits = s.run(SearchRequest([rows[4]["text"]], k=N)).hits[0]
        assert len(hits) == N
        for h in hits:
            want = rows[h["row"]]
            assert {c: h[c] for c in kept} == {c: want[c] for c in kept}
            assert type(h["year"]) is int and type(h["score"]) is float and type(h["flag"]) is bool
        # a filter over kept fields equals the same filter over the source
        expr = 'year >= 2005 and flag == true and date < "2024-05-20"'
        filtered = s.run(SearchRequest([rows[4]["text"]], k=N, filter=expr)).hits[0]
        want = {i for i, r in enumerate(rows) if r["year"] >= 2005 and r["flag"] and r["date"] < "2024-05-20"}
        assert {h["row"] for h in filtered} == want and want
        # milvus-lite keeps the document's own fields in one JSON field; they filter as fields of their own
        fields = [f["name"] for f in s.client.describe_collection("docs")["fields"]]
        assert fields == ["id", "code", "label", "row", "doc", *kept]
        near = s.run(SearchRequest([rows[4]["text"]], k=N, filter='row % 7 == 2 or row in [9, 11] and text like "%the%" and '
                                                        'label_name == ""')).hits[0]
        assert {h["row"] for h in near} == {2, 9, 16, 23, 30, 37, 44, 51, 58} | {
            i for i in (9, 11) if "the" in rows[i]["text"][:1024]}
        with pytest.raises(ConfigError, match="'not' before a 'like' or a function call, which milvus-lite"):
            s.run(SearchRequest([rows[4]["text"]], k=N, filter='not (text like "%the%")'))

    # a rerun with the same columns finds every row stored as it is; with other columns it is refused in one line
    again = run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1, keep_columns=kept), progress=False)
    assert again.verified and (again.rows_written, again.rows_unchanged) == (0, N)
    with pytest.raises(CollectionMismatchError, match=r"it keeps columns title, year, score, flag, date, this "
                                                      r"ingest title \(keep_columns=NAMES\)"):
        run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1, keep_columns=("title",)), progress=False)
    with pytest.raises(CollectionMismatchError, match="this ingest none"):
        run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1), progress=False)


@pytest.mark.slow
def test_search_json_carries_the_kept_columns(ray_session, model_dir, corpus, tmp_path, capsys):
    from dhim_ray.cli import main

    path, rows = corpus
    db = str(tmp_path / "cli.db")
    with pytest.raises(SystemExit) as done:
        main(["ingest", str(path), "--model", str(model_dir), "--uri", db, "--collection", "docs",
              "--keep-columns", "title, year", "--workers", "1", "--json"])
    assert done.value.code in (0, None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["search", rows[7]["text"], "--model", str(model_dir), "--uri", db, "-k", "3", "--json",
              "--filter", "year == 1997"])
    assert done.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    hit = out["results"][0][0] if "results" in out else out[0]["hits"][0]
    assert hit["title"] == "story 7" and hit["year"] == 1997


@pytest.mark.slow
@pytest.mark.parametrize("keep, lines, message", [
    (("nosuch",), None, r"no column 'nosuch' to keep; columns are \['text', 'year', 'source'\]"),
    (("text",), None, "keep_columns='text' is already kept"),
    (("source",), None, "keep_columns='source': a collection's own field has that name"),
    (("year",), {2: None, 5: None}, r"column 'year' has no value in 2 rows \(rows 2, 5\)"),
    # CSV: an empty cell is a missing value, not ""; a header naming a kept column twice is refused
    (("year",), {2: "", 5: ""}, r"column 'year' has no value in 2 rows \(rows 2, 5\)"),
    (("year",), "twice", r"2 columns are named 'year'; rename all but one"),
])
def test_columns_that_cannot_be_kept_are_refused_before_a_collection_exists(ray_session, model_dir, tmp_path,
                                                                             keep, lines, message):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    texts = load_split(CorpusSpec("bbc", "train", limit=8)).texts
    if lines == "twice" or "" in (lines or {}).values():
        path = tmp_path / "docs.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "year", "year" if lines == "twice" else "source"])
            w.writerows([t, {} if lines == "twice" else lines.get(i, 2000 + i), "x"] for i, t in enumerate(texts))
    else:
        path = tmp_path / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": t, "year": (lines or {}).get(i, 2000 + i), "source": "x"}) + "\n"
                                for i, t in enumerate(texts)))
    target = MilvusTarget(str(tmp_path / "refused.db"), "docs")
    with pytest.raises(DataError, match=message):
        run_ingest(IngestRequest(CorpusSpec(str(path)), model_dir, target, workers=1, keep_columns=keep), progress=False)
    with target.open() as collection:
        assert collection.describe() is None
