"""The query service, with real parts: Ray Serve, milvus-lite, the packaged encoder and
BBC corpus, an HTTP client in Python and curl. Every request goes to 127.0.0.1 only, and
the load is bounded (32 clients for LOAD_S seconds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from conftest import BBC16_DOCS

from dhim_ray.connectors.connection import release
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.data import load_split
from dhim_ray.corpus.spec import CorpusSpec
from dhim_ray.errors import ConfigError
from dhim_ray.search import SearchRequest

pytestmark = pytest.mark.slow  # real Ray, real Milvus, the packaged encoder: minutes

N = BBC16_DOCS  # the session collection (conftest.bbc16_collection)
TOKEN = "s3rvice-t0ken-for-tests"
QUERIES = ["oil prices rise as markets fall", "the striker scored twice in the cup final",
           "a new mobile phone with a faster chip"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(ray_session, bbc16, bbc16_collection):
    """A 16-bit BBC model, its collection, what Searcher returns for QUERIES (computed before
    the service opens the milvus-lite file), then the service itself, with a bearer token."""

    from dhim_ray.hasher import Hasher
    from dhim_ray.jobs.serve import ServeOptions, token_digest
    from dhim_ray.jobs.service_life import start_service, stop_service
    from dhim_ray.search import Searcher

    model, (target, _) = bbc16, bbc16_collection
    with Searcher(model, target) as s:
        expected = {"search": s.run(SearchRequest(QUERIES, k=5)).hits, "reranked": s.run(SearchRequest(QUERIES, k=5, rerank=4)).hits}
    expected["codes"] = [c.tobytes().hex() for c in Hasher.load(model).encode(QUERIES)]
    release(target.uri)  # the session's file: earlier modules searched it from this process
    os.environ["DHIM_RAY_TEST_API_TOKEN"] = TOKEN
    options = ServeOptions(str(model), target.uri, target.collection, api_token_sha256=token_digest(
        "DHIM_RAY_TEST_API_TOKEN"))
    url = start_service(options, port=free_port())
    yield {"url": url, "expected": expected, "target": target, "model": model}
    stop_service()
    import ray

    from dhim_ray.jobs.serve import DRAIN_ACTOR, DRAIN_NAMESPACE

    with pytest.raises(ValueError):  # gone with the service: a later one in this Ray would answer 503 to all
        ray.get_actor(DRAIN_ACTOR, namespace=DRAIN_NAMESPACE)


def post(service, path: str, body, token: str | None = TOKEN, headers: dict | None = None, **kw) -> httpx.Response:
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    if isinstance(body, (bytes, str)):
        return httpx.post(service["url"] + path, content=body, headers={**headers, "Content-Type": "application/json"},
                          timeout=60, **kw)
    # json.dumps escapes what UTF-8 cannot encode (a lone surrogate stays valid JSON), as browsers' JSON.stringify does
    return httpx.post(service["url"] + path, content=json.dumps(body).encode(),
                      headers={**headers, "Content-Type": "application/json"}, timeout=60, **kw)


def test_search_through_the_service_equals_searcher(service):
    r = post(service, "/search", {"texts": QUERIES, "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["n_bits"] == 16 and body["collection"] == "bbc16"
    assert body["results"] == service["expected"]["search"]
    assert {"id", "distance", "label", "label_name", "text", "source", "row", "key"} <= set(body["results"][0][0])
    reranked = post(service, "/search", {"texts": QUERIES, "k": 5, "rerank": 4}).json()["results"]
    # hybrid: the text list's phrase matches go first (no rerank_score); the codes' hits carry theirs
    assert reranked == service["expected"]["reranked"]
    assert all("rerank_score" in h for hits in reranked for h in hits if "bm25" not in h)
    assert any("rerank_score" in h for hits in reranked for h in hits)


def test_hash_gives_the_hashers_codes_as_hex(service):
    r = post(service, "/hash", {"texts": QUERIES})
    assert r.status_code == 200
    assert r.json()["n_bits"] == 16 and r.json()["codes"] == service["expected"]["codes"]


def test_health_names_model_collection_and_rows_without_a_token(service):
    r = httpx.get(service["url"] + "/health", timeout=30)
    assert r.status_code == 200
    h = r.json()
    assert h["collection"] == "bbc16" and h["n_bits"] == 16 and h["rows"] == N and h["model"]
    assert h["complete"] is True and "warning" not in h  # the ingest verified it


def test_the_openapi_schema_is_served_and_no_page_that_needs_a_cdn(service):
    """The schema is served; /docs (Swagger UI, fetched from a CDN: blank offline) is not."""
    schema = httpx.get(service["url"] + "/openapi.json", timeout=30).json()
    assert {"/search", "/hash", "/health"} <= set(schema["paths"])
    assert httpx.get(service["url"] + "/docs", timeout=30).status_code == 404


@pytest.mark.parametrize("body, status, field, words", [
    (b'{"texts": ["a"', 400, "body", "not valid JSON"),
    (b'{"texts": ["a"], "k": 1' + b"0" * 5000 + b"}", 400, "body", "a number of more than 4,300 digits"),
    ({}, 422, "texts", "give query texts or like=ID"),
    ({"texts": "one string"}, 422, "texts", "valid list"),
    ({"texts": []}, 422, "texts", "at least 1"),
    ({"texts": [""]}, 422, "texts", "text 0 ('') is empty"),
    ({"texts": ["fine", "   "]}, 422, "texts", "text 1 ('   ') is empty"),
    ({"texts": ["---"]}, 422, "texts", "empty after cleaning"),
    ({"texts": [3]}, 422, "texts.0", "valid string"),
    ({"texts": ["q"] * 257}, 422, "texts", "at most 256"),
    ({"texts": ["x" * 100_001]}, 422, "texts", "at most 100000"),
    ({"texts": ["q"], "k": 0}, 422, "k", "k: must be between 1 and 1,000 (hits per text), not 0"),
    ({"texts": ["q"], "k": -5}, 422, "k", "k: must be between 1 and 1,000"),
    ({"texts": ["q"], "k": 1001}, 422, "k", "must be between 1 and 1,000"),
    ({"texts": ["oil \ud800"]}, 422, "texts", "texts[0]: a lone surrogate '\\ud800' at character 5 is not text"),
    ({"like": ["\udc80"]}, 422, "like", "like[0]: a lone surrogate"),
    ({"texts": ["q"], "filter": "label == 1\x1c"}, 422, "filter", "the control character 0x1c"),
    ({"texts": ["q"], "k": "10"}, 422, "k", "valid integer"),
    ({"texts": ["q"], "rerank": 0}, 422, "rerank", "must be an integer in 1..64"),
    ({"texts": ["q"], "k": 1000, "rerank": 64}, 422, "rerank", "k x rerank = 64000 Hamming candidates"),
    ({"like": [1], "rerank": 4}, 422, "rerank", "a stored row has no query scores"),
    ({"texts": ["q"], "max_distance": -1}, 422, "max_distance", "0 or more"),
    ({"texts": ["q"], "topk": 5}, 422, "topk", "Extra inputs"),
    ({"texts": ["q"], "mode": "fast"}, 422, "mode", "choose codes, text or hybrid"),
    ({"texts": ["q"], "fields": ["nope"]}, 422, "fields", "the collection has no field 'nope'"),
])
def test_a_bad_request_gets_one_json_error_naming_the_field(service, body, status, field, words):
    r = post(service, "/search", body)
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"error", "field"} and err["field"] == field and words in err["error"]
    assert post(service, "/search", {"texts": ["still answering"], "k": 1}).status_code == 200


def test_the_search_body_is_made_from_the_request_s_fields():
    """Every SearchRequest field is a body field, a tuple as a list (None: the request's default);
    a field the request gains reaches the body without a line of the service's."""
    from dataclasses import dataclass, fields

    from dhim_ray.jobs.serve import SearchBody, _body_of

    assert list(SearchBody.model_fields) == [f.name for f in fields(SearchRequest)]

    @dataclass(frozen=True)
    class Later:
        texts: tuple[str, ...] = ()
        depth: int = 3

    assert _body_of(Later).model_validate({"depth": 4}).model_dump() == {"texts": None, "depth": 4}


def test_a_body_s_fields_choose_what_a_hit_carries(service):
    r = post(service, "/search", {"texts": QUERIES[:1], "k": 3, "fields": ["label"]})
    assert r.status_code == 200, r.text
    assert all(set(hit) <= {"id", "distance", "label", "bm25"} and "label" in hit for hit in r.json()["results"][0])


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_missing_or_wrong_token_gets_401(service, token):
    for path in ("/search", "/hash"):
        r = post(service, path, {"texts": ["q"]}, token=token)
        assert r.status_code == 401 and r.json()["field"] == "authorization"
        assert TOKEN not in r.text


def test_curl_can_query_it(service):
    out = subprocess.run(
        ["curl", "-sS", "-X", "POST", service["url"] + "/search", "-H", "Content-Type: application/json",
         "-H", f"Authorization: Bearer {TOKEN}", "-d", json.dumps({"texts": QUERIES[:1], "k": 5})],
        capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout)["results"] == service["expected"]["search"][:1]


def test_concurrent_requests_share_encoder_passes(service):
    before = httpx.get(service["url"] + "/health", timeout=30).json()["encoder"]
    texts = [[f"{q} number {i}"] for i in range(32) for q in QUERIES[:1]]
    with ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(lambda t: post(service, "/hash", {"texts": t}), texts))
    assert all(r.status_code == 200 for r in replies)
    after = httpx.get(service["url"] + "/health", timeout=30).json()["encoder"]
    requests, passes = after["requests"] - before["requests"], after["passes"] - before["passes"]
    assert requests == 32 and passes < requests  # batched: fewer encoder passes than requests
    # and each request got its own text's code, not a neighbour's
    alone = post(service, "/hash", {"texts": texts[7]}).json()["codes"]
    assert replies[7].json()["codes"] == alone


