"""The egress policy rule by rule, as tables: the name check, then the address check.

``tests/test_egress.py`` covers the common cases; this file walks the rules one at a time
(names: case, trailing dot, IDNA, wildcards, length limits, IP literals; labels before
everything else; ports; addresses: every class the proxy refuses, IPv4-mapped IPv6, the
host's own addresses, and ``allow_networks`` as the only exception), so that a change to
any one rule shows up as the row that names it. No sockets are opened here except one
UDP ``connect`` that only asks the kernel for a route (no packet is sent).
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from pytest_automedbench.config import build_config
from pytest_automedbench.egress import (
    DEFAULT_ALLOWLIST,
    NETWORK_MODES,
    Decision,
    EgressPolicy,
    EgressPolicyError,
    NetworkMode,
)
from pytest_automedbench.egress._rules import host_addresses

LABEL_HOSTS = ("physionet.org", "*.physionet.org", "labels.test")


def allowlist_policy(*allow_hosts: str, ports: tuple[int, ...] = ()) -> EgressPolicy:
    return EgressPolicy(
        mode="allowlist",
        allow_hosts=allow_hosts or DEFAULT_ALLOWLIST,
        label_hosts=LABEL_HOSTS,
        ports=ports,
    )


def expect(decision: Decision, reason: str) -> None:
    assert decision.reason == reason, decision
    assert decision.allowed is (reason == "allowed"), decision
    assert decision.answer_seeking is (reason == "label_host"), decision


# ------------------------------------------------------------------------- host names


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        # exact names, whatever their case or a trailing dot
        ("pypi.org", "allowed"),
        ("PYPI.ORG", "allowed"),
        ("pypi.org.", "allowed"),
        ("  pypi.org  ", "allowed"),
        ("files.pythonhosted.org", "allowed"),
        ("sub.pypi.org", "not_allowlisted"),  # an exact entry does not cover subdomains
        # "*.x": any subdomain of x, at any depth, never x itself or a look-alike
        ("cdn-lfs.huggingface.co", "allowed"),
        ("a.b.c.huggingface.co", "allowed"),
        ("huggingface.co", "allowed"),  # listed on its own as well
        ("raw.githubusercontent.com", "allowed"),
        ("githubusercontent.com", "not_allowlisted"),
        ("evilgithubusercontent.com", "not_allowlisted"),
        ("githubusercontent.com.evil.org", "not_allowlisted"),
        ("codeload.github.com", "allowed"),
        ("pypi.org.evil.org", "not_allowlisted"),
        ("xpypi.org", "not_allowlisted"),
        # label hosts: refused first, flagged, even where a wildcard entry would allow them
        ("physionet.org", "label_host"),
        ("PhysioNet.ORG.", "label_host"),
        ("data.physionet.org", "label_host"),
        ("labels.test", "label_host"),
        # garbage
        ("", "bad_host"),
        (".", "bad_host"),
        ("a..b.org", "bad_host"),
        ("-leading.org", "bad_host"),
        ("trailing-.org", "bad_host"),
        ("white space.org", "bad_host"),
        ("slash/evil.org", "bad_host"),
        ("user@pypi.org", "bad_host"),
        ("pypi.org:443", "bad_host"),
        ("a" * 64 + ".org", "bad_host"),  # one label over 63
        (".".join(["a" * 63] * 4) + ".org", "bad_host"),  # the name over 253
        ("[1.2.3.4", "bad_host"),
    ],
)
def test_allowlist_names(host: str, reason: str) -> None:
    expect(allowlist_policy().host_decision(host, 443), reason)


def test_names_up_to_the_dns_limits_are_accepted() -> None:
    longest_label = "a" * 63 + ".pypi.org"
    longest_name = ".".join(["a" * 61] * 4) + ".hf.co"  # 4 * 62 + 5 = 253
    assert len(longest_name) == 253
    policy = EgressPolicy(mode="on")
    expect(policy.host_decision(longest_label, 443), "allowed")
    expect(policy.host_decision(longest_name, 443), "allowed")
    expect(policy.host_decision(longest_name + ".", 443), "allowed")  # the dot is not counted


@pytest.mark.parametrize(
    ("pattern", "host", "reason"),
    [
        ("bücher.example", "bücher.example", "allowed"),
        ("bücher.example", "BÜCHER.EXAMPLE.", "allowed"),
        ("bücher.example", "xn--bcher-kva.example", "allowed"),  # the encoded form is the same
        ("xn--bcher-kva.example", "bücher.example", "allowed"),
        ("*.bücher.example", "www.bücher.example", "allowed"),
        ("*.bücher.example", "bücher.example", "not_allowlisted"),
        ("bücher.example", "bucher.example", "not_allowlisted"),  # no folding to ASCII
    ],
)
def test_idna_names_match_their_encoded_form(pattern: str, host: str, reason: str) -> None:
    expect(allowlist_policy(pattern).host_decision(host, 443), reason)


@pytest.mark.parametrize(
    ("allow_hosts", "host", "reason"),
    [
        # in allowlist mode an IP literal passes the name check only if it is listed as such
        ((), "1.2.3.4", "not_allowlisted"),
        (("1.2.3.4",), "1.2.3.4", "allowed"),
        (("1.2.3.4",), "1.2.3.5", "not_allowlisted"),
        (("2001:db8::1",), "[2001:db8::1]", "allowed"),
        (("2001:db8::1",), "2001:db8::1", "allowed"),
        (("2001:db8::1",), "[2001:DB8:0:0::1]", "allowed"),  # compared in canonical form
        (("[2001:db8::1]",), "2001:db8::1", "allowed"),  # a listed literal may be bracketed
        (("2001:db8::1",), "[2001:db8::2]", "not_allowlisted"),
        (("*.github.com",), "140.82.112.3", "not_allowlisted"),
    ],
)
def test_ip_literals_in_allowlist_mode(
    allow_hosts: tuple[str, ...], host: str, reason: str
) -> None:
    expect(allowlist_policy(*allow_hosts).host_decision(host, 443), reason)


@pytest.mark.parametrize("host", ["1.2.3.4", "[2001:db8::1]", "2001:db8::1", "anything.example"])
def test_on_mode_leaves_literals_and_unlisted_names_to_the_address_check(host: str) -> None:
    expect(EgressPolicy(mode="on", label_hosts=LABEL_HOSTS).host_decision(host, 443), "allowed")


@pytest.mark.parametrize("mode", ["allowlist", "on"])
@pytest.mark.parametrize("host", ["physionet.org", "www.physionet.org", "labels.test"])
def test_label_hosts_beat_the_allow_list_and_on_mode(mode: NetworkMode, host: str) -> None:
    """Even when the allow-list names the label host (or covers it with a wildcard)."""
    policy = EgressPolicy(
        mode=mode,
        allow_hosts=("physionet.org", "*.physionet.org", "labels.test"),
        label_hosts=LABEL_HOSTS,
    )
    expect(policy.host_decision(host, 443), "label_host")


def test_a_label_host_is_refused_whatever_the_port() -> None:
    policy = allowlist_policy(ports=(443,))
    expect(policy.host_decision("physionet.org", 8443), "label_host")


def test_label_hosts_may_be_ip_literals() -> None:
    policy = EgressPolicy(mode="on", label_hosts=("203.0.113.7",))
    expect(policy.host_decision("203.0.113.7", 443), "label_host")
    expect(policy.host_decision("[::ffff:203.0.113.7]", 443), "allowed")  # name-level only


@pytest.mark.parametrize(
    ("ports", "port", "reason"),
    [
        ((80, 443), 443, "allowed"),
        ((80, 443), 80, "allowed"),
        ((80, 443), 22, "port"),
        ((80, 443), 8443, "port"),
        ((), 8080, "allowed"),  # no list: any port
        ((), 0, "port"),
        ((), 65536, "port"),
        ((), -1, "port"),
    ],
)
def test_ports(ports: tuple[int, ...], port: int, reason: str) -> None:
    expect(allowlist_policy(ports=ports).host_decision("pypi.org", port), reason)


def test_off_mode_refuses_every_host() -> None:
    policy = EgressPolicy(mode="off")
    for host in ("pypi.org", "1.2.3.4", "anything.example"):
        expect(policy.host_decision(host, 443), "mode_off")


def test_modes_and_bad_policies() -> None:
    assert set(NETWORK_MODES) == {"off", "allowlist", "on"}
    with pytest.raises(EgressPolicyError):
        EgressPolicy(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(EgressPolicyError, match="not a host name"):
        EgressPolicy(mode="allowlist", allow_hosts=("bad host.org",))
    with pytest.raises(EgressPolicyError, match="not a host name"):
        EgressPolicy(mode="allowlist", label_hosts=("*.",))
    with pytest.raises(EgressPolicyError, match="allow_networks"):
        EgressPolicy(mode="on", allow_networks=("10.0.0.0/33",))


def test_the_default_allow_list_is_short_and_covers_a_researchers_setup() -> None:
    assert len(DEFAULT_ALLOWLIST) < 25
    assert len(set(DEFAULT_ALLOWLIST)) == len(DEFAULT_ALLOWLIST)
    policy = EgressPolicy(mode="allowlist")
    needed = [
        "pypi.org",
        "files.pythonhosted.org",
        "download.pytorch.org",
        "huggingface.co",
        "cdn-lfs.huggingface.co",
        "hf.co",
        "cas-bridge.xethub.hf.co",
        "github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
        "deb.debian.org",
        "security.debian.org",
        "archive.ubuntu.com",
        "security.ubuntu.com",
        "ports.ubuntu.com",
        "conda.anaconda.org",
        "repo.anaconda.com",
    ]
    refused = [host for host in needed if not policy.host_decision(host, 443).allowed]
    assert refused == []
    for host in ("example.com", "physionet.org", "google.com", "kaggle.com", "zenodo.org"):
        expect(policy.host_decision(host, 443), "not_allowlisted")


# ------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("93.184.215.14", "allowed"),
        ("140.82.112.3", "allowed"),
        ("2a00:1450:4001:81c::200e", "allowed"),
        # loopback
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        # link-local, the cloud metadata service included
        ("169.254.169.254", "link_local"),
        ("169.254.0.1", "link_local"),
        ("fe80::1", "link_local"),
        ("fe80::1%eth0", "link_local"),  # a zone index is not a way around it
        ("febf::1", "link_local"),
        ("::ffff:169.254.169.254", "link_local"),
        # unspecified
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        # multicast
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        # reserved and broadcast
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        # private and shared ranges, and their IPv4-mapped forms
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "private"),
        ("100.127.255.254", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:192.168.1.1", "private"),
        ("::ffff:100.64.0.1", "private"),
        ("::ffff:172.16.0.1", "private"),
        # just outside the private ranges
        ("172.32.0.1", "allowed"),
        ("100.128.0.1", "allowed"),
        ("11.0.0.1", "allowed"),
        # not an address at all
        ("", "bad_host"),
        ("pypi.org", "bad_host"),
        ("1.2.3", "bad_host"),
        ("[::1]", "bad_host"),  # address_decision takes a bare address, as resolved
    ],
)
def test_address_classes(address: str, reason: str) -> None:
    modes: tuple[NetworkMode, ...] = ("allowlist", "on")
    for mode in modes:
        policy = EgressPolicy(mode=mode)
        decision = policy.address_decision(address)
        assert (decision.allowed, decision.reason) == (reason == "allowed", reason), (
            mode,
            address,
        )
        assert decision.answer_seeking is False


def test_every_address_of_this_host_is_refused() -> None:
    """Whatever the class of the host's own addresses, none is a destination."""
    own = set(host_addresses())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # picks a route; no packet is sent
        own.add(ipaddress.ip_address(probe.getsockname()[0]))
    assert ipaddress.ip_address("127.0.0.1") in own
    policy = EgressPolicy(mode="on")
    allowed = [str(ip) for ip in own if policy.address_decision(str(ip)).allowed]
    assert allowed == []


