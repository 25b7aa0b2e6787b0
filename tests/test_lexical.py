"""The words of a milvus-lite collection, kept beside its file in tantivy (connectors/lexical.py):
on real milvus-lite with generated rows, the words follow every write, rewrite, deletion and
overwrite of the rows; a hit's fields and code come from the engine's stored row; a filter most
rows fail pages through the ranked list; a query's words are never read as operators, a quoted
part is a phrase; the words are tied to their collection by a generation; and Milvus' own BM25
(a 2.5+ server's path) still runs on the same engine."""

from __future__ import annotations

import numpy as np
import pytest

from dhim_ray.connectors.connection import release
from dhim_ray.connectors.lexical import MAX_QUERY_WORDS, parse_query, text_file
from dhim_ray.connectors.milvus import CodeCollection, IndexSpec, MilvusTarget
from dhim_ray.connectors.rows import TEXT_SPARSE_FIELD, code_rows
from dhim_ray.errors import CollectionMismatchError, StoreError

TOPICS = ["oil prices rose sharply in asian markets", "the football club signed a striker from spain",
          "a new phone was unveiled at the fair", "parliament voted on the budget bill"]


def rows(ids, texts, labels=None):
    n = len(ids)
    codes = np.asarray([[i % 256] + [0] * 7 for i in ids], np.uint8)
    batch = {"id": np.asarray(ids, np.int64), "row": np.asarray(ids, np.int64), "code": codes,
             "label": np.asarray(labels if labels is not None else [0] * n, np.int64),
             "text": np.asarray(texts, dtype=object)}
    return code_rows(batch, 64, "gen")


def ranked_ids(collection, text, k=100):
    collection._commit_words()
    return [h.id for h in collection.words.top(collection.name, text, k)]


@pytest.fixture
def lite(tmp_path):
    db = str(tmp_path / "codes.db")
    yield db
    release(db)


def test_a_query_is_words_and_quoted_phrases_never_operators():
    query = parse_query('NEAR(oil "prices rose") AND -rose OR col:x* ^spain Caf\u00e9 "one"')
    assert query.words == ["near", "oil", "prices", "rose", "and", "or", "col", "x", "spain", "cafe", "one"]
    assert query.phrases == [["prices", "rose"]]  # a quoted single word is a word
    assert parse_query("  ,;!? ") == ([], []) and parse_query("Oil oil OIL").words == ["oil"]
    assert parse_query('"a b" ' + "word " * 40).phrases == []  # a document's quotes are its text


def test_a_new_lite_collection_keeps_its_words_beside_the_file_and_finds_a_phrases_document(lite):
    with MilvusTarget(lite, "docs").open() as c:
        info = c.ensure(64, "m", IndexSpec(), text_index=True)
        assert (info.text_index, info.text_store, info.meta["text_index"]) == (True, "file", "tantivy")
        c.upsert(rows(range(40), [f"{TOPICS[i % 4]} story {i}" for i in range(40)]), new=True)
        fields = {f["name"] for f in c.client.describe_collection("docs")["fields"]}
    assert text_file(lite).exists() and TEXT_SPARSE_FIELD not in fields  # Milvus keeps no BM25 of its own
    with MilvusTarget(lite, "docs").open() as c:  # reopened: read from the description, nothing rebuilt
        assert c.describe().text_store == "file"
        hits = c.search_text(["football club story 13", "nothing shared xyzzy"], k=5)
        assert hits[0][0]["id"] == 13 and hits[0][0]["bm25"] > hits[0][1]["bm25"] and hits[1] == []
        assert {h["id"] % 4 for h in hits[0][1:]} == {1}  # the rest share the topic's words
        assert set(hits[0][0]) == {"id", "bm25", "label", "text", "source", "row"}
        assert hits[0][0]["text"] == "the football club signed a striker from spain story 13"
        query = np.asarray([[13, 0, 0, 0, 0, 0, 0, 1]], np.uint8)  # the stored code gives the distance
        assert c.search_text(["football club story 13"], k=1, codes=query)[0][0]["distance"] == 1
        phrase = c.search_text(['"club signed"', '"signed club"'], k=50)
        assert len(phrase[0]) == 10 and phrase[1] == []  # the phrase in its order only
        scores = [h["bm25"] for h in c.search_text(["oil prices"], k=10)[0]]
        assert scores == sorted(scores, reverse=True)  # best first
        hits = c.search_text(["story"], k=40)[0]
        assert [(-h["bm25"], h["id"]) for h in hits] == sorted((-h["bm25"], h["id"]) for h in hits)  # ties by id


