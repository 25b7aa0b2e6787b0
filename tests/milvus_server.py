"""A real Milvus 2.3 standalone server from the PyPI package ``milvus``, for tests.

It listens on all interfaces, so it must run inside a network namespace of its own
(``tests/test_milvus_server.py`` arranges that). Every port is pinned: after a kill,
a port left in TIME_WAIT would otherwise move a component elsewhere and leave stale
etcd sessions that stop the next start. All of them lie below Linux's ephemeral range
(32768-60999), which the components' own loopback connections draw from: the root
coordinator's default, 53100, lies inside it and was refused once ("bind failed").
"""

from __future__ import annotations

from pathlib import Path

PORTS = dict(
    proxy_port=19530, proxy_internal_port=19529, query_coord_port=19531, query_node_port=21123,
    index_coord_port=22930, index_node_port=21121, data_coord_port=13333, data_node_port=21124,
    root_coord_port=23100, etcd_port=2379,
)
URI = f"http://127.0.0.1:{PORTS['proxy_port']}"
ROOT_TOKEN = "root:Milvus"  # the server's default login once authorization is on


def start_server(base_dir: str | Path, authorization: bool = True):
    """Start a server whose data lives under ``base_dir``; returns it (call ``stop()``)."""
    from milvus import MilvusServer, MilvusServerConfig

    server = MilvusServer(MilvusServerConfig(**PORTS))
    server.set_base_dir(str(base_dir))
    server.config.set("common.gracefulStopTimeout", 10)  # fast stop and reload
    server.config.set("common.session.ttl", 10)
    server.config.set("authorization_enabled", authorization)
    server.start()
    return server


if __name__ == "__main__":  # python tests/milvus_server.py DIR: a server until SIGTERM (a namespace's host)
    import signal
    import sys

    server = start_server(sys.argv[1], authorization=False)
    signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
    signal.pause()
