"""Queries from any application: a Ray Serve HTTP service that hashes texts with a trained model
and searches the collection ingested with it: ``POST /search``, ``POST /hash``, ``GET /`` (a
search page), ``/info``, ``/health``, ``/openapi.json`` (docs/serve.md). Concurrent requests share encoder
passes (``@serve.batch``); a bad request gets one JSON error (4xx), Milvus trouble a 503 with
Retry-After. ``build_app`` is the import path for ``serve deploy``; jobs/service_life.py starts and stops it."""


import asyncio
import functools
import hashlib
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from importlib import resources
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from dhim_ray.connectors.connection import is_lite, mask_uri
from dhim_ray.connectors.filters import Filter
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.corpus.text import check_texts, not_text
from dhim_ray.errors import ConfigError, DataError, DHIMRayError, StoreError, check_range
from dhim_ray.hasher import Hasher
from dhim_ray.retrieval.fusion import MODES
from dhim_ray.retrieval.rerank import MAX_RERANK
from dhim_ray.search import Searcher, SearchRequest

from .http_guard import MAX_BODY_BYTES, RequestGuard, host_allowed, origin_allowed, token_matches

logger = logging.getLogger(__name__)

#: The search page at GET /: one file, no build step, nothing loaded from elsewhere.
PAGE = (resources.files("dhim_ray.jobs") / "page.html").read_text(encoding="utf-8")

#: Texts in one request, characters in one text, hits per text (the re-rank factor is the library's).
MAX_TEXTS = 256
MAX_TEXT_CHARS = 100_000
MAX_K = 1000
#: Seconds a client is told to wait before retrying while Milvus is unreachable.
RETRY_AFTER_S = 5
APP_NAME = "dhim-ray"
#: Seconds a stopping replica waits for the requests it holds to finish.
GRACEFUL_STOP_S = 60
#: The actor whose existence tells the replicas the service is stopping (they answer new
#: requests 503 and report what they still hold), and how often a replica looks for it.
DRAIN_ACTOR, DRAIN_NAMESPACE = "dhim-ray-draining", "dhim-ray"
DRAIN_POLL_S = 0.2
#: Seconds /health waits for Milvus' row count before answering 503 (a hung server).
HEALTH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServeOptions:
    """What a service replica needs, as plain values that travel to the replicas.
    ``api_token_sha256``: the bearer token's sha256 ("" serves without one); ``allowed_hosts``: the
    names a request's Host may give besides addresses and localhost (None: any, with a token);
    ``max_batch_size`` 1 turns dynamic batching off."""

    model_dir: str
    uri: str
    collection: str
    token_env: str = "MILVUS_TOKEN"
    nprobe: int | None = None
    api_token_sha256: str = ""
    max_batch_size: int = 32
    batch_wait_s: float = 0.005
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_range("max_batch_size", self.max_batch_size, 1, 1024, example=32)
        if not 0 <= self.batch_wait_s <= 1:
            raise ConfigError(f"batch_wait_s={self.batch_wait_s}: must be between 0 and 1 second", field="batch_wait_s")


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: A variable's name as people write one (DHIM_RAY_API_TOKEN): echoed; any other may be a token itself.
_CONVENTIONAL = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")


def token_digest(token_env: str | None) -> str:
    """The sha256 of the bearer token in environment variable ``token_env`` ("" for None;
    an empty name is a mistake, not a request for no token)."""
    if token_env is None:
        return ""
    if not token_env.strip():
        raise ConfigError("api_token_env='': an empty variable name; name the variable holding the token "
                          "(e.g. DHIM_RAY_API_TOKEN), or leave the option out to serve without one", field="api_token_env")
    if not _VARIABLE.fullmatch(token_env):  # most likely the token itself: never echoed
        raise ConfigError("api_token_env: takes the NAME of an environment variable holding the token (letters, "
                          "digits, '_'; the value given is not shown), e.g. export DHIM_RAY_API_TOKEN=... then "
                          "--api-token-env DHIM_RAY_API_TOKEN", field="api_token_env")
    token = os.environ.get(token_env, "")
    if not token:
        named = token_env if _CONVENTIONAL.fullmatch(token_env) and sum(c.isdigit() for c in token_env) < 4 else None
        raise ConfigError(f"api_token_env{'=' + named if named else ''}: the environment variable is not set or empty"
                          f"{'' if named else ' (its name is not echoed: it may be a token)'}; export it, or leave the "
                          "option out to serve without a token", field="api_token_env")
    return hashlib.sha256(token.encode()).hexdigest()


