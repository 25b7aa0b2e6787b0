import json
import time

import numpy as np
import pytest

from conftest import make_toy_corpus, shared_corpus, write_csv
from dhim_ray.data import load_corpus, load_split, parse_spec
from dhim_ray.errors import DataError, HubUnreachableError, UnknownDatasetError
from dhim_ray.text import clean_and_truncate, clean_string


def test_clean_string_like_the_paper():
    assert clean_string("It's a BERT-based model, isn't it?") == "it 's a bert based model , is n't it ?"
    assert clean_and_truncate("one two three four", 2) == "one two"
    assert clean_string("@@@ ###") == ""


def test_local_folder_headerless_csv(toy_folder):
    corpus = load_corpus(str(toy_folder))
    assert set(corpus.splits) == {"train", "val"}
    train = corpus.split("train")
    assert len(train) == 160 and train.labels.dtype == np.int64
    assert load_split(f"{toy_folder}:val").texts == corpus.split("val").texts


def test_shared_dbpedia_folder():
    corpus = load_corpus(str(shared_corpus("dbpedia")))
    assert len(corpus.split("train")) == 4000 and len(corpus.split("val")) == 1000
    assert set(np.unique(corpus.split("train").labels)) == set(range(1, 15))


def test_single_files_with_named_columns(tmp_path):
    rows = make_toy_corpus(3)
    write_csv(tmp_path / "c.csv", [(["sport", "politics", "tech", "film"][l], t) for l, t in rows], header=True)
    split = load_split(str(tmp_path / "c.csv"))
    assert len(split) == 12 and split.label_names == ["film", "politics", "sport", "tech"]
    with open(tmp_path / "c.jsonl", "w") as f:
        for l, t in rows:
            f.write(json.dumps({"body": t, "topic": l}) + "\n")
    split = load_split(str(tmp_path / "c.jsonl"), text_column="body", label_column="topic")
    assert split.texts == [t for _, t in rows]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [t for _, t in rows], "label": [l for l, _ in rows]}), tmp_path / "c.parquet")
    assert len(load_split(str(tmp_path / "c.parquet"))) == 12


def test_missing_text_column(tmp_path):
    with open(tmp_path / "c.jsonl", "w") as f:
        f.write(json.dumps({"body": "hello", "label": 1}) + "\n")
    with pytest.raises(DataError, match="no text column 'text'; columns are .*body.*; pass --text-column NAME"):
        load_corpus(str(tmp_path / "c.jsonl"))


def test_empty_and_bad_rows(tmp_path):
    write_csv(tmp_path / "d" / "train.csv", [(1, "football goal"), (2, ""), (1, "@@@"), (2, "vote party")])
    with pytest.raises(DataError, match=r"2 of 4 rows have empty or non-string text \(rows 1, 2\).*--drop-empty"):
        load_corpus(str(tmp_path / "d"))
    split = load_corpus(str(tmp_path / "d"), drop_empty=True).split("train")
    assert split.texts == ["football goal", "vote party"] and split.rows.tolist() == [0, 3]


def test_non_string_text(tmp_path):
    with open(tmp_path / "c.jsonl", "w") as f:
        f.write(json.dumps({"text": "ok words", "label": 1}) + "\n" + json.dumps({"text": 5, "label": 1}) + "\n")
    with pytest.raises(DataError, match="non-string"):
        load_corpus(str(tmp_path / "c.jsonl"))


def test_empty_corpus(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "train.csv").write_text("label,text\n")
    with pytest.raises(DataError, match="is empty"):
        load_corpus(str(tmp_path / "e"))
    (tmp_path / "f").mkdir()
    with pytest.raises(DataError, match="no train/val/test files"):
        load_corpus(str(tmp_path / "f"))


def test_unknown_preset_lists_choices():
    with pytest.raises(UnknownDatasetError, match="unknown corpus 'dbpeida': use a preset \\(bbc, dbpedia, agnews, 20ng\\)"):
        load_corpus("dbpeida")


def test_missing_split(toy_folder):
    with pytest.raises(DataError, match="has no split 'test'; it has: train, val"):
        load_corpus(f"{toy_folder}:test")


def test_hub_preset_offline_fails_fast_with_a_fix():
    t0 = time.perf_counter()
    with pytest.raises(HubUnreachableError, match="unreachable .* pass a local folder"):
        load_corpus("dbpedia")
    assert time.perf_counter() - t0 < 5


def test_builtin_bbc_corpus():
    corpus = load_corpus("bbc")
    assert len(corpus.split("train")) + len(corpus.split("val")) == 2225
    assert corpus.split("train").label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert load_corpus("bbc").split("val").texts == corpus.split("val").texts  # deterministic


def test_parse_spec():
    assert parse_spec("dbpedia:train") == ("dbpedia", "train")
    assert parse_spec("../shared/data/dbpedia:val") == ("../shared/data/dbpedia", "val")
    assert parse_spec("owner/name") == ("owner/name", None)
