"""Starting or joining a Ray cluster with the settings this stack needs, and the
resource arithmetic the Ray Data and Ray Train programs share."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

from dhim_ray.errors import ClusterError, ConfigError, DHIMRayError, first_line
from dhim_ray.stderr import stderr_to

logger = logging.getLogger(__name__)

#: Ray's own loggers: kept to errors unless the user asks for more (-v).
RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune", "ray.serve")
LOCAL_START_ATTEMPTS = 3


def cluster_address(address: str | None = None) -> str | None:
    """The Ray cluster to join: ``address``, else RAY_ADDRESS (set inside 'ray job
    submit'); None means a local Ray on this machine."""
    return address or os.environ.get("RAY_ADDRESS") or None


#: How often Ray Train's controller polls its workers (Ray's default: 2 s); bench ray_poll.
TRAIN_POLL_SECONDS = 0.25


def init_ray(address: str | None = None, num_cpus: int | None = None, verbose: bool | None = None) -> None:
    """Start a local Ray (address None) or join one ('auto', 'ray://host:10001', 'host:6379'). Ray's
    logs stay out of the terminal unless ``verbose`` (default: ``dhim-ray -v``); a local start that
    fails on a loaded machine is retried cleanly before giving up."""
    if verbose is None:
        verbose = logging.getLogger("dhim_ray").isEnabledFor(logging.DEBUG)
    if not verbose:  # Ray Data's advice for a corpus of fewer blocks than encoding actors: nothing to act on
        warnings.filterwarnings("ignore", message="The minimum number of concurrent actors", category=UserWarning)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Workers import torch and transformers; on a loaded 2-core box that can pass the
    # 60 s default and fail the group start.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
    # Ray Train's controller takes one report per worker each time it polls them, every 2 s by
    # default, and a worker's next report waits for the last: epochs shorter than that (a GPU, a
    # small corpus) ran 2 s apart (bench ray_poll). The driver's value reaches the controller.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(TRAIN_POLL_SECONDS))
    os.environ.setdefault("RAY_gcs_server_request_timeout_seconds", "120")
    address = cluster_address(address)
    if address is None:
        # A local Ray's node agent samples every process for the dashboard (off here): on a small
        # machine that took a share of a core from training.
        os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
        # Ray starts its workers 15 nice levels below the driver, starving them beside any busy
        # process (docs/experiments.md); a local run is the user's own command, so its workers
        # run at the user's priority (`nice dhim-ray ...` still works).
        os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    quiet_ray(verbose)
    if ray.is_initialized():
        return
    # Without -v Ray says nothing itself: a local start that fails and is retried, or a
    # dashboard process that does not come up (the CLI needs none), is not the user's news;
    # what does fail reaches them as this project's one line.
    kwargs = dict(include_dashboard=False, logging_level=logging.DEBUG if verbose else logging.CRITICAL,
                  log_to_driver=verbose, ignore_reinit_error=True)
    if address:
        # every worker process of the job binds torch.distributed's gloo to its node's address
        kwargs["runtime_env"] = {"worker_process_setup_hook": "dhim_ray.jobs.ray_env.bind_gloo_to_node"}
        if address != "auto":
            _check_address(address)
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(
                f"address={address}: cannot join the Ray cluster ({first_line(exc)}); "
                "start it with 'ray start --head' or check the address", field="address"
            ) from exc
    else:
        _start_local(num_cpus, kwargs)
    quiet_ray_data(verbose)
    if not verbose:
        try:
            _absorb_actor_restart_warning()
        except Exception as exc:  # cosmetic: never fail a run over it
            logger.debug("could not absorb Ray's actor-restart warning: %s", exc)


class _Idle:
    def __init__(self, _):
        pass


def _absorb_actor_restart_warning() -> None:
    """Spend Ray's once-a-process false alarm for actor pools (ray-project/ray#53727) away from the terminal."""
    # Ray's C++ core logs "has constructor arguments in the object store and max_restarts > 0" at
    # ERROR once per process, when the first such actor is submitted; no log level hides it. One
    # actor submitted here with fd 2 pointed elsewhere, then killed, spends it (-v leaves it alone).
    import ray

    with stderr_to(os.devnull):
        actor = ray.remote(num_cpus=0, max_restarts=1)(_Idle).remote(ray.put(None))
    ray.kill(actor, no_restart=True)


#: Where a local Ray's own processes (GCS, raylet, the workers they start) write their C++
#: stderr without -v: their stack dumps on shutdown ("*** SIGTERM received ...") are not news.
RAY_STDERR_LOG = os.path.join(tempfile.gettempdir(), "dhim-ray-ray-processes.log")


def _start_local(num_cpus: int | None, kwargs: dict) -> None:
    import ray

    last: Exception | None = None
    quiet = kwargs.get("logging_level", logging.ERROR) > logging.DEBUG
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            with stderr_to(RAY_STDERR_LOG if quiet else None):
                ray.init(num_cpus=num_cpus, **kwargs)
            return
        except Exception as exc:  # Ray raises bare Exception for a node that timed out
            last = exc
            logger.debug("starting a local Ray failed (attempt %d of %d): %s", attempt, LOCAL_START_ATTEMPTS,
                         first_line(exc))
            try:
                ray.shutdown()  # stops the half-started processes of this attempt
            except Exception as cleanup:
                logger.debug("ray.shutdown after a failed start: %s", cleanup)
            time.sleep(2 * attempt)
    raise ClusterError(
        f"could not start a local Ray on this machine after {LOCAL_START_ATTEMPTS} attempts ({first_line(last)}); "
        "the machine may be overloaded: retry when it is quieter, or start Ray yourself with "
        "'ray start --head' and pass --address auto"
    )


def _check_address(address: str) -> None:
    url = urlparse(address if "://" in address else f"ray://{address}")
    host, port = url.hostname, url.port or (10001 if address.startswith("ray://") else 6379)
    if not host:
        raise ClusterError(f"address={address!r}: expected 'auto', ray://host:10001 or host:6379", field="address")
    try:
        with socket.create_connection((host, port), timeout=5):
            return
    except OSError as exc:
        raise ClusterError(
            f"address={address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
            "start the cluster or check the address", field="address"
        ) from exc


def quiet_ray(verbose: bool = False) -> None:
    """Ray's own loggers silent (or at DEBUG with -v): errors that matter reach the user as
    exceptions, which the CLI prints in one line."""
    for name in RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.CRITICAL)


