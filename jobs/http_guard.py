"""The query service's front door: a plain ASGI middleware that answers what must never reach
the application, before a byte of the body is read: unknown routes (404), wrong methods (405),
an unknown ``Host`` or cross-site ``Origin`` (403), a header sent twice (400), a bad bearer token
(401), an encoded body (415), a body over the limit (413), a body not sent in time (408), a client
past its share of requests in flight (429), and 503 with Retry-After while the service stops."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: Bytes in one request body: 256 texts of 100,000 characters would need more, but a text
#: that long is a document to ingest, not a query.
MAX_BODY_BYTES = 16 * 1024 * 1024

#: Seconds a request's whole body may take to arrive: an idle or trickling body holds a slot no longer.
BODY_DEADLINE_S = 10.0
#: Requests one client address may have in flight on a replica (of its MAX_ONGOING_REQUESTS):
#: hundreds of idle connections from one client leave the other clients their slots.
MAX_CLIENT_REQUESTS = 64
#: Headers a request may send once only (a second Host or Origin must not pick which is checked).
_SINGLE = ("host", "origin", "authorization", "content-length", "content-encoding")

#: Route -> (methods, whether it needs the token).
ROUTES: dict[str, tuple[tuple[str, ...], bool]] = {
    "/search": (("POST",), True),
    "/hash": (("POST",), True),
    "/": (("GET",), False),  # the search page: it holds no data, and asks for the token
    "/info": (("GET",), True),
    "/health": (("GET",), False),
    "/openapi.json": (("GET",), False),
}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def token_matches(header: str, api_token_sha256: str) -> bool:
    """Whether an Authorization header carries the bearer token whose sha256 is given
    ("" accepts anything: a service without a token). Compared in constant time."""
    if not api_token_sha256:
        return True
    scheme, _, token = header.partition(" ")
    given = hashlib.sha256(token.strip().encode()).hexdigest()
    return scheme.lower() == "bearer" and hmac.compare_digest(given, api_token_sha256)


def _split_host(netloc: str) -> str:
    """The host of a ``host[:port]`` (``[v6]:port`` too), lower case, without a trailing dot."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0].rstrip(".") if netloc.count(":") == 1 else netloc.rstrip(".")


def host_allowed(host_header: str, allowed_hosts: list[str] | tuple[str, ...] | None) -> bool:
    """Whether a request's ``Host`` names this service: any address written out (a rebinding
    page's Host is its own domain name), ``localhost``, or one of ``allowed_hosts``; None: any."""
    if allowed_hosts is None:
        return True
    host = _split_host(host_header)
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return host == "localhost" or host.endswith(".localhost") or host in {h.lower().rstrip(".") for h in allowed_hosts}


def origin_allowed(origin: str | None, host_header: str) -> bool:
    """A browser's ``Origin`` must be the service's own (same host and port as ``Host``); a request
    without one (curl, an SDK) is not a page's."""
    if origin is None:
        return True
    scheme, sep, netloc = origin.strip().lower().partition("://")
    return bool(sep) and scheme in ("http", "https") and netloc == host_header.strip().lower()


