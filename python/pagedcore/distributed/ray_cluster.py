"""Joining the Ray cluster the user started (`ray start --head`, then `ray start --address HEAD:PORT`
on every other node), for --distributed-executor-backend ray. pagedcore never starts or stops a
cluster itself: it connects as a driver (RAY_ADDRESS, else "auto": the cluster started on this
machine) and leaves it running.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading

logger = logging.getLogger(__name__)

_START_HINT = ("start one with `ray start --head` on this machine (and `ray start --address HEAD_IP:6379` on every "
               "other node), or point RAY_ADDRESS at a running cluster")
_join_lock = threading.Lock()   # data-parallel replicas start their executors on parallel threads


def check_ray_installed() -> None:
    """ValueError naming the fix when `ray` cannot be imported (before any weight loads)."""
    if importlib.util.find_spec("ray") is None:
        raise ValueError("--distributed-executor-backend ray needs the `ray` package: pip install 'ray==2.60.0' "
                         "(or pip install 'pagedcore[ray]'), or use --distributed-executor-backend mp")


def cluster_address() -> str:
    return os.environ.get("RAY_ADDRESS") or "auto"


def join_cluster():
    """Connects this process to the running cluster once (idempotent, thread-safe); returns the ray module.
    ValueError naming `ray start --head` when no cluster is reachable."""
    check_ray_installed()
    import ray

    with _join_lock:
        if ray.is_initialized():
            return ray
        address = cluster_address()
        _check_reachable(address)
        # Ray's C++ failure-signal handler takes over SIGTERM: the server's drain then ends in an abort
        # (exit 134) instead of exit 0. Our own handlers already report what matters.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        try:
            # log_to_driver off: the ranks' logs stay in the cluster's session folder, not in the server's.
            ray.init(address=address, namespace="pagedcore", log_to_driver=False, include_dashboard=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ValueError(f"--distributed-executor-backend ray: no Ray cluster reachable at {address!r} ({error}); "
                             f"{_START_HINT}") from None
    resources = ray.cluster_resources()
    logger.info("joined the Ray cluster at %s: %d node(s), %s CPU(s)", address, len(ray.nodes()),
                resources.get("CPU", 0))
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A HOST:PORT address must accept a TCP connection: ray.init retries an unreachable one for minutes."""
    host, sep, port = address.rpartition(":")
    if address in ("auto", "local") or address.startswith("ray://") or not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as error:
        raise ValueError(f"--distributed-executor-backend ray: no Ray cluster reachable at {address!r} "
                         f"({error.strerror or error}); {_START_HINT}") from None


def node_ip() -> str:
    """This process's node address as Ray names it (ranks with the driver's address share its machine)."""
    import ray

    return ray.util.get_node_ip_address()
