"""The file a running service leaves beside its milvus-lite file is trusted only when it is the
user's own, names a loopback address, and the token it asks for is the one the service checks:
a planted file never sends a credential anywhere."""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import threading

import pytest

from dhim_ray.jobs.service_file import announce, ask, loopback_url, running_service, service_file


class _Listener(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Listener.seen.append(dict(self.headers))
        body = json.dumps({"results": [[{"id": 666}]], "mode": "codes"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def listener():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Listener.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _plant(uri: str, record: dict, mode: int = 0o600) -> None:
    path = service_file(uri)
    path.write_text(json.dumps(record))
    os.chmod(path, mode)


def _record(url: str, tmp_path, **extra) -> dict:
    return {"url": url, "collection": "c", "model_dir": str(tmp_path.resolve()), "pid": os.getpid(), **extra}


def test_the_services_own_file_is_honoured_and_sends_its_token(tmp_path, listener, monkeypatch):
    uri = str(tmp_path / "a.db")
    monkeypatch.setenv("DHIM_RAY_API_TOKEN", "t0ken")
    announce(uri, listener, "c", str(tmp_path), "DHIM_RAY_API_TOKEN", hashlib.sha256(b"t0ken").hexdigest())
    assert os.stat(service_file(uri)).st_mode & 0o777 == 0o600
    record = running_service(uri, "c", str(tmp_path))
    assert record is not None and ask(record, {"texts": ["x"]})["results"] == [[{"id": 666}]]
    assert _Listener.seen[-1]["Authorization"] == "Bearer t0ken"


def test_a_planted_file_naming_another_variable_gets_no_token(tmp_path, listener, monkeypatch):
    monkeypatch.setenv("MILVUS_TOKEN", "root:Milvus-S3cret")
    uri = str(tmp_path / "a.db")
    _plant(uri, _record(listener, tmp_path, api_token_env="MILVUS_TOKEN", api_token_sha256="0" * 64))
    ask(running_service(uri, "c", str(tmp_path)), {"texts": ["x"]})
    _plant(uri, _record(listener, tmp_path, api_token_env="MILVUS_TOKEN"))  # no digest at all
    ask(running_service(uri, "c", str(tmp_path)), {"texts": ["x"]})
    assert len(_Listener.seen) == 2 and not any("Authorization" in h for h in _Listener.seen)


@pytest.mark.parametrize("why, plant", [
    ("others may write it", lambda uri, rec: _plant(uri, rec, 0o666)),
    ("another user owns it", lambda uri, rec: (_plant(uri, rec), os.chown(service_file(uri), 65534, 65534))),
    ("it is not a regular file", lambda uri, rec: (_plant(uri + ".x", rec), os.symlink(service_file(uri + ".x"),
                                                                                          service_file(uri)))),
    ("its address is not a loopback", lambda uri, rec: _plant(uri, {**rec, "url": "http://10.1.2.3:8000"})),
    ("its address is not a loopback", lambda uri, rec: _plant(uri, {**rec, "url": "http://127.0.0.1.evil.test:80"})),
    ("its address is not a loopback", lambda uri, rec: _plant(uri, {**rec, "url": "http://u:p@127.0.0.1:80"})),
    ("not a service's record", lambda uri, rec: _plant(uri, ["x"])),
    ("cannot be read", lambda uri, rec: service_file(uri).write_text("{")),
])
def test_a_file_that_is_not_the_users_own_or_points_away_is_ignored_in_one_warning(tmp_path, listener, caplog, why,
                                                                                 plant):
    uri = str(tmp_path / "a.db")
    plant(uri, _record(listener, tmp_path, api_token_env="MILVUS_TOKEN"))
    with caplog.at_level(logging.WARNING, logger="dhim_ray.jobs.service_file"):
        assert running_service(uri, "c", str(tmp_path)) is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and why in caplog.records[0].getMessage()
    assert _Listener.seen == []


def test_announce_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    uri, target = str(tmp_path / "a.db"), tmp_path / "victim"
    target.write_text("keep")
    os.symlink(target, service_file(uri))
    announce(uri, "http://127.0.0.1:1", "c", str(tmp_path), None)
    assert target.read_text() == "keep" and not service_file(uri).is_symlink()


@pytest.mark.parametrize("url, sent", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"), ("http://localhost:8000/", "http://localhost:8000"),
    ("http://[::1]:8000", "http://[::1]:8000"), ("http://127.9.9.9:1", "http://127.9.9.9:1"),
    ("https://127.0.0.1:8000", None), ("http://127.0.0.1", None), ("http://0.0.0.0:8000", None),
    ("http://127.0.0.1:99999", None), ("http://127.0.0.1:80?x=1", None), (None, None), (5, None),
])
def test_only_a_loopback_http_address_is_asked(url, sent):
    assert loopback_url(url) == sent