@contextlib.contextmanager
def task_errors():
    """An error raised inside a Ray task or actor arrives wrapped: a RayTaskError whose
    message carries the task's name, pid and traceback. A library error (a file that does
    not parse, a row without text) comes out as itself, its own one line; others pass as
    they are."""
    try:
        yield
    except Exception as exc:
        cause, seen = exc, 0
        # RayTaskError(DataError) is a DataError too: unwrap until the error the task raised
        while seen < 16 and (getattr(cause, "cause", None) is not None or
                             (not isinstance(cause, DHIMRayError) and cause.__cause__ is not None)):
            cause, seen = getattr(cause, "cause", None) or cause.__cause__, seen + 1
        if cause is exc or not isinstance(cause, DHIMRayError):
            raise
        # Ray Data appends its retry advice to the message ("\nFailed to apply UDF transform
        # after 1/1 attempts ... configure ray.data.DataContext"): the error is the user's data, not
        # a transient fault, so the line stays ours alone.
        raise type(cause)(str(cause).split("\nFailed to ")[0]) from None


def quiet_ray_data(verbose: bool = False) -> None:
    """Ray Data logs its plan and a progress block every 10 s; our own progress bars
    say the same in one line; a failed read task is logged with its whole stack, where the
    CLI says what was wrong in one line. (Importing ray.data configures its loggers: quiet
    them after.)"""
    from ray.data import DataContext

    quiet_ray(verbose)
    if not verbose:
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def check_gpus(workers: int, use_gpu: bool, available: float | None = None) -> None:
    """With use_gpu, one GPU per worker must exist (else the actors wait forever): in the
    running Ray cluster, or ``available`` when given (a local check before Ray starts)."""
    if not use_gpu:
        return
    if available is None:
        import ray

        available = ray.cluster_resources().get("GPU", 0)
    gpus = float(available)
    if gpus < workers:
        raise ClusterError(
            f"use_gpu with workers={workers}: the cluster has {gpus:g} GPUs; lower workers to {int(gpus)} "
            "or add GPU nodes (cluster.yaml)" if gpus else
            "use_gpu: the cluster has no GPUs; drop use_gpu=True or start GPU workers (cluster.yaml)"
        )


def check_capacity(workers: int, use_gpu: bool) -> None:
    """Workers (Ray Train workers, encoding actors) the running cluster cannot place would wait
    forever: at most one per CPU, and with use_gpu one GPU each, or a ClusterError naming both."""
    import ray

    check_gpus(workers, use_gpu)
    cpus = float(ray.cluster_resources().get("CPU", 0))
    if workers > max(1, int(cpus)):
        raise ClusterError(f"workers={workers}: the cluster has {cpus:g} CPUs and takes at most one worker per CPU; "
                           f"use at most {max(1, int(cpus))} or add nodes (cluster.yaml)", field="workers")