def test_the_host_addresses_are_read_once() -> None:
    assert host_addresses() is host_addresses()


def test_a_public_address_of_the_host_itself_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An address that would pass every range rule is refused when it is the host's own."""
    from pytest_automedbench.egress import _rules

    public = ipaddress.ip_address("203.0.113.77")
    own = frozenset({*host_addresses(), ipaddress.ip_address("8.8.4.4"), public})
    monkeypatch.setattr(_rules, "host_addresses", lambda: own)
    policy = EgressPolicy(mode="on")
    expect(policy.address_decision("8.8.4.4"), "host_address")
    expect(policy.address_decision("::ffff:8.8.4.4"), "host_address")
    expect(policy.address_decision("8.8.8.8"), "allowed")


@pytest.mark.parametrize(
    ("networks", "address", "reason"),
    [
        (("127.0.0.2/32",), "127.0.0.2", "allowed"),
        (("127.0.0.2/32",), "::ffff:127.0.0.2", "allowed"),  # mapped: the same address
        (("127.0.0.2/32",), "127.0.0.1", "loopback"),
        (("127.0.0.2/32",), "127.0.0.3", "loopback"),
        (("10.1.0.0/16",), "10.1.200.3", "allowed"),
        (("10.1.0.0/16",), "10.2.0.1", "private"),
        (("10.1.0.0/16",), "169.254.169.254", "link_local"),
        (("192.168.7.0/24", "fd00:1::/64"), "fd00:1::9", "allowed"),
        (("192.168.7.0/24", "fd00:1::/64"), "fd00:2::9", "private"),
        (("192.168.7.0/24", "fd00:1::/64"), "192.168.7.200", "allowed"),
        (("10.1.2.3",), "10.1.2.3", "allowed"),  # a bare address is a /32
        (("10.1.2.3/24",), "10.1.2.99", "allowed"),  # host bits are tolerated
    ],
)
def test_allow_networks_are_the_only_exception(
    networks: tuple[str, ...], address: str, reason: str
) -> None:
    policy = EgressPolicy(mode="on", allow_networks=networks)
    expect(policy.address_decision(address), reason)


