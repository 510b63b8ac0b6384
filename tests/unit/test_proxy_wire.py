"""The proxy's protocol pieces: startup packets, endpoint names, SCRAM on both sides."""

from __future__ import annotations

import base64
import struct

import pytest

from pgplane.proxy import scram, wire


def test_startup_round_trip_and_endpoint_option() -> None:
    startup = wire.Startup(
        wire.PROTOCOL_3,
        {"user": "u", "database": "d", "options": "-c search_path=x endpoint=ep-a-b-12 -c a=b"},
    )
    encoded = startup.encode()
    (length,) = struct.unpack("!I", encoded[:4])
    assert length == len(encoded)
    parsed = wire.parse_startup(*struct.unpack("!I", encoded[4:8]), encoded[8:])
    assert parsed == startup
    endpoint, rest = wire.take_endpoint_option(parsed)
    assert endpoint == "ep-a-b-12"
    assert rest.params["options"].split() == ["-c", "search_path=x", "-c", "a=b"]
    alone, bare = wire.take_endpoint_option(wire.Startup(wire.PROTOCOL_3, {"user": "u",
                                                          "options": "endpoint=ep-x"}))  # fmt: skip
    assert alone == "ep-x" and "options" not in bare.params


@pytest.mark.parametrize(
    "payload",
    [b"user\0u\0", b"user\0u\0database\0\0", b"\xff\0u\0\0", b"database\0d\0\0", b"\0"],
)
def test_malformed_startups_are_refused(payload: bytes) -> None:
    with pytest.raises(wire.ProtocolViolation):
        wire.parse_startup(wire.PROTOCOL_3, payload)


def test_sni_names_an_endpoint_only_under_the_proxy_host() -> None:
    assert wire.endpoint_from_sni("ep-cool-1.localhost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("EP-COOL-1.LocalHost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("ep-cool-1-pooler.localhost", "localhost") == "ep-cool-1"
    assert wire.endpoint_from_sni("ep-cool-1.elsewhere", "localhost") is None
    assert wire.endpoint_from_sni("localhost", "localhost") is None
    assert wire.endpoint_from_sni("../x.localhost", "localhost") is None
    assert wire.endpoint_from_sni(None, "localhost") is None


def _exchange(server: scram.ServerExchange, password: str, gs2: str, binding: bytes) -> str:
    """A client of ``server`` (as libpq would be), returning server-final-message."""
    mechanism = scram.MECHANISM_PLUS if gs2.startswith("p=") else scram.MECHANISM
    client = scram.ClientExchange(password, gs2=gs2, binding=binding)
    server_first = server.first(mechanism, client.first())
    return server.final(client.final(server_first))


def test_scram_with_and_without_channel_binding() -> None:
    cert_hash = b"\x01" * 32
    server = scram.ServerExchange("s3cret", cert_hash)
    assert server.mechanisms() == [scram.MECHANISM_PLUS, scram.MECHANISM]
    assert _exchange(server, "s3cret", "p=tls-server-end-point,,", cert_hash).startswith("v=")
    plain = scram.ServerExchange("s3cret", None)
    assert plain.mechanisms() == [scram.MECHANISM]
    assert _exchange(plain, "s3cret", "n,,", b"").startswith("v=")


def test_scram_refuses_wrong_password_binding_and_downgrade() -> None:
    cert_hash = b"\x01" * 32
    with pytest.raises(scram.ScramError, match="password authentication failed"):
        _exchange(scram.ServerExchange("s3cret", None), "wrong", "n,,", b"")
    with pytest.raises(scram.ScramError, match="channel binding"):
        _exchange(scram.ServerExchange("s3cret", cert_hash), "s3cret",
                  "p=tls-server-end-point,,", b"\x02" * 32)  # fmt: skip
    # The client could bind ("y") but we offered PLUS: someone removed it on the way.
    with pytest.raises(scram.ScramError, match="negotiation"):
        _exchange(scram.ServerExchange("s3cret", cert_hash), "s3cret", "y,,", b"")


def test_client_checks_the_server_signature() -> None:
    server = scram.ServerExchange("pw", None)
    client = scram.ClientExchange("pw")
    server_first = server.first(scram.MECHANISM, client.first())
    final = server.final(client.final(server_first))
    client.check(final)
    with pytest.raises(scram.ScramError):
        client.check("v=" + base64.b64encode(b"x" * 32).decode())


def test_error_response_fields() -> None:
    message = wire.error_response("08004", "endpoint x not found")
    assert message[:1] == b"E"
    assert wire.error_fields(message[5:]) == {
        "S": "FATAL", "V": "FATAL", "C": "08004", "M": "endpoint x not found",
    }  # fmt: skip