def bind_gloo_to_node() -> None:
    """Ray worker start-up hook (a cluster only): point gloo, torch.distributed's CPU transport, at
    the interface holding this node's Ray address. Left alone it takes the address the host
    name resolves to, which on many hosts (containers, namespaces) is 127.0.x.x: every other
    node's worker is then refused and multi-node training stops at its first collective."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    try:
        import socket

        import psutil
        import ray

        ip = ray.util.get_node_ip_address()
        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == ip for a in addresses) and not ip.startswith("127."):
                os.environ["GLOO_SOCKET_IFNAME"] = name
                return
    except Exception:  # a start-up hook must never stop a worker; gloo keeps its own choice
        logging.getLogger(__name__).debug("could not find the interface of this node's address", exc_info=True)


def cluster_cpus() -> float:
    import ray

    return max(1.0, float(ray.cluster_resources().get("CPU", 1)))


def actor_resources(workers: int) -> tuple[float, int]:
    """(CPUs each encoding actor asks for, torch threads it uses).

    Actors asking 1 CPU each on a small box leave nothing for Ray Data's other
    tasks and the pipeline hangs; one CPU always stays free. (Read and write tasks ask
    for none, jobs/read_tasks.READ_TASK: they run whatever else holds the CPUs.)
    """
    cpus = cluster_cpus()
    actor_cpus = max(0.1, min(1.0, (cpus - 1) / workers)) if cpus > 1 else 0.5 / workers
    return round(actor_cpus, 3), max(1, int(cpus // workers))


def _path_view(path: str, probe: str | None) -> str:
    """This node's view of ``path``: its top-level names and sizes, and whether ``probe`` is there."""
    folder = Path(path)
    if not folder.exists():
        return "missing"
    if folder.is_file():
        return f"file {folder.stat().st_size}"
    if probe is not None:
        return "probe seen" if (folder / probe).exists() else "probe not seen"
    return ";".join(sorted(f"{p.name}:{p.stat().st_size if p.is_file() else 'dir'}" for p in folder.iterdir()))


def check_shared_paths(paths: dict[str, tuple[str | Path, bool]]) -> None:
    """Refuse at once a path another node does not see as the driver does. ``paths``: {what the
    user named it: (path, written)}: a written path gets the driver's probe file, which every node
    must see; a read one must list the same files at the same sizes there. Nothing to check on
    one node. Raises ConfigError naming the node."""
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others or not paths:
        return
    view = ray.remote(num_cpus=0, max_retries=0)(_path_view)
    probes = {}
    for label, (path, written) in paths.items():
        if written:
            Path(path).mkdir(parents=True, exist_ok=True)
            probes[label] = f".dhim-ray-probe-{uuid.uuid4().hex[:12]}"
            (Path(path) / probes[label]).touch()
    try:
        for label, (path, _) in paths.items():
            probe = probes.get(label)
            want = "probe seen" if probe else _path_view(str(path), None)
            seen = ray.get([view.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                            .remote(str(path), probe) for node in others], timeout=120)
            for node, got in zip(others, seen):
                if got != want:
                    raise ConfigError(
                        f"{label} {path}: node {node['NodeManagerAddress']} does not see it as this machine does "
                        f"({'it sees no file written here' if probe else got if got == 'missing' else 'other files'}); "
                        "on a cluster every path must be on a file system all nodes mount (NFS, EFS): docs/cluster.md")
    finally:
        for label, probe in probes.items():
            (Path(paths[label][0]) / probe).unlink(missing_ok=True)


def tokeniser_resources(workers: int, actor_cpus: float) -> tuple[float, int]:
    """(CPUs each tokenising actor asks for, most such actors): the CPUs the encoding actors
    leave, at most one an actor, so the first one always fits."""
    free = cluster_cpus() - workers * actor_cpus
    cpus = round(min(1.0, max(0.1, free)), 3)
    return cpus, max(1, int(free // cpus))


def split_table(table, n_blocks: int) -> list:
    """Slices of a pyarrow table, one Ray Data block each (no repartition task needed)."""
    n_blocks = max(1, min(n_blocks, table.num_rows))
    step = -(-table.num_rows // n_blocks)
    return [table.slice(i, step) for i in range(0, table.num_rows, step)]