def test_allow_networks_do_not_touch_the_name_check() -> None:
    policy = EgressPolicy(
        mode="allowlist",
        allow_hosts=("allowed.test",),
        label_hosts=("labels.test",),
        allow_networks=("127.0.0.0/8",),
    )
    expect(policy.host_decision("unlisted.test", 443), "not_allowlisted")
    expect(policy.host_decision("labels.test", 443), "label_host")
    expect(policy.host_decision("127.0.0.1", 443), "not_allowlisted")
    expect(policy.address_decision("127.0.0.1"), "allowed")


def test_decisions_are_frozen_values() -> None:
    decision = EgressPolicy(mode="on").address_decision("127.0.0.1")
    assert decision == Decision(False, "loopback")
    with pytest.raises(AttributeError):
        decision.allowed = True  # type: ignore[misc]
    policy = EgressPolicy(mode="on")
    with pytest.raises(AttributeError):
        policy.mode = "off"  # type: ignore[misc]


# ------------------------------------------------------------------------- ports


@pytest.mark.parametrize(
    ("entry", "normalised"),
    [
        ("Mirror.Test:8443", "mirror.test:8443"),
        ("*.Mirror.Test.:8080", "*.mirror.test:8080"),
        ("[2001:DB8::1]:8443", "[2001:db8::1]:8443"),
        ("2001:db8::1", "2001:db8::1"),  # a bare IPv6 address has no port
        ("203.0.113.7:81", "203.0.113.7:81"),
    ],
)
def test_an_allow_list_entry_may_name_a_port(entry: str, normalised: str) -> None:
    assert EgressPolicy(mode="allowlist", allow_hosts=(entry,)).allow_hosts == (normalised,)


