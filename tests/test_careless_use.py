"""Careless and hostile use that needs no cluster: labels of odd types kept as names (never
truncated), the service's front door (a plain ASGI middleware) on a small app, a refused run
leaving the disk as it was, --set and flags resolved by one rule, and milvus-lite's lock
left to the process that holds it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest
from fastapi import Request
from typer.testing import CliRunner

from dhim_ray.cli import app
from dhim_ray.corpus.data import load_corpus
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError


# ---- labels ---------------------------------------------------------------------------------
def _corpus(tmp_path, name: str, labels: list, fmt: str = "csv"):
    folder = tmp_path / name
    folder.mkdir()
    texts = [f"story {i} about football and votes" for i in range(len(labels))]
    if fmt == "csv":
        lines = ["label,text"] + [f"{lab},{text}" for lab, text in zip(labels, texts)]
        (folder / "train.csv").write_text("\n".join(lines) + "\n")
    else:
        (folder / "train.jsonl").write_text("".join(json.dumps({"label": lab, "text": t}) + "\n"
                                                    for lab, t in zip(labels, texts)))
    return load_corpus(CorpusSpec(str(folder))).split("train")


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_fractional_labels_are_kept_as_names_not_truncated(tmp_path, fmt):
    split = _corpus(tmp_path, f"frac_{fmt}", [1.2, 1.7, 1.2, 2.5], fmt)
    assert split.label_names == ["1.2", "1.7", "2.5"]
    assert split.labels.tolist() == [0, 1, 0, 2]  # three classes, not 1, 1, 1, 2


def test_whole_float_labels_stay_class_numbers(tmp_path):
    split = _corpus(tmp_path, "whole", ["1.0", "2.0", "", "2.0"][:2] + ["1.0", "2.0"])
    assert split.label_names is None and split.labels.tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("labels, names", [
    ([True, False, True], ["False", "True"]),
    ([2**70, 1, 2**70], ["1", str(2**70)]),
])
def test_boolean_and_huge_labels_are_names(tmp_path, labels, names):
    split = _corpus(tmp_path, f"odd{len(names)}{labels[0]}", labels, "jsonl")
    assert sorted(split.label_names) == sorted(names)
    assert len(set(split.labels.tolist())) == 2 and split.labels[0] == split.labels[2]


# ---- the service's front door ----------------------------------------------------------------
def _guarded(token_sha256: str = "", limit: int = 64, allowed_hosts=None, **limits):
    from fastapi import FastAPI

    from dhim_ray.jobs.http_guard import RequestGuard

    inner = FastAPI()
    seen = {"bodies": 0}

    @inner.post("/search")
    async def search(request: Request):
        seen["bodies"] += 1
        return {"n": len(await request.body())}

    @inner.get("/health")
    async def health():
        return {"status": "ok"}

    return RequestGuard(inner, api_token_sha256=token_sha256, max_body_bytes=limit, allowed_hosts=allowed_hosts,
                        **limits), seen


async def _two_chunks():
    for _ in range(2):
        yield b"x" * 40


def _call(app, method: str, path: str, **kw) -> httpx.Response:
    if kw.get("content") == "chunked":
        kw["content"] = _two_chunks()

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def test_the_guard_checks_route_method_token_and_size_before_the_body():
    import hashlib

    guard, seen = _guarded(hashlib.sha256(b"secret").hexdigest(), limit=64)
    ok = {"Authorization": "Bearer secret"}
    assert _call(guard, "POST", "/search", content=b"{}", headers=ok).json() == {"n": 2}
    cases = [
        (("GET", "/nowhere"), {}, 404, "path"),
        (("GET", "/search"), {}, 405, "method"),
        (("POST", "/search"), {"content": b"x" * 65}, 401, "authorization"),  # token first, body unread
        (("POST", "/search"), {"content": b"x" * 65, "headers": ok}, 413, "body"),
        (("POST", "/search"), {"content": "chunked", "headers": ok}, 413, "body"),  # no length, streamed
        (("POST", "/search"), {"content": b"{}", "headers": {**ok, "Content-Encoding": "gzip"}}, 415,
         "content-encoding"),
    ]
    for (method, path), kw, status, field in cases:
        r = _call(guard, method, path, **kw)
        assert r.status_code == status and r.json()["field"] == field and set(r.json()) == {"error", "field"}, r.text
    assert seen["bodies"] == 2  # the handler ran for the good request and the chunked one (cut off at 64)
    assert _call(guard, "GET", "/health").json() == {"status": "ok"}  # no token needed


@pytest.mark.parametrize("host, origin, status, field", [
    ("127.0.0.1:8000", None, 200, None),
    ("localhost:8000", "http://localhost:8000", 200, None),
    ("[::1]:8000", None, 200, None),
    ("search.internal:8000", None, 200, None),  # named with --allow-host
    ("10.1.2.3:8000", "http://10.1.2.3:8000", 200, None),  # an address: what a rebinding page cannot send
    ("attacker.example:8000", None, 403, "host"),  # DNS rebinding: the page's own name
    ("attacker.example", "http://attacker.example", 403, "host"),
    ("", None, 403, "host"),
    ("127.0.0.1:8000", "http://attacker.example", 403, "origin"),  # a page on another site
    ("127.0.0.1:8000", "null", 403, "origin"),  # a sandboxed frame or a file
    ("127.0.0.1:8000", "http://127.0.0.1:9999", 403, "origin"),
])
def test_an_open_service_answers_its_own_names_and_pages_only(host, origin, status, field):
    guard, seen = _guarded(allowed_hosts=("search.internal",))
    headers = {"Host": host, **({"Origin": origin} if origin else {})}
    for method, path, kw in (("GET", "/health", {}), ("POST", "/search", {"content": b"{}"})):
        r = _call(guard, method, path, headers=headers, **kw)
        assert r.status_code == status, r.text
        if field:
            assert r.json()["field"] == field and "\n" not in r.json()["error"]
    assert seen["bodies"] == (1 if status == 200 else 0)  # refused before the body is read


def test_a_service_with_a_token_takes_any_host_but_no_foreign_page():
    import hashlib

    guard, _ = _guarded(hashlib.sha256(b"secret").hexdigest())  # allowed_hosts None: behind a proxy, any name
    ok = {"Authorization": "Bearer secret", "Host": "search.example.com"}
    assert _call(guard, "POST", "/search", content=b"{}", headers=ok).status_code == 200
    foreign = _call(guard, "POST", "/search", content=b"{}", headers={**ok, "Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["field"] == "origin"


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_frees_its_slot():
    guard, seen = _guarded(body_deadline_s=0.2)

    async def trickle():
        yield b"{"
        await asyncio.sleep(2)
        yield b"}"

    r = _call(guard, "POST", "/search", content=trickle())
    assert r.status_code == 408 and r.json()["field"] == "body" and "within 0.2 s" in r.json()["error"]
    assert guard.settings()["per_client"] == {} and guard.settings().get("in_flight") == 0


def test_one_client_past_its_share_in_flight_gets_429_and_others_are_answered():
    guard, seen = _guarded(body_deadline_s=5, max_client_requests=3)

    async def idle():
        yield b"{"
        await asyncio.sleep(1)
        yield b"}"

    async def go():
        def client(address):
            return httpx.AsyncClient(transport=httpx.ASGITransport(app=guard, client=(address, 1)), base_url="http://t")

        async with client("10.0.0.9") as hostile, client("10.0.0.7") as honest:
            held = [asyncio.create_task(hostile.post("/search", content=idle())) for _ in range(3)]
            await asyncio.sleep(0.2)
            refused = await hostile.post("/search", content=b"{}")
            answered = await honest.post("/search", content=b"{}")
            return refused, answered, await asyncio.gather(*held)

    refused, answered, held = asyncio.run(go())
    assert refused.status_code == 429 and refused.json()["field"] == "client" and refused.headers["retry-after"]
    assert answered.status_code == 200 and [r.status_code for r in held] == [200, 200, 200]
    assert guard.settings()["per_client"] == {}


@pytest.mark.parametrize("name", ["Host", "Origin", "Authorization"])
def test_a_header_sent_twice_is_refused_whichever_comes_first(name):
    guard, _ = _guarded(allowed_hosts=())
    headers = [(name, "attacker.example" if name != "Authorization" else "Bearer x"), (name, "127.0.0.1:8000")]
    if name != "Host":
        headers.append(("Host", "127.0.0.1:8000"))
    r = _call(guard, "POST", "/search", content=b"{}", headers=headers)
    assert r.status_code == 400 and r.json()["field"] == name.lower() and "sent twice" in r.json()["error"]


# ---- a refused command leaves the disk as it was ------------------------------------------------
def test_a_failed_block_removes_only_the_folders_it_created(tmp_path):
    from dhim_ray.folders import removed_unless_kept

    target = tmp_path / "a" / "b" / "c"
    with pytest.raises(RuntimeError), removed_unless_kept(target, lambda p: False):
        target.mkdir(parents=True)
        (target / "half.bin").write_bytes(b"x")
        raise RuntimeError("refused")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), removed_unless_kept(tmp_path / "kept", lambda p: False):
        raise RuntimeError("refused")
    assert (tmp_path / "kept").is_dir()  # it existed before
    with pytest.raises(RuntimeError), removed_unless_kept(tmp_path / "state", lambda p: True):
        (tmp_path / "state").mkdir()
        raise RuntimeError("interrupted with something to resume")
    assert (tmp_path / "state").is_dir()


# ---- --set and flags --------------------------------------------------------------------------
def test_set_values_are_used_and_recorded(tmp_path, toy_folder, tiny_bert):
    out = tmp_path / "run" / "model"
    r = CliRunner().invoke(app, ["train", str(toy_folder), "--bits", "16", "--out", str(out), "--encoder", tiny_bert,
                                 "--epochs", "1", "--set", "features.max_words=12", "--set", "train.seed=5",
                                 "--set", "train.patience=3", "--set", "train.val_fraction=0.25",
                                 "--set", "train.batch_size=32", "--json"])
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["train"]["seed"] == 5 and config["train"]["patience"] == 3
    assert config["train"]["val_fraction"] == 0.25 and config["features"]["max_words"] == 12
    assert config["train"]["max_epochs"] == 1  # the flag, given once


def test_a_refused_train_leaves_no_out_folder(tmp_path, toy_folder):
    out = tmp_path / "runs" / "nope"
    r = CliRunner().invoke(app, ["train", str(toy_folder), "--out", str(out), "--encoder", str(tmp_path / "nomodel")])
    assert r.exit_code == 2 and not (tmp_path / "runs").exists()


def test_window_and_bounds_are_checked_by_the_config_itself():
    from dhim_ray.config import ModelConfig, TrainConfig

    with pytest.raises(ConfigError, match="windows"):
        ModelConfig(windows=(1.5,))
    with pytest.raises(ConfigError, match="windows"):
        ModelConfig(windows=(1, 3, 100001))
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=10**9)
    assert ModelConfig(windows=[1, 3]).windows == (1, 3)


# ---- milvus-lite's lock ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_refused_open_leaves_the_holders_lock(tmp_path):
    from dhim_ray.connectors.connection import connect
    from dhim_ray.errors import StoreBusyError

    db = tmp_path / "k.db"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from dhim_ray.connectors.connection import connect
        client = connect({str(db)!r})
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = tmp_path / ".k.db.lock"
        assert lock.exists()
        for _ in range(2):  # a refused open, and its retry
            with pytest.raises(StoreBusyError, match="open in another process"):
                connect(str(db))
            import gc

            gc.collect()  # milvus-lite's refused server object is gone: its cleanup ran
            assert lock.exists(), "a refused open deleted the holder's lock"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert not (tmp_path / ".k.db.lock").exists()  # the holder removed its own lock
    connect(str(db)).close()  # and the file is free
    assert os.path.exists(db)


# ---- a full disk ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_it(tmp_path, toy_folder, tiny_bert):
    """Saving the model into a 64 KB filesystem (a tmpfs this test mounts: the machines and CI
    run as root) ends in one line saying the disk is full, exit 1, and leaves no folder."""
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"this test mounts a small tmpfs and needs root: {mounted.stderr.strip()}"
    try:
        run = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "train", str(toy_folder), "--encoder", tiny_bert,
                              "--max-words", "12", "--bits", "16", "--epochs", "1", "--out", str(full / "m"),
                              "--json"], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, HF_HUB_OFFLINE="1"))
        assert run.returncode == 1, run.stderr[-2000:]
        assert "Traceback" not in run.stderr
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert errors == [errors[-1]] and "no space left on the device" in errors[0]
        assert run.stderr.strip().splitlines()[-1] == errors[0]
        assert list(full.iterdir()) == []  # the half-written run is gone
    finally:
        subprocess.run(["umount", str(full)], check=False)


def test_the_demo_owns_only_a_folder_with_its_mark(tmp_path):
    from dhim_ray.jobs.demo import MARK, claim_folder

    runs = tmp_path / "runs"
    (runs / "features").mkdir(parents=True)  # train --cache-dir runs/features: anyone's cache
    (runs / "bbc-64").mkdir()
    (runs / "bbc-64" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="was not made by the demo"):
        claim_folder(runs, runs / "bbc-64")
    assert (runs / "bbc-64" / "config.json").exists() and not (runs / MARK).exists()
    claim_folder(tmp_path / "demo", tmp_path / "demo" / "bbc-64")  # a new folder becomes the demo's
    assert (tmp_path / "demo" / MARK).exists()


@pytest.mark.parametrize("what", ["collection", "alias"])
def test_the_ledgers_name_is_reserved(what):
    from dhim_ray.connectors.ledger import LEDGER
    from dhim_ray.connectors.milvus import MilvusTarget, check_collection_name

    with pytest.raises(ConfigError, match=f"{what}='dhim_ray_ingests': the name is reserved"):
        check_collection_name(LEDGER, what)
    with pytest.raises(ConfigError, match="reserved"):
        MilvusTarget("x.db", LEDGER)


def test_a_read_only_database_is_an_environment_error(tmp_path):
    """milvus-lite on a read-only mount failed with 'Milvus refused to create it (code=5)' and exit 2:
    it is the environment (exit 1), said before milvus-lite starts."""
    import os
    import subprocess

    from dhim_ray.connectors.connection import check_lite_path
    from dhim_ray.errors import StoreReadOnlyError

    assert os.geteuid() == 0, "this test mounts a read-only tmpfs: run the suite as root"
    disk = tmp_path / "ro"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "codes.db").write_bytes(b"")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for uri, where in ((disk / "codes.db", "the file cannot be written"), (disk / "new.db", "its folder")):
            with pytest.raises(StoreReadOnlyError, match=where) as caught:
                check_lite_path(str(uri))
            assert caught.value.retriable  # exit 1: the environment
        check_lite_path(str(disk / "codes.db"), create=False)  # reading needs no write
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
