"""A project's IP allow-list (``settings.allowed_ips.ips``): its entries read, an address tried.

Pure: no I/O, nothing of the API or the proxy. The API reads entries with :func:`parse_entry` to
refuse a bad one; every door of the proxy (Postgres today; HTTP and WebSocket to come) asks
:meth:`AllowList.allows` about the client's address before anything else.

Entries are those Neon's proxy reads (``proxy/src/auth/credentials.rs``, ``parse_ip_pattern``):
an address (``203.0.113.7``, ``2001:db8::1``), a CIDR block (``203.0.113.0/24``; host bits may be
set, as ``ipnet`` allows) or an inclusive range ``first-last``. Neon's proxy turns an entry it
cannot read into one that matches nothing; here such an entry is refused when it is set, so what
is stored is what is enforced. For the same reason a range that is empty (``first`` past
``last``) or spans two families, which Neon's parser takes and which can match nothing, is
refused too. An empty list allows every address, as Neon's does.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Longer than any entry can be ("ffff:…:ffff/128" and ranges of two such are under 90).
MAX_ENTRY = 100


@dataclass(frozen=True, slots=True)
class Range:
    """An inclusive range of one family's addresses, ``first`` <= ``last``."""

    first: Address
    last: Address

    def __contains__(self, address: Address) -> bool:
        # As integers: mypy cannot see that the families were checked to be one.
        same = address.version == self.first.version
        return same and int(self.first) <= int(address) <= int(self.last)


Rule = Network | Range


class BadEntry(ValueError):
    """An entry that is none of an address, a CIDR block or a range; the message says why."""


def _address(text: str) -> Address:
    # Scoped IPv6 ("fe80::1%eth0") names an interface of this host, not a client anywhere;
    # Neon's parser (Rust's IpAddr) refuses it, and so does this one.
    if "%" in text:
        raise BadEntry(f"{text!r} has an interface scope (%); give the address alone")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise BadEntry(f"{text!r} is not an IPv4 or IPv6 address") from None


def parse_entry(entry: str) -> Rule:
    """The rule an entry stands for; BadEntry (saying why) for one that is none of an address,
    a CIDR block or a range."""
    if not entry or len(entry) > MAX_ENTRY:
        raise BadEntry("an entry must be an IP address, a CIDR block (a.b.c.d/n) or a range (a-b)")
    if "/" in entry:
        host, _, bits = entry.partition("/")
        # Prefix lengths only: Python would also take a netmask ("/255.255.0.0"), Neon would not.
        if not bits.isascii() or not bits.isdigit():
            raise BadEntry(f"{entry!r}: the prefix length after / must be a number")
        address = _address(host)
        if int(bits) > address.max_prefixlen:
            raise BadEntry(f"{entry!r}: the prefix length must be at most {address.max_prefixlen}")
        return ipaddress.ip_network(f"{address}/{int(bits)}", strict=False)
    if "-" in entry:
        start, _, end = entry.partition("-")
        first, last = _address(start), _address(end)
        if first.version != last.version:
            raise BadEntry(f"{entry!r}: a range's two ends must be of one family (IPv4 or IPv6)")
        if int(first) > int(last):
            raise BadEntry(f"{entry!r}: a range's first address must not be past its last")
        return Range(first, last)
    address = _address(entry)
    return ipaddress.ip_network(address)


def client_address(text: str) -> Address | None:
    """A client's address as a socket gives it; None for none (a unix socket gives "").

    An IPv4 client of a dual-stack listener arrives as ``::ffff:a.b.c.d``: it is tried as the
    IPv4 address it is, which is what a user lists.
    """
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class AllowList:
    """The rules of one list. A list with no entries allows everyone; one with entries allows
    only the addresses its rules match."""

    rules: tuple[Rule, ...] = ()
    # Whether the list has any entry, readable or not: a list whose every entry is unreadable
    # still restricts (its owner meant to), and allows nobody.
    restricted: bool = False

    def allows(self, client: str) -> bool:
        """Whether a client at ``client`` (a socket's peer address) may connect. An address that
        cannot be read is refused by a list that restricts: it fails closed."""
        if not self.restricted:
            return True
        address = client_address(client)
        return address is not None and any(address in rule for rule in self.rules)


ALLOW_ALL = AllowList()


def allow_list(entries: Iterable[str]) -> AllowList:
    """The list of stored entries, each list read once (the proxy's hot path sees the same few
    lists again and again). An entry that cannot be read (stored before entries were checked)
    matches nothing, as in Neon's proxy."""
    return _cached(tuple(entries))


@functools.lru_cache(maxsize=4096)
def _cached(entries: tuple[str, ...]) -> AllowList:
    rules: list[Rule] = []
    for entry in entries:
        try:
            rules.append(parse_entry(entry))
        except BadEntry:
            continue
    return AllowList(rules=tuple(rules), restricted=bool(entries))