def lite_servers(db: str) -> list[int]:
    """pids of milvus-lite server processes serving ``db``."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "milvus" in cmd and os.path.abspath(db) in cmd.split() and p.info["pid"] != os.getpid():
            found.append(p.info["pid"])
    return found


def test_milvus_going_away_answers_503_and_the_service_recovers(service):
    pids = lite_servers(service["target"].uri)
    assert pids, "the service's milvus-lite server process was not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    r = post(service, "/search", {"texts": QUERIES[:1], "k": 5})
    assert r.status_code == 503 and r.headers["Retry-After"] and "retry" in r.json()["error"]
    deadline = time.time() + 60  # the next requests reopen the file: Milvus is back
    while (r := post(service, "/search", {"texts": QUERIES[:1], "k": 5})).status_code != 200 and time.time() < deadline:
        time.sleep(1)
    assert r.status_code == 200 and r.json()["results"] == service["expected"]["search"][:1]
    assert httpx.get(service["url"] + "/health", timeout=30).json()["rows"] == N


def test_more_than_one_replica_on_a_lite_file_is_refused(tmp_path):
    from dhim_ray.jobs.serve import check_replicas

    with pytest.raises(ConfigError, match="opens in one process only"):
        check_replicas(str(tmp_path / "x.db"), 2)
    check_replicas("http://127.0.0.1:19530", 4)
    out = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "serve", str(tmp_path), "--collection", "c",
                          "--uri", str(tmp_path / "x.db"), "--replicas", "2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--replicas 2" in out.stderr


def test_the_serve_config_file_builds_the_application(service):
    """serve.yaml (for `serve deploy` on a cluster) names build_app and arguments it takes."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from dhim_ray.jobs.serve import build_app

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
        else ServeDeploySchema.parse_obj(config)
    app = schema.applications[0]
    assert app.import_path == "dhim_ray.jobs.serve:build_app"
    args = {**app.args, "model_dir": service["model"], "uri": service["target"].uri,
            "collection": service["target"].collection, "api_token_env": "DHIM_RAY_TEST_API_TOKEN"}
    assert app.args["replicas"] == 2 and app.args["uri"].startswith("http://")  # the file's: a server
    with pytest.raises(ConfigError, match="replicas=2"):
        build_app(args)  # on a lite file
    from ray.serve import Application

    built = build_app({**args, "replicas": 1})
    assert isinstance(built, Application)
    deployment = built._bound_deployment  # what `serve deploy` starts: one replica of the query service
    assert deployment.name == "QueryService" and deployment.num_replicas == 1
    assert deployment.init_args[0]["model_dir"] == service["model"] and deployment.init_args[0]["api_token_sha256"]
    assert np.all([a in ("model_dir", "uri", "collection", "token_env", "replicas", "api_token_env",
                         "max_batch_size") for a in app.args])