@pytest.mark.parametrize("entry", ["mirror.test:0", "mirror.test:65536", "mirror.test:", ":443"])
def test_an_entry_with_a_bad_port_is_an_error(entry: str) -> None:
    with pytest.raises(EgressPolicyError):
        EgressPolicy(mode="allowlist", allow_hosts=(entry,))


@pytest.mark.parametrize(
    ("mode", "host", "port", "tunnel", "reason"),
    [
        ("allowlist", "pypi.org", 443, True, "allowed"),
        ("allowlist", "pypi.org", 80, True, "port"),  # no plain-text tunnel by default
        ("allowlist", "pypi.org", 80, False, "allowed"),
        ("allowlist", "pypi.org", 8443, True, "port"),
        ("allowlist", "mirror.test", 8443, True, "allowed"),  # its entry names 8443
        ("allowlist", "mirror.test", 8443, False, "allowed"),
        ("allowlist", "mirror.test", 443, True, "port"),  # and only 8443
        ("allowlist", "a.cdn.test", 8080, False, "allowed"),
        ("allowlist", "cdn.test", 8080, False, "not_allowlisted"),
        ("on", "anything.example", 443, True, "allowed"),
        ("on", "anything.example", 22, True, "port"),
        ("on", "mirror.test", 8443, True, "allowed"),
        ("on", "mirror.test", 443, True, "allowed"),  # on: the defaults for every host
        ("on", "physionet.org", 443, True, "label_host"),
    ],
)
def test_ports_default_to_443_for_tunnels_and_80_for_plain_http(
    mode: NetworkMode, host: str, port: int, tunnel: bool, reason: str
) -> None:
    policy = EgressPolicy(
        mode=mode,
        allow_hosts=(*DEFAULT_ALLOWLIST, "mirror.test:8443", "*.cdn.test:8080"),
        label_hosts=("physionet.org:443",),  # a label host's port is ignored: every port
    )
    expect(policy.host_decision(host, port, tunnel=tunnel), reason)