# ---- requests -----------------------------------------------------------------------------
class _ServiceBounds(BaseModel):
    """What the service bounds on top of the library's own checks: a text's length and k."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("texts", check_fields=False)
    @classmethod
    def _each_text(cls, texts: list[str] | None) -> list[str] | None:
        for i, t in enumerate(texts or ()):
            if len(t) > MAX_TEXT_CHARS:
                raise ValueError(f"texts[{i}] has {len(t)} characters: at most {MAX_TEXT_CHARS}")
        return texts

    @field_validator("k", check_fields=False)
    @classmethod
    def _k(cls, k: int) -> int:
        if not 1 <= k <= MAX_K:
            raise ValueError(f"must be between 1 and {MAX_K:,} (hits per text), not {k}")
        return k


class HashRequest(_ServiceBounds):
    texts: list[str] = Field(min_length=1, max_length=MAX_TEXTS,
                             description=f"1 to {MAX_TEXTS} texts, each 1 to {MAX_TEXT_CHARS} characters")

    @field_validator("texts")
    @classmethod
    def _words(cls, texts: list[str]) -> list[str]:
        for i, t in enumerate(texts):
            if why := not_text(t, f"texts[{i}]"):
                raise ValueError(why)
            if not t.strip():
                raise ValueError(f"texts[{i}] is empty or whitespace: give some words")
        return texts


#: The service's words and bounds on ``SearchRequest``'s fields; a field not named here travels as its type says.
_FIELD_POLICY: dict[str, dict[str, Any]] = {
    "texts": dict(min_length=1, max_length=MAX_TEXTS,
                  description=f"1 to {MAX_TEXTS} texts, each 1 to {MAX_TEXT_CHARS} characters (or like)"),
    "like": dict(min_length=1, max_length=MAX_TEXTS, description=(
        "more like these stored rows: their ids (a hit's id) or their own ids (ingest --id-column), instead of "
        "texts; each row itself is left out")),
    "k": dict(description=f"hits per text, 1 to {MAX_K}"),
    "rerank": dict(description=f"re-rank k x rerank Hamming candidates (1 = off), at most {MAX_RERANK}"),
    "filter": dict(max_length=4096, description="a Milvus boolean expression over the stored fields, e.g. label == 3"),
    "max_distance": dict(description="every row within this many bits (up to k)"),
    "mode": dict(json_schema_extra={"enum": list(MODES)}, description=(
        "codes (Hamming distance), text (BM25 over the stored text) or hybrid (both fused); default: hybrid where "
        "the collection has a text index")),
    "fields": dict(description="the stored fields each hit carries (default: all)"),
}


def _as_json(hint: Any) -> Any:
    """A ``SearchRequest`` field's type as JSON carries it: a tuple is a list, a parsed Filter its text."""
    if get_origin(hint) is tuple:
        return list[get_args(hint)[0]] | None
    if get_origin(hint) in (Union, UnionType):
        return Union[tuple(_as_json(a) for a in get_args(hint) if a is not Filter)]
    return hint


def _body_of(request: type) -> type[BaseModel]:
    """A request dataclass's JSON body: its fields, types and defaults, the service's policy on top."""
    hints = get_type_hints(request)
    return create_model("SearchBody", __base__=_ServiceBounds, __doc__="``SearchRequest``'s fields as JSON.", **{
        f.name: (_as_json(hints[f.name]), Field(None if get_origin(hints[f.name]) is tuple else f.default,
                                                **_FIELD_POLICY.get(f.name, {}))) for f in dataclass_fields(request)})


SearchBody = _body_of(SearchRequest)