# ---- hostile and careless clients: the front door ------------------------------------------
BIG = 17 * 1024 * 1024  # past the 16 MiB body limit


def _chunks(total: int, size: int = 1 << 20):
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


def nested(depth: int) -> bytes:
    return b'{"texts": ' + b"[" * depth + b"]" * depth + b"}"


#: (method, path, token, headers, body, status, field): every answer is {"error", "field"}.
ABUSE = [
    ("GET", "/nope", TOKEN, {}, None, 404, "path"),
    ("POST", "/admin", None, {}, b"{}", 404, "path"),
    ("GET", "/search", TOKEN, {}, None, 405, "method"),
    ("DELETE", "/search", TOKEN, {}, None, 405, "method"),
    ("PUT", "/hash", TOKEN, {}, b"{}", 405, "method"),
    ("POST", "/health", None, {}, b"{}", 405, "method"),
    ("POST", "/search", None, {}, b"x" * BIG, 401, "authorization"),  # the token before the body
    ("POST", "/search", "wrong", {}, b'{"texts": ["q"]}', 401, "authorization"),
    ("POST", "/search", TOKEN, {}, b"x" * BIG, 413, "body"),  # by its Content-Length
    ("POST", "/hash", TOKEN, {}, "chunked", 413, "body"),  # streamed, no length
    ("POST", "/search", TOKEN, {"Content-Encoding": "gzip"}, b"\x1f\x8b\x08\x00", 415, "content-encoding"),
    ("POST", "/search", TOKEN, {}, b"\xff\xfe\x00{", 400, "body"),  # not UTF-8
    ("POST", "/search", TOKEN, {}, "\ufeff".encode() + b'{"texts": ["q"]', 400, "body"),
    ("POST", "/search", TOKEN, {}, nested(1000), 400, "body"),
    ("POST", "/search", TOKEN, {}, nested(50), 422, "texts.0"),
    ("POST", "/search", TOKEN, {}, b"[]", 422, "body"),
    ("POST", "/search", TOKEN, {}, b"null", 422, "body"),
    # JSON the service cannot read for its type: named as such, not as a malformed dictionary
    ("POST", "/search", TOKEN, {"Content-Type": "text/plain"}, b'{"texts": ["q"]}', 415, "content-type"),
    ("POST", "/search", TOKEN, {"Content-Type": "application/x-www-form-urlencoded"}, b"texts=q", 415, "content-type"),
    ("POST", "/hash", TOKEN, {"Content-Type": "application/xml"}, b"<texts>q</texts>", 415, "content-type"),
]


