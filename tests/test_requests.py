"""A command's request is checked once, when made, and a refusal names the field it is about:
the CLI turns that name into its flag (``k=0`` -> ``--k 0``), the HTTP service into the JSON
field it reports."""

from __future__ import annotations

import pickle

import pytest

from dhim_ray.cli_words import as_flags
from dhim_ray.config import FeatureConfig
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError
from dhim_ray.evaluation import EvalRequest
from dhim_ray.retrieval.fusion import Fusion
from dhim_ray.search import SearchRequest

DB, Q = CorpusSpec.parse("bbc:train"), CorpusSpec.parse("bbc:val")


@pytest.mark.parametrize("fields, starts, field", [
    ({}, "give query texts or like=ID", "texts"),
    ({"texts": ["a"], "like": [1]}, "give query texts or like=ID", "texts"),
    ({"texts": ["a"], "k": 0}, "k=0: must be between 1 and 16384", "k"),
    ({"texts": ["a"], "rerank": 65}, "rerank=65: must be an integer in 1..64", "rerank"),
    ({"texts": ["a"], "k": 1000, "rerank": 64}, "rerank=64: k x rerank = 64000", "rerank"),
    ({"texts": ["a"], "mode": "fuzzy"}, "mode='fuzzy': choose codes, text or hybrid", "mode"),
    ({"texts": ["a"], "max_distance": -1}, "max_distance=-1: must be a whole number of bits", "max_distance"),
    ({"texts": ["a"], "filter": "(label == 3"}, "filter='(label == 3': 1 bracket left open", "filter"),
    ({"texts": ["oil", "\ud800 prices"]}, "texts[1]: a lone surrogate '\\ud800' at character 1 is not text", "texts"),
    ({"like": ["doc-7", "\udc80"]}, "like[1]: a lone surrogate '\\udc80'", "like"),
    ({"like": [7], "rerank": 4}, "rerank=4 with like", "rerank"),
    ({"like": [7], "mode": "text"}, "mode=text with like", "mode"),
])
def test_a_bad_search_request_is_refused_naming_its_field(fields, starts, field):
    """The message starts with the field, and the error carries it (what the service's 422 names)."""
    with pytest.raises(ConfigError) as refused:
        SearchRequest(**fields)
    assert str(refused.value).startswith(starts), str(refused.value)
    assert refused.value.field == field
    again = pickle.loads(pickle.dumps(refused.value))  # as Ray carries it from a worker
    assert (str(again), again.field) == (str(refused.value), field)


def test_a_search_request_takes_one_text_or_many_and_keeps_them_as_given():
    assert SearchRequest("oil prices").texts == ("oil prices",)
    req = SearchRequest(["a", "b"], k=5, rerank=4, filter="  label == 3 ", max_distance=0)
    assert req.texts == ("a", "b") and req.filter.text == "label == 3" and req.max_distance == 0
    assert SearchRequest(like=["doc-7", 3]).like == ("doc-7", 3)


def test_the_cli_names_the_flag_of_the_field():
    with pytest.raises(ConfigError) as refused:
        SearchRequest(["a"], k=20_000)
    assert as_flags(str(refused.value)).startswith("--k 20000: must be between 1 and 16384")
    # a switch is its flag alone; a message naming parameters names flags, one table for both
    assert as_flags("fix the data or pass drop_empty=True") == "fix the data or pass --drop-empty"
    assert as_flags("(drop text_index=False)") == "(drop --no-text-index)"
    assert as_flags("pick another collection=NAME or pass overwrite=True") == \
        "pick another --collection NAME or pass --overwrite"


def collection():
    return MilvusTarget("codes.db", "bbc_64")


@pytest.mark.parametrize("fields, starts", [
    ({"database": DB, "queries": Q}, "give a model folder, baseline=NAME, or both"),
    ({"model_dir": "m", "database": DB, "queries": Q, "task": "topics"}, "task='topics': choose topic or known-item"),
    ({"baselines": ("itq",), "database": DB, "queries": Q, "rerank": 4}, "rerank=4 with baseline=itq"),
    ({"model_dir": "m", "database": DB, "queries": Q, "bits": 64}, "bits=64: applies to baseline=NAME only"),
    ({"model_dir": "m", "database": DB, "queries": Q, "max_words": 9}, "max_words=9: applies to baseline=NAME"),
    ({"baselines": ("cosine",), "database": DB, "queries": Q, "bits": 64}, "bits=64: baseline=cosine searches the "
                                                                             "float vectors"),
    ({"model_dir": "m", "database": DB, "queries": Q, "nprobe": 8}, "nprobe=8: applies to a Milvus collection=NAME"),
    ({"model_dir": "m", "database": DB, "queries": Q, "fusion": Fusion("rrf")}, "fusion=rrf: applies to a Milvus"),
    ({"model_dir": "m", "queries": Q}, "eval needs database=CORPUS:SPLIT"),
    ({"model_dir": "m", "database": DB}, "eval needs queries=CORPUS:SPLIT"),
    ({"model_dir": "m", "database": DB, "queries": Q, "collection": collection()},
     "database=bbc:train and collection=bbc_64 both given"),
    ({"baselines": ("itq",), "queries": Q, "collection": collection()}, "collection=bbc_64: give the model folder"),
    ({"model_dir": "m", "queries": Q, "collection": collection(), "curves": True}, "collection=bbc_64: curves are "
                                                                                    "drawn from in-memory"),
    ({"model_dir": "m", "queries": Q, "collection": collection(), "task": "known-item"},
     "queries=bbc:val: known-item windows in a collection are cut from its own texts"),
])
def test_a_bad_eval_request_is_refused_naming_its_field(fields, starts):
    with pytest.raises(ConfigError) as refused:
        EvalRequest(**fields)
    assert str(refused.value).startswith(starts), str(refused.value)


def test_an_eval_request_compares_a_model_with_baselines_each_once():
    req = EvalRequest("m", ("itq", "ubinary", "itq"), DB, Q, bits=None)
    assert req.baselines == ("itq", "ubinary")
    assert req.baseline_bits("itq") == 64 and req.baseline_bits("ubinary") is None
    assert req.baseline_bits("itq", model_bits=16) == 16  # beside a model: its width
    model = FeatureConfig("some/encoder", 12, cleaning="unicode")
    assert req.baseline_features(model) is model  # its features: one encoder pass serves every method
    assert req.baseline_features() == FeatureConfig()  # alone: the packaged encoder, 50 words
    assert EvalRequest("m", ("itq",), DB, Q, max_words=9).baseline_features(model) == FeatureConfig("some/encoder", 9)
    known = EvalRequest("m", database=DB, task="known-item")  # the windows come from the database
    assert known.queries is None and known.collection is None


@pytest.mark.parametrize("write_tasks", [0, 1025, 2.5, True])
def test_an_ingest_request_refuses_write_tasks_out_of_range(write_tasks, tmp_path):
    from dhim_ray.jobs.ingest import IngestRequest

    with pytest.raises(ConfigError, match=rf"^write_tasks={write_tasks}: must be between 1 and 1024, e.g. 4$"):
        IngestRequest(DB, tmp_path, MilvusTarget("http://127.0.0.1:19530", "c"), write_tasks=write_tasks)
    assert IngestRequest(DB, tmp_path, MilvusTarget("http://127.0.0.1:19530", "c"), write_tasks=4).write_tasks == 4
