"""The egress proxy: every route out of an agent sandbox, checked and recorded.

A sandbox has no network interface but its loopback, in every mode; with a route out
(``--sandbox-network allowlist`` or ``on``) the in-sandbox relay (``sandbox.egress``)
forwards its proxy port to a unix socket of this proxy, one per cell. The proxy decides
each connection by the cell's :class:`EgressPolicy` (host name first, then every address
it resolves to) and keeps a :class:`ConnectionRecord` of each.
"""

from pytest_automedbench.egress._rules import (
    DEFAULT_ALLOWLIST,
    NETWORK_MODES,
    Decision,
    EgressPolicy,
    EgressPolicyError,
    NetworkMode,
    normalise_host,
    normalise_pattern,
)
from pytest_automedbench.egress._server import (
    STATIC_ONLY_ENV,
    ConnectionRecord,
    EgressLease,
    EgressProxy,
)
from pytest_automedbench.egress._shared import shared_proxy

__all__ = [
    "DEFAULT_ALLOWLIST",
    "NETWORK_MODES",
    "STATIC_ONLY_ENV",
    "ConnectionRecord",
    "Decision",
    "EgressLease",
    "EgressPolicy",
    "EgressPolicyError",
    "EgressProxy",
    "NetworkMode",
    "normalise_host",
    "normalise_pattern",
    "shared_proxy",
]
