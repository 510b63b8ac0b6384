"""Connection caps per client address and overall, for any listener (the API, the proxy).

The hazard: every open connection holds a descriptor until it closes, and a stranger can open
them for free. Without caps a few hundred silent sockets from one address used up the process's
descriptors, and the API, the proxy and the engine (whose store and compute connections need
descriptors too) failed together. With them one address can hold at most ``per_address`` of a
listener's connections, and all addresses together at most ``total``, sized at start-up so the
rest of the process keeps descriptors in reserve (:mod:`pgplane.fdlimit`).

A gate only counts. The listener asks :meth:`ConnectionGate.admit` as a connection is accepted,
before reading a byte of it; on ``None`` it tells the client why in its own protocol and closes
the connection at once, and otherwise calls :meth:`Admission.release` when the connection ends.
Everything runs on the event loop, between awaits: no locks.
"""

from __future__ import annotations

from enum import Enum

from pgplane.core.gcra import address_key


class Refusal(Enum):
    """Why a connection was refused: its address has its share, or the listener is full."""

    PER_ADDRESS = "per_address"
    TOTAL = "total"


class Admission:
    """One admitted connection's place; :meth:`release` it when the connection ends."""

    __slots__ = ("_gate", "_key")

    def __init__(self, gate: ConnectionGate, key: str | None) -> None:
        self._gate: ConnectionGate | None = gate
        self._key = key

    def release(self) -> None:
        """Give the place back; a second call does nothing."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._release(self._key)


class ConnectionGate:
    """At most ``per_address`` open connections per client address and ``total`` in all.

    0 turns a cap off. A connection without an address (a unix socket) counts towards the total
    only.
    """

    def __init__(self, *, per_address: int, total: int) -> None:
        if per_address < 0 or total < 0:
            raise ValueError("connection caps are counts: 0 (no cap) or more")
        self.per_address = per_address
        self.total = total
        self._open = 0
        self._by_address: dict[str, int] = {}
        self.admitted = 0
        self.refused_per_address = 0
        self.refused_total = 0
        self.last_refusal: Refusal | None = None

    @property
    def open(self) -> int:
        """Connections admitted and not yet released."""
        return self._open

    def open_from(self, host: str) -> int:
        """Connections open from ``host``'s address (its /64 for IPv6)."""
        return self._by_address.get(address_key(host), 0)

    @property
    def addresses(self) -> int:
        """Addresses with a connection open: what the gate's memory follows."""
        return len(self._by_address)

    def admit(self, host: str | None) -> Admission | None:
        """A place for a new connection from ``host``, or None (then :attr:`last_refusal` says
        why and :meth:`refusal_message` what to tell the client)."""
        if self.total and self._open >= self.total:
            self.refused_total += 1
            self.last_refusal = Refusal.TOTAL
            return None
        key = address_key(host) if host else None
        if key is not None:
            count = self._by_address.get(key, 0)
            if self.per_address and count >= self.per_address:
                self.refused_per_address += 1
                self.last_refusal = Refusal.PER_ADDRESS
                return None
            self._by_address[key] = count + 1
        self._open += 1
        self.admitted += 1
        return Admission(self, key)

    def refusal_message(self) -> str:
        """What to tell the client :meth:`admit` last refused, in words."""
        if self.last_refusal is Refusal.PER_ADDRESS:
            return (
                f"too many connections from your address: at most {self.per_address} at once;"
                " close one or retry later"
            )
        return f"too many connections: the server is at its limit of {self.total}; retry later"

    def _release(self, key: str | None) -> None:
        self._open -= 1
        if key is not None:
            count = self._by_address[key] - 1
            if count:
                self._by_address[key] = count
            else:
                del self._by_address[key]  # memory follows open connections, not every address
