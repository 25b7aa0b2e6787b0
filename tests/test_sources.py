"""Streaming reads: every file format gives the same rows, in the same order, as the
in-memory loader; shards read in pieces; the Ray scan counts and refuses bad rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_toy_corpus, write_csv

from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.sources import plan_split, read_shard
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.corpus.text import clean_string, has_text
from dhim_ray.errors import DataError

ROWS = [(i % 3, f"document number {i} about topic {i % 3}") for i in range(1000)]


def read_all(spec: CorpusSpec, block_rows: int = 97) -> tuple[list[str], list, list[int]]:
    """Every row of the split through read_shard, with split-wide row numbers."""
    plan = plan_split(spec)
    texts, labels, rows = [], [], []
    offset = 0
    for shard in plan.shards:
        n = 0
        for block in read_shard(shard, plan.text_column, plan.label_column, block_rows=block_rows):
            assert block.num_rows <= block_rows
            texts += block.column("text").to_pylist()
            if plan.label_column:
                labels += block.column("label").to_pylist()
            rows += (block.column("row").to_numpy() + offset).tolist()
            n += block.num_rows
        offset += n
    return texts, labels, rows


def write_format(folder, fmt: str, rows, parts: int = 1):
    """The same rows as train.<fmt>, or as a train/ folder of ``parts`` files."""
    records = [{"label": label, "text": text} for label, text in rows]
    chunks = np.array_split(np.arange(len(records)), parts)
    target = folder / "train" if parts > 1 else folder
    target.mkdir(parents=True, exist_ok=True)
    for p, idx in enumerate(chunks):
        name = f"part-{p:03d}" if parts > 1 else "train"
        part = [records[i] for i in idx]
        if fmt == "csv":
            write_csv(target / f"{name}.csv", [(r["label"], r["text"]) for r in part], header=True)
        elif fmt == "jsonl":
            (target / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        elif fmt == "json":
            (target / f"{name}.json").write_text(json.dumps(part))
        else:
            pq.write_table(pa.Table.from_pylist(part), target / f"{name}.parquet", row_group_size=64)
    return folder


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json", "parquet"])
def test_each_format_streams_the_rows_the_loader_reads(tmp_path, fmt):
    folder = write_format(tmp_path / fmt, fmt, ROWS)
    texts, labels, rows = read_all(CorpusSpec(str(folder), "train"))
    loaded = load_split(CorpusSpec(str(folder), "train"))
    assert texts == loaded.texts
    assert rows == loaded.rows.tolist() == list(range(len(ROWS)))
    assert labels == [label for label, _ in ROWS]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_split_of_many_files_reads_in_file_order(tmp_path, fmt):
    folder = write_format(tmp_path / fmt, fmt, ROWS, parts=3)
    plan = plan_split(CorpusSpec(str(folder), "train"))
    assert len({s.path for s in plan.shards}) == 3
    texts, _, rows = read_all(CorpusSpec(str(folder), "train"))
    assert texts == [t for _, t in ROWS] and rows == list(range(len(ROWS)))
    assert load_split(CorpusSpec(str(folder), "train")).texts == texts


def test_parquet_plans_row_group_ranges_with_counts(tmp_path):
    folder = write_format(tmp_path, "parquet", ROWS)  # 64-row groups: 16 of them
    plan = plan_split(CorpusSpec(str(folder), "train"))
    assert all(s.n_rows is not None for s in plan.shards) and len(plan.shards) > 1
    assert sum(s.n_rows for s in plan.shards) == len(ROWS)


def test_headerless_csv_and_jsonl_blocks_larger_than_one_read(tmp_path, monkeypatch):
    import dhim_ray.corpus.sources as sources

    monkeypatch.setattr(sources, "JSON_BLOCK_BYTES", 100)  # many partial lines per read
    folder = write_format(tmp_path / "j", "jsonl", ROWS[:50])
    assert read_all(CorpusSpec(str(folder), "train"))[0] == [t for _, t in ROWS[:50]]
    headerless = tmp_path / "h.csv"
    write_csv(headerless, ROWS[:30])
    texts, labels, rows = read_all(CorpusSpec(str(headerless)))
    assert texts == [t for _, t in ROWS[:30]] and labels == [label for label, _ in ROWS[:30]]


def test_missing_columns_are_named_before_reading(tmp_path):
    folder = write_format(tmp_path, "parquet", ROWS[:10])
    with pytest.raises(DataError, match="no text column 'body'.*text_column=NAME"):
        plan_split(CorpusSpec(str(folder), "train", text_column="body"))
    with pytest.raises(DataError, match="no label column 'topic'"):
        plan_split(CorpusSpec(str(folder), "train", label_column="topic"))
    assert plan_split(CorpusSpec(str(folder), "train")).label_column == "label"
    with pytest.raises(DataError, match="has no split 'test'; it has: train"):
        plan_split(CorpusSpec(str(folder), "test"))


def test_packaged_corpus_plans_as_one_table():
    plan = plan_split(CorpusSpec("bbc", "val"))
    texts, labels, rows = read_all(CorpusSpec("bbc", "val"))
    loaded = load_split(CorpusSpec("bbc", "val"))
    assert texts == loaded.texts and labels == loaded.labels.tolist() and len(plan.shards) == 1


def test_datasets_cache_files_stream_as_arrow(tmp_path):
    """The hub path reads a datasets cache's Arrow files: built here from a local CSV."""
    import datasets

    from dhim_ray.corpus.sources import Shard, _arrow_rows

    write_csv(tmp_path / "d.csv", ROWS[:300], header=True)
    ds = datasets.load_dataset("csv", data_files=str(tmp_path / "d.csv"), split="train",
                               cache_dir=str(tmp_path / "cache"))
    shard = Shard(ds.cache_files[0]["filename"], "arrow", _arrow_rows(ds.cache_files[0]["filename"]))
    assert shard.n_rows == 300
    blocks = list(read_shard(shard, "text", "label", block_rows=128))
    assert [b.num_rows for b in blocks] == [128, 128, 44]
    assert sum((b.column("text").to_pylist() for b in blocks), []) == [t for _, t in ROWS[:300]]


