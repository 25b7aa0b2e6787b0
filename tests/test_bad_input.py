"""Bad input, as a careful new user would type it: the CLI run as a process of its own over a
table of mistakes (forked from one that has done the imports: tests/cli_fork.py; the busy
machine's cases run ``python -m dhim_ray.cli`` itself). Each must exit 2 (1 for the environment), print exactly one line
on stderr saying what was wrong and how to fix it, no traceback, and leave the model
folder and the collection as they were."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_fork import ForkedCLI
from conftest import write_csv

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]  # a process per case: minutes

def cli_env() -> dict[str, str]:
    return dict(os.environ, COLUMNS="100", HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """The CLI's parent process: each case forks a run from it."""
    cli = ForkedCLI(cli_env(), tmp_path_factory.mktemp("runs"))
    yield cli.run
    cli.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory, toy_folder, tiny_bert, tiny_model):
    """A trained tiny model, a milvus-lite file with its collection, and broken copies."""
    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.hasher import Hasher

    root = tmp_path_factory.mktemp("bad")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    hasher = Hasher.load(model)
    db = root / "codes.db"
    target = MilvusTarget(str(db), "toy_16")
    client = target.connect()
    texts = ["football goal", "vote party", "chip data"]
    target.bind(client).ensure(16, hasher.model_id)
    target.bind(client).upsert(code_rows({"id": document_ids("toy@1", range(3)), "code": hasher.encode(texts),
                                          "text": texts, "row": np.arange(3)}, 16, "toy@1"))
    client.close()
    release(str(db))
    for name, edit in (("no_model_section", lambda m: m["config"].pop("model")),
                       ("text_bits", lambda m: m["config"]["model"].update(n_bits="x")),
                       ("no_digest", lambda m: m.pop("weights_sha256"))):
        broken = root / name
        broken.mkdir()
        (broken / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes())
        meta = json.loads((model / "config.json").read_text())
        edit(meta)
        (broken / "config.json").write_text(json.dumps(meta))
    truncated = root / "truncated-encoder"
    truncated.mkdir()
    for f in Path(tiny_bert).iterdir():
        data = f.read_bytes()
        (truncated / f.name).write_bytes(data[: len(data) // 3] if f.suffix == ".safetensors" else data)
    (root / "afile").write_text("not a folder")
    write_csv(root / "one_label" / "train.csv", [("a", f"story number {i}") for i in range(8)], header=True)
    write_csv(root / "latin1" / "train.csv", [("a", "x")], header=True)
    (root / "latin1" / "train.csv").write_bytes("label,text\na,caf\xe9\n".encode("latin-1"))
    # files broken in the ways a streaming read meets them: in a source's first block (read before
    # Ray starts), and in a later shard (met inside Ray Data's read tasks)
    (root / "ragged.csv").write_text('label,text\n1,"football goal"\n2,"vote party",extra\n')
    (root / "broken.jsonl").write_text('{"label": 1, "text": "football goal"}\n{"label": 2, "text": "vote\n')
    for name, suffix in (("ragged", "csv"), ("broken", "jsonl")):
        (root / f"{name}-parts" / "train").mkdir(parents=True)
        (root / f"{name}-parts" / "train" / f"a.{suffix}").write_text(
            'label,text\n1,"chip data"\n' if suffix == "csv" else '{"label": 1, "text": "chip data"}\n')
        shutil.copy(root / f"{name}.{suffix}", root / f"{name}-parts" / "train" / f"b.{suffix}")
    (root / "mixed.jsonl").write_text('{"label": 1, "text": "football goal"}\n{"label": [2], "text": "vote party"}\n')
    (root / "bom.csv").write_bytes("\ufefflabel,text\nsport,football goal\npolitics,vote party\n".encode("utf-8"))
    big = "football goal " * 400_000  # one 5.6 MB document: above the csv module's 128 KB field limit
    (root / "big.csv").write_text(f'label,text\nsport,"{big}"\npolitics,"vote party"\n')
    (root / "with space").mkdir()
    write_csv(root / "strlab" / "train.csv", [(["sport", "politics"][i % 2], f"football vote goal {i}")
                                             for i in range(20)], header=True)
    (root / "notadb.db").write_text("this is a text file, not a milvus-lite database\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [["football", "goal"], ["vote"]], "label": [1, 2]}), root / "listtext.parquet")
    pq.write_table(pa.table({"text": [{"x": 1}, {"x": 2}], "label": [1, 2]}), root / "structtext.parquet")
    foreign_collections(str(db))
    busy = socket.socket()  # a port another program listens on
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield {"root": root, "model": model, "db": db, "toy": toy_folder, "bert": tiny_bert, "truncated": truncated,
           "busy_port": busy.getsockname()[1]}
    busy.close()


def foreign_collections(db: str) -> None:
    """Collections another program made in the same file: one whose description is a JSON
    list, one with dhim-ray's description but a JACCARD index, one with a VARCHAR id."""
    from pymilvus import DataType, MilvusClient

    from dhim_ray.connectors.connection import release
    from dhim_ray.connectors.milvus import FORMAT, FORMAT_VERSION

    client = MilvusClient(db)
    ours = json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": ""})
    for name, description, id_type, metric in (("foreign_list", "[1, 2]", DataType.INT64, "HAMMING"),
                                               ("foreign_jaccard", ours, DataType.INT64, "JACCARD"),
                                               ("foreign_varchar", ours, DataType.VARCHAR, "HAMMING")):
        schema = client.create_schema(description=description)
        schema.add_field("id", id_type, is_primary=True, **({"max_length": 64} if id_type == DataType.VARCHAR else {}))
        schema.add_field("code", DataType.BINARY_VECTOR, dim=16)
        for field in ("label", "row"):
            schema.add_field(field, DataType.INT64)
        for field in ("text", "source"):
            schema.add_field(field, DataType.VARCHAR, max_length=256)
        index = client.prepare_index_params()
        index.add_index("code", index_type="BIN_FLAT", metric_type=metric)
        client.create_collection(name, schema=schema, index_params=index)
    client.close()
    release(db)


def T(*args):  # train on the toy corpus with the tiny BERT
    return ["train", "{toy}", "--encoder", "{bert}", "--max-words", "12", "--out", "{root}/out", *args]


def E(*args):  # eval a model in memory
    return ["eval", "{model}", "--database", "{toy}:train", "--queries", "{toy}:val", *args]


def ING(*args):  # ingest into the existing collection
    return ["ingest", "{toy}", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16", *args]


def S(*args):  # search the existing collection
    return ["search", "football", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16", *args]


CASES = [
    # train: every option out of range, of the wrong type, or empty
    (T("--bits", "100"), 2, "--bits 100: must be a multiple of 8"),
    (T("--bits", "abc"), 2, "Invalid value for '--bits'"),
    (T("--bits", ""), 2, "Invalid value for '--bits'"),
    (T("--bits", "2048"), 2, "--bits 2048: must be a multiple of 8"),
    (T("--epochs", "0"), 2, "--epochs 0: must be between 1 and 100000"),
    (T("--epochs", "x"), 2, "Invalid value for '--epochs'"),
    (T("--patience", "0"), 2, "--patience 0: must be between 1 and 100000"),
    (T("--set", "train.batch_size=1"), 2, "--set train.batch_size=1: must be between 2"),
    (T("--set", "train.lr=0"), 2, "--set train.lr=0.0: must be in (0, 1)"),
    (T("--set", "train.lr=fast"), 2, "--set 'train.lr=fast': expected a float value"),
    (T("--set", "model.alpha=0"), 2, "--set model.alpha=0.0: must be in (0, 100]"),
    (T("--set", "train.beta=-1"), 2, "--set train.beta=-1.0: must be between 0 and 1000"),
    (T("--set", "model.regulariser=x"), 2, "--set model.regulariser='x': choose cls, mean or none"),
    (T("--formulation", "x"), 2, "--formulation 'x': choose shipped or paper"),
    (T("--set", "train.neighbours=-1"), 2, "--set train.neighbours=-1: must be between 0 (off) and 1000"),
    (T("--set", "train.crop_tokens=-1"), 2, "--set train.crop_tokens=-1: must be 0 (off) or up to 100000"),
    (T("--set", "model.n_filters=0"), 2, "--set model.n_filters=0: must be between 1 and 4096"),
    (T("--set", "model.init=pca"), 2, "--set model.init='pca': choose random or itq"),
    (T("--set", "features.cleaning=latin"), 2, "--set features.cleaning='latin': choose unicode or ascii"),
    # --set and flags: one resolution, every value checked, every number bounded
    (T("--set", "train.seed=-1"), 2, "--set train.seed=-1: must be an integer between 0 and 4294967295"),
    (T("--set", "train.val_fraction=NaN"), 2, "--set train.val_fraction=nan: must be in (0, 1)"),
    (T("--set", "train.patience=0"), 2, "--set train.patience=0: must be between 1 and 100000"),
    (["train", "{toy}", "--encoder", "{bert}", "--out", "{root}/out", "--set", "features.max_words=0"], 2,
     "--set features.max_words=0: must be between 1 and 100000"),
    (T("--set", "features.max_words=30"), 2, "--max-words and --set features.max_words: the same setting given twice"),
    (T("--set", "model.windows=[1.5]"), 2, "--set model.windows=[1.5]: need 1 to 8 odd whole sizes"),
    (T("--set", "model.windows=[1,3,100001]"), 2, "--set model.windows=[1, 3, 100001]: need 1 to 8 odd whole sizes"),
    (T("--set", "model.n_filters=1000000"), 2, "--set model.n_filters=1000000: must be between 1 and 4096"),
    (T("--set", "train.max_epochs=10000000"), 2, "--set train.max_epochs=10000000: must be between 1 and 100000"),
    (T("--set", "train.batch_size=10000000"), 2, "--set train.batch_size=10000000: must be between 2"),
    (T("--seed", "3", "--set", "train.seed=5"), 2, "--seed and --set train.seed: the same setting given twice"),
    (T("--epochs", "3", "--set", "train.max_epochs=5"), 2, "--epochs and --set train.max_epochs: the same setting"),
    (["train", "{toy}", "--max-words", "12", "--out", "{root}/out", "--set", "features.encoder={root}/nomodel"], 2,
     "nomodel"),
    (T("--device", "meta"), 2, "--device meta: dhim-ray runs on cpu, cuda or mps"),
    (T("--device", "mps"), 2, "--device mps: this machine has no Apple GPU"),
    (T("--device", "cuda:3"), 2, "--device cuda:3: this machine has no CUDA GPU"),
    (T("--max-words", "0"), 2, "--max-words 0: must be between 1 and 100000"),
    (T("--max-words", "500"), 2, "--max-words 500 needs 501 tokens"),
    (T("--workers", "0"), 2, "--workers 0: must be >= 1"),
    (T("--feature-memory", "-1"), 2, "--feature-memory -1.0: must be a finite number >= 0 GiB"),
    (T("--select", "best"), 2, "--select 'best': choose one of auto, labels, neighbours"),
    (T("--set", "model.target_transform=pca"), 2,
     "--set model.target_transform='pca': choose one of none, whitening"),
    (T("--set", "model.neighbour_transform=zca"), 2, "--set 'model.neighbour_transform=zca': model has no field"),
    (T("--set", "model.target_transform=whitening", "--set", "model.regulariser=none"), 2,
     "target_transform='whitening' transforms the regulariser target: also set regulariser=mean or cls"),
    (T("--device", "tpu9"), 2, "--device tpu9: not a torch device"),
    (T("--limit", "0"), 2, "--limit 0: must be >= 1"),
    (["train", "{root}/one_label", "--encoder", "{bert}", "--select", "labels", "--out", "{root}/out"], 2,
     "--select labels but every training document has the same label"),
    (T("--bits", "64", "--set", "model.identity_bits=60"), 2,
     "--set model.identity_bits=60: must be between 0 and n_bits - 8 = 56"),
    (T("--text-column", ""), 2, "--text-column '': give a column name"),
    (T("--text-column", "body"), 2, "no text column 'body'"),
    (T("--label-column", "lable"), 2, "no label column 'lable'"),
    (T("--set", "train.beta"), 2, "--set 'train.beta': write SECTION.FIELD=VALUE"),
    (T("--set", "train.nope=1"), 2, "train has no field 'nope'"),
    (T("--set", "train.beta=high"), 2, "expected a float value"),
    (["train", "{toy}", "--encoder", "{bert}", "--resume", "{root}/nowhere"], 2, "no unfinished run there"),
    (T("--resume", "{root}/elsewhere"), 2, "out: an in-process run resumes in its own out folder"),
    (T("--seed", "x"), 2, "Invalid value for '--seed'"),
    (T("--workers", "2", "--max-failures", "-1"), 2, "--max-failures -1: must be >= 0"),
    (T("--address", "ray://127.0.0.1:1"), 1, "--address ray://127.0.0.1:1: nothing answers at 127.0.0.1:1"),
    (["train", "{toy}", "--encoder", "", "--out", "{root}/o2"], 2, "--encoder '': give a model name or path"),
    (["train", "{toy}", "--encoder", "{truncated}", "--out", "{root}/o3"], 2, "cannot be loaded"),
    (["train", "{toy}", "--encoder", "{bert}", "--max-words", "12", "--out", "{root}/afile"], 2, "is a file, not a folder"),
    (["train", "{toy}", "--encoder", "{bert}", "--max-words", "12", "--out", "{root}/afile/sub"], 2, "is a file"),
    (["train", "{toy}", "--encoder", "{bert}", "--max-words", "12", "--out", "{truncated}"], 2,
     "is not a dhim-ray checkpoint's (another model?); writing there would overwrite it"),
    (["train", "nosuchcorpus"], 2, "unknown corpus 'nosuchcorpus': use a preset"),
    (["train", ""], 2, "empty name"),
    (["train", "data/missing.csv"], 2, "data/missing.csv: no such file or folder"),
    (["train", "dbpedia"], 1, "needs the Hugging Face hub, which is unreachable"),
    (["train", "{toy}", "--encoder", "bert-base-uncased", "--out", "{root}/o-hub"], 1,
     "--encoder 'bert-base-uncased': not a local folder and the Hugging Face hub is unreachable"),
    (["train", "{root}/latin1"], 2, "not UTF-8 text"),
    (["train", "{toy}", "--bits", "16", "--encoder", "{bert}", "--max-words", "12", "--out", "{root}/o4",
      "--limit", "2"], 2, "or --set model.init=random"),
    # eval
    (["eval", "--database", "{toy}:train", "--queries", "{toy}:val"], 2, "give a model folder"),
    (E("--k", "0"), 2, "--k 0: must be a positive integer"),
    (E("--k", "x"), 2, "Invalid value for '--k'"),
    (E("--k", "100000"), 2, "--k 100000: larger than the database (160 codes); use --k 160 or less"),
    (E("--rerank", "0"), 2, "--rerank 0: must be an integer in 1..64"),
    (["eval", "--baseline", "itq", "--database", "{toy}:train", "--queries", "{toy}:val", "--rerank", "4"], 2,
     "--rerank 4 with --baseline itq: re-ranking needs a DHIM model's scores"),
    (["eval", "{model}", "--queries", "{toy}:val"], 2, "eval needs --database"),
    (["eval", "{model}", "--database", "{toy}:train"], 2, "eval needs --queries"),
    (E("--collection", "toy_16"), 2, "--collection toy_16 both given; the collection is the database"),
    (["eval", "{root}/nomodel", "--database", "{toy}:train", "--queries", "{toy}:val"], 2, "no such folder"),
    (["eval", "{root}/no_model_section", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "has no model/features config"),
    (["eval", "--baseline", "sh", "--database", "{toy}:train", "--queries", "{toy}:val"], 2, "--baseline 'sh'"),
    (["eval", "--baseline", "cosine-flow", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "--baseline 'cosine-flow': choose one of lsh, pca-sign, pca-median, itq, whitening-sign, ubinary, cosine, "
     "whitening-cosine"),
    (["eval", "--baseline", "itq", "--bits", "7", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "--bits 7: must be a multiple of 8"),
    (["eval", "--baseline", "itq", "--encoder", "{truncated}", "--database", "{toy}:train", "--queries",
      "{toy}:val"], 2, "cannot be loaded"),
    (["eval", "{model}", "--database", "{toy}:test", "--queries", "{toy}:val"], 2, "has no split 'test'"),
    (["eval", "--baseline", "itq", "--max-words", "0", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "--max-words 0: must be between 1 and 100000"),
    (["eval", "--baseline", "itq", "--bits", "x", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "Invalid value for '--bits'"),
    # ingest: nothing may be written, the collection stays as it was
    (["ingest", "{toy}", "--uri", "{db}"], 2, "Missing option '--model'"),
    (ING("--batch-size", "0"), 2, "--batch-size 0: must be >= 1"),
    (ING("--workers", "0"), 2, "--workers 0: must be >= 1"),
    (ING("--use-gpu"), 1, "use_gpu: the cluster has no GPUs; drop --use-gpu"),
    (ING("--index", "BIN_IVF_FLAT"), 2, "--index BIN_IVF_FLAT: milvus-lite files take BIN_FLAT only"),
    (ING("--index", "HNSW"), 2, "--index 'HNSW': choose one of BIN_FLAT, BIN_IVF_FLAT"),
    (ING("--nlist", "0", "--index", "BIN_FLAT"), 2, "--nlist 0: must be between 1 and 65536"),
    (ING("--limit", "0"), 2, "--limit 0: must be >= 1"),
    (ING("--label-column", "lable"), 2, "no label column 'lable'"),
    (ING("--id-column", "lable"), 2, "no id column 'lable'"),
    (ING("--id-column", "text"), 2, "--id-column 'text' is the text column"),
    (ING("--split", "test"), 2, "has no split 'test'"),
    (ING("--split", ""), 2, "--split '': give a split name"),
    (ING("--nlist", "abc"), 2, "Invalid value for '--nlist'"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "{db}", "--collection", "1bad"], 2, "--collection '1bad'"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "", "--collection", "c"], 2, "uri is empty"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "{root}/codes.txt", "--collection", "c"], 2,
     "must end in .db"),
    (["ingest", "{toy}", "--model", "{root}/no_model_section", "--uri", "{db}", "--collection", "toy_16"], 2,
     "has no model/features config"),
    (["ingest", "{toy}", "--model", "{root}/text_bits", "--uri", "{db}", "--collection", "toy_16"], 2,
     "holds an invalid config"),
    (["ingest", "{toy}", "--model", "{root}/nomodel", "--uri", "{db}", "--collection", "toy_16"], 2,
     "no such folder"),
    (["ingest", "nosuchcorpus", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "unknown corpus"),
    (["ingest", "http://user:hunter2@127.0.0.1:1", "--model", "{model}", "--uri", "http://user:hunter2@127.0.0.1:1",
      "--collection", "c"], 2, "http://***@127.0.0.1:1: credentials do not go in the URI"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "http://user:hunter2@127.0.0.1:1", "--collection", "c"], 2,
     "http://***@127.0.0.1:1: credentials do not go in the URI"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "http://admin:Hunt/er2hunter2@127.0.0.1:18799", "--collection",
      "c"], 2, "http://***@127.0.0.1:18799: credentials do not go in the URI"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "http://127.0.0.1:18799/db;token=hunter2", "--collection", "c"],
     2, "http://127.0.0.1:18799/db;***: a Milvus address has no ';', '?' or '#' part"),
    # search
    (S("-k", "0"), 2, "--k 0: must be between 1 and 16384"),
    (["search", "@#$", "--model", "{root}/nomodel", "--uri", "{root}/none.db"], 2,
     "text 0 ('@#$') is empty after cleaning: give some words to hash"),  # before the model, before Milvus
    (S("-k", "20000"), 2, "--k 20000: must be between 1 and 16384"),
    (S("--nprobe", "0"), 2, "--nprobe 0: must be >= 1"),
    (S("--rerank", "100"), 2, "--rerank 100: must be an integer in 1..64"),
    (S("-k", "1000", "--rerank", "64"), 2, "--rerank 64: k x rerank = 64000 Hamming candidates, at most 16384"),
    (S("--max-distance", "-1"), 2, "--max-distance -1: must be a whole number of bits, 0 or more"),
    (["search", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "give query texts or --like ID"),
    (S("--like", "7"), 2, "give query texts or --like ID (a stored row's id), not both"),
    (["search", "--like", "99", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "holds no document with id '99'"),
    (["search", "--like", "\u00b2", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "holds no document with id '\\xb2'"),
    (["search", "--like=--5", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "holds no document with id '--5'"),
    (["search", "--like", "", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "like: the id '' is empty, which no Milvus filter matches"),
    (["search", "--like", "a\nb", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "holds a line break or another control character"),
    (["search", "--like", "x" * 100_000, "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     "(100,000 characters); give @RANK (a hit of the last search, e.g. @1), a hit's id (--json shows it)"),
    (S("--filter", "lable == 3"), 2, "--filter 'lable == 3': the collection has no field 'lable' (its fields: id, label"),
    # filters checked before they reach Milvus (a zero divisor stops milvus-lite's server), or its refusal mapped
    (S("--filter", "label / 0 == 1"), 2, "'/' at character 7: a filter does no arithmetic but 'FIELD % N'"),
    (S("--filter", "label % (1 - 1) == 0"), 2, "'%' at character 7 must divide by a positive whole number"),
    (S("--filter", "label // 2 == 1"), 2, "a filter does no arithmetic"),
    (S("--filter", "label % -0 == 1"), 2, "must divide by a positive whole number written out"),
    (S("--filter", "label + 1 in [2, 3]"), 2, "'+' at character 7: a filter does no arithmetic"),
    (S("--filter", "1 in [1] and label == 1"), 2, "the left side of 'in' must be a field"),
    (S("--filter", "true"), 2, "--filter 'true': it names no field"),
    (S("--filter", "1"), 2, "--filter '1': it names no field"),
    (S("--filter", "'\") or true or (\"'"), 2, "it names no field"),
    (S("--filter", 'label == 1 or 1==1'), 2, "'==' compares two literals; every comparison needs a field"),
    (S("--filter", "label in []"), 2, "the list at character 10 is empty"),
    (S("--filter", "label == 3; label == 4"), 2, "';' (one expression, no statements) at character 11"),
    (S("--filter", "id > 0; drop collection toy_16"), 2, "';' (one expression, no statements) at character 7"),
    (S("--filter", "((label == 3)"), 2, "1 bracket left open"),
    (S("--filter", "label == 3)"), 2, "')' at character 11 closes nothing"),
    (S("--filter", "label == {{x}}"), 2, "'{' (templates are not supported) at character 10"),
    (S("--filter", "not " * 1000 + "label == 1"), 2, "(4,010 characters): more than 32 'not's"),
    (S("--filter", "text == \"unclosed"), 2, "the string opened at character 9 is not closed"),
    (S("--max-distance", "99"), 2, "--max-distance 99: must be a whole number of bits between 0 and 16"),
    (S("--max-distance", "-1"), 2, "--max-distance -1: must be a whole number of bits"),
    (["search", "x", "--model", "{model}", "--uri", "{root}/typo.db", "--collection", "toy_16"], 2,
     "no such milvus-lite file"),
    (["search", "x", "--model", "{model}", "--uri", "{db}", "--collection", "nothere"], 2,
     "collection 'nothere' does not exist at "),
    (["search", "x", "--model", "{model}", "--uri", "{db}", "--collection", "toy16"], 2,
     "; the model's codes are in toy_16"),  # a typo: where the model's codes are
    (["search", "", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2, "text 0 ('') is empty"),
    (["search", "x", "--model", "{root}/[exp1]/m", "--uri", "{db}", "--collection", "toy_16"], 2,
     "[exp1]/m: no such folder"),
    # demo
    (["demo", "--out", "{root}/afile/sub"], 2, "is a file, not a folder"),
    (["demo", "--out", "{root}/demo", "--bits", "100"], 2, "--bits 100: must be a multiple of 8"),
    (["demo", "--out", "{root}/demo", "--epochs", "0"], 2, "--epochs 0: must be between 1 and 100000"),
    (["demo", "--bits", "abc"], 2, "Invalid value for '--bits'"),
    # secrets, capacity, odd values (each failed differently before)
    (["search", "x", "--model", "{model}", "--uri", "http://127.0.0.1:1/?token=hunter2", "--collection", "toy_16"], 2,
     "http://127.0.0.1:1/?***: a Milvus address has no"),
    (T("--workers", "99"), 1, "CPUs and takes at most one worker per CPU; use at most"),
    (T("--seed", "-1"), 2, "--seed -1: must be an integer between 0 and 4294967295"),
    (T("--cache-dir", "/proc/1/dhim-cache"), 2, "cannot be written; give a writable folder"),
    (T("--cache-dir", "{root}/afile"), 2, "afile is a file, not a folder"),
    (E("--cache-dir", "{root}/afile/sub"), 2, "afile is a file, not a folder"),
    (T("--feature-memory", "nan"), 2, "--feature-memory nan: must be a finite number >= 0 GiB"),
    (S("--collection", "caf\u00e9_docs"), 2, "use ASCII letters, digits and underscores"),
    (S("--collection", "c" * 300), 2, "at most 255 characters"),
    (ING("--collection", "naïve"), 2, "use ASCII letters, digits and underscores"),
    (E("--bits", "64"), 2, "--bits 64: applies to --baseline NAME only"),
    (E("--encoder", "{bert}"), 2, "--encoder"),
    (E("--max-words", "400"), 2, "--max-words 400: applies to --baseline NAME only"),
    (E("--nprobe", "8"), 2, "--nprobe 8: applies to a Milvus --collection NAME only"),
    (["eval", "--baseline", "cosine", "--bits", "64", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "--baseline cosine searches the float vectors"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--replicas", "2"], 2,
     "--replicas 2: a milvus-lite file"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--api-token-env", "DHIM_RAY_NO_SUCH_VAR"], 2,
     "--api-token-env DHIM_RAY_NO_SUCH_VAR: the environment variable is not set"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--max-batch-size", "0"], 2,
     "--max-batch-size 0: must be between 1 and 1024"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--api-token-env", ""], 2,
     "--api-token-env '': an empty variable name"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--host", "0.0.0.0"], 2,
     "--host 0.0.0.0: a service without a token on an address other hosts can reach"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--port", "{busy_port}"], 2,
     "is in use by another process"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--host", "not a host"], 2,
     "--host not a host: not an address of this machine"),
    (["serve", "{model}", "--collection", "toy_16", "--uri", "{db}", "--port", "0"], 2,
     "--port 0: must be between 1 and 65535"),
    # Milvus addresses that do not parse
    (S("--uri", "http://127.0.0.1:99999"), 2, "the port must be a number from 1 to 65535"),
    (S("--uri", "abc"), 2, "--uri abc: a milvus-lite file must end in .db"),
    (S("--uri", "http://[::1"), 2, "'::1' is not a host name or address"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "http://127.0.0.1:99999", "--collection", "c"], 2,
     "the port must be a number from 1 to 65535"),
    # a text column that holds lists or records, a collection dhim-ray did not make
    (["train", "{root}/listtext.parquet", "--encoder", "{bert}", "--out", "{root}/o5"], 2,
     "holds list<element: string> values, not text"),
    (["ingest", "{root}/structtext.parquet", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "holds struct<x: int64> values, not text"),
    (["search", "x", "--model", "{model}", "--uri", "{db}", "--collection", "foreign_list"], 2,
     "it was not made by dhim-ray"),
    (["search", "x", "--model", "{model}", "--uri", "{db}", "--collection", "foreign_jaccard"], 2,
     "its metric is JACCARD, not HAMMING"),
    (["search", "x", "--model", "{model}", "--uri", "{db}", "--collection", "foreign_varchar"], 2,
     "it was not made by dhim-ray"),
    (ING("--collection", "foreign_varchar"), 2, "it was not made by dhim-ray"),
    # broken files: the file, the row or line, what was wrong; one line (the parts' second file
    # is met inside Ray Data's read tasks)
    (["ingest", "{root}/ragged.csv", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "ragged.csv: cannot be read as csv (CSV parse error: Row #3: Expected 2 columns, got 3"),
    (["train", "{root}/ragged.csv", "--encoder", "{bert}", "--out", "{root}/o6"], 2,
     "ragged.csv: cannot be read as csv (CSV parse error: Row #3: Expected 2 columns, got 3"),
    (["ingest", "{root}/broken.jsonl", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "broken.jsonl: line 2 is not valid JSON"),
    (["ingest", "{root}/ragged-parts", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "b.csv: cannot be read as csv (CSV parse error: Row #3: Expected 2 columns, got 3"),
    (["ingest", "{root}/broken-parts", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "b.jsonl: line 2 is not valid JSON"),
    (["ingest", "{root}/mixed.jsonl", "--model", "{model}", "--uri", "{db}", "--collection", "c2"], 2,
     "mixed.jsonl: cannot be read as json"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "{root}/with space/my codes.db", "--collection", "c2"], 2,
     "the milvus-lite file name 'my codes.db' has a space"),
    (["search", "x", "--model", "{model}", "--uri", "{root}/with space/my codes.db", "--collection", "c2"], 2,
     "the milvus-lite file name 'my codes.db' has a space"),
    (["ingest", "{toy}", "--model", "{model}", "--uri", "{root}/notadb.db", "--collection", "c2"], 2,
     "is not a milvus-lite database"),
    (["search", "x", "--model", "{model}", "--uri", "{root}/notadb.db", "--collection", "c2"], 2,
     "is not a milvus-lite database"),
    # options that do not apply, or contradict each other, are refused, never ignored
    (["train", "{toy}:test", "--encoder", "{bert}", "--max-words", "12", "--out", "{root}/out"], 2,
     "has no split 'test'"),
    (["ingest", "{toy}:val", "--split", "train", "--model", "{model}", "--uri", "{db}", "--collection", "toy_16"], 2,
     ":val: two splits named; give one"),
    (ING("--nlist", "64"), 2, "--nlist 64: applies to BIN_IVF_FLAT on a Milvus server"),
    (["eval", "{root}/no_digest", "--database", "{toy}:train", "--queries", "{toy}:val"], 2,
     "has no weights_sha256"),
    (["eval", "{model}", "--database", "{root}/strlab:train", "--queries", "{toy}:val"], 2,
     "the database' labels are names and the queries' are numbers"),
    # names checked as typed
    (ING("--alias", "bad-name"), 2, "--alias 'bad-name': use ASCII letters, digits and underscores"),
    # nothing overwrites a model without being asked
    (["train", "{toy}", "--encoder", "{bert}", "--max-words", "12", "--out", "{model}"], 2,
     "holds a trained model (codes ingested with it would no longer match a new one's)"),
    (["export", "{model}", "--out", "{model}/config.onnx"], 2, "holds a model, whose files the export would replace"),
    (["export", "{model}", "--out", "{root}/afile/m.onnx"], 2, "afile is a file, not a folder"),
    # the command line itself
    (["nosuchcommand"], 2, "No such command 'nosuchcommand'"),
    (["train", "{toy}", "--no-such-flag"], 2, "No such option: --no-such-flag"),
]


_ROWS_AT: dict[tuple, str] = {}  # the collection's rows by the file's (size, mtime): read again only if it was written


def snapshot(world) -> str:
    """The model folder's bytes, the collection's rows and the world's file names. The rows are
    read through milvus-lite (a server process started each time) only when the .db file was
    written since they were last read: reading them leaves the file untouched."""
    from dhim_ray.connectors.milvus import MilvusTarget

    digest = hashlib.sha256()
    for f in sorted(world["model"].iterdir()):
        digest.update(f.name.encode() + f.read_bytes())
    stat = os.stat(world["db"])
    key = (str(world["db"]), stat.st_size, stat.st_mtime_ns)
    if key not in _ROWS_AT:
        with MilvusTarget(str(world["db"]), "toy_16").open(create=False) as collection:
            rows = collection.query(["text"])
        _ROWS_AT[key] = json.dumps(sorted((r["id"], r["text"]) for r in rows))
    files = sorted(str(p.relative_to(world["root"])) for p in world["root"].rglob("*") if not p.name.endswith(".lock"))
    return digest.hexdigest() + _ROWS_AT[key] + json.dumps(files)


@pytest.mark.parametrize("args, code, message", CASES, ids=[" ".join(a)[:80] for a, _, _ in CASES])
def test_bad_input_is_one_line_and_changes_nothing(world, forked, args, code, message):
    check_one_line(world, args, code, message, forked)


#: Mistakes found only inside Ray Data's read tasks: Ray starts for them, which on a busy
#: machine printed Ray's own dashboard errors and a start-up retry before the one line.
IN_RAY = [case for case in CASES if case[0][:2] in (["ingest", "{root}/ragged-parts"], ["ingest", "{root}/broken-parts"])]


@pytest.mark.parametrize("name", ["ragged.csv", "broken.jsonl", "mixed.jsonl", "structtext.parquet"])
def test_a_source_whose_first_rows_cannot_be_read_is_refused_before_ray_starts(world, monkeypatch, name):
    from dhim_ray.connectors.milvus import MilvusTarget
    from dhim_ray.corpus.spec import CorpusSpec
    from dhim_ray.errors import DataError
    from dhim_ray.jobs import ingest

    def started(*args, **kwargs):
        raise AssertionError(f"Ray started for {name}, which its first block refuses")

    monkeypatch.setattr(ingest, "init_ray", started)
    target = MilvusTarget(str(world["root"] / "first-block.db"), "c")
    with pytest.raises(DataError, match=re.escape(name)):
        ingest.run_ingest(ingest.IngestRequest(CorpusSpec(str(world["root"] / name)), world["model"], target))
    assert not Path(target.uri).exists()


def test_the_one_line_holds_on_a_busy_machine(world):
    """The same promise with every core busy with other work (bounded: the hogs stop
    themselves after 10 minutes, and are killed when the test ends)."""
    assert len(IN_RAY) == 2
    hog = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(os.cpu_count() or 2)]
    try:
        for args, code, message in IN_RAY + [CASES[0]]:
            check_one_line(world, args, code, message, run_module)
    finally:
        for p in hogs:
            p.kill()
            p.wait()


def run_module(argv: list[str]) -> subprocess.CompletedProcess:
    """``python -m dhim_ray.cli`` itself, imports and all."""
    return subprocess.run([sys.executable, "-m", "dhim_ray.cli", *argv], capture_output=True, text=True, env=cli_env(),
                          timeout=300, stdin=subprocess.DEVNULL)


def check_one_line(world, args, code, message, run_cli):
    before = snapshot(world)
    run = run_cli([a.format(**{k: str(v) for k, v in world.items()}) for a in args])
    lines = [line for line in run.stderr.splitlines() if line.strip() and not line.startswith(("encoding", "train "))]
    assert run.returncode == code, run.stderr[-2000:]
    assert "Traceback" not in run.stderr + run.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-2000:]
    assert message in lines[0]
    assert "DataContext" not in lines[0] and "Failed to apply" not in lines[0], lines[0]
    assert "hunter2" not in run.stderr + run.stdout
    assert snapshot(world) == before