def test_insert_each_writes_the_next_batchs_words_meanwhile_and_no_row_goes_in_before_its_words(lite):
    """The ingest's writer: each batch's rows and words in; where a batch's words cannot be
    written (their table gone), that batch's rows never reach Milvus, and the batches before it
    stay whole."""
    texts = [f"{TOPICS[i % 4]} story {i} caf\u00e9 \"quoted\" \U0001f600 \x00 after{i}" for i in range(30)]
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        assert list(c.insert_each(rows(range(s, s + 10), texts[s : s + 10]) for s in (0, 10, 20))) == [10, 10, 10]
        assert c.count() == 30 and ranked_ids(c, "football club story 13")[0] == 13
        assert ranked_ids(c, "after17") == [17]  # a word past a NUL is kept
        assert ranked_ids(c, "cafe")[:1] and ranked_ids(c, "CAF\u00c9") == ranked_ids(c, "cafe")  # accents folded
        assert c.get([29], ["text"])[29]["text"] == texts[29]

    def batches():
        yield rows(range(30, 40), texts[:10])
        yield {**rows([40], ["x"]), "text": [5]}  # words the engine cannot take: the batch never reaches Milvus

    with MilvusTarget(lite, "docs").open() as c:
        written = c.insert_each(batches())
        with pytest.raises(StoreError, match="writing the words' index failed"):
            list(written)
        assert c.count() == 40  # the first batch, whose words were in; not the second
        assert sorted(c.ids()) == list(range(40))


def test_rewrites_deletions_and_an_overwrite_keep_the_words_in_step_with_the_rows(lite):
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        c.upsert(rows(range(8), [TOPICS[i % 4] for i in range(8)]), new=True)
        assert ranked_ids(c, "budget") == [3, 7]
        c.upsert(rows([3], ["budget talks moved to the markets desk"]))  # rewritten: its old words go
        assert ranked_ids(c, "parliament") == [7] and ranked_ids(c, "desk") == [3]
        assert c.upsert_changed(rows([3, 9], ["budget talks moved to the markets desk", "a desk lamp"])) == (1, 1)
        assert sorted(ranked_ids(c, "desk")) == [3, 9]
        removed, left = c.delete_stale_rows("gen", last_row=5, dropped_ids=[1])  # rows 6, 7, 9 and row 1 go
        assert (removed, left) == (4, 5) and ranked_ids(c, "desk") == [3] and ranked_ids(c, "football") == [5]
        c.ensure(64, "m", IndexSpec(), overwrite=True, text_index=True)
        assert ranked_ids(c, "oil") == [] and c.count() == 0


def test_a_filter_most_rows_fail_pages_through_the_ranked_list(lite):
    n = 3000  # every row holds the word; the filter passes 3, ranked anywhere in the list
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        c.upsert(rows(range(n), [f"common {'filler ' * (i % 7)}{i}" for i in range(n)], [i % 1000 for i in range(n)]),
                 new=True)
        hits = c.search_text(["common"], k=5, filter="label == 7", output_fields=["label"])[0]
        assert sorted(h["id"] for h in hits) == [7, 1007, 2007] and {h["label"] for h in hits} == {7}
        assert len(c.search_text(["common"], k=5)[0]) == 5


def test_a_query_past_the_word_limit_keeps_its_rarest_words(lite):
    """A whole document as a query: its first MAX_QUERY_WORDS words are all common, the one word
    that finds its row comes after them, and is kept (the rarest words are what BM25 weighs)."""
    common = [f"w{i}" for i in range(MAX_QUERY_WORDS)]  # the rows hold the first 20; none holds the rest
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        c.upsert(rows(range(40), [" ".join(common[:20]) + f" story{i}" for i in range(40)]), new=True)
        assert [h["id"] for h in c.search_text([" ".join(common) + " story17"], k=1)[0]] == [17]


def test_bm25_orders_the_hits_best_first_ties_by_id(lite):
    texts = [f"the {TOPICS[i % 4]} {'and more ' * (i % 3)}story {i}" for i in range(60)]
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        c.upsert(rows(range(60), texts), new=True)
        hits = c.search_text(["the story of the budget and the phone"], k=60)[0]
        assert len(hits) == 60 and [(-h["bm25"], h["id"]) for h in hits] == sorted((-h["bm25"], h["id"]) for h in hits)
        assert [h["id"] for h in c.search_text(["the story of the budget and the phone"], k=7)[0]] == \
            [h["id"] for h in hits[:7]]  # ties by id, however many are asked for
        assert {h["id"] for h in hits[:30]} == {i for i in range(60) if i % 4 in (2, 3)}  # budget, phone first


