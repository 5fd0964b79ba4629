"""What a cell's agent may reach through the egress proxy: its mode, its hosts, addresses.

Two checks, in this order, for every connection:

1. **The name** (:meth:`EgressPolicy.host_decision`), before anything is resolved: a host
   that serves the task's data or labels is refused in every mode and flagged; in
   ``allowlist`` mode the host must match the allow-list.
2. **Every address** the name resolves to (:meth:`EgressPolicy.address_decision`), in
   every mode: never the host's loopback, the host's own addresses, private networks
   (the host's LAN), shared address space, link-local addresses (169.254.169.254, a
   cloud's metadata service), multicast or reserved ranges, unless a network of
   ``allow_networks`` holds the address (a LAN mirror, a test's server). The proxy
   connects to the address it checked, so a second lookup cannot change it.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import re
from dataclasses import dataclass
from typing import Literal

NetworkMode = Literal["off", "allowlist", "on"]
NETWORK_MODES: tuple[str, ...] = ("allowlist", "on", "off")

#: What a researcher's agent needs to set up: the Python package index and its files, the
#: PyTorch wheels, model hubs (Hugging Face and its CDN names), code and release assets on
#: GitHub, conda channels and the Debian/Ubuntu mirrors. Short on purpose: each entry is a
#: place answers could also be found, and a run adds its own (``--sandbox-allow-host``).
DEFAULT_ALLOWLIST: tuple[str, ...] = (
    "pypi.org",
    "files.pythonhosted.org",
    "download.pytorch.org",
    "huggingface.co",
    "*.huggingface.co",
    "hf.co",
    "*.hf.co",
    "github.com",
    "*.github.com",
    "*.githubusercontent.com",
    "conda.anaconda.org",
    "repo.anaconda.com",
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "ports.ubuntu.com",
)

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
#: Ranges refused in every mode (unless allowed), with the reason a record gives.
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")


class EgressPolicyError(ValueError):
    """A host pattern or network that cannot be used (the message names it)."""


def normalise_host(host: str) -> str:
    """A host as the proxy compares it: lower case, no trailing dot, IDNA-encoded (an IP
    literal in its canonical form, brackets removed); raises EgressPolicyError."""
    text = host.strip()
    bracketed = text.startswith("[") and text.endswith("]")
    if bracketed:
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        if bracketed:  # brackets hold an IPv6 address, never a name
            raise EgressPolicyError(f"{host!r} is not a host name") from None
    text = text.rstrip(".").lower()
    try:
        encoded = text.encode("idna").decode("ascii")
    except UnicodeError:
        raise EgressPolicyError(f"{host!r} is not a host name") from None
    labels = encoded.split(".")
    if not encoded or len(encoded) > 253 or not all(_LABEL.match(label) for label in labels):
        raise EgressPolicyError(f"{host!r} is not a host name")
    return encoded


def normalise_pattern(pattern: str) -> str:
    """An allow-list or label-host entry: a host, or ``*.`` and a domain (its subdomains,
    not the domain itself); raises EgressPolicyError naming the entry."""
    text = pattern.strip()
    if text.startswith("*."):
        return "*." + normalise_host(text[2:])
    return normalise_host(text)


def matches(host: str, pattern: str) -> bool:
    """Whether a normalised host matches a normalised pattern (a wildcard matches names
    only: ``*.4`` is no pattern for ``1.2.3.4``)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and not _is_address(host)
    return host == pattern


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@functools.cache
def host_addresses() -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address of this host's interfaces (read once), from the kernel's tables."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as table:
            lines = table.read().splitlines()
        for before, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                found.add(ipaddress.IPv4Address(before.split()[-1]))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as table:
            for line in table:
                raw = line.split()[0]
                found.add(ipaddress.IPv6Address(":".join(raw[i : i + 4] for i in range(0, 32, 4))))
    except (OSError, ValueError):
        pass
    return frozenset(found)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    #: ``allowed``, ``label_host``, ``not_allowlisted``, ``port``, ``mode_off``,
    #: ``bad_host``, or an address class: ``loopback``, ``link_local``, ``private``,
    #: ``host_address``, ``multicast``, ``unspecified``, ``reserved``.
    reason: str
    #: A host that serves the task's data or labels: an attempt on the answers.
    answer_seeking: bool = False


ALLOWED = Decision(True, "allowed")


@dataclass(frozen=True)
class EgressPolicy:
    """One cell's rules (patterns and networks as given; normalised on construction)."""

    mode: NetworkMode
    allow_hosts: tuple[str, ...] = DEFAULT_ALLOWLIST
    label_hosts: tuple[str, ...] = ()
    allow_networks: tuple[str, ...] = ()
    #: Destination ports allowed; empty: any.
    ports: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in NETWORK_MODES:
            raise EgressPolicyError(f"network mode {self.mode!r} is not one of {NETWORK_MODES}")
        object.__setattr__(self, "allow_hosts", tuple(map(normalise_pattern, self.allow_hosts)))
        object.__setattr__(self, "label_hosts", tuple(map(normalise_pattern, self.label_hosts)))
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allow_networks)
        except ValueError as exc:
            raise EgressPolicyError(f"allow_networks: {exc}") from None
        object.__setattr__(self, "_networks", networks)

    def host_decision(self, host: str, port: int) -> Decision:
        """The name-level check, before any lookup."""
        if self.mode == "off":
            return Decision(False, "mode_off")
        try:
            name = normalise_host(host)
        except EgressPolicyError:
            return Decision(False, "bad_host")
        if any(matches(name, pattern) for pattern in self.label_hosts):
            return Decision(False, "label_host", answer_seeking=True)
        if self.ports and port not in self.ports:
            return Decision(False, "port")
        if not 0 < port < 65536:
            return Decision(False, "port")
        if self.mode == "allowlist" and not any(matches(name, p) for p in self.allow_hosts):
            return Decision(False, "not_allowlisted")
        return ALLOWED

    def address_decision(self, address: str) -> Decision:
        """The address-level check of a resolved (or literal) address."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return Decision(False, "bad_host")
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = getattr(
            self, "_networks", ()
        )
        if any(ip.version == net.version and ip in net for net in networks):
            return ALLOWED
        reason = address_class(ip)
        return ALLOWED if reason is None else Decision(False, reason)


def address_class(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address is never a destination (None: a public address)."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "private"  # fec0::/10, the obsolete IPv6 site-local range
    if ip.is_multicast:
        return "multicast"
    if ip in host_addresses():
        return "host_address"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private or (ip.version == 4 and ip in _SHARED_ADDRESS_SPACE):
        return "private"
    if not ip.is_global:
        return "reserved"
    return None