@pytest.mark.parametrize("method, path, token, headers, body, status, field", ABUSE,
                         ids=[f"{m} {p} {s} {f}" for m, p, _, _, _, s, f in ABUSE])
def test_abuse_gets_one_json_error_with_the_right_status(service, method, path, token, headers, body, status, field):
    headers = {**headers, **({"Authorization": f"Bearer {token}"} if token else {})}
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    content = _chunks(BIG) if body == "chunked" else body
    r = httpx.request(method, service["url"] + path, content=content, headers=headers, timeout=120)
    assert r.status_code == status, r.text[:300]
    err = r.json()
    assert set(err) == {"error", "field"} and err["field"] == field, err
    assert "detail" not in err and TOKEN not in r.text
    if status == 405:
        assert r.headers["Allow"]
    assert post(service, "/hash", {"texts": ["still answering"]}).status_code == 200


def test_a_second_service_on_a_port_in_use_is_refused(service):
    from dhim_ray.jobs.serve import ServeOptions
    from dhim_ray.jobs.service_life import start_service

    port = int(service["url"].rsplit(":", 1)[1])
    options = ServeOptions(str(service["model"]), service["target"].uri, service["target"].collection)
    with pytest.raises(ConfigError, match=f"port={port}: 127.0.0.1:{port} is in use"):
        start_service(options, port=port)
    # the first service still answers alone, and still wants its token
    assert post(service, "/search", {"texts": ["q"]}, token=None).status_code == 401


def test_an_open_service_beyond_loopback_needs_allow_open():
    from dhim_ray.jobs.service_life import check_listen, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    with pytest.raises(ConfigError, match="allow_open=True"):
        check_listen("0.0.0.0", free_port(), open_access=True)
    check_listen("0.0.0.0", free_port(), open_access=True, allow_open=True)
    check_listen("0.0.0.0", free_port(), open_access=False)
    with pytest.raises(ConfigError, match="empty variable name"):
        from dhim_ray.jobs.serve import token_digest

        token_digest("")


def test_a_refused_open_keeps_the_holders_lock_and_the_next_writer_is_refused(service, tmp_path):
    """While the service holds the file, a search is refused, the lock stays, and an ingest
    into the same file is refused too (it used to run beside the service)."""
    db = service["target"].uri
    lock = os.path.join(os.path.dirname(db), f".{os.path.basename(db)}.lock")
    assert os.path.exists(lock)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    base = [sys.executable, "-m", "dhim_ray.cli"]
    search = subprocess.run([*base, "search", "oil", "--model", str(service["model"]), "--uri", db,
                             "--collection", "bbc16"], capture_output=True, text=True, timeout=300, env=env)
    assert search.returncode == 1 and "open in another process" in search.stderr
    assert len([x for x in search.stderr.splitlines() if x.strip()]) == 1, search.stderr
    assert os.path.exists(lock), "a refused open deleted the service's lock"
    ingest = subprocess.run([*base, "ingest", "bbc", "--limit", "20", "--model", str(service["model"]), "--uri", db,
                             "--collection", "bbc16_more"], capture_output=True, text=True, timeout=300, env=env)
    assert ingest.returncode == 1 and "open in another process" in ingest.stderr, ingest.stderr[-1000:]
    assert os.path.exists(lock)
    assert httpx.get(service["url"] + "/health", timeout=30).json()["rows"] == N


