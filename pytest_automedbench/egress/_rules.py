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
   connects to the address it checked, so a second lookup cannot change it. An IPv6
   address that carries an IPv4 one is judged by what it carries too
   (:func:`embedded_ipv4`): ``::ffff:127.0.0.1``, ``2002:7f00:1::`` (6to4) or a Teredo
   or NAT64 address around 169.254.169.254 is refused like the plain form.

**Ports** are part of the name check: a tunnel (``CONNECT``) goes to 443 and plain HTTP
to 80 unless the policy names others, for every host (``ports``) or for one
(``host:port`` in the allow-list). ``CONNECT`` to 80 is refused by default: a tunnel is
opaque, and on a plain-text port it would carry requests the proxy never reads (a
``Host:`` header naming a label host on the allowed name's servers).
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

#: The ports a host the policy allows may be reached on, unless the policy names others:
#: tunnels (``CONNECT``, HTTPS) and plain HTTP (absolute-form requests the proxy reads).
DEFAULT_TUNNEL_PORTS: frozenset[int] = frozenset({443})
DEFAULT_PLAIN_PORTS: frozenset[int] = frozenset({80})

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


def split_entry(entry: str) -> tuple[str, int | None]:
    """An allow-list entry as (host pattern, port or None): ``host``, ``*.domain``,
    ``host:8443``, ``[2001:db8::1]:8443``; a bare IPv6 address has no port."""
    text = entry.strip()
    port: int | None = None
    head, colon, tail = text.rpartition(":")
    if colon and tail.isdigit() and (head.endswith("]") or ":" not in head):
        text, port = head, int(tail)
        if not 0 < port < 65536:
            raise EgressPolicyError(f"{entry!r}: port {port} is not a port")
    if text.startswith("[") and text.endswith("]") and port is not None:
        text = text[1:-1]
    return text, port


def normalise_pattern(pattern: str) -> str:
    """An allow-list or label-host entry: a host, or ``*.`` and a domain (its subdomains,
    not the domain itself), with an optional ``:port``; raises EgressPolicyError naming
    the entry."""
    text, port = split_entry(pattern)
    host = "*." + normalise_host(text[2:]) if text.startswith("*.") else normalise_host(text)
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    #: Host patterns; an entry may name a port (``host:8443``), which that host (and no
    #: other) may then be reached on, by tunnel or plain HTTP.
    allow_hosts: tuple[str, ...] = DEFAULT_ALLOWLIST
    #: Refused whatever the port (a port given here is ignored).
    label_hosts: tuple[str, ...] = ()
    allow_networks: tuple[str, ...] = ()
    #: Destination ports allowed for every host, tunnel or plain. None: the defaults
    #: (:data:`DEFAULT_TUNNEL_PORTS`, :data:`DEFAULT_PLAIN_PORTS`); empty: any port (the
    #: tests' servers listen on ephemeral ports).
    ports: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in NETWORK_MODES:
            raise EgressPolicyError(f"network mode {self.mode!r} is not one of {NETWORK_MODES}")
        object.__setattr__(self, "allow_hosts", tuple(map(normalise_pattern, self.allow_hosts)))
        object.__setattr__(self, "label_hosts", tuple(map(normalise_pattern, self.label_hosts)))
        entries = tuple(split_entry(entry) for entry in self.allow_hosts)
        object.__setattr__(self, "_entries", entries)
        labels = tuple(split_entry(entry)[0] for entry in self.label_hosts)
        object.__setattr__(self, "_labels", labels)
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.allow_networks)
        except ValueError as exc:
            raise EgressPolicyError(f"allow_networks: {exc}") from None
        object.__setattr__(self, "_networks", networks)

    def host_decision(self, host: str, port: int, *, tunnel: bool = True) -> Decision:
        """The name-level check, before any lookup: the host, then the port (``tunnel``:
        a ``CONNECT``, whose bytes the proxy never reads; else a plain HTTP request)."""
        if self.mode == "off":
            return Decision(False, "mode_off")
        try:
            name = normalise_host(host)
        except EgressPolicyError:
            return Decision(False, "bad_host")
        labels: tuple[str, ...] = getattr(self, "_labels", ())
        if any(matches(name, pattern) for pattern in labels):
            return Decision(False, "label_host", answer_seeking=True)
        if not 0 < port < 65536:
            return Decision(False, "port")
        entries: tuple[tuple[str, int | None], ...] = getattr(self, "_entries", ())
        listed = [entry_port for pattern, entry_port in entries if matches(name, pattern)]
        if self.mode == "allowlist" and not listed:
            return Decision(False, "not_allowlisted")
        if port not in self.ports_for(listed, tunnel=tunnel):
            return Decision(False, "port")
        return ALLOWED

    def ports_for(self, listed: list[int | None], *, tunnel: bool) -> frozenset[int] | range:
        """The ports a host may be reached on: the policy's (or the defaults) when an entry
        without a port lists it, or in ``on`` mode; plus each port its entries name."""
        if self.ports is not None and not self.ports:
            return range(1, 65536)
        general = frozenset(self.ports or ()) or (
            DEFAULT_TUNNEL_PORTS if tunnel else DEFAULT_PLAIN_PORTS
        )
        named = frozenset(p for p in listed if p is not None)
        if self.mode == "on" or None in listed:
            return general | named
        return named

    def address_decision(self, address: str) -> Decision:
        """The address-level check of a resolved (or literal) address."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return Decision(False, "bad_host")
        if isinstance(ip, ipaddress.IPv6Address):
            translated = translated_ipv4(ip)
            if translated is not None:  # the IPv4 host itself is the destination
                return self._one_address(translated)
            for inner in embedded_ipv4(ip):  # a tunnel's end: judged, then the address
                verdict = self._one_address(inner)
                if not verdict.allowed:
                    return verdict
        return self._one_address(ip)

    def _one_address(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Decision:
        networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = getattr(
            self, "_networks", ()
        )
        if any(ip.version == net.version and ip in net for net in networks):
            return ALLOWED
        reason = address_class(ip)
        return ALLOWED if reason is None else Decision(False, reason)


_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
#: Where RFC 6052 puts the IPv4 address in a NAT64 prefix of each length: bit ranges
#: (from the most significant bit) that, joined, are its 32 bits (bits 64-71 are zero).
_RFC6052_SPANS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((96, 128),),
    ((72, 104),),
    ((56, 64), (72, 96)),
    ((48, 64), (72, 88)),
)


def _bits(value: int, start: int, end: int) -> int:
    return (value >> (128 - end)) & ((1 << (end - start)) - 1)


def translated_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 host an IPv6 address stands for, where a connection to it reaches that
    host: IPv4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``, not ``::``
    and ``::1``) and the well-known NAT64 prefix (``64:ff9b::a.b.c.d``)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries as a tunnel's end: 6to4 (2002::/16),
    Teredo (2001::/32: its server and its client) and local-use NAT64 (64:ff9b:1::/48:
    every RFC 6052 placement, the prefix length being the operator's choice)."""
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    if ip in _NAT64_LOCAL:
        value = int(ip)
        found = []
        for spans in _RFC6052_SPANS:
            joined = 0
            for start, end in spans:
                joined = (joined << (end - start)) | _bits(value, start, end)
            found.append(ipaddress.IPv4Address(joined))
        return tuple(found)
    return ()


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