def test_milvus_own_bm25_the_servers_path_still_runs_on_milvus_lite(lite):
    """A 2.5+ server keeps BM25 in Milvus; milvus-lite 2.5.1 runs the same calls (its collection
    bound as a server's, with no file): the same rows in both stores find the same document first."""
    texts = [f"{TOPICS[i % 4]} story {i}" for i in range(40)]
    with MilvusTarget(lite, "in_file").open() as s:
        m = CodeCollection(s.client, "in_milvus")  # the server's layout: Milvus' BM25 function
        info = m.ensure(64, "m", IndexSpec(), text_index=True)
        assert (info.text_store, info.meta["text_index"], info.in_doc) == ("milvus", "bm25", False)
        s.ensure(64, "m", IndexSpec(), text_index=True)
        for c in (m, s):
            c.upsert(rows(range(40), texts), new=True)
        assert m.describe().text_store == "milvus" and not (text_file(lite) / "in_milvus").exists()
        queries = ["football club story 13", "parliament budget story 22", "phone fair story 6"]
        assert [h[0]["id"] for h in m.search_text(queries, 3)] == [h[0]["id"] for h in s.search_text(queries, 3)] \
            == [13, 22, 6]
    with MilvusTarget(lite, "in_milvus").open() as c, pytest.raises(CollectionMismatchError) as err:
        c.ensure(64, "m", IndexSpec(), text_index=True)  # in a file, such words are not searched: refused
    assert str(err.value) == ("collection 'in_milvus': its words are in milvus-lite's own BM25 index, which this "
                              "dhim-ray does not search in a file (it keeps them in tantivy beside it); ingest it "
                              "again with overwrite=True")


def _ingested(lite, texts):
    with MilvusTarget(lite, "docs").open() as c:
        c.ensure(64, "m", IndexSpec(), text_index=True)
        c.upsert(rows(range(len(texts)), texts), new=True)


@pytest.mark.parametrize("harm, why", [
    ("an old copy put back", "stale (written before the collection last changed)"),
    ("removed", "missing"),
    ("garbage", "damaged (the engine cannot read it)"),
    ("its folder removed", "missing for this collection"),
])
def test_words_out_of_step_are_refused_in_one_line_then_rebuilt_by_the_next_write_session(lite, harm, why):
    """The words' index is tied to its collection by a generation both keep: one from before a
    rerun, a lost one or a damaged one never answers for the rows; the next ingest (its write
    session: ``renew_words``) rebuilds it from the stored text, without overwrite."""
    import shutil

    _ingested(lite, [TOPICS[i % 4] for i in range(8)])
    old = text_file(lite).with_name("old.words")
    shutil.copytree(text_file(lite), old)
    with MilvusTarget(lite, "docs").open() as c:  # a rerun: a write session that rewrites rows 3 and 7
        c.renew_words()
        c.upsert(rows([3, 7], ["a desk lamp", "a desk chair"]))
        assert sorted(h["id"] for h in c.search_text(["parliament budget"], k=5)[0]) == []
    if harm == "an old copy put back":
        shutil.rmtree(text_file(lite))
        shutil.copytree(old, text_file(lite))
    elif harm == "removed":
        shutil.rmtree(text_file(lite))
    elif harm == "garbage":
        (text_file(lite) / "docs" / "meta.json").write_bytes(b"\x00not json" * 100)
    else:
        shutil.rmtree(text_file(lite) / "docs")
    with MilvusTarget(lite, "docs").open() as c:
        with pytest.raises(StoreError) as caught:
            c.search_text(["parliament budget"], k=5)
        message = str(caught.value)
        assert f"its words' index ({text_file(lite)}) is {why}; rerun the same ingest" in message, message
        assert "\n" not in message
        c.renew_words()  # the next ingest's write session
        assert c.search_text(["parliament budget"], k=5)[0] == []  # no phantom rows: 3 and 7 hold other texts now
        assert [h["id"] for h in c.search_text(["desk chair"], k=5)[0]][:1] == [7]
        assert sorted(h["id"] for h in c.search_text(["football club"], k=8)[0]) == [1, 5]
    if harm == "garbage":
        assert len(list(text_file(lite).parent.glob("codes.db.words.damaged-*"))) == 1


def test_a_truncated_milvus_lite_file_is_not_said_to_be_open_elsewhere(lite):
    _ingested(lite, TOPICS)
    release(lite)
    with open(lite, "r+b") as f:
        f.truncate(8192)
    with pytest.raises(StoreError) as caught, MilvusTarget(lite, "docs").open():
        pass
    assert "another process" not in str(caught.value) and "damaged or truncated" in str(caught.value), caught.value
