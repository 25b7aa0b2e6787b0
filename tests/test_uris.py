"""A Milvus URI is masked before anything parses it, and what the client opens is written from
the parse: a table of malformed URIs, each holding a secret, and no secret character in any
line the library or the CLI prints."""

from __future__ import annotations

import itertools

import pytest

from dhim_ray.connectors.connection import mask_uri, mask_urls, parse_server_uri
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.errors import ConfigError

SECRET = "Zq9Xw"  # letters no host, port or message of the table holds
RESERVED = ":/?#[]@!$&'()*+,;= %\n\t"
HOSTS = ["127.0.0.1:18799", "milvus.example:19530", "[::1]:19530", "[::1", "host:99999", "host:0", "host:x1",
         "ho st:1", ":1", ""]


def _uris() -> list[str]:
    out = []
    for char, host in itertools.product(RESERVED, HOSTS):
        out += [f"http://admin:{SECRET[:2]}{char}{SECRET[2:]}@{host}",  # a password with a reserved character
                f"http://{SECRET[:2]}{char}{SECRET[2:]}@{host}/db"]  # a token as the user
    for host in HOSTS:
        out += [f"http://{host}/db;token={SECRET}", f"http://{host}/?token={SECRET}", f"http://{host}/?{SECRET}",
                f"http://{host}#{SECRET}", f"https://{host}/db?password={SECRET}&user=x",
                f"http://{host};{SECRET}", f"grpc://u:{SECRET}@{host}"]
    return out


URIS = _uris()


def test_no_secret_character_in_any_message():
    assert len(URIS) > 400 and all(SECRET[:2] in u and SECRET[2:] in u for u in URIS)
    for uri in URIS:
        masked = mask_uri(uri)
        assert SECRET[2:] not in masked and SECRET[:2] not in masked and "\n" not in masked, masked
        with pytest.raises(ConfigError) as caught:
            MilvusTarget(uri, "c")
        message = str(caught.value)
        assert SECRET[2:] not in message and SECRET[:2] not in message, message
        assert "\n" not in message and message.startswith("uri="), message


def test_a_message_has_every_url_in_it_masked_as_mask_uri_masks_it():
    """The CLI's last line of defence: a message quoting a URL (one word) before it prints."""
    for uri in (u for u in URIS if not any(c.isspace() for c in u)):
        message = mask_urls(f"cannot reach {uri} (refused); or {uri}, check it")
        assert SECRET[2:] not in message and SECRET[:2] not in message, message
        assert message.startswith("cannot reach ") and message.endswith(" check it"), message
    assert mask_urls("runs/dhim_ray.db: not found") == "runs/dhim_ray.db: not found"


@pytest.mark.parametrize("uri, url", [
    ("http://127.0.0.1:19530", "http://127.0.0.1:19530"),
    ("HTTP://Milvus.Example:19530/", "http://milvus.example:19530"),
    ("https://milvus.example/db_1", "https://milvus.example/db_1"),
    ("http://[::1]:19530", "http://[::1]:19530"),
    ("tcp://10.0.0.5:19530", "tcp://10.0.0.5:19530"),
])
def test_what_the_client_opens_is_written_from_the_parse(uri, url):
    assert parse_server_uri(uri).url == url


def test_a_file_path_is_left_as_it_is():
    assert mask_uri("runs/dhim_ray.db") == "runs/dhim_ray.db"
    assert MilvusTarget("runs/dhim_ray.db", "c").lite


#: Shapes the code does not take for URLs: a mistyped scheme, none, or slashes alone.
SHAPES = ["http:/admin:{s}@127.0.0.1:18799", "admin:{s}@127.0.0.1:18799", "//admin:{s}@127.0.0.1:18799",
          "http ://admin:{s}@127.0.0.1:18799", "http:\\\\admin:{s}@127.0.0.1:18799",
          "http:/host/db?token={s}", "HTTP :/u:{s}@h#x", " http://u:{s}@h:1"]


@pytest.mark.parametrize("shape", SHAPES)
def test_no_secret_character_for_any_shape(shape):
    uri = shape.format(s=SECRET)
    assert SECRET not in mask_uri(uri) and SECRET[:2] not in mask_uri(uri), mask_uri(uri)
    with pytest.raises(ConfigError) as caught:
        MilvusTarget(uri, "c")
    assert SECRET[2:] not in str(caught.value) and SECRET[:2] not in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["S3cret-T0ken.value", "tok en", "abc:def"])
def test_a_token_name_flag_never_echoes_a_value_that_is_not_a_name(value):
    from dhim_ray.jobs.serve import token_digest

    with pytest.raises(ConfigError) as caught:
        token_digest(value)
    assert value not in str(caught.value) and "NAME of an environment variable" in str(caught.value)


def test_an_unset_token_variable_is_not_echoed(monkeypatch):
    from dhim_ray.jobs.serve import token_digest

    monkeypatch.delenv("Zq9XwSecretLooking", raising=False)
    with pytest.raises(ConfigError) as caught:
        token_digest("Zq9XwSecretLooking")
    assert "Zq9Xw" not in str(caught.value) and "not set or empty" in str(caught.value)