def test_health_answers_503_at_once_while_milvus_hangs(service):
    pids = lite_servers(service["target"].uri)
    assert pids, "the service's milvus-lite server process was not found"
    assert httpx.get(service["url"] + "/health", timeout=30).status_code == 200
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        r = httpx.get(service["url"] + "/health", timeout=60)
        assert r.status_code == 503 and "not answering" in r.json()["error"] and r.headers["Retry-After"]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    deadline = time.time() + 60
    while (r := httpx.get(service["url"] + "/health", timeout=60)).status_code != 200 and time.time() < deadline:
        time.sleep(1)
    assert r.status_code == 200 and r.json()["rows"] == N


def write_rows(target: MilvusTarget, model, texts: list[str]) -> MilvusTarget:
    """``texts`` hashed by ``model`` into a new collection, written directly (an ingest would
    need Ray CPUs the running service holds)."""
    from dhim_ray.connectors.rows import code_rows, document_ids
    from dhim_ray.hasher import Hasher

    hasher = Hasher.load(model)
    with target.open() as collection:
        collection.ensure(16, hasher.model_id)
        rows = np.arange(len(texts))
        collection.upsert(code_rows({"id": document_ids("t@t", rows), "code": hasher.encode(texts), "text": texts,
                                     "row": rows}, 16, "t@t"))
    return target


