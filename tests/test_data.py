import json

import numpy as np
import pytest
from conftest import make_toy_corpus, shared_corpus, write_csv

from dhim_ray.corpus.data import load_corpus, load_split
from dhim_ray.corpus.spec import CorpusSpec, parse_spec
from dhim_ray.corpus.text import clean_and_truncate, clean_string
from dhim_ray.errors import DataError, HubUnreachableError, UnknownDatasetError


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


@pytest.mark.shared_data
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
    with pytest.raises(DataError, match="no text column 'text'; columns are .*body.*; pass text_column=NAME"):
        load_corpus(str(tmp_path / "c.jsonl"))


def test_empty_and_bad_rows(tmp_path):
    write_csv(tmp_path / "d" / "train.csv", [(1, "football goal"), (2, ""), (1, "@@@"), (2, "vote party")])
    with pytest.raises(DataError, match=r"2 of 4 rows have empty or non-string text \(rows 1, 2\).*drop_empty=True"):
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
    with pytest.raises(HubUnreachableError, match="unreachable .* pass a local CSV"):
        load_corpus("dbpedia")


def test_builtin_bbc_corpus():
    corpus = load_corpus("bbc")
    assert [len(corpus.split(s)) for s in ("train", "val", "test")] == [1780, 223, 222]
    from dhim_ray.corpus.sources import _bbc_table

    parts = [set(_bbc_table(s)[0].column("source_row").to_pylist()) for s in ("train", "val", "test")]
    assert len(set.union(*parts)) == 2225  # the three splits share no article
    assert corpus.split("train").label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert load_corpus("bbc").split("val").texts == corpus.split("val").texts  # deterministic


def test_parse_spec():
    assert parse_spec("dbpedia:train") == ("dbpedia", "train")
    assert parse_spec("../shared/data/dbpedia:val") == ("../shared/data/dbpedia", "val")
    assert parse_spec("owner/name") == ("owner/name", None)


def test_unicode_text_keeps_its_letters_ascii_cleaning_reproduces_the_paper():
    """Issue 11.3: "Zürich café" hashed as "z rich caf"; CJK and emoji documents were empty."""
    assert clean_string("Zürich café") == "zürich café"
    assert clean_string("Zürich café", "ascii") == "z rich caf"
    assert clean_string("北京大学") == "北京大学" and clean_string("👍🎉") == "👍🎉"
    assert clean_string("It's a BERT-based model, isn't it?", "ascii") == clean_string(
        "It's a BERT-based model, isn't it?")


def test_cjk_corpus_loads_without_drop_empty(tmp_path):
    write_csv(tmp_path / "train.csv", [("a", "北京大学"), ("b", "東京の天気"), ("a", "👍🎉")], header=True)
    split = load_split(str(tmp_path / "train.csv"))
    assert len(split) == 3


def test_string_labels_share_one_vocabulary_across_splits(tmp_path):
    """Issue 11.2: val lacking a class shifted every later label by one."""
    write_csv(tmp_path / "train.csv", [("apple", "x y"), ("banana", "y z"), ("cherry", "z w")], header=True)
    write_csv(tmp_path / "val.csv", [("apple", "x"), ("cherry", "w")], header=True)
    corpus = load_corpus(str(tmp_path))
    train, val = corpus.split("train"), corpus.split("val")
    assert train.label_names == val.label_names == ["apple", "banana", "cherry"]
    assert train.labels.tolist() == [0, 1, 2] and val.labels.tolist() == [0, 2]
    # one split at a time still numbers by the whole corpus
    assert load_split(f"{tmp_path}:val").labels.tolist() == [0, 2]


def test_misspelled_label_column_is_an_error(toy_folder, tmp_path):
    """Issue 11.8: --label-column misspelled was ignored (training ran without model selection)."""
    write_csv(tmp_path / "train.csv", [("a", "x y")], header=True)
    with pytest.raises(DataError, match="no label column 'lable'.*columns are \\['label', 'text'\\]"):
        load_corpus(str(tmp_path / "train.csv"), label_column="lable")
    assert load_split(str(tmp_path / "train.csv")).labels is not None  # the default name is optional


def test_empty_label_cell_is_an_error(tmp_path):
    """Issue 11.8: an empty label cell became a class of its own."""
    write_csv(tmp_path / "train.csv", [("a", "x y"), ("", "y z"), ("b", "z")], header=True)
    with pytest.raises(DataError, match="1 rows have no label \\(rows 1\\)"):
        load_corpus(str(tmp_path / "train.csv"))