def _refused(exc: Exception) -> JSONResponse:
    """A 422 naming the body's field the refusal is about (``exc.field``), else the texts."""
    message, field = str(exc), getattr(exc, "field", None)
    if field not in SearchBody.model_fields:
        message, field = f"texts: {message}", "texts"
    return _error(422, message, field)


def _error(status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"error": message, **({"field": field} if field else {})}
    return JSONResponse(body, status_code=status, headers=headers)


# No /docs: FastAPI's page loads Swagger UI from a CDN, blank offline; /openapi.json is the schema.
app = FastAPI(title="dhim-ray query service", docs_url=None, redoc_url=None,
              description="Hash texts with a DHIM model and search its Milvus collection by Hamming distance.")


def _replica_guard() -> dict[str, Any]:
    """What the guard checks: the settings of the replica serving this process (Serve's replica context)."""
    return serve.get_replica_context().servable_object.guard


app.add_middleware(RequestGuard, settings=_replica_guard)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else "bad request"
    if exc.status_code == 400:
        cause = exc.__cause__
        detail = "body: a number of more than 4,300 digits; send ordinary JSON numbers" if isinstance(
            cause, ValueError) and "digits" in str(cause) else \
            "body: not valid JSON in UTF-8; send a JSON object such as {\"texts\": [\"a query\"]}"
    return _error(exc.status_code, detail, "body" if exc.status_code == 400 else None, headers=exc.headers)


@app.exception_handler(RequestValidationError)
async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    sent = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if request.method == "POST" and sent != "application/json":  # a form, XML, text/plain: FastAPI reads no JSON
        return _error(415, f"content-type: {sent or 'none'} is not JSON; send the body as JSON with "
                           "Content-Type: application/json", "content-type")
    if first.get("type") in ("json_invalid", "json_type"):
        return _error(400, "body: not valid JSON; send a JSON object such as {\"texts\": [\"a query\"]}", "body")
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    return _error(422, f"{field}: {message}", field)


@app.exception_handler(RecursionError)
async def _too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
    return _error(400, "body: JSON nested too deeply; send a flat object such as {\"texts\": [\"a query\"]}", "body")


@app.exception_handler(Exception)
async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.error("request failed", exc_info=exc)
    return _error(500, f"internal error ({type(exc).__name__}); the service keeps running")


def _watch_for_drain(guard: dict[str, Any]) -> None:
    """Once ``stop_service`` made the drain actor: refuse new requests, report those still held."""
    import ray

    replica = serve.get_replica_context().replica_tag
    while True:
        time.sleep(DRAIN_POLL_S)
        try:
            drain = ray.get_actor(DRAIN_ACTOR, namespace=DRAIN_NAMESPACE)
        except ValueError:  # not stopping
            continue
        except Exception:  # Ray itself is going
            return
        guard["draining"] = True
        drain.report.remote(replica, guard["in_flight"])


class MilvusDown(Exception):
    """Milvus could not answer: a 503 with a retry hint."""


#: Requests one replica holds at once. Serve's default (5) is below a batch: the router would
#: hold the rest back and retry them with growing back-off, and under 32 clients throughput fell
#: to a fifth of 8 clients'.
MAX_ONGOING_REQUESTS = 256
#: Seconds between asking which collection a served alias points at (ingest --alias).
ALIAS_CHECK_S = 2.0
#: A request of more texts than LANE_TEXTS, or of more than LANE_WORK texts x k, is large: it is
#: hashed and searched in a lane of its own, one large request at a time per replica, so a small
#: one never waits behind a large one's encoder pass or text search (bench/serve_load.py, mixed).
LANE_TEXTS, LANE_WORK = 8, 2000


def is_large(n_texts: int, k: int = 1) -> bool:
    """Whether a request of ``n_texts`` texts (or ids) and ``k`` hits each goes to the large lane."""
    return n_texts > LANE_TEXTS or n_texts * k > LANE_WORK


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=MAX_ONGOING_REQUESTS,
                  graceful_shutdown_wait_loop_s=0.5, graceful_shutdown_timeout_s=GRACEFUL_STOP_S)