def start_serve_command(model, target: MilvusTarget, port: int, **popen):
    """`dhim-ray serve` in a process, once it says it is serving: (process, stdout lines, reader)."""
    proc = subprocess.Popen([sys.executable, "-m", "dhim_ray.cli", "serve", str(model), "--collection",
                             target.collection, "--uri", target.uri, "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), **popen)
    printed: list[str] = []  # stdout, read as it comes: "serving ..." once the command is up and listening
    reader = threading.Thread(target=lambda: printed.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline, up = time.time() + 300, False
    while not up and time.time() < deadline and proc.poll() is None:
        up = any(line.startswith(f"serving {target.collection}") for line in printed)
        time.sleep(0.5)
    if not up:
        proc.kill()
        raise AssertionError(f"the service did not come up: {proc.communicate()[1][-2000:]}")
    return proc, printed, reader


def test_sigterm_to_the_process_group_stops_at_once_with_its_line(service, tmp_path):
    """systemd and `docker stop` signal every process of the group: Ray's own go first, so the
    service has nothing left to drain; it stops without waiting for a dead Ray, with its one line."""
    port = free_port()
    target = write_rows(MilvusTarget(str(tmp_path / "group.db"), "grp16"), service["model"], QUERIES * 4)
    proc, printed, reader = start_serve_command(service["model"], target, port, start_new_session=True)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]  # Ray's own wait for a dead GCS is 60 s: stopping must not wait
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-2000:]
    assert "GCS" not in err and "Traceback" not in err, err[-2000:]
    assert [line for line in err.splitlines() if line.strip()][-1] == "stopped serving grp16", err


def test_sigterm_stops_serve_cleanly_and_frees_the_file(service, tmp_path):
    """What systemd and container runtimes send: the service stops as Ctrl-C stops it, exit 0,
    no stack, and the milvus-lite file is free for the next process."""
    texts = load_split(CorpusSpec("bbc", "train", limit=40)).texts
    target = write_rows(MilvusTarget(str(tmp_path / "term.db"), "term16"), service["model"], texts)
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc, printed, reader = start_serve_command(service["model"], target, port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        # `dhim-ray search` on the file the service holds asks the service: the same hits, not "open elsewhere"
        from dhim_ray.jobs.service_file import service_file

        assert service_file(target.uri).exists()
        asked = subprocess.run([sys.executable, "-m", "dhim_ray.cli", "search", QUERIES[0], "--model",
                                str(service["model"]), "--uri", target.uri, "--collection", "term16", "-k", "5",
                                "--json"], capture_output=True, text=True, timeout=300, env=env)
        assert asked.returncode == 0, asked.stderr[-2000:]
        direct = httpx.post(f"http://127.0.0.1:{port}/search", json={"texts": [QUERIES[0]], "k": 5}, timeout=60)
        assert json.loads(asked.stdout)[0]["hits"] == direct.json()["results"][0] and direct.json()["results"][0]
        # under load: the requests it holds when the signal comes are answered, not dropped
        answers: list[tuple[object, float]] = []
        long_texts = [f"{t} " * 4 for t in texts[:32]]

        def one_search():
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/search", json={"texts": long_texts, "k": 5}, timeout=300)
                answers.append((r.status_code, time.time()))
            except httpx.HTTPError as exc:
                answers.append((type(exc).__name__, time.time()))

        # new requests meanwhile: a JSON 503 with Retry-After until the port closes, never Ray's plain 404
        probes: list[tuple[int, str, str | None]] = []

        def probe_until_closed():
            while True:
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
                except httpx.HTTPError:
                    return
                probes.append((r.status_code, r.headers.get("content-type", ""), r.headers.get("retry-after")))
                time.sleep(0.05)

        clients = [threading.Thread(target=one_search) for _ in range(8)]
        for c in clients:
            c.start()
        time.sleep(1.0)
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)
        prober = threading.Thread(target=probe_until_closed)
        prober.start()
        for c in clients:
            c.join(timeout=300)
        prober.join(timeout=300)
        err = proc.communicate(timeout=180)[1]
        reader.join(timeout=10)
        assert [a for a, _ in answers] == [200] * 8, answers
        assert any(at > signalled for _, at in answers), "no request was in flight at the signal"
        assert all(p[0] == 200 or (p[0] == 503 and p[1] == "application/json" and p[2]) for p in probes), probes
        assert any(p[0] == 503 for p in probes), probes
        out = "".join(printed)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert not service_file(target.uri).exists()  # withdrawn with the service
    assert "Traceback" not in err and "***" not in err and "SIGTERM" not in err, err[-2000:]
    assert "serving term16" in out and "(raylet)" not in out, out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == "stopped serving term16" and all(x.startswith("serving term16") for x in lines[:-1]), err
    with MilvusTarget(target.uri, "term16").open(create=False) as collection:  # the file is free again
        assert collection.count() == 40


def test_filters_radius_and_like_through_the_service(service):
    first = post(service, "/search", {"texts": QUERIES[:1], "k": 5}).json()["results"][0]
    label = first[0]["label"]
    r = post(service, "/search", {"texts": QUERIES[:1], "k": 5, "filter": f"label == {label}"})
    assert r.status_code == 200 and all(h["label"] == label for h in r.json()["results"][0])
    bad = post(service, "/search", {"texts": QUERIES[:1], "filter": "lable == 1"})
    assert bad.status_code == 422 and bad.json()["field"] == "filter" and "lable" in bad.json()["error"]
    near = post(service, "/search", {"texts": QUERIES[:1], "k": 1000, "max_distance": 3}).json()["results"][0]
    assert all(h["distance"] <= 3 for h in near)
    assert post(service, "/search", {"texts": QUERIES[:1], "max_distance": 17}).status_code == 422
    like = post(service, "/search", {"like": [first[0]["id"]], "k": 3})
    assert like.status_code == 200 and first[0]["id"] not in {h["id"] for h in like.json()["results"][0]}
    missing = post(service, "/search", {"like": [123], "k": 3})
    assert missing.status_code == 422 and missing.json()["field"] == "like"
    both = post(service, "/search", {"texts": ["q"], "like": [1]})
    assert both.status_code == 422 and "texts or like" in both.json()["error"]


HOSTILE_FILTERS = [
    "label + 1 in [2, 3]", "1 in [1] and label == 1", '"a" in ["a"] and label == 1', "row % 2 in [0]",
    "label / 0 == 1", "label % 0 == 1", "row / (1 - 1) == 0", "label // 2 == 1", "true", "label == 3; label == 4",
    "((label == 3)", "label == {x}", "label in []", "label == 1 or 1==1", "label == 1\x00", "not " * 1000 + "label == 1",
    # what a checker that mirrored Milvus' grammar let through, and each stopped milvus-lite
    "label % 0\u0663 == 0", 'label == 1 "\\q or label % 0 == 0 or label_name == " label "\\q"',
    'label_name == "\n" or label % 0 == 0', "row / -1 == 0", "row % -1 == 0", "label == 1\x1c",
    'text like "' + "%" * 4000 + 'x"', 'text like "' + "%a" * 400 + '"',
]
#: (body, headers, the field the 4xx names): every class of hostile request the service has met.
HOSTILE = [({"texts": QUERIES[:1], "k": 5, "filter": f}, {}, "filter") for f in HOSTILE_FILTERS] + [
    ({"texts": ["\ud800 oil"], "k": 5}, {}, "texts"),  # a lone surrogate: valid JSON, not text
    ({"like": ["\udc80"], "k": 5}, {}, "like"),
    ({"like": ["\u00b2"], "k": 5}, {}, "like"),  # a digit Python's int() reads, not a row id: no 500
    ({"texts": ["q"], "k": -5}, {}, "k"),
    ({"texts": ["oil"], "k": 5}, {"Origin": "http://attacker.example"}, "origin"),  # a page on another site
]
LOAD_S = 20


def test_hostile_clients_get_4xx_and_honest_clients_see_no_failure(service):
    """8 hostile clients send every request that stopped or misled the service, over and over,
    beside 24 honest clients for LOAD_S seconds: each hostile request is a 4xx naming its
    field, every honest one a 200, and Milvus keeps the same server process throughout."""
    pids = lite_servers(service["target"].uri)
    stop = time.monotonic() + LOAD_S

    def hostile(i: int) -> list[int]:
        statuses = []
        while time.monotonic() < stop:
            for body, headers, field in HOSTILE[i::8] or HOSTILE:
                r = post(service, "/search", body, headers=headers)
                assert r.json().get("field") == field, r.text
                statuses.append(r.status_code)
        return statuses

    def honest(i: int) -> list[int]:
        statuses = []
        while time.monotonic() < stop:
            statuses.append(post(service, "/search", {"texts": [f"{QUERIES[i % 3]} {i}"], "k": 5}).status_code)
        return statuses

    with ThreadPoolExecutor(32) as pool:
        bad = [pool.submit(hostile, i) for i in range(8)]
        good = list(pool.map(honest, range(24)))
    refused = [s for f in bad for s in f.result()]
    assert len(refused) >= len(HOSTILE) and all(400 <= s < 500 for s in refused), sorted(set(refused))
    answered = [s for statuses in good for s in statuses]
    assert answered and set(answered) == {200}, f"{answered.count(200)} of {len(answered)} honest searches answered"
    assert lite_servers(service["target"].uri) == pids  # the same milvus-lite process: nothing restarted it


IDLE_CONNECTIONS = 500


def test_idle_and_slow_bodies_from_one_client_leave_the_others_answered(service):
    """One client (127.0.0.2) opens 500 connections that send their headers and 18 of 100 body
    bytes, then nothing: honest searches from another address are all answered, and each idle
    connection is answered 429 (past its share) or 408 (its body's deadline), never left hanging."""
    host, port = service["url"].removeprefix("http://").rsplit(":", 1)
    token = {"Authorization": f"Bearer {TOKEN}"}

    def timed() -> tuple[int, float]:
        start = time.monotonic()
        r = post(service, "/search", {"texts": [QUERIES[0]], "k": 5})
        return r.status_code, time.monotonic() - start

    unloaded = sorted(timed()[1] for _ in range(5))
    held = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.settimeout(60)
            sock.connect((host, int(port)))
            head = (f"POST /search HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Authorization: {token['Authorization']}\r\nContent-Length: 100\r\n\r\n")
            sock.sendall(head.encode() + b'{"texts": ["oil", ')
            held.append(sock)
        loaded = [timed() for _ in range(10)]
        answers = [sock.recv(200).split(b"\r\n", 1)[0] for sock in held]
    finally:
        for sock in held:
            sock.close()
    assert {status for status, _ in loaded} == {200}
    assert {a.split(b" ")[1] for a in answers} <= {b"408", b"429"} and len(answers) == IDLE_CONNECTIONS, set(answers)
    print(f"honest p50 {sorted(t for _, t in loaded)[5]:.3f} s beside {IDLE_CONNECTIONS} idle connections, "
          f"unloaded {unloaded[2]:.3f} s")


def test_batches_of_common_word_texts_leave_honest_clients_their_speed(service):
    """8 clients each sending 256 short common-word texts in text mode, over and over, beside 8
    honest ones: every honest search answered, and a request past the text-work limit a 422
    naming it. The honest p50 beside the load, against its own unloaded p50, is printed."""
    heavy = {"texts": [f"the {w} of the said" for w in ("and", "in", "to", "a") * 64], "k": 10, "mode": "text"}
    too_much = post(service, "/search", {**heavy, "k": 1000})
    assert too_much.status_code == 422 and too_much.json()["field"] == "texts", too_much.text
    assert "units of text work, at most 262,144" in too_much.json()["error"]

    def honest_once() -> tuple[int, float]:
        start = time.monotonic()
        return post(service, "/search", {"texts": [QUERIES[1]], "k": 5}).status_code, time.monotonic() - start

    unloaded = sorted(honest_once()[1] for _ in range(10))[5]
    stop = time.monotonic() + LOAD_S / 2

    def hostile(_: int) -> list[int]:
        statuses = []
        while time.monotonic() < stop:
            statuses.append(post(service, "/search", heavy).status_code)
        return statuses

    def honest(_: int) -> list[tuple[int, float]]:
        out = []
        while time.monotonic() < stop:
            out.append(honest_once())
        return out

    with ThreadPoolExecutor(16) as pool:
        bad = [pool.submit(hostile, i) for i in range(8)]
        good = [t for f in [pool.submit(honest, i) for i in range(8)] for t in f.result()]
    assert {s for f in bad for s in f.result()} <= {200, 429} and good
    assert {status for status, _ in good} == {200}
    print(f"honest p50 {sorted(t for _, t in good)[len(good) // 2]:.3f} s beside 8 clients of 256 common-word "
          f"texts, unloaded {unloaded:.3f} s")


def shown(text: str) -> str:
    """A hit's text as the page shows it: newlines folded, the first 300 characters."""
    folded = " ".join(text.split())
    return folded if len(folded) <= 300 else folded[:300].rstrip() + " …"


def test_the_search_page_in_a_real_browser(service):
    """GET / as a person uses it, in headless chromium: the token asked for (a wrong one shown as
    such), the collection named, a query typed, the hits read (as Searcher gives them), "more
    like this" clicked (as the API's like gives them)."""
    from browser import SearchPage, browser

    page_html = httpx.get(service["url"] + "/", timeout=30)
    assert page_html.status_code == 200 and "text/html" in page_html.headers["content-type"]
    assert "http://" not in page_html.text.replace(service["url"], "") and "https://" not in page_html.text
    assert post(service, "/info", {}, token=None).status_code in (401, 405)
    assert httpx.get(service["url"] + "/info", timeout=30).status_code == 401  # nothing without the token

    driver = browser()
    try:
        page = SearchPage(driver, service["url"])
        assert page.auth_message() == "this service needs its API token"
        page.give_token("not-the-token")
        assert page.auth_message() == "wrong token: the service refused it"
        page.give_token(TOKEN)
        about = page.about()
        assert "bbc16" in about and f"{N} documents" in about and "16-bit" in about
        assert f"model {service['model'].name}" in about  # the folder a person knows it by, not its hash
        assert page.modes() == ["hybrid", "codes", "text"]

        hits = page.search(QUERIES[1], k=5)
        want = service["expected"]["search"][1]
        assert [h["distance"] for h in hits] == [str(w["distance"]) for w in want]
        assert [h["text"] for h in hits] == [shown(w["text"]) for w in want]  # newlines folded, 300 characters
        assert [h["label"] for h in hits] == [w["label_name"] for w in want]

        first_id = post(service, "/search", {"texts": [QUERIES[1]], "k": 5}).json()["results"][0][0]["id"]
        like = post(service, "/search", {"like": [first_id], "k": 5}).json()["results"][0]
        assert [h["text"] for h in page.more_like(1)] == [shown(w["text"]) for w in like]
        # "more like this" names the document and leaves no query in the box that these hits do not answer
        assert page.status().startswith(f'5 hits for documents like #1, "{shown(want[0]["text"])[:20]}')
        assert page.query() == ""

        # on a narrow screen the k label stays beside its selector
        from selenium.webdriver.common.by import By

        driver.set_window_size(420, 900)
        label, select = driver.find_element(By.CSS_SELECTOR, "label[for=k]"), driver.find_element(By.ID, "k")
        assert abs(label.rect["y"] + label.rect["height"] / 2 - select.rect["y"] - select.rect["height"] / 2) < \
            select.rect["height"] and label.rect["x"] < select.rect["x"]

        # a refused filter's red line stands alone: the last answer's hits are not shown under it
        assert "must divide by a positive whole number" in page.refused(QUERIES[1], "label % 0 == 1")
        assert not page.hits_shown()

        label = want[0]["label"]
        filtered = page.search(QUERIES[1], k=10, filter=f"label == {label}", mode="codes")
        assert filtered and all(h["label"] == want[0]["label_name"] for h in filtered)
        assert "bm25" not in filtered[0]  # codes only: no BM25 column

        # a collection without labels: its hits carry label -1, and the page draws no label column
        driver.execute_script("show(arguments[0], 'q')", [{**h, "label": -1, "label_name": ""} for h in like])
        assert list(page.hits()[0]) == ["#", "distance", "text", ""]
    finally:
        driver.quit()
