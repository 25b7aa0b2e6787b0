"""Connecting to Milvus: a milvus-lite file (one process per file; its server's guards and
quiet start) or a server URL, and the checks a URI gets before anything opens it."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dhim_ray.errors import (
    ConfigError,
    StoreBusyError,
    StoreError,
    StoreReadOnlyError,
    StoreUnreachableError,
    first_line,
)
from dhim_ray.stderr import stderr_to

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
# milvus-lite is a local process on a unix socket: keepalive pings only earn a GOAWAY
# ("too_many_pings") from its server while the client waits idle (e.g. on slow encoders),
# which gRPC prints to the terminal. pymilvus pings every 10 s by default; lite needs none.
LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_lite(uri: str) -> bool:
    """A local file path (milvus-lite) rather than a server URL."""
    scheme = _SCHEME.match(uri)
    return scheme is None or scheme.group(1).lower() not in ("http", "https", "tcp", "grpc", "unix")


#: What may stand before a URI's credentials and still be shown: a known scheme however it is
#: mistyped (``http ://``, ``http:/``, ``http:\\``), or slashes alone.
_SHOWN_PREFIX = re.compile(r"^\s*(?:(?:https?|tcp|grpc|unix)\s*:)?[/\\]*", re.I)
#: A URL whose scheme is mistyped: a name, a colon, then a slash or backslash.
_URLISH = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*\s*:[/\\]")


def mask_uri(uri: str) -> str:
    """The URI with every place a credential can hide masked, whatever its shape, for messages
    and logs, found without parsing it (a parser's own error would quote the secret): all
    before the last ``@`` but a known scheme (a file path's too), and from the first ``;``,
    ``?`` or ``#`` on where it starts with a scheme. A path without ``@`` is returned as it is."""
    prefix = _SHOWN_PREFIX.match(uri).group(0)
    rest = uri[len(prefix):]
    if "@" in rest:
        rest = "***@" + rest[rest.rfind("@") + 1:]
    cut = next((i for i, c in enumerate(rest) if c in ";?#"), None) if _URLISH.match(uri) else None
    if cut is not None:
        rest = rest[: cut + 1] + "***"
    return _printable(prefix + rest)


def looks_like_url(uri: str) -> bool:
    """A scheme and a slash, however mistyped (``http:/h``, ``http ://h``): never a milvus-lite path."""
    return _URLISH.match(uri) is not None


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://\S*?)([:,.)\]'\"]*)(?=\s|$)")


def mask_urls(text: str) -> str:
    """``text`` (a message) with every URL in it masked as ``mask_uri`` masks one (punctuation
    after a URL stays as it is)."""
    return _URL.sub(lambda m: mask_uri(m.group(1)) + m.group(2), text)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@dataclass(frozen=True)
class ServerAddress:
    """A Milvus server's address as parsed from a URI: what the client is given is ``url``,
    written from these fields, never the text the user typed."""

    scheme: str
    host: str
    port: int | None  # None: the client's default for the scheme
    database: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}" + (f":{self.port}" if self.port else "") + (
            f"/{self.database}" if self.database else "")


_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})")
_DATABASE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


def parse_server_uri(uri: str) -> ServerAddress:
    """A server URI (``http://host:19530``, ``https://host/db``) parsed into a ServerAddress, or a
    ConfigError naming what is malformed. The URI is masked first and only the masked text is
    read or quoted: credentials belong in the token variable, never in a URI."""
    masked = mask_uri(uri)
    scheme = _SCHEME.match(masked)
    if scheme is None or scheme.group(1).lower() not in ("http", "https", "tcp", "grpc"):
        raise ConfigError(f"uri={masked}: not a Milvus address; give http://host:19530 (a server) or a path ending "
                          "in .db (milvus-lite)", field="uri")
    rest = masked[scheme.end():]
    if rest.startswith("***@"):
        raise ConfigError(f"uri={masked}: credentials do not go in the URI (it is printed and kept in shell history); "
                          "export MILVUS_TOKEN=user:password (or --token-env VAR) and give the URI without them", field="uri")
    if any(c in rest for c in ";?#"):
        raise ConfigError(f"uri={masked}: a Milvus address has no ';', '?' or '#' part; give http://host:19530 "
                          "(a token goes in MILVUS_TOKEN)", field="uri")
    hostport, _, path = rest.partition("/")
    if hostport.startswith("["):
        host, closed, port_text = hostport[1:].partition("]")
        port_text = port_text.removeprefix(":") if port_text.startswith(":") or not port_text else "x"
        try:
            valid = bool(closed) and ipaddress.IPv6Address(host) is not None
        except ValueError:
            valid = False
    else:
        host, _, port_text = hostport.partition(":")
        valid = _HOST.fullmatch(host) is not None
    if not valid:
        raise ConfigError(f"uri={masked}: {host!r} is not a host name or address; give http://host:19530", field="uri")
    if port_text and not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ConfigError(f"uri={masked}: the port must be a number from 1 to 65535, e.g. http://HOST:19530", field="uri")
    database = path.strip("/")
    if database and not _DATABASE.fullmatch(database):
        raise ConfigError(f"uri={masked}: '/{database}' is not a Milvus database name (letters, digits, '_'); "
                          "give http://host:19530 or http://host:19530/DATABASE", field="uri")
    return ServerAddress(scheme.group(1).lower(), host.lower(), int(port_text) if port_text else None, database)