def test_a_label_host_named_with_a_port_is_refused_on_every_port() -> None:
    policy = EgressPolicy(mode="on", label_hosts=("labels.test:443",))
    for port in (443, 80, 8443):
        expect(policy.host_decision("labels.test", port, tunnel=port != 80), "label_host")


# ------------------------------------------------------------------------- embedded IPv4


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "link_local"),  # 6to4 of 169.254.169.254
        ("2002:0a00:0001::", "private"),  # 6to4 of 10.0.0.1
        ("2002:0808:0808::", "allowed"),  # 6to4 of 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:5601:5656", "link_local"),  # client 169.254.169.169
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link_local"),
        ("64:ff9b::808:808", "allowed"),  # NAT64 reaches 8.8.8.8
        ("64:ff9b:1::7f00:1", "loopback"),  # local-use NAT64, /96 placement
        ("::127.0.0.1", "loopback"),  # IPv4-compatible
        ("::169.254.169.254", "link_local"),
        ("::8.8.8.8", "allowed"),
        ("::ffff:10.0.0.1", "private"),  # IPv4-mapped
        ("::1", "loopback"),
        ("::", "unspecified"),
    ],
)
def test_ipv6_addresses_are_judged_by_the_ipv4_address_they_carry(
    address: str, reason: str
) -> None:
    expect(EgressPolicy(mode="on").address_decision(address), reason)


@pytest.mark.parametrize("address", ["64:ff9b:1:7f00:0:100::", "64:ff9b:1::808:808"])
def test_local_use_nat64_is_never_a_destination(address: str) -> None:
    """64:ff9b:1::/48 (RFC 8215) is a network's own translator: refused whatever it
    carries (every RFC 6052 placement is checked; the first refusal names the reason)."""
    assert not EgressPolicy(mode="on").address_decision(address).allowed


def test_allow_networks_reach_an_embedded_address_only_through_its_ipv4_form() -> None:
    """A LAN mirror listed as 10.1.0.0/16 is reached at ::ffff:10.1.2.3 (the same host);
    its 6to4 form passes the embedded check and the 6to4 address is public."""
    policy = EgressPolicy(mode="on", allow_networks=("10.1.0.0/16",))
    expect(policy.address_decision("::ffff:10.1.2.3"), "allowed")
    expect(policy.address_decision("64:ff9b::a01:203"), "allowed")
    expect(policy.address_decision("2002:0a01:0203::"), "allowed")
    expect(policy.address_decision("2002:0a02:0203::"), "private")


def test_a_port_named_on_the_command_line_reaches_the_policy(tmp_path: Path) -> None:
    """``--sandbox-allow-host mirror.lab:8443`` (a run's setting) opens that port of that
    host, by tunnel, and no other port of it."""
    config = build_config({"sandbox_allow_hosts": ["Mirror.Lab.:8443"]}, {}, None, tmp_path)
    assert config.sandbox_allow_hosts == ("mirror.lab:8443",)
    policy = EgressPolicy(mode="allowlist", allow_hosts=config.sandbox_allow_hosts)
    expect(policy.host_decision("mirror.lab", 8443), "allowed")
    expect(policy.host_decision("mirror.lab", 443), "port")