@pytest.mark.parametrize("text", ["", "   ", "!!", "Zürich café", "東京", "🙂", "-- ...", "a", "_", "\u0301", "(ok)",
                                  "it's", "é", "\t\n"])
@pytest.mark.parametrize("cleaning", ["unicode", "ascii"])
def test_has_text_agrees_with_the_cleaner(text, cleaning):
    assert has_text(text, cleaning) == bool(clean_string(text, cleaning))


@pytest.mark.slow  # real Ray
def test_scan_counts_and_refuses_empty_rows(ray_session, tmp_path):
    from dhim_ray.jobs.read_tasks import Prepare, check_scan, read_documents, scan

    rows = [(label, text) for label, text in make_toy_corpus(60)]
    rows[7] = (rows[7][0], "  ")
    rows[100] = (rows[100][0], "...")
    folder = write_format(tmp_path, "csv", rows, parts=2)
    plan = plan_split(CorpusSpec(str(folder), "train"))
    result = scan(plan, "unicode")
    assert result.n_rows == len(rows) and result.blank_rows.tolist() == [7, 100]
    with pytest.raises(DataError, match=r"2 of \d+ rows have empty .*rows 7, 100.*drop_empty=True"):
        check_scan(plan, result, drop_empty=False, limit=None)
    assert check_scan(plan, result, drop_empty=False, limit=7) == (7, 0)
    n, dropped = check_scan(plan, result, drop_empty=True, limit=None)
    assert (n, dropped) == (len(rows), 2)
    prepare = Prepare("toy:train@0", tuple(result.offsets), n, None, True)
    table = read_documents(plan, "unicode", prepare).to_pandas().sort_values("row")
    assert table["row"].tolist() == [r for r in range(len(rows)) if r not in (7, 100)]
    assert table["text"].tolist() == [t for i, (_, t) in enumerate(rows) if i not in (7, 100)]