def test_non_utf8_file_says_so(tmp_path):
    """Issue 11.12: a non-UTF-8 file said only 'cannot be read as csv'."""
    (tmp_path / "train.csv").write_bytes("label,text\na,caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 text \\(byte 16.*re-save it as UTF-8"):
        load_corpus(str(tmp_path / "train.csv"))


def test_missing_local_file_is_not_blamed_on_the_hub(tmp_path):
    """Issue 11.12: a missing local file was reported as needing the Hugging Face hub."""
    for missing in (f"{tmp_path}/nope.csv", "data/train.csv", "./corpus"):
        with pytest.raises(DataError, match="no such file or folder") as info:
            load_corpus(missing)
        assert "hub" not in str(info.value).split(";")[0]


def test_drop_empty_logs_what_it_dropped(tmp_path, caplog):
    """Issue 11.3: --drop-empty dropped rows silently."""
    write_csv(tmp_path / "train.csv", [("a", "x y"), ("b", "@@@"), ("a", "z")], header=True)
    with caplog.at_level("WARNING", logger="dhim_ray"):
        split = load_split(str(tmp_path / "train.csv"), drop_empty=True)
    assert len(split) == 2 and "dropped 1 of 3 rows with empty text (rows 1)" in caplog.text


def test_limit_warns_when_the_first_rows_hold_few_labels(caplog):
    """The packaged BBC train split is ordered by label: its first 300 rows are all 'business'."""
    with caplog.at_level("WARNING", logger="dhim_ray"):
        few = load_corpus("bbc", limit=300)
        assert "bbc:train: --limit 300 keeps its first 300 of 1780 rows, which hold 1 of its 5 labels" in caplog.text
        assert "bbc:val" not in caplog.text  # val's first 300 rows hold all five
        caplog.clear()
        load_corpus("bbc", limit=2000)  # nothing cut
    assert len(few.split("train")) == 300 and set(few.split("train").labels) == {0}
    assert "--limit" not in caplog.text


def test_naming_the_default_text_column_keeps_the_same_source_and_ids(toy_folder):
    """A rerun that spells out --text-column text must upsert onto the same rows, not add copies."""
    assert CorpusSpec(str(toy_folder), text_column="text").source_id == CorpusSpec(str(toy_folder)).source_id
    assert CorpusSpec(str(toy_folder), text_column="body").source_id != CorpusSpec(str(toy_folder)).source_id
    assert CorpusSpec("dbpedia", text_column="content").source_id == CorpusSpec("dbpedia").source_id


def test_train_on_a_named_split_reads_that_split(toy_folder, tiny_config):
    from dhim_ray.training.pipeline import load_train_val

    val_rows = len(load_split(CorpusSpec(str(toy_folder), "val")))
    train, val, source = load_train_val(CorpusSpec(str(toy_folder), "val"), tiny_config)
    assert len(train) + len(val) == val_rows and "carved" in source
    train, val, source = load_train_val(CorpusSpec(str(toy_folder), "train"), tiny_config)
    assert len(val) == val_rows and source == "val split"
    with pytest.raises(DataError, match="has no split 'test'"):
        load_train_val(CorpusSpec(str(toy_folder), "test"), tiny_config)


def test_labels_named_on_one_side_and_numbered_on_the_other_are_refused():
    from dhim_ray.corpus.data import Split, align_labels

    named = Split(["a", "b"], np.array([0, 1]), np.arange(2), ["politics", "sport"])
    numbered = Split(["c", "d"], np.array([1, 0]), np.arange(2))
    with pytest.raises(DataError, match="labels are names and the queries' are numbers"):
        align_labels(named, numbered)
    with pytest.raises(DataError, match="the queries' labels are names and the database' are numbers"):
        align_labels(numbered, named)


def test_csv_labels_past_64_bits_stay_distinct_names(tmp_path):
    """A CSV reader's float64 made 2**70 + n one label: read as text, they stay 14 classes."""
    rows = [(2**70 + i % 14, f"document {i} about topic {i % 14}") for i in range(42)]
    write_csv(tmp_path / "train.csv", rows, header=True)
    split = load_split(str(tmp_path / "train.csv"))
    assert split.label_names == sorted(str(2**70 + i) for i in range(14))
    assert split.labels.tolist() == [split.label_names.index(str(label)) for label, _ in rows]
    write_csv(tmp_path / "small.csv", [(3, "x y"), (1, "y z"), ("", "z")], header=True)
    with pytest.raises(DataError, match="1 rows have no label"):
        load_split(str(tmp_path / "small.csv"))
    write_csv(tmp_path / "numbers.csv", [(3, "x y"), (1, "y z")], header=True)
    assert load_split(str(tmp_path / "numbers.csv")).labels.tolist() == [3, 1]
