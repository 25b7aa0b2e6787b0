"""The service's life in this process: checks before it listens (``check_listen``, ``preflight``),
``start_service`` (Ray, then Serve, then the app of jobs/serve.py) and ``stop_service`` (the
replicas drained first, so no request is cut short); ``dhim-ray serve`` runs them."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, replace
from typing import Any

from ray import serve

from dhim_ray.connectors.connection import is_lite, mask_uri
from dhim_ray.connectors.milvus import MilvusTarget
from dhim_ray.errors import ConfigError, check_range
from dhim_ray.search import Searcher

from .serve import (
    APP_NAME,
    DRAIN_ACTOR,
    DRAIN_NAMESPACE,
    DRAIN_POLL_S,
    GRACEFUL_STOP_S,
    QueryService,
    ServeOptions,
    check_replicas,
)

logger = logging.getLogger(__name__)


def preflight(options: ServeOptions) -> dict[str, Any]:
    """Open the model and collection once in this process (clear errors before Serve starts),
    then let go of them (a milvus-lite file opens in one process at a time)."""
    with Searcher(options.model_dir, MilvusTarget(options.uri, options.collection, token_env=options.token_env),
                  nprobe=options.nprobe) as s:
        return {"model": s.hasher.model_id, "n_bits": s.hasher.n_bits, "rows": s.count()}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_open(host: str, open_access: bool, allow_open: bool) -> None:
    """A service without a token listens on loopback only, unless ``allow_open``."""
    if open_access and not is_loopback(host) and not allow_open:
        raise ConfigError(f"host={host}: a service without a token on an address other hosts can reach; set "
                          "api_token_env=VAR (clients send Authorization: Bearer ...), or pass allow_open=True", field="host")


def check_listen(host: str, port: int, open_access: bool, allow_open: bool = False) -> None:
    """Refuse, before anything starts, what would serve the wrong thing or the wrong people:
    a port out of range, a host that is not an address of this machine, a port another
    process already listens on (a second service would share it and split the requests),
    and a service without a token on a non-loopback address unless ``allow_open``."""
    check_range("port", port, 1, 65535)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"host={host}: not an address of this machine ({exc}); use 127.0.0.1 or 0.0.0.0", field="host") from None
    check_open(host, open_access, allow_open)
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier run is fine
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
                raise ConfigError(f"port={port}: {host}:{port} is in use by another process (another service?); "
                                  "stop it or pick another port=N", field="port") from None
            raise ConfigError(f"host={host}: cannot listen there ({exc.strerror or exc}); use 127.0.0.1 or "
                              "0.0.0.0", field="host") from None


def start_service(options: ServeOptions, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
                  address: str | None = None, allow_open: bool = False) -> str:
    """Start Ray (or join ``address``) and the service; returns its base URL. ``serve.shutdown()``
    stops it. Serve's HTTP address is fixed when Serve first starts in a Ray cluster: a second
    service in the same cluster listens where the first did."""
    from .ray_env import cluster_address, init_ray

    check_replicas(options.uri, replicas)
    if cluster_address(address) is None:  # the proxy listens on this machine
        check_listen(host, port, not options.api_token_sha256, allow_open)
    else:  # on the cluster's nodes: the port cannot be probed from here, the rest still holds
        check_range("port", port, 1, 65535)
        check_open(host, not options.api_token_sha256, allow_open)
    if not options.api_token_sha256:  # an open service answers only to the names it is bound to
        options = replace(options, allowed_hosts=tuple(dict.fromkeys([*(options.allowed_hosts or ()), host])))
    preflight(options)
    init_ray(address)
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    serve.run(QueryService.options(num_replicas=replicas).bind(asdict(options)), name=APP_NAME, route_prefix="/",
              blocking=False)
    url = f"http://{host}:{port}"
    logger.debug("serving %s (%s) at %s: POST /search, POST /hash, GET /health", options.collection,
                mask_uri(options.uri), url)
    return url


def stop_service(and_ray: bool = False) -> bool:
    """Stop as a load balancer wants: new requests get 503 with Retry-After while the replicas finish
    theirs (up to GRACEFUL_STOP_S), then Serve stops (and, ``and_ray``, Ray). Returns False where Ray
    was already gone: the caller should then leave with ``os._exit`` (Ray's core worker would wait
    60 s for its dead cluster)."""

    import ray

    serve_stopped = threading.Event()

    def stop_serve() -> None:
        _drain()
        with contextlib.redirect_stdout(_Without(sys.stdout, "ServeController.graceful_shutdown failed")):
            serve.shutdown()
        serve_stopped.set()

    # The whole process group signalled (systemd, docker stop): Ray's own processes go too, and a
    # call to a dead cluster blocks; so Serve is stopped in a thread, watched while Ray answers.
    if _ray_alive():
        threading.Thread(target=stop_serve, daemon=True, name="dhim-ray-stop").start()
        while not serve_stopped.wait(0.5) and _ray_alive():
            pass
    if not serve_stopped.is_set():
        logger.debug("Ray is gone; the service stops without draining")
        return False
    if and_ray:
        ray.shutdown()
    return True


def _drain() -> None:
    """Tell every replica the service stops; wait (GRACEFUL_STOP_S) until each holds no request twice."""
    import ray

    @ray.remote(num_cpus=0)
    class Draining:
        def __init__(self):
            self.held: dict[str, int] = {}

        def report(self, replica: str, in_flight: int) -> None:
            self.held[replica] = in_flight

        def held_now(self) -> dict[str, int]:
            return dict(self.held)

    try:
        status = serve.status().applications.get(APP_NAME)
        replicas = status.deployments["QueryService"].replica_states.get("RUNNING", 0) if status else 0
    except Exception:  # Serve is not answering: nothing to wait for
        logger.debug("no Serve status; stopping without draining", exc_info=True)
        return
    if not replicas:
        return
    flag = Draining.options(name=DRAIN_ACTOR, namespace=DRAIN_NAMESPACE).remote()
    try:
        deadline, idle = time.monotonic() + GRACEFUL_STOP_S, 0
        while time.monotonic() < deadline and idle < 2:
            held = ray.get(flag.held_now.remote())
            idle = idle + 1 if len(held) >= replicas and not any(held.values()) else 0
            time.sleep(DRAIN_POLL_S)
        if idle < 2:
            logger.warning("requests still held after %d s; stopping anyway", GRACEFUL_STOP_S)
    finally:  # the replicas that saw it stay draining; a later service in this Ray must not see it (the
        ray.kill(flag)  # actor would also go with its last handle, but that hangs on whoever keeps one)


def _ray_alive() -> bool:
    """Whether the Ray this process joined still answers: its GCS port accepts a connection."""
    import ray

    if not ray.is_initialized():
        return False
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


class _Without:
    """A text stream passing every write on but those holding ``words``."""

    def __init__(self, stream, words: str):
        self.stream, self.words = stream, words

    def write(self, text: str) -> int:
        return len(text) if self.words in text else self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def serve_until_stopped(options: ServeOptions, host: str, port: int, replicas: int, address: str | None,
                        allow_open: bool, api_token_env: str | None, say=print) -> None:
    """``dhim-ray serve``: start the service, announce it beside a milvus-lite file (``dhim-ray search``
    asks it), serve until Ctrl-C or SIGTERM, then stop it cleanly; ``say`` prints its two lines."""
    import signal

    from .service_file import announce, withdraw

    stop = threading.Event()
    url = start_service(options, host, port, replicas, address, allow_open)
    if is_lite(options.uri):
        announce(options.uri, url, options.collection, options.model_dir, api_token_env, options.api_token_sha256)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # systemd, docker stop, kill: as Ctrl-C
    say(f"serving {options.collection} at {url}: a search page at {url}/ (POST /search, POST /hash, GET /health, "
        "GET /openapi.json); Ctrl-C stops")
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if is_lite(options.uri):
            withdraw(options.uri)
        ray_was_alive = stop_service(and_ray=True)
    say(f"stopped serving {options.collection}", err=True)  # not logged: ray.shutdown() has reset the loggers
    if not ray_was_alive:  # Ray's core worker would hold the process 60 s for its dead cluster
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
