"""A certificate of its own for each name under a one-label host (``ep-x.localhost``).

Clients do not take a wildcard directly under a single label: OpenSSL (libpq, node, Python) and
node's own check want two labels after the ``*``, so ``*.localhost`` does not cover
``ep-x.localhost`` (nor ``*.box`` ``ep-x.box``). For those names the proxy shows a certificate
made for the name the client asked for (TLS SNI), signed by the platform's authority when first
asked and kept in a bounded cache. Only names of that shape are made: one DNS label under
``localhost`` or under a one-label proxy host.

A certificate costs one signature and one context; a client sending a new name each time makes
the proxy do that on top of the handshake it pays anyway, and the cache keeps the names in use.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pgplane.tls.authority import Authority

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
CACHED = 512


@dataclass(frozen=True, slots=True)
class Made:
    context: ssl.SSLContext
    cert_hash: bytes  # tls-server-end-point channel binding of this certificate


def _one_label(host: str) -> bool:
    return bool(_LABEL.fullmatch(host)) and not host.isdigit()


class ByName:
    def __init__(
        self,
        authority: Authority,
        key_path: Path,
        host: str,
        scratch: Path,
        alpn_protocols: tuple[str, ...] = (),
    ) -> None:
        self._authority = authority
        # The context chosen for a name is the one whose ALPN choice counts, and a context's
        # protocols cannot be read back from it: they are given here too.
        self._alpn = list(alpn_protocols)
        self._key_path = key_path
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("the proxy's key is not an EC key")
        self._key = key
        host = host.lower().rstrip(".")
        self._bases = {"localhost"} | ({host} if _one_label(host) else set())
        self._scratch = scratch  # a private directory: ssl loads certificates from files only
        self._made: OrderedDict[str, Made] = OrderedDict()

    def wants(self, name: str) -> bool:
        """Whether ``name`` (lower case) is one label under a one-label base."""
        label, _, base = name.partition(".")
        return base in self._bases and bool(_LABEL.fullmatch(label))

    def get(self, name: str, template: ssl.SSLContext) -> Made:
        """The context for ``name``, made like ``template`` on first use."""
        made = self._made.get(name)
        if made is not None:
            self._made.move_to_end(name)
            return made
        cert = self._authority.issue([x509.DNSName(name)], self._key)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = template.minimum_version
        context.options = template.options
        if self._alpn:
            context.set_alpn_protocols(self._alpn)
        with tempfile.NamedTemporaryFile(dir=self._scratch, prefix=".sni-", suffix=".crt") as f:
            f.write(pem)
            f.flush()
            context.load_cert_chain(f.name, self._key_path)
        made = Made(context, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest())
        self._made[name] = made
        if len(self._made) > CACHED:
            self._made.popitem(last=False)
        return made
