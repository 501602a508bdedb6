"""``ray start`` kept on 127.0.0.1, for a cluster of several nodes on one machine: ``python -m tests._ray_node ARGS``.

It runs Ray's own ``ray start`` command (``ray.scripts.scripts.main``) with
one change. For a node of a multi-node cluster, Ray replaces a node address of
``127.0.0.1`` with the machine's own address
(``ray._private.services.resolve_ip_for_localhost``), so every server of the
node (GCS, raylet, agents, workers) would listen on the machine's network
interface. Tests listen on 127.0.0.1 only: here that replacement is off, and
the address given (``--node-ip-address=127.0.0.1``) is the one the node uses.
"""

from __future__ import annotations

import sys

from ray._private import services
from ray.scripts.scripts import main


def _as_given(host: str) -> str:
    if not host:
        raise ValueError(f"Malformed host: {host}")
    return host


if __name__ == "__main__":
    services.resolve_ip_for_localhost = _as_given
    sys.argv = ["ray", "start", *sys.argv[1:]]
    sys.exit(main())
