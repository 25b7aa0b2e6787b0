"""One search for both tasks: BM25 over the stored text beside the codes, fused.

The rankers on lists whose answer is known (quick); then on real milvus-lite with the packaged
encoder and BBC corpus: an exact phrase finds its document first and a topic query keeps the
codes' topic order (Searcher and CLI), filters hold on both lists, reruns keep the index and a
rerun that adds or drops it is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import BBC16_DOCS

from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import CollectionMismatchError, ConfigError
from dhim_ray.retrieval.fusion import Fusion, fuse
from dhim_ray.search import SearchRequest

N = BBC16_DOCS  # the session collection (conftest.bbc16_collection)
BBC = CorpusSpec("bbc", "train", limit=N)


# ---- the rankers, on lists with a known answer -------------------------------------------------
def hits(ids, key, values):
    return [{"id": i, key: v} for i, v in zip(ids, values)]


CODES = hits([10, 11, 12, 13, 14, 15], "distance", [1, 2, 2, 3, 4, 5])  # nearest first
TEXT = hits([99, 13, 98, 10], "bm25", [9.5, 4.0, 3.0, 1.0])  # best first


def test_head_puts_the_text_lists_first_hits_above_the_codes_own_order():
    fused = fuse(CODES, TEXT, k=5, fusion=Fusion("head", depth=2))
    assert [h["id"] for h in fused] == [99, 13, 10, 11, 12]
    assert fused[1] == {"id": 13, "distance": 3, "bm25": 4.0}  # found by both: the fields of both
    assert [h["id"] for h in fuse(CODES, [], k=4)] == [10, 11, 12, 13]  # nothing lexical: the codes' list
    assert [h["id"] for h in fuse(CODES, TEXT, k=2, fusion=Fusion("head", depth=3))] == [99, 13]


def test_rrf_sums_reciprocal_ranks_and_the_better_rank_wins():
    fused = fuse(CODES, TEXT, k=3, fusion=Fusion("rrf", c=1))
    # 10: 1/2 + 1/5; 13: 1/5 + 1/3; 99: 1/2; 11: 1/3
    assert [h["id"] for h in fused] == [10, 13, 99]
    assert fused[0]["rrf_score"] == pytest.approx(0.7)
    reversed_codes = list(reversed(CODES))  # rank order, never the raw scores: the list order decides
    assert fuse(reversed_codes, [], k=1, fusion=Fusion("rrf"))[0]["id"] == 15


def test_phrase_puts_a_text_hit_first_only_where_it_holds_the_querys_words():
    text = [{"id": 99, "bm25": 9.0, "text": "A quiet Cat sat on the mat, today."},
            {"id": 13, "bm25": 5.0, "text": "the cat ran"}, {"id": 98, "bm25": 4.0, "text": "sat mat quiet cat"}]
    fused = fuse(CODES, text, k=5, fusion=Fusion("phrase", depth=3), query="the cat sat on the mat")
    assert [h["id"] for h in fused] == [99, 10, 11, 12, 13]  # 99 holds 5 of the 5 words, 98 3, 13 2
    fused = fuse(CODES, text, k=5, fusion=Fusion("phrase", depth=3, cover=0.6), query="the cat sat on the mat")
    assert [h["id"] for h in fused] == [99, 98, 10, 11, 12]
    assert [h["id"] for h in fuse(CODES, text, k=3, fusion=Fusion("phrase"), query="oil prices")] == [10, 11, 12]


@pytest.mark.parametrize("spelling, fusion", [(None, Fusion("phrase", 5)), ("head", Fusion("head", 5)),
                                              ("head:3", Fusion("head", 3)), ("phrase:3", Fusion("phrase", 3)),
                                              ("rrf", Fusion("rrf")),
                                              ("rrf:10", Fusion("rrf", c=10))])
def test_fusion_spellings(spelling, fusion):
    assert Fusion.parse(spelling) == fusion


@pytest.mark.parametrize("spelling", ["weighted", "head:x", "head:0", "rrf:-1", "head:101"])
def test_a_fusion_that_does_not_exist_is_one_line(spelling):
    with pytest.raises(ConfigError, match="fusion"):
        Fusion.parse(spelling)


# ---- on real milvus-lite --------------------------------------------------------------------------
pytest_slow = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(bbc16):
    return bbc16


@pytest.fixture(scope="module")
def ingested(bbc16_collection):
    return bbc16_collection


def phrase(text: str, start: int = 12, words: int = 8) -> str:
    return " ".join(text.split()[start : start + words])


@pytest_slow
def test_an_exact_phrase_finds_its_document_first_where_the_codes_alone_do_not(ingested, model_dir):
    from dhim_ray.search import Searcher

    target, result = ingested
    assert result.text_index  # the default on milvus-lite
    split = load_split(BBC)
    with Searcher(model_dir, target) as s:
        assert s.has_text_index and s.resolve_mode(None) == "hybrid"
        docs = range(0, N, 12)
        queries = [phrase(split.texts[i]) for i in docs]
        fused = s.run(SearchRequest(queries, k=10)).hits
        codes = s.run(SearchRequest(queries, k=10, mode="codes")).hits
        text = s.run(SearchRequest(queries, k=10, mode="text")).hits
    firsts = [row[0]["row"] for row in fused]
    assert firsts == [int(split.rows[i]) for i in docs]
    assert all("bm25" in row[0] and isinstance(row[0]["distance"], int) for row in fused)
    found_by_codes = sum(any(h["row"] == split.rows[i] for h in row) for i, row in zip(docs, codes))
    assert found_by_codes < len(docs)  # what the text index is for: 16-bit codes miss most of them
    for row in text:  # text mode: BM25's order, best first
        assert [h["bm25"] for h in row] == sorted((h["bm25"] for h in row), reverse=True)


@pytest_slow
def test_opening_a_big_collection_loads_it_once_and_says_so(ingested, model_dir, monkeypatch, caplog):
    """milvus-lite loads a file's collection on its first use after every open (minutes at ten
    million codes, past one call's timeout): the Searcher loads it with a timeout of its own and
    says so in one line where it holds many rows; loaded, it says nothing. The words are kept
    beside the file, so nothing is rebuilt."""
    import logging

    from dhim_ray.connectors import milvus
    from dhim_ray.search import Searcher

    target, result = ingested
    monkeypatch.setattr(milvus, "LOAD_NOTICE_ROWS", result.rows_in_collection)  # as if it were big
    with caplog.at_level(logging.INFO, logger="dhim_ray"), Searcher(model_dir, target) as s:
        assert s.run(SearchRequest(["oil prices"], k=3)).hits[0]
        before = caplog.text
        s.collection.load()  # loaded: nothing more
    assert before.count("loading collection bbc16") == 1 and "rebuilds its text index" not in before
    assert caplog.text.count("loading collection") == 1


@pytest_slow
def test_a_topic_query_keeps_the_codes_order_below_the_lexical_head(ingested, model_dir):
    from dhim_ray.retrieval.fusion import coverage
    from dhim_ray.search import Searcher

    target, _ = ingested
    queries = load_split(CorpusSpec("bbc", "val", limit=10)).texts
    with Searcher(model_dir, target) as s:
        fused = s.run(SearchRequest(queries, k=20)).hits  # the default: phrase:5
        codes = s.run(SearchRequest(queries, k=20, mode="codes")).hits
        text = s.run(SearchRequest(queries, k=5, mode="text")).hits
        head3 = s.run(SearchRequest(queries, k=20), fusion=Fusion("head", 3)).hits
    for q, f, c, t, h in zip(queries, fused, codes, text, head3):
        first = [x["id"] for x in t if coverage(q, x["text"]) >= 0.8]  # a whole document: rarely any
        assert [x["id"] for x in f] == (first + [x["id"] for x in c if x["id"] not in first])[:20]
        top = [x["id"] for x in t[:3]]
        assert [x["id"] for x in h[:3]] == top
        assert [x["id"] for x in h[3:]] == [x["id"] for x in c if x["id"] not in top][:17]
    same = sum([x["id"] for x in f] == [x["id"] for x in c] for f, c in zip(fused, codes))
    assert same >= 8  # whole documents as queries: the codes' own list


@pytest_slow
def test_a_filter_holds_on_both_lists(ingested, model_dir):
    from dhim_ray.search import Searcher

    target, _ = ingested
    split = load_split(BBC)
    inside, outside = 5, 200  # the rows the filter keeps are row < 120
    with Searcher(model_dir, target) as s:
        rows = s.run(SearchRequest([phrase(split.texts[outside]), phrase(split.texts[inside])], k=10, filter="row < 120")).hits
    assert all(h["row"] < 120 for row in rows for h in row) and all(len(row) == 10 for row in rows)
    assert rows[1][0]["row"] == split.rows[inside]  # its own document passes the filter and comes first
    assert all(h["row"] != split.rows[outside] for h in rows[0])


@pytest_slow
def test_modes_the_collection_cannot_search_are_one_line(ingested, model_dir, tmp_path):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.search import Searcher

    target, _ = ingested
    with Searcher(model_dir, target) as s:
        with pytest.raises(ConfigError, match="max_distance=3: a radius in bits applies to the codes only"):
            s.run(SearchRequest(["oil prices"], k=5, max_distance=3, mode="hybrid"))
        near = s.run(SearchRequest(["oil prices"], k=5, max_distance=16)).hits[0]  # default + a radius: the codes
        assert near and all("bm25" not in h and h["distance"] <= 16 for h in near)
        with pytest.raises(ConfigError, match="mode='words'"):
            s.run(SearchRequest(["oil prices"], mode="words"))
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest

    bare = MilvusTarget(str(tmp_path / "bare.db"), "bare16")
    assert not run_ingest(IngestRequest(CorpusSpec("bbc", "train", limit=40), model_dir, bare, workers=1, text_index=False), progress=False).text_index
    with Searcher(model_dir, bare) as s:
        assert s.resolve_mode(None) == "codes"
        with pytest.raises(ConfigError, match="has no text index; search mode=codes"):
            s.run(SearchRequest(["oil prices"], mode="hybrid"))


@pytest_slow
def test_a_rerun_keeps_the_index_and_one_that_adds_or_drops_it_is_refused(ingested, model_dir):
    from dhim_ray.jobs.ingest import IngestRequest, run_ingest
    from dhim_ray.search import Searcher

    target, _ = ingested
    again = run_ingest(IngestRequest(BBC, model_dir, target, workers=1), progress=False)
    assert again.text_index and again.rows_in_collection == N and again.verified
    with pytest.raises(CollectionMismatchError, match="keeps a text index .* and this ingest has none"):
        run_ingest(IngestRequest(BBC, model_dir, target, workers=1, text_index=False), progress=False)
    with Searcher(model_dir, target) as s:
        assert s.count() == N and s.has_text_index


@pytest_slow
def test_a_one_shot_search_loads_no_torch_and_finds_the_torch_hashers_hits(ingested, model_dir):
    from dhim_ray.search import Searcher

    target, _ = ingested
    queries = [phrase(load_split(BBC).texts[30]), "oil prices rise as markets fall"]
    with Searcher(model_dir, target) as s:  # hashed by the torch Hasher
        expected = [[(h["id"], h["distance"]) for h in hits] for hits in s.run(SearchRequest(queries, k=10)).hits]
    argv = ["search", *queries, "--model", str(model_dir), "--uri", target.uri, "--collection", target.collection,
            "--json"]
    code = ("import json, sys\nfrom dhim_ray.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))\n")
    for run in ("makes the model's query graph (with torch)", "finds it cached"):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        printed, heavy = done.stdout.strip().splitlines()[-2:]
        found = [[(h["id"], h["distance"]) for h in q["hits"]] for q in json.loads(printed)]
        assert found == expected, run
    assert json.loads(heavy) == []


@pytest_slow
def test_cli_search_and_eval_through_milvus_take_the_mode(ingested, model_dir):
    from typer.testing import CliRunner

    from dhim_ray.cli import app

    target, _ = ingested
    split = load_split(BBC)
    runner = CliRunner()
    base = ["--model", str(model_dir), "--uri", target.uri, "--collection", target.collection, "--json"]
    out = runner.invoke(app, ["search", phrase(split.texts[30]), *base])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)[0]["hits"][0]["row"] == split.rows[30]
    out = runner.invoke(app, ["search", "oil", *base, "--mode", "codes"])
    assert out.exit_code == 0 and all("bm25" not in h for h in json.loads(out.stdout)[0]["hits"])
    shown = runner.invoke(app, ["search", phrase(split.texts[30]), *base[:-1]])
    assert shown.exit_code == 0 and "bm25" in shown.stdout

    ev = ["eval", str(model_dir), "--collection", target.collection, "--uri", target.uri, "--json"]
    known = runner.invoke(app, [*ev, "--task", "known-item", "--windows", "60"])
    assert known.exit_code == 0, known.output
    fused = json.loads(known.stdout)
    codes = json.loads(runner.invoke(app, [*ev, "--task", "known-item", "--windows", "60", "--mode", "codes"]).stdout)
    assert fused["mode"] == "hybrid" and fused["fusion"] == "phrase:5" and codes["mode"] == "codes"
    assert fused["recall_at_10"] >= 0.95 > codes["recall_at_10"]
    topic = json.loads(runner.invoke(app, [*ev, "--queries", "bbc:val", "--limit", "40", "-k", "20"]).stdout)
    assert topic["mode"] == "hybrid" and 0 < topic["precision_at_k"] == topic["precision_at_k_tie_aware"] <= 1
    # --rerank: the codes' candidates re-ranked before the fusion, reported beside the plain list
    reranked = json.loads(runner.invoke(app, [*ev, "--queries", "bbc:val", "--limit", "40", "-k", "20",
                                              "--rerank", "4"]).stdout)
    assert reranked["precision_at_k"] == topic["precision_at_k"] and 0 < reranked["precision_at_k_reranked"] <= 1
    refused = runner.invoke(app, ["eval", str(model_dir), "--database", "bbc:train", "--queries", "bbc:val",
                                  "--mode", "hybrid"])
    assert refused.exit_code == 2 and "applies to a Milvus --collection" in refused.output


@pytest_slow
def test_eval_without_labels_scores_the_collection_as_in_memory(ingested, model_dir, tmp_path):
    """Queries without labels: the collection's stored codes are scored by cosine-neighbour
    recall@k (its stored texts encoded again), the figure the in-memory eval gives for the same
    documents; a mode other than codes is refused in one line."""
    from dhim_ray.eval_in_memory import Model, topic
    from dhim_ray.evaluation import EvalRequest, evaluate

    target, _ = ingested
    texts = load_split(CorpusSpec("bbc", "test")).texts[:40]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    queries = CorpusSpec.parse(f"{tmp_path / 'q.jsonl'}:train")
    milvus = evaluate(EvalRequest(model_dir, queries=queries, collection=target, k=10, mode="codes"))[0]
    memory = topic(Model(model_dir), BBC, queries, k=10, progress=False)
    assert milvus["metric"] == memory["metric"] and milvus["n_database"] == memory["n_database"] == N
    assert milvus["neighbour_recall_at_k"] == pytest.approx(memory["neighbour_recall_at_k"], abs=1e-12)
    assert 0 < milvus["neighbour_recall_at_k"] <= 1
    with pytest.raises(ConfigError, match="mode=hybrid: without labels"):
        evaluate(EvalRequest(model_dir, queries=queries, collection=target, k=10, mode="hybrid"))


def test_the_text_mode_ranks_by_bm25_on_a_corpus_whose_answer_is_known(tiny_model, tmp_path):
    """Three documents share a rare word 3, 2 and 1 times: text mode ranks them in that order
    (BM25's order: any model's codes serve)."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.hasher import Hasher
    from dhim_ray.search import Searcher

    hasher = Hasher.load(tiny_model)
    texts = ["the zephyr zephyr zephyr blew over the hills today", "a zephyr zephyr came over the bay in the morning",
             "one zephyr crossed the valley and the river and the town", "markets fell as oil prices rose sharply"]
    rows = np.arange(len(texts))
    target = MilvusTarget(str(tmp_path / "known.db"), "known16")
    with target.open() as collection:
        collection.ensure(16, hasher.model_id, text_index=True)
        collection.upsert(code_rows({"id": document_ids("k@1", rows), "code": hasher.encode(texts), "text": texts,
                                     "row": rows}, 16, "k@1"))
    with Searcher(tiny_model, target) as s:
        text = s.run(SearchRequest(["zephyr"], k=4, mode="text")).hits[0]
        assert [h["row"] for h in text] == [0, 1, 2]  # the fourth shares no word: not found
        head = s.run(SearchRequest(["zephyr"], k=4), fusion=Fusion("head", 1)).hits[0]
        assert head[0]["row"] == 0 and {h["row"] for h in head} == {0, 1, 2, 3}
        rrf = s.run(SearchRequest(["zephyr"], k=4), fusion=Fusion("rrf")).hits[0]
        assert rrf[-1]["row"] == 3  # in one list only: below every row both lists hold


