"""The IP allow-list's reading and matching (pgplane.core.ipallow), Neon's proxy's cases first
(proxy/src/auth/credentials.rs: test_parse_ip_v4, test_check_ipv4, test_check_peer_addr_is_in_list).
"""

from __future__ import annotations

import pytest

from pgplane.core.ipallow import ALLOW_ALL, BadEntry, allow_list, client_address, parse_entry


@pytest.mark.parametrize(
    "entry",
    [
        "127.0.0.1",
        "127.0.0.1/31",  # host bits set: taken, as Neon's ipnet takes them
        "0.0.0.0-200.0.1.2",
        "2001:db8::1",
        "2001:db8::/32",
        "2001:db8::1-2001:db8::ff",
        "::ffff:10.0.0.1",
        "10.0.0.0/0",
        "::/0",
    ],
)
def test_entries_neon_reads_are_read(entry: str) -> None:
    parse_entry(entry)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "300.0.1.2",
        "30.1.2",
        "127.0.0.1/33",
        "2001:db8::/129",
        "127.0.0.1-127.0.3",
        "1234.0.0.1-127.0.3.0",
        "localhost",
        " 127.0.0.1",
        "127.0.0.1,",  # neonctl's own usage line separates with ", ": the comma is not an address
        "010.0.0.1",  # leading zeros: octal to some readers, decimal to others
        "10.0.0.0/255.0.0.0",  # netmasks: Python reads them, Neon does not
        "10.0.0.0/-1",
        "10.0.0.0/",
        "fe80::1%eth0",  # an interface of this host, not a client's address
        "10.0.0.2-10.0.0.1",  # empty: matches nothing
        "10.0.0.1-2001:db8::1",  # two families: matches nothing
        "1.2.3.4/24/8",
        "a" * 200,
    ],
)
def test_other_entries_are_refused(entry: str) -> None:
    with pytest.raises(BadEntry) as refused:
        parse_entry(entry)
    assert str(refused.value)  # says why: the API's 400 shows it


def test_an_empty_list_allows_everyone() -> None:
    assert ALLOW_ALL.allows("203.0.113.9")
    assert allow_list([]).allows("2001:db8::1")
    assert allow_list([]).allows("")


def test_addresses_blocks_and_ranges_match_as_neon_matches_them() -> None:
    assert allow_list(["127.0.0.1"]).allows("127.0.0.1")
    assert not allow_list(["8.8.8.8"]).allows("127.0.0.1")
    assert not allow_list(["255.255.255.255"]).allows("127.0.0.1")
    assert allow_list(["127.0.0.0/31"]).allows("127.0.0.1")
    assert allow_list(["127.0.0.2/30"]).allows("127.0.0.1")
    assert not allow_list(["127.0.0.2/31"]).allows("127.0.0.1")
    assert allow_list(["0.0.0.0-200.0.1.2"]).allows("127.0.0.1")
    assert allow_list(["127.0.0.1-127.0.0.1"]).allows("127.0.0.1")
    assert not allow_list(["127.0.0.2-127.0.0.9"]).allows("127.0.0.1")
    assert allow_list(["127.0.0.2-127.0.0.9"]).allows("127.0.0.9")
    assert not allow_list(["127.0.0.2-127.0.0.9"]).allows("127.0.0.10")


def test_families_do_not_mix() -> None:
    v6 = allow_list(["::/0"])
    assert v6.allows("2001:db8::1")
    assert not v6.allows("127.0.0.1")
    assert not allow_list(["0.0.0.0/0"]).allows("::1")
    assert not allow_list(["::-::ffff"]).allows("0.0.0.1")
    assert allow_list(["2001:db8::1-2001:db8::ff"]).allows("2001:db8::80")


def test_an_ipv4_client_of_a_dual_stack_listener_is_its_ipv4_address() -> None:
    assert client_address("::ffff:127.0.0.2") == client_address("127.0.0.2")
    assert allow_list(["127.0.0.2"]).allows("::ffff:127.0.0.2")
    assert not allow_list(["127.0.0.1"]).allows("::ffff:127.0.0.2")
    assert allow_list(["fe80::/10"]).allows("fe80::1%eth0")


def test_an_unreadable_entry_matches_nothing_and_still_restricts() -> None:
    # Stored before entries were checked: skipped as Neon's proxy skips it...
    assert allow_list(["88.8.8", "127.0.0.1"]).allows("127.0.0.1")
    assert not allow_list(["88.8.8", "127.0.0.1"]).allows("127.0.0.2")
    # ... and a list of nothing readable allows nobody, not everybody.
    assert not allow_list(["88.8.8"]).allows("127.0.0.1")


def test_an_address_that_cannot_be_read_is_refused_by_a_list() -> None:
    assert not allow_list(["0.0.0.0/0", "::/0"]).allows("")
    assert not allow_list(["0.0.0.0/0"]).allows("not-an-address")


def test_a_list_is_read_once() -> None:
    assert allow_list(["10.0.0.0/8", "10.1.0.1"]) is allow_list(("10.0.0.0/8", "10.1.0.1"))
