"""SCRAM-SHA-256 (RFC 5802, 7677) on both sides of the proxy.

The proxy authenticates clients itself, as Neon's does, because channel binding
(``SCRAM-SHA-256-PLUS``, ``channel_binding=require``) binds the proof to the TLS connection the
client made, to the proxy; no compute behind it could check that proof. With the client proven,
the proxy logs in to the compute as the same role with the role's password.

Passwords are the platform's generated ones (ASCII), for which SASLprep changes nothing.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
CHANNEL_BINDING = "tls-server-end-point"
ITERATIONS = 4096


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


@functools.lru_cache(maxsize=4096)
def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey): the slow PBKDF2 once per password and salt."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac(salted, "Client Key")
    return client_key, hashlib.sha256(client_key).digest(), _hmac(salted, "Server Key")


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


# One salt per password for the life of the process, so its keys are computed once.
_salts: dict[str, bytes] = {}


def _verifier_salt(password: str) -> bytes:
    return _salts.setdefault(password, secrets.token_bytes(16))


@dataclass
class ServerExchange:
    """The proxy's side of a client's SCRAM exchange."""

    password: str
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
        salt = _verifier_salt(self.password)
        self._server_first = f"r={self._nonce},s={_b64(salt)},i={ITERATIONS}"
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
        _, stored_key, server_key = _keys(self.password, _verifier_salt(self.password), ITERATIONS)
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
        attrs = _attributes(server_first)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or salt is None or not iterations.isdigit():
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
