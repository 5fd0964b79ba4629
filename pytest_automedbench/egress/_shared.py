"""The egress proxy of this process: one for every cell the process runs.

A pytest worker (or a Slurm job) runs its cells one after another; they share one proxy,
started on the first cell that has a route out and stopped when the process exits. Each
cell gets its own socket on it (:meth:`EgressProxy.open_cell`), so every connection is
told apart by the socket it came in on, not by anything the agent says.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping

from pytest_automedbench.egress._server import EgressProxy

_lock = threading.Lock()
_proxies: dict[tuple[tuple[str, str], ...], EgressProxy] = {}


def shared_proxy(hosts: Mapping[str, str] | None = None) -> EgressProxy:
    """The process's proxy for this static host map (started on first use)."""
    key = tuple(sorted((hosts or {}).items()))
    with _lock:
        proxy = _proxies.get(key)
        if proxy is None:
            proxy = EgressProxy(hosts=dict(key))
            proxy.start()
            atexit.register(proxy.stop)
            _proxies[key] = proxy
        return proxy
