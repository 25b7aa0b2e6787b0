"""Starting or joining a Ray cluster with the settings this stack needs."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from dhim_ray.errors import ClusterError


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start a local Ray (address None) or join one ('auto', 'ray://host:10001', 'host:6379').

    Local runs disable Ray 2.60's token auth (RAY_AUTH_MODE=disabled) and make
    Train's health checks frequent, which cuts per-report latency.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Workers import torch and transformers; on a loaded 2-core box that can pass the
    # 60 s default and fail the group start.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
    import ray

    if ray.is_initialized():
        return
    if address and address != "auto":
        _check_address(address)
    try:
        ray.init(
            address=address,
            num_cpus=num_cpus if not address else None,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=True,
            runtime_env=None,
            ignore_reinit_error=True,
        )
        quiet_ray_data()
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(
            f"--address {address}: cannot join the Ray cluster ({str(exc).splitlines()[0][:200]}); "
            "start it with 'ray start --head' or check the address"
        ) from exc


def _check_address(address: str) -> None:
    url = urlparse(address if "://" in address else f"ray://{address}")
    host, port = url.hostname, url.port or (10001 if address.startswith("ray://") else 6379)
    if not host:
        raise ClusterError(f"--address {address!r}: expected 'auto', ray://host:10001 or host:6379")
    try:
        with socket.create_connection((host, port), timeout=5):
            return
    except OSError as exc:
        raise ClusterError(
            f"--address {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
            "start the cluster or check the address"
        ) from exc


def cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def quiet_ray_data() -> None:
    """Ray Data logs its plan and a progress block every 10 s at INFO; our own
    progress bars say the same in one line, so keep Ray to warnings."""
    import logging

    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    for name in ("ray.data", "ray.train", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)
