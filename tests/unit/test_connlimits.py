"""The connection gate's counting and the descriptor budget's arithmetic."""

from __future__ import annotations

import resource

import pytest

from pgplane.connlimits import ConnectionGate, Refusal
from pgplane.fdlimit import Caps, raise_nofile, reserve, size_caps


def test_per_address_cap_refuses_that_address_only() -> None:
    gate = ConnectionGate(per_address=2, total=10)
    held = [gate.admit("10.0.0.1"), gate.admit("10.0.0.1")]
    assert all(held)
    assert gate.admit("10.0.0.1") is None
    assert gate.last_refusal is Refusal.PER_ADDRESS
    assert "at most 2" in gate.refusal_message()
    assert gate.admit("10.0.0.2") is not None  # another address still gets in
    assert (gate.open, gate.open_from("10.0.0.1"), gate.refused_per_address) == (3, 2, 1)


def test_total_cap_refuses_everyone() -> None:
    gate = ConnectionGate(per_address=5, total=3)
    for host in ("a", "b", "c"):
        assert gate.admit(host) is not None
    assert gate.admit("d") is None
    assert gate.last_refusal is Refusal.TOTAL
    assert "limit of 3" in gate.refusal_message()
    assert gate.refused_total == 1


def test_release_gives_the_place_back_once() -> None:
    gate = ConnectionGate(per_address=1, total=1)
    first = gate.admit("10.0.0.1")
    assert first is not None
    assert gate.admit("10.0.0.1") is None
    first.release()
    first.release()  # a second release must not free a place someone else holds
    second = gate.admit("10.0.0.1")
    assert second is not None
    assert gate.admit("10.0.0.1") is None
    assert gate.open == 1
    second.release()
    assert (gate.open, gate.addresses) == (0, 0)  # nothing kept for addresses gone


def test_ipv6_is_counted_per_64() -> None:
    gate = ConnectionGate(per_address=2, total=0)
    assert gate.admit("2001:db8:1:2::1") is not None
    assert gate.admit("2001:db8:1:2::ffff") is not None
    assert gate.admit("2001:db8:1:2:abcd::1") is None  # same /64, another address
    assert gate.admit("2001:db8:1:3::1") is not None


def test_no_address_counts_towards_the_total_only() -> None:
    gate = ConnectionGate(per_address=1, total=3)
    held = [gate.admit(None) for _ in range(3)]
    assert all(held)
    assert gate.admit(None) is None
    assert gate.last_refusal is Refusal.TOTAL


def test_zero_turns_a_cap_off() -> None:
    gate = ConnectionGate(per_address=0, total=0)
    held = [gate.admit("10.0.0.1") for _ in range(10_000)]
    assert all(held)
    assert gate.open == 10_000


def test_negative_caps_are_refused() -> None:
    with pytest.raises(ValueError, match="0 \\(no cap\\) or more"):
        ConnectionGate(per_address=-1, total=10)


WANTED = Caps(api_total=4096, api_per_address=256, proxy_total=4096, proxy_per_address=256)


def test_caps_that_fit_are_kept() -> None:
    assert size_caps(1 << 20, WANTED) == WANTED
    assert size_caps(20_000, WANTED) == WANTED  # 12,288 for clients, 2,500 in reserve


def test_caps_are_cut_to_keep_a_reserve() -> None:
    for limit in (1024, 4096, 8192):
        caps = size_caps(limit, WANTED)
        assert caps.descriptors <= limit - reserve(limit)
        assert caps.api_per_address <= caps.api_total
        assert caps.proxy_per_address <= caps.proxy_total
    assert size_caps(1024, WANTED) == Caps(
        api_total=256, api_per_address=256, proxy_total=256, proxy_per_address=256
    )
    assert reserve(1024) == 256
    assert reserve(1 << 20) == 1 << 17


def test_zero_totals_take_what_the_limit_allows() -> None:
    caps = size_caps(16_384, Caps(0, 0, 0, 0))
    assert caps.descriptors <= 16_384 - reserve(16_384)
    assert caps.api_total > 0 and caps.proxy_total > 0
    assert (caps.api_per_address, caps.proxy_per_address) == (0, 0)


def test_raise_nofile_ends_at_the_hard_limit() -> None:
    before, after = raise_nofile()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert after == soft >= before
    assert hard in (resource.RLIM_INFINITY, soft)