async def send_error(send: Send, status: int, message: str, field: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": message, **({"field": field} if field else {})}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _CutOff(Exception):
    pass


class RequestGuard:
    """ASGI middleware: ``RequestGuard(app, api_token_sha256=..., max_body_bytes=..., allowed_hosts=..., ...)``.

    ``settings``, when given, is called at each request for the settings instead: a Serve
    replica's own (it knows its token only once made)."""

    def __init__(self, app, api_token_sha256: str = "", max_body_bytes: int = MAX_BODY_BYTES,
                 settings: Callable[[], dict[str, Any]] | None = None, allowed_hosts: tuple[str, ...] | None = None,
                 body_deadline_s: float = BODY_DEADLINE_S, max_client_requests: int = MAX_CLIENT_REQUESTS):
        self.app = app
        fixed = {"api_token_sha256": api_token_sha256, "max_body_bytes": max_body_bytes,
                 "allowed_hosts": allowed_hosts, "body_deadline_s": body_deadline_s,
                 "max_client_requests": max_client_requests}
        self.settings = settings or (lambda: fixed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.settings()
        if settings.get("draining"):  # a load balancer or client retries elsewhere, or here once it is back
            retry = str(settings.get("retry_after_s", 5))
            await send_error(send, 503, f"the service is stopping; retry in {retry} s", None,
                             {"Retry-After": retry, "Connection": "close"})
            return
        client = (scope.get("client") or ("?", 0))[0]
        per_client = settings.setdefault("per_client", {})
        limit = int(settings.get("max_client_requests", MAX_CLIENT_REQUESTS))
        if per_client.get(client, 0) >= limit:
            await send_error(send, 429, f"client: {limit} requests of this address are in flight already; wait for "
                                        "their answers", "client", {"Retry-After": "1", "Connection": "close"})
            return
        settings["in_flight"] = settings.get("in_flight", 0) + 1
        per_client[client] = per_client.get(client, 0) + 1
        try:
            await self._checked(scope, receive, send, settings)
        finally:
            settings["in_flight"] -= 1
            per_client[client] -= 1
            if not per_client[client]:
                del per_client[client]

    async def _checked(self, scope: Scope, receive: Receive, send: Send, settings: dict[str, Any]) -> None:
        path = scope.get("path", "")
        route = ROUTES.get(path.rstrip("/") or path)
        if route is None:
            await send_error(send, 404, f"{path}: no such route; the service has POST /search, POST /hash, "
                                        "GET /, GET /info, GET /health and GET /openapi.json", "path")
            return
        methods, protected = route
        if scope["method"] not in methods:
            await send_error(send, 405, f"{scope['method']} {path}: use {' or '.join(methods)}", "method",
                             {"Allow": ", ".join(methods)})
            return
        names = [k.decode("latin-1").lower() for k, _ in scope.get("headers", [])]
        twice = next((n for n in _SINGLE if names.count(n) > 1), None)
        if twice is not None:
            await send_error(send, 400, f"{twice}: sent twice; send it once", twice)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not host_allowed(host, settings.get("allowed_hosts")):
            await send_error(send, 403, f"host: the service is not known as {host[:80]!r}; use its address, or "
                                        "start it with --allow-host NAME", "host")
            return
        if not origin_allowed(headers.get("origin"), host):
            await send_error(send, 403, "origin: a page on another site may not use this service", "origin")
            return
        if protected and not token_matches(headers.get("authorization", ""),
                                           settings.get("api_token_sha256", "")):
            await send_error(send, 401, "authorization: missing or wrong bearer token", "authorization",
                             {"WWW-Authenticate": "Bearer"})
            return
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await send_error(send, 415, f"content-encoding: {encoding!r} is not accepted; send plain JSON",
                             "content-encoding")
            return
        limit = int(settings.get("max_body_bytes", MAX_BODY_BYTES))
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await send_error(send, 400, f"content-length: {declared!r} is not a number of bytes", "content-length")
                return
            if int(declared) > limit:
                await send_error(send, 413, f"body: {int(declared)} bytes; at most {limit}", "body")
                return
        await self._counted(scope, receive, send, limit, float(settings.get("body_deadline_s", BODY_DEADLINE_S)))

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int, deadline_s: float) -> None:
        """The app with a receive that stops a body at the limit (413) or at its deadline (408)."""
        seen, started, cut, done = 0, False, None, False
        deadline = asyncio.get_running_loop().time() + deadline_s

        async def counted_receive() -> Message:
            nonlocal seen, cut, done
            if done:  # the body is in: what follows is the client leaving, awaited without a deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                cut = (408, f"body: not received within {deadline_s:g} "
                                  "s; send the whole request at once", "body")
                raise _CutOff from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                done = not message.get("more_body", False)
                if seen > limit:
                    cut = (413, f"body: more than {limit} bytes", "body")
                    raise _CutOff
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if cut:  # the app's own answer to the cut-off body is replaced by the 413 or 408
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await send_error(send, *cut)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _CutOff:
            if not started:
                await send_error(send, *cut)