def test_a_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    """Excel's "CSV UTF-8" starts with a BOM: both readers must still find the label column."""
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufefflabel,text\nsport,football goal\npolitics,vote party\n".encode())
    spec = CorpusSpec(str(path))
    texts, labels, _ = read_all(spec)
    assert plan_split(spec).label_column == "label" and labels == ["sport", "politics"]
    split = load_split(spec)
    assert split.label_names == ["politics", "sport"] and split.labels.tolist() == [1, 0]


def test_a_document_of_megabytes_is_read_by_both_readers(tmp_path):
    big = "football goal " * 400_000  # 5.6 MB in one field, past the csv module's 128 KB default
    path = tmp_path / "big.csv"
    write_csv(path, [("sport", big), ("politics", "vote party")], header=True)
    texts, labels, _ = read_all(CorpusSpec(str(path)))
    assert texts == [big, "vote party"] and labels == ["sport", "politics"]
    assert load_split(CorpusSpec(str(path))).texts[0] == big


def test_a_broken_json_line_is_named_by_its_line_number(tmp_path, monkeypatch):
    import dhim_ray.corpus.sources as sources

    monkeypatch.setattr(sources, "JSON_BLOCK_BYTES", 64)  # the bad line falls in a later block
    path = tmp_path / "broken.jsonl"
    lines = [json.dumps({"label": i % 2, "text": f"document number {i}"}) for i in range(20)]
    lines[13] = '{"label": 1, "text": "unterminated'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"broken.jsonl: line 14 is not valid JSON \(Unterminated string"):
        read_all(CorpusSpec(str(path)))


def test_the_input_rules_on_a_table_without_a_cluster():
    """dhim_ray.corpus.rules on one pyarrow block: what is wrong, and the one line that says so."""
    from dhim_ray.corpus import rules

    block = pa.table({"text": ["football goal", "  ", None, "vote", "chip data"],
                      "label": [1.0, 2.0, float("nan"), 1.0, 2.0], "row": np.arange(5, dtype=np.int64)})
    found = rules.findings(block)
    assert found["blank"] == [1, 2] and found["unlabelled"] == [2] and not found["string_labels"]
    scanned = rules.ScanResult.collect(1, [(0, found)])
    with pytest.raises(DataError, match=r"t:train: 1 rows have no label \(rows 2\)"):
        rules.check("t:train", scanned, drop_empty=True, limit=None)
    assert rules.check("t:train", scanned, drop_empty=True, limit=2) == (2, 1)  # row 2 lies past the limit
    labels, names = rules.number_labels(["b", "a", "b"], ["a", "b", "c"])
    assert labels.tolist() == [1, 0, 1] and names == ["b", "a", "b"]
    assert rules.number_labels([2, 0], None, ("x", "y"))[1] == ["", "x"]  # a number the names lack: no name


@pytest.mark.slow  # real Ray
@pytest.mark.parametrize("rows, message", [
    ([("sport", "football goal"), ("politics", ""), ("sport", "match")], r"1 of 3 rows have empty or non-string text \(rows 1\)"),
    ([("sport", "football goal"), ("", "vote party")], r"1 rows have no label \(rows 1\)"),
    ([], "is empty: no documents to work with"),
])
def test_the_in_memory_loader_and_the_ray_scan_refuse_alike(ray_session, tmp_path, rows, message):
    """One set of rules: a file refused in memory (train, eval) is refused with the same line by
    the streaming scan (ingest)."""
    from dhim_ray.corpus.data import load_corpus
    from dhim_ray.jobs.read_tasks import check_scan, scan

    write_csv(tmp_path / "train.csv", rows, header=True)
    spec = CorpusSpec(str(tmp_path), "train")
    with pytest.raises(DataError, match=message) as in_memory:
        load_corpus(spec)
    plan = plan_split(spec)
    with pytest.raises(DataError, match=message) as streamed:
        check_scan(plan, scan(plan, "unicode"), drop_empty=False, limit=None)
    assert str(in_memory.value) == str(streamed.value)
