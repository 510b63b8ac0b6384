"""SCRAM-SHA-256 (RFC 5802, 7677) on both sides of the proxy.

The proxy authenticates clients itself, as Neon's does, because channel binding
(``SCRAM-SHA-256-PLUS``, ``channel_binding=require``) binds the proof to the TLS connection the
client made, to the proxy; no compute behind it could check that proof. With the client proven,
the proxy logs in to the compute as the same role with the role's password.

Passwords are the platform's generated ones (ASCII), for which SASLprep changes nothing. Roles
created with SQL on a compute are known by their SCRAM verifier (what ``pg_authid`` keeps), which
is all the server side of an exchange needs: it never derives a key itself.

Key derivation (PBKDF2) is the one slow step, and its cost is whatever iteration count the other
side names. The proxy derives keys only for the platform's passwords with its own count (once per
password, cached, off the event loop: :func:`password_verifier`) and, as a client of a compute,
refuses a count above :data:`MAX_ITERATIONS` before deriving anything: a tenant can raise its
compute's ``scram_iterations`` but cannot make the proxy pay for it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
CHANNEL_BINDING = "tls-server-end-point"
ITERATIONS = 4096
# Postgres' default is 4096; a hundred times that costs a client about a second. A compute that
# asks the proxy for more is refused rather than obeyed.
MAX_ITERATIONS = 100_000
_CACHED_VERIFIERS = 4096
_VERIFIER = re.compile(
    r"SCRAM-SHA-256\$(?P<i>[0-9]{1,10}):(?P<salt>[A-Za-z0-9+/=]+)"
    r"\$(?P<stored>[A-Za-z0-9+/=]+):(?P<server>[A-Za-z0-9+/=]+)"
)


class ScramError(Exception):
    """Authentication failed or the exchange was malformed."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError("malformed SCRAM message") from None


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


Keys = tuple[bytes, bytes, bytes]  # ClientKey, StoredKey, ServerKey