#: milvus-lite 2.5.1's own rule for a database file's name (the folder may hold any characters).
_LITE_NAME = re.compile(r"[A-Za-z0-9.\-_]{1,36}")
_SQLITE_HEADER = b"SQLite format 3\x00"


def check_lite_file(uri: str) -> None:
    """A milvus-lite file's name must be ASCII letters, digits, '.', '-', '_' (36 at most), and an
    existing file must be a milvus-lite database (an SQLite file): said in one line, before
    milvus-lite starts and fails with a traceback or a misleading lock error."""
    name = os.path.basename(uri)
    if not _LITE_NAME.fullmatch(name):
        why = "has a space" if " " in name else "is longer than 36 characters" if len(name) > 36 else \
            "has characters other than letters, digits, '.', '-' and '_'"
        raise ConfigError(f"uri={mask_uri(uri)}: the milvus-lite file name {name!r} {why}, which milvus-lite refuses; "
                          "rename it, e.g. codes.db (its folder may have any name)", field="uri")
    if os.path.isfile(uri) and os.path.getsize(uri) > 0:
        with open(uri, "rb") as f:
            head = f.read(len(_SQLITE_HEADER))
        if head != _SQLITE_HEADER:
            raise ConfigError(f"uri={mask_uri(uri)}: the file is not a milvus-lite database; give another .db path "
                              "(a new one is created by 'dhim-ray ingest')", field="uri")


def _check_reachable(uri: str, timeout: float) -> None:
    host, port = check_server_uri(uri)
    try:
        with socket.create_connection((host, port), timeout=min(timeout, 5.0)):
            return
    except OSError as exc:
        raise StoreUnreachableError(
            f"cannot reach Milvus at {mask_uri(uri)} ({exc.strerror or exc}); start the server or check uri"
        ) from exc


def _quiet_pymilvus() -> None:
    """pymilvus' stack-logging of refused calls and lite's clock warning, kept for DEBUG (set after its import)."""
    level = logging.DEBUG if logging.getLogger("dhim_ray").isEnabledFor(logging.DEBUG) else logging.CRITICAL
    for name in ("pymilvus.decorators", "pymilvus.client.abstract", "pymilvus.client.iterator.query_iterator"):
        logging.getLogger(name).setLevel(level)


def lite_path_error(uri: str) -> str:
    """Why ``uri``, read as a milvus-lite path, is not one (masked: it may be a mistyped URL)."""
    if looks_like_url(uri) or "@" in uri:
        return f"uri={mask_uri(uri)}: not a Milvus address; give http://host:19530 (a server, its token in " \
               "MILVUS_TOKEN) or a path ending in .db (milvus-lite)"
    return f"uri={mask_uri(uri)}: a milvus-lite file must end in .db, or give http://host:19530"


def check_lite_path(uri: str, create: bool = True) -> None:
    """What a milvus-lite URI must be before a server opens it (creating nothing): a .db
    name milvus-lite takes, in a folder that exists; ``create=False``: the file exists."""
    if looks_like_url(uri) or not uri.endswith(".db"):
        raise ConfigError(lite_path_error(uri), field="uri")
    check_lite_file(uri)
    if not create and not os.path.isfile(uri):
        raise StoreError(f"uri={mask_uri(uri)}: no such milvus-lite file; check the path or run 'dhim-ray ingest' first", field="uri")
    parent = os.path.dirname(os.path.abspath(uri))
    if not os.path.isdir(parent):
        raise StoreError(f"uri={mask_uri(uri)}: folder {parent} does not exist; create it or pick another path", field="uri")
    if create and not os.access(uri if os.path.exists(uri) else parent, os.W_OK):
        where = "the file" if os.path.exists(uri) else f"its folder {parent}"
        raise StoreReadOnlyError(f"uri={mask_uri(uri)}: {where} cannot be written (read-only); make it writable or ingest into "
                                 "a file elsewhere (uri=PATH)", field="uri")


def check_server_uri(uri: str) -> tuple[str, int]:
    """(host, port) of a server URI, or a ConfigError naming what is malformed (see parse_server_uri)."""
    address = parse_server_uri(uri)
    return address.host, address.port or 19530