@serve.ingress(app)
class QueryService:
    """One replica: the model loaded once, the collection opened lazily and reopened after
    a failure, concurrent requests' texts hashed together."""

    def __init__(self, options: dict):
        self.options = ServeOptions(**options)
        self.guard = {"api_token_sha256": self.options.api_token_sha256, "max_body_bytes": MAX_BODY_BYTES,
                      "allowed_hosts": self.options.allowed_hosts, "draining": False, "in_flight": 0,
                      "retry_after_s": RETRY_AFTER_S}
        self.hasher = Hasher.load(self.options.model_dir)
        self.target = MilvusTarget(self.options.uri, self.options.collection, token_env=self.options.token_env)
        self.searcher: Searcher | None = None
        self._checked = 0.0  # when the served name was last resolved (aliases)
        self._lock = asyncio.Lock()
        self._large = ThreadPoolExecutor(1, thread_name_prefix="dhim-ray-large")  # the large requests' lane
        self.passes = self.requests = 0  # encoder passes, and the requests they served
        self._encode_batch.set_max_batch_size(self.options.max_batch_size)
        self._encode_batch.set_batch_wait_timeout_s(self.options.batch_wait_s)
        threading.Thread(target=_watch_for_drain, args=(self.guard,), daemon=True).start()

    # ---- plumbing ------------------------------------------------------------------------
    def _authorised(self, request: Request) -> bool:
        """Checked again beside the guard, so a deployment without it still refuses."""
        host = request.headers.get("host", "")
        return token_matches(request.headers.get("authorization", ""), self.options.api_token_sha256) and \
            host_allowed(host, self.options.allowed_hosts) and origin_allowed(request.headers.get("origin"), host)

    async def _searcher(self) -> Searcher:
        """The open Searcher; every ALIAS_CHECK_S, a moved alias's Searcher replaces it once ready."""
        async with self._lock:
            try:
                if self.searcher is None:
                    self.searcher = await asyncio.to_thread(self._open_searcher)
                    self._checked = time.monotonic()
                elif time.monotonic() - self._checked > ALIAS_CHECK_S:
                    self._checked = time.monotonic()
                    try:
                        moved = await asyncio.to_thread(self._follow_alias, self.searcher)
                    except DHIMRayError as exc:  # the new collection's model cannot be loaded: keep the old pair
                        logger.warning("%s moved but cannot be followed (%s); still serving %s",
                                       self.options.collection, exc, self.searcher.info.name)
                        moved = None
                    if moved is not None:
                        old, self.searcher = self.searcher, moved
                        await asyncio.to_thread(old.close)
            except StoreError as exc:
                raise MilvusDown(str(exc)) from exc
            self.hasher = self.searcher.hasher
            return self.searcher

    def _open_searcher(self) -> Searcher:
        """A Searcher of what the served name points at, with the model that collection was ingested with."""
        hasher, model_dir = self.hasher, self.options.model_dir
        if not self.target.lite:  # a milvus-lite file has no aliases
            with self.target.open(create=False) as collection:
                info = collection.describe()
            named = info.meta.get("model_dir") if info is not None else None
            if info is not None and info.model and info.model != hasher.model_id and named:
                hasher, model_dir = Hasher.load(named), named
                logger.info("%s now holds codes of %s: loaded %s", self.options.collection, info.model, named)
        return Searcher(model_dir, self.target, hasher=hasher, nprobe=self.options.nprobe)

    def _follow_alias(self, searcher: Searcher) -> Searcher | None:
        """A Searcher of the collection the served alias points at now, or None where it did not move."""
        if self.target.lite or searcher.pointed_at() == searcher.info.name:
            return None
        return self._open_searcher()

    async def _drop_searcher(self) -> None:
        async with self._lock:
            if self.searcher is not None:
                searcher, self.searcher = self.searcher, None
                try:
                    await asyncio.to_thread(searcher.close)
                except Exception:  # a connection already gone
                    logger.debug("closing a failed Milvus connection", exc_info=True)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _encode_batch(self, requests: list[tuple[Hasher, list[str], bool]]) -> list[tuple[Any, Any]]:
        """The waiting requests' texts in one encoder pass per model; scores where any re-ranks."""
        out: list[Any] = [None] * len(requests)
        by_model: dict[int, list[int]] = {}
        for i, (hasher, _, _) in enumerate(requests):
            by_model.setdefault(id(hasher), []).append(i)
        for members in by_model.values():
            hasher = requests[members[0]][0]
            flat = [t for i in members for t in requests[i][1]]
            self.passes, self.requests = self.passes + 1, self.requests + len(members)
            if any(requests[i][2] for i in members):
                codes, scores, _ = await asyncio.to_thread(hasher.encode, flat, scores=True, prepared=True)
            else:
                codes, scores = await asyncio.to_thread(hasher.encode, flat, prepared=True), None
            start = 0
            for i in members:
                stop = start + len(requests[i][1])
                out[i] = (codes[start:stop], None if scores is None else scores[start:stop])
                start = stop
        return out

    async def _encode(self, hasher: Hasher, texts: list[str], scores: bool, large: bool) -> tuple[Any, Any]:
        """``texts``' codes (and scores): a small request's in the shared pass, a large one's alone in its lane."""
        if not large:
            return await self._encode_batch((hasher, texts, scores))
        done = await asyncio.get_running_loop().run_in_executor(
            self._large, functools.partial(hasher.encode, texts, scores=scores, prepared=True))
        return (done[0], done[1]) if scores else (done, None)

    def _milvus_down(self, exc: Exception) -> JSONResponse:
        """A 503 that tells the client when to retry and nothing of where the store lives (the log has it)."""
        logger.warning("Milvus at %s is not answering: %s", mask_uri(self.options.uri), str(exc)[:200])
        return _error(503, f"the collection's store is not answering; retry in {RETRY_AFTER_S} s",
                      headers={"Retry-After": str(RETRY_AFTER_S)})

    # ---- routes --------------------------------------------------------------------------
    @app.post("/search")
    async def search(self, body: SearchBody, request: Request):
        """The k nearest rows per text: ``Searcher.run`` on the body's ``SearchRequest``."""
        if not self._authorised(request):
            return _error(401, "authorization: missing or wrong bearer token", "authorization")
        try:
            search = SearchRequest(**body.model_dump())
            hasher = self.hasher  # empty after cleaning: a 422, alone, before Milvus is asked
            texts = check_texts(list(search.texts), hasher.config.features) if search.texts else None
        except (ConfigError, DataError) as exc:
            return _refused(exc)
        try:
            searcher = await self._searcher()  # the model comes with the collection (an alias may move)
            if texts and searcher.hasher is not hasher:  # moved to another model: cleaned by its rules
                texts = check_texts(list(search.texts), searcher.hasher.config.features)
            large = is_large(len(search.texts or search.like), search.k)
            encoded = await self._encode(searcher.hasher, texts, search.rerank > 1, large) if texts else None
            t0 = time.perf_counter()
            result = await asyncio.get_running_loop().run_in_executor(
                self._large if large else None, searcher.run, search, encoded)
        except (ConfigError, DataError) as exc:  # a filter Milvus refuses, an id the collection lacks
            return _refused(exc)
        except (MilvusDown, StoreError) as exc:
            await self._drop_searcher()
            return self._milvus_down(exc)
        incomplete = await asyncio.to_thread(searcher.incomplete)
        return {"results": result.hits, "n_bits": searcher.hasher.n_bits, "collection": self.options.collection,
                "mode": result.mode, "search_ms": round((time.perf_counter() - t0) * 1e3, 2),
                **({"warning": incomplete} if incomplete else {})}

    @app.post("/hash")
    async def hash_texts(self, body: HashRequest, request: Request):
        """Packed codes (most significant bit first) as hex: query Milvus with any SDK."""
        if not self._authorised(request):
            return _error(401, "authorization: missing or wrong bearer token", "authorization")
        try:
            codes, _ = await self._encode(self.hasher, check_texts(body.texts, self.hasher.config.features), False,
                                          is_large(len(body.texts)))
        except DataError as exc:
            return _error(422, f"texts: {exc}", "texts")
        return {"n_bits": self.hasher.n_bits, "model": self.hasher.model_id, "codes": [c.tobytes().hex() for c in codes]}

    @app.get("/", response_class=HTMLResponse)
    async def page(self):
        """A search page: a query, k, a filter and the mode; the hits, "more like this" on each."""
        return HTMLResponse(PAGE, headers={"Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; "
                                                                       "script-src 'unsafe-inline'; frame-ancestors 'none'",
                                                 "X-Frame-Options": "DENY"})

    @app.get("/info")
    async def info(self, request: Request):
        """What the page shows and offers: the model, the collection, its size, the search modes
        and the kept columns."""
        if not self._authorised(request):
            return _error(401, "authorization: missing or wrong bearer token", "authorization")
        try:
            searcher = await self._searcher()
            rows = await asyncio.to_thread(searcher.count)
            incomplete = await asyncio.to_thread(searcher.incomplete)
        except (MilvusDown, StoreError) as exc:
            await self._drop_searcher()
            return self._milvus_down(exc)
        modes = ["hybrid", "codes", "text"] if searcher.has_text_index else ["codes"]
        folder = searcher.hasher.info.path.name if searcher.hasher.info is not None else searcher.hasher.model_id
        return {"model": searcher.hasher.model_id, "model_name": folder, "n_bits": searcher.hasher.n_bits,
                "collection": self.options.collection, "rows": rows, "text_index": searcher.has_text_index,
                "modes": modes, "default_mode": searcher.resolve_mode(None), "columns": list(searcher.info.columns),
                "filter_fields": searcher.filter_fields, **({"warning": incomplete} if incomplete else {})}

    @app.get("/health")
    async def health(self):
        """The model and collection served, with its row count; 503 while Milvus is down."""
        try:
            searcher = await asyncio.wait_for(self._searcher(), HEALTH_TIMEOUT_S)
            rows = await asyncio.wait_for(asyncio.to_thread(searcher.count), HEALTH_TIMEOUT_S)
            incomplete = await asyncio.wait_for(asyncio.to_thread(searcher.incomplete), HEALTH_TIMEOUT_S)
        except TimeoutError:  # a hung server: answer now; the stuck call ends with its own timeout
            return self._milvus_down(TimeoutError(f"no answer within {HEALTH_TIMEOUT_S:g} s"))
        except Exception as exc:  # MilvusDown, StoreError, or whatever a broken connection raises
            await self._drop_searcher()
            return self._milvus_down(exc)
        return {"status": "ok", "model": self.hasher.model_id, "n_bits": self.hasher.n_bits,
                "collection": self.options.collection, "rows": rows, "text_index": searcher.has_text_index,
                "complete": incomplete is None, **({"warning": incomplete} if incomplete else {}),
                "encoder": {"passes": self.passes, "requests": self.requests,
                            "max_batch_size": self.options.max_batch_size}}


def build_app(args: dict[str, Any]):
    """The Serve application, for ``serve run``/``serve deploy`` (see serve.yaml): ``args`` are
    ServeOptions' fields plus ``replicas`` and ``api_token_env`` (the variable holding the token)."""
    args = dict(args)
    replicas = int(args.pop("replicas", 1))
    api_token_env = args.pop("api_token_env", None)
    options = ServeOptions(**args, api_token_sha256=token_digest(api_token_env))
    if not options.api_token_sha256:  # open: only to addresses, localhost and the names given
        options = replace(options, allowed_hosts=tuple(options.allowed_hosts or ()))
    check_replicas(options.uri, replicas)
    return QueryService.options(num_replicas=replicas).bind(asdict(options))


def check_replicas(uri: str, replicas: int) -> None:
    if isinstance(replicas, bool) or replicas < 1:
        raise ConfigError(f"replicas={replicas}: must be >= 1", field="replicas")
    if replicas > 1 and is_lite(uri):
        raise ConfigError(f"replicas={replicas}: a milvus-lite file ({uri}) opens in one process only; "
                          "serve one replica, or use a Milvus server (uri=http://host:19530) to scale", field="replicas")