class _DerivedKeys:
    """The keys PBKDF2 gave, per (password, salt, count), the least recently used forgotten
    first: the slow step once per password and salt.

    A pure function's results, so nothing here can go stale: whether a password is right is
    decided each time against the verifier of the moment (a changed password has another
    salt or stored key, and the old one stops matching). Filled from worker threads, read on
    the event loop: a lock around every use.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[tuple[str, bytes, int], Keys] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, password: str, salt: bytes, iterations: int) -> Keys | None:
        with self._lock:
            keys = self._keys.get((password, salt, iterations))
            if keys is not None:
                self._keys.move_to_end((password, salt, iterations))
            return keys

    def put(self, password: str, salt: bytes, iterations: int, keys: Keys) -> None:
        with self._lock:
            self._keys[password, salt, iterations] = keys
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)


_derived = _DerivedKeys(_CACHED_VERIFIERS)


def _keys(password: str, salt: bytes, iterations: int) -> Keys:
    """(ClientKey, StoredKey, ServerKey): the slow PBKDF2 once per password and salt."""
    keys = _derived.get(password, salt, iterations)
    if keys is None:
        if iterations > MAX_ITERATIONS:
            raise ScramError(f"SCRAM iteration count {iterations} is above {MAX_ITERATIONS}")
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
        client_key = _hmac(salted, "Client Key")
        keys = client_key, hashlib.sha256(client_key).digest(), _hmac(salted, "Server Key")
        _derived.put(password, salt, iterations, keys)
    return keys


@dataclass(frozen=True, slots=True)
class Verifier:
    """What a server needs to check a SCRAM-SHA-256 proof (Postgres' ``rolpassword``)."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


def parse_verifier(text: str) -> Verifier | None:
    """A ``SCRAM-SHA-256$i:salt$StoredKey:ServerKey`` verifier; None for anything else."""
    match = _VERIFIER.fullmatch(text)
    if match is None:
        return None
    try:
        salt, stored, server = (
            base64.b64decode(match[name], validate=True) for name in ("salt", "stored", "server")
        )
    except ValueError:
        return None
    iterations = int(match["i"])
    if iterations < 1 or len(stored) != 32 or len(server) != 32 or not salt:
        return None
    return Verifier(iterations, salt, stored, server)


# One salt and verifier per password for the life of the process, so its keys are derived once;
# bounded, the least recently used forgotten first.
_verifiers: OrderedDict[str, Verifier] = OrderedDict()


def derive_verifier(password: str) -> Verifier:
    salt = secrets.token_bytes(16)
    _, stored_key, server_key = _keys(password, salt, ITERATIONS)
    return Verifier(ITERATIONS, salt, stored_key, server_key)


async def password_verifier(password: str) -> Verifier:
    """The proxy's verifier for a platform password: derived once, in a thread, then cached."""
    verifier = _verifiers.get(password)
    if verifier is None:
        verifier = await asyncio.to_thread(derive_verifier, password)
        # Another login may have derived one meanwhile: keep the first, so salts stay stable.
        verifier = _verifiers.setdefault(password, verifier)
    _verifiers.move_to_end(password)
    while len(_verifiers) > _CACHED_VERIFIERS:
        _verifiers.popitem(last=False)
    return verifier


def check_password(verifier: Verifier, password: str) -> bool:
    """Whether ``password`` is the one ``verifier`` was made from (blocking: PBKDF2 at the
    verifier's count, refused above :data:`MAX_ITERATIONS`; run it in a thread).

    For the doors where a client sends its password itself (a WebSocket, ``/sql``, the
    ``endpoint=<id>;<password>`` form): the same proof SCRAM gives, checked by the proxy.
    """
    _, stored_key, _ = _keys(password, verifier.salt, verifier.iterations)
    return hmac.compare_digest(stored_key, verifier.stored_key)


def check_password_derived(verifier: Verifier, password: str) -> bool | None:
    """:func:`check_password` without blocking: None when the keys of ``password`` with this
    verifier's salt and count were never derived (then :func:`check_password` must run, in a
    thread). The same comparison against the same verifier: only PBKDF2 is skipped."""
    keys = _derived.get(password, verifier.salt, verifier.iterations)
    if keys is None:
        return None
    return hmac.compare_digest(keys[1], verifier.stored_key)


def mock_verifier(user: str) -> Verifier:
    """A verifier no password matches, stable per user name, for roles that do not exist.

    The exchange then runs as for a real role and fails as a wrong password does (as Postgres'
    own mock authentication): a stranger learns nothing of which roles exist.
    """
    seed = hashlib.sha256(b"pgplane mock salt\0" + _MOCK_SECRET + user.encode()).digest()
    return Verifier(ITERATIONS, seed[:16], secrets.token_bytes(32), secrets.token_bytes(32))


_MOCK_SECRET = secrets.token_bytes(32)


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


@dataclass
class ServerExchange:
    """The proxy's side of a client's SCRAM exchange, checking against a verifier."""

    verifier: Verifier
    cert_hash: bytes | None  # tls-server-end-point data when the client is on TLS
    _first_bare: str = ""
    _server_first: str = ""
    _gs2: str = ""
    _nonce: str = ""

    def mechanisms(self) -> list[str]:
        return [MECHANISM_PLUS, MECHANISM] if self.cert_hash is not None else [MECHANISM]

    def first(self, mechanism: str, client_first: str) -> str:
        """Read client-first-message, return server-first-message."""
        if mechanism not in self.mechanisms():
            raise ScramError(f"unsupported SASL mechanism {mechanism}")
        flag, _, rest = client_first.partition(",")
        authzid, _, bare = rest.partition(",")
        if authzid or not bare:
            raise ScramError("malformed SCRAM message")
        if mechanism == MECHANISM_PLUS:
            if flag != f"p={CHANNEL_BINDING}":
                raise ScramError("SCRAM channel binding negotiation error")
        elif flag == "y" and self.cert_hash is not None:
            # The client could bind but thinks we cannot: someone stripped PLUS from our offer.
            raise ScramError("SCRAM channel binding negotiation error")
        elif flag not in ("n", "y"):
            raise ScramError("SCRAM channel binding negotiation error")
        client_nonce = _attributes(bare).get("r")
        if not client_nonce:
            raise ScramError("malformed SCRAM message")
        self._gs2 = f"{flag},{authzid},"
        self._first_bare = bare
        self._nonce = client_nonce + _b64(secrets.token_bytes(18))
        v = self.verifier
        self._server_first = f"r={self._nonce},s={_b64(v.salt)},i={v.iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        """Check client-final-message; return server-final-message or raise ScramError."""
        without_proof, sep, proof_text = client_final.rpartition(",p=")
        if not sep:
            raise ScramError("malformed SCRAM message")
        attrs = _attributes(without_proof)
        binding = self._gs2.encode()
        if self._gs2.startswith("p=") and self.cert_hash is not None:
            binding += self.cert_hash
        if attrs.get("c") != _b64(binding):
            raise ScramError("SCRAM channel binding check failed")
        if attrs.get("r") != self._nonce:
            raise ScramError("SCRAM nonce mismatch")
        stored_key, server_key = self.verifier.stored_key, self.verifier.server_key
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}"
        signature = _hmac(stored_key, auth_message)
        proof = _unb64(proof_text)
        if len(proof) != len(signature):
            raise ScramError("malformed SCRAM message")
        candidate = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(candidate).digest(), stored_key):
            raise ScramError("password authentication failed")
        return f"v={_b64(_hmac(server_key, auth_message))}"


@dataclass
class ClientExchange:
    """The proxy's side as a client of the compute (plain SCRAM-SHA-256: ``n,,``, no binding).

    ``gs2`` and ``binding`` exist for the tests, which play a channel-binding client with it.
    """

    password: str
    gs2: str = "n,,"
    binding: bytes = b""
    _nonce: str = ""
    _first_bare: str = ""
    _server_signature: bytes = b""

    def first(self) -> str:
        self._nonce = _b64(secrets.token_bytes(18))
        self._first_bare = f"n=,r={self._nonce}"
        return f"{self.gs2}{self._first_bare}"

    def final(self, server_first: str) -> str:
        """The client-final-message; derives the key (slow: run it off the event loop)."""
        attrs = _attributes(server_first)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if (
            not nonce.startswith(self._nonce)
            or salt is None
            or not iterations.isdigit()
            or len(iterations) > 10
        ):
            raise ScramError("malformed SCRAM message from the compute")
        client_key, stored_key, server_key = _keys(self.password, _unb64(salt), int(iterations))
        without_proof = f"c={_b64(self.gs2.encode() + self.binding)},r={nonce}"
        auth_message = f"{self._first_bare},{server_first},{without_proof}"
        signature = _hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}"

    def check(self, server_final: str) -> None:
        if _attributes(server_final).get("v") != _b64(self._server_signature):
            raise ScramError("the compute's SCRAM signature does not match")