def connect(uri: str, timeout: float = DEFAULT_TIMEOUT, token_env: str = "MILVUS_TOKEN", create: bool = True):
    """A MilvusClient for a milvus-lite file or a server URL. ``create=False``: a
    milvus-lite file must exist already (searching a mistyped path must not create one)."""
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    from pymilvus import MilvusClient

    _quiet_pymilvus()

    kwargs: dict[str, Any] = {}
    if is_lite(uri):
        check_lite_path(uri, create)
        guard_lite_locks()
        kwargs["grpc_options"] = LITE_GRPC_OPTIONS
    else:
        _check_reachable(uri, timeout)
        uri = parse_server_uri(uri).url  # what the client opens is written from the parse
        secret = os.environ.get(token_env)
        if secret:
            kwargs["token"] = secret
    # The wait for the channel: pymilvus' default is 10 s, which a milvus-lite server
    # starting on a loaded machine can pass.
    kwargs["timeout"] = timeout
    # A milvus-lite server now and then does not answer its first channel (seen once in a
    # full test run on a quiet machine): its process is released and started once more.
    attempts = 2 if is_lite(uri) else 1
    for attempt in range(attempts):
        try:
            with _quiet_lite():
                return MilvusClient(uri=uri, **kwargs)
        except Exception as exc:  # pymilvus raises MilvusException or plain errors
            message = first_line(exc)
            if is_lite(uri) and "open local milvus failed" in message.lower() and not _lock_held(uri):
                raise StoreError(f"uri={mask_uri(uri)}: milvus-lite stopped while opening the file (damaged or "
                                 f"truncated?); restore it from a copy or ingest into a new file (its log: "
                                 f"{LITE_SERVER_LOG})", field="uri") from exc
            if is_lite(uri) and "open local milvus failed" in message.lower():
                raise StoreBusyError(
                    f"uri={mask_uri(uri)}: the milvus-lite file is open in another process (one process per file); "
                    "stop it or use a Milvus server"
                ) from exc
            if attempt + 1 < attempts and "fail connecting" in message.lower():
                logger.debug("milvus-lite %s did not answer (%s); starting it again", uri, message)
                release(uri)
                continue
            where = "the milvus-lite file" if is_lite(uri) else "the server"
            raise StoreUnreachableError(f"cannot open Milvus at {mask_uri(uri)} ({message}); check {where} and "
                                        f"credentials (${token_env})") from exc
    raise AssertionError("unreachable")


#: Where milvus-lite's server process writes its own log (its C++ errors: a refused filter
#: expression, a missing file), unless dhim-ray's logger is at DEBUG (``-v``).
LITE_SERVER_LOG = os.path.join(tempfile.gettempdir(), "dhim-ray-milvus-lite.log")


def _with_server_log(start):
    """Run ``start`` with fds 1 and 2 on LITE_SERVER_LOG, so the server it launches writes there, not the terminal."""
    verbose = logging.getLogger("dhim_ray").isEnabledFor(logging.DEBUG)
    with stderr_to(None if verbose else LITE_SERVER_LOG, fds=(1, 2)):  # its errors go to stdout too
        return start()


def _lock_held(uri: str) -> bool:
    """Whether another process holds milvus-lite's lock on file ``uri`` (its ``.NAME.db.lock``)."""
    import fcntl

    path = os.path.join(os.path.dirname(os.path.abspath(uri)), f".{os.path.basename(uri)}.lock")
    try:
        with open(path, "a") as f:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(f, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def guard_lite_locks() -> None:
    """Only the process that took a milvus-lite file's lock removes it (once per process):
    milvus-lite 2.5.1 deletes ``.NAME.db.lock`` whenever a Server stops, also one refused because
    another process holds the file, which left the holder unprotected; wrapped, a server that
    never took the lock closes its handle and deletes nothing."""
    from milvus_lite.server import Server

    if getattr(Server, "_dhim_ray_guarded", False):
        return
    start, stop = Server.start, Server.stop

    def guarded_start(self) -> bool:
        ok = _with_server_log(lambda: start(self))
        # the lock is held once the server process was launched (whether or not it then stayed up)
        self._dhim_ray_holds_lock = self._p is not None
        return ok

    def guarded_stop(self) -> None:
        if getattr(self, "_dhim_ray_holds_lock", False):
            stop(self)
            self._dhim_ray_holds_lock = False
            return
        if self._lock_fd:  # opened to try the lock, never held: close it, remove nothing
            self._lock_fd.close()
            self._lock_fd = None

    Server.start, Server.stop = guarded_start, guarded_stop
    Server._dhim_ray_guarded = True


class _LiteChatter(logging.Filter):
    """Drops milvus-lite's root-logger lines about releasing or sharing a file: the caller says its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("No local milvus in path") or "has been opened by another program" in message
                    or message == "Start milvus-lite failed")


@contextlib.contextmanager
def _quiet_lite() -> Iterator[None]:
    quiet, root = _LiteChatter(), logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def release(uri: str) -> None:
    """Free a milvus-lite file's lock so another process may open it (close() does not)."""
    if not is_lite(uri):
        return
    from milvus_lite.server_manager import server_manager_instance

    with _quiet_lite():
        try:
            server_manager_instance.release_server(uri)  # it resolves the path itself
        except Exception as exc:  # a server already gone is fine; say so in the debug log
            logger.debug("release of milvus-lite %s: %s", uri, exc)