def test_the_same_rows_written_in_another_order_give_the_same_hits(model_dir, tmp_path):
    """Which rows tied at the k-th distance (or BM25 score) Milvus returns depends on the order they
    were written in; the hits do not: the same rows, written forwards in one file and backwards
    in small batches in another, give the same codes, text and hybrid lists (16-bit codes tie a
    lot; the duplicated texts tie on BM25)."""
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.hasher import Hasher
    from dhim_ray.search import Searcher

    hasher = Hasher.load(model_dir)
    texts = load_split(BBC).texts[:150]
    texts = texts + texts[:30]  # duplicates: equal BM25 scores
    codes = hasher.encode(texts)
    rows = np.arange(len(texts))
    found = []
    for name, order, batch in (("forwards", rows, len(rows)), ("backwards", rows[::-1], 17)):
        target = MilvusTarget(str(tmp_path / f"{name}.db"), "bbc16")
        with target.open() as collection:
            collection.ensure(16, hasher.model_id, text_index=True)
            for start in range(0, len(order), batch):
                part = order[start : start + batch]
                collection.upsert(code_rows({"id": document_ids("bbc@t", part), "code": codes[part],
                                             "text": [texts[i] for i in part], "row": part}, 16, "bbc@t"))
        with Searcher(model_dir, target) as searcher:
            queries = texts[:20]
            found.append({mode: [[h["id"] for h in row] for row in searcher.run(SearchRequest(queries, k=25, mode=mode)).hits]
                          for mode in ("codes", "text", "hybrid")})
    assert found[0] == found[1]
    distances = [h["distance"] for h in Searcher(model_dir, MilvusTarget(str(tmp_path / "forwards.db"), "bbc16"))
                 .run(SearchRequest(texts[:1], k=25, mode="codes")).hits[0]]
    assert len(set(distances)) < len(distances)  # ties there were


@pytest_slow
def test_the_first_k_hits_are_those_of_any_larger_k(ingested, model_dir):
    """Paging (k=3, then k=10) never sees a hit appear or vanish: in every mode and for every
    fusion, the top 3 is the top 10's first three (each list's depth is fetched whatever k,
    rrf's up to RRF_DEPTH, ties cut by id)."""
    from dhim_ray.search import Searcher

    target, _ = ingested
    split = load_split(BBC)
    queries = [phrase(split.texts[i]) for i in (3, len(split.texts) // 2, -1)] + ["oil prices rise as markets fall", "the film"]
    with Searcher(model_dir, target) as s:
        for mode, fusion in (("codes", None), ("text", None), ("hybrid", Fusion("phrase", 5)), ("hybrid", Fusion("head", 5)),
                             ("hybrid", Fusion("rrf"))):
            small = s.run(SearchRequest(queries, k=3, mode=mode), fusion=fusion).hits
            large = s.run(SearchRequest(queries, k=10, mode=mode), fusion=fusion).hits
            assert [[h["id"] for h in row] for row in small] == [[h["id"] for h in row[:3]] for row in large], mode
